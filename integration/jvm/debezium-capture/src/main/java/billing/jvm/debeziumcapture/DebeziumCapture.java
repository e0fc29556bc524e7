package billing.jvm.debeziumcapture;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.format.Json;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Stream;

/**
 * debezium-capture: Debezium's MySQL connector (which reads MariaDB's binary
 * log as well), embedded, capturing tables of one database the way a
 * binlog-tapping consumer of the ledger would, and printing every change
 * event it emits.
 *
 * <pre>
 * debezium-capture --host H --port P --user U --password PW --database DB --tables T1,T2
 *                  [--duration SECONDS] [--server-id N] [--dir STATE_DIR]
 * </pre>
 *
 * Streams from the binary log position current at start (snapshot.mode
 * no_data: the tables' structure is read, not their rows; no lock is
 * taken, snapshot.locking.mode none), until --duration seconds passed (0,
 * the default: until killed). Offsets and schema history are files under
 * --dir (default a temporary folder, removed at exit). It needs the
 * REPLICATION SLAVE and REPLICATION CLIENT privileges (root has them), and a
 * server id no other replica of the server uses (default: random).
 *
 * Output, on stdout, one JSON object a line per change event: "table",
 * "op" (c, u, d), "file", "pos", "row" (the binary log position of the
 * event), "gtid", "ts_ms", "before", "after" (Debezium's rows: DATETIME(6)
 * as microseconds since the epoch, VARBINARY as hex). Logs and status go to
 * stderr. Exit status 0 after --duration or SIGTERM, 1 when the engine
 * fails, 2 on a usage error.
 */
public final class DebeziumCapture {
    private DebeziumCapture() {}

    private static final String NAME = "[A-Za-z0-9_]{1,64}";

    public static void main(String[] args) throws Exception {
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        PrintStream err = new PrintStream(new FileOutputStream(FileDescriptor.err), true, StandardCharsets.UTF_8);
        Args a;
        try {
            a = Args.parse(args);
        } catch (IllegalArgumentException e) {
            err.println("debezium-capture: " + e.getMessage());
            System.exit(2);
            return;
        }
        Path dir = a.dir != null ? Files.createDirectories(Path.of(a.dir)) : Files.createTempDirectory("debezium-capture-");
        int rc = capture(a, dir, out, err);
        if (a.dir == null) {
            deleteTree(dir);
        }
        out.flush();
        err.flush();
        System.exit(rc);
    }

    private static final class Args {
        String host = "127.0.0.1";
        int port = 3306;
        String user = "root";
        String password = "";
        String database;
        List<String> tables = new ArrayList<>();
        long durationSeconds;
        long serverId = ThreadLocalRandom.current().nextLong(100_000, 1L << 31);
        String dir;

        static Args parse(String[] args) {
            Args a = new Args();
            for (int i = 0; i < args.length; i++) {
                String f = args[i];
                if (i + 1 >= args.length) {
                    throw new IllegalArgumentException(f + " needs a value");
                }
                String v = args[++i];
                switch (f) {
                    case "--host" -> a.host = v;
                    case "--port" -> a.port = Integer.parseInt(v);
                    case "--user" -> a.user = v;
                    case "--password" -> a.password = v;
                    case "--database" -> a.database = v;
                    case "--tables" -> a.tables = List.of(v.split(","));
                    case "--duration" -> a.durationSeconds = Long.parseLong(v);
                    case "--server-id" -> a.serverId = Long.parseLong(v);
                    case "--dir" -> a.dir = v;
                    default -> throw new IllegalArgumentException("unknown flag " + f);
                }
            }
            if (a.database == null || a.tables.isEmpty()) {
                throw new IllegalArgumentException("usage: debezium-capture --host H --port P --user U --password PW "
                        + "--database DB --tables T1,T2 [--duration SECONDS] [--server-id N] [--dir STATE_DIR]");
            }
            // Names go into Debezium's include lists, which are regular
            // expressions: plain identifiers only.
            if (!a.database.matches(NAME)) {
                throw new IllegalArgumentException("bad database name " + a.database);
            }
            for (String t : a.tables) {
                if (!t.matches(NAME)) {
                    throw new IllegalArgumentException("bad table name " + t);
                }
            }
            return a;
        }
    }

    static Properties properties(Args a, Path dir) {
        Properties p = new Properties();
        p.setProperty("name", "debezium-capture");
        p.setProperty("connector.class", "io.debezium.connector.mysql.MySqlConnector");
        p.setProperty("topic.prefix", "capture");
        p.setProperty("offset.storage", "org.apache.kafka.connect.storage.FileOffsetBackingStore");
        p.setProperty("offset.storage.file.filename", dir.resolve("offsets.dat").toString());
        p.setProperty("offset.flush.interval.ms", "1000");
        p.setProperty("schema.history.internal", "io.debezium.storage.file.history.FileSchemaHistory");
        p.setProperty("schema.history.internal.file.filename", dir.resolve("schema-history.dat").toString());
        // The shared server holds hundreds of test databases: record only
        // the captured tables' structure.
        p.setProperty("schema.history.internal.store.only.captured.databases.ddl", "true");
        p.setProperty("schema.history.internal.store.only.captured.tables.ddl", "true");
        p.setProperty("database.hostname", a.host);
        p.setProperty("database.port", Integer.toString(a.port));
        p.setProperty("database.user", a.user);
        p.setProperty("database.password", a.password);
        p.setProperty("database.server.id", Long.toString(a.serverId));
        p.setProperty("database.ssl.mode", "disabled");
        p.setProperty("database.jdbc.driver", MariaDbDriver.class.getName());
        p.setProperty("database.include.list", a.database);
        List<String> tables = new ArrayList<>();
        for (String t : a.tables) {
            tables.add(a.database + "\\." + t);
        }
        p.setProperty("table.include.list", String.join(",", tables));
        // From the current position; no global read lock on a shared server.
        p.setProperty("snapshot.mode", "no_data");
        p.setProperty("snapshot.locking.mode", "none");
        p.setProperty("include.schema.changes", "false");
        p.setProperty("tombstones.on.delete", "false");
        p.setProperty("binary.handling.mode", "hex");
        p.setProperty("converter.schemas.enable", "false");
        p.setProperty("key.converter.schemas.enable", "false");
        p.setProperty("value.converter.schemas.enable", "false");
        return p;
    }

    private static int capture(Args a, Path dir, PrintStream out, PrintStream err) throws InterruptedException {
        ObjectMapper json = new ObjectMapper();
        CountDownLatch done = new CountDownLatch(1);
        AtomicReference<String> failure = new AtomicReference<>();
        DebeziumEngine<ChangeEvent<String, String>> engine = DebeziumEngine.create(Json.class)
                .using(properties(a, dir))
                .using(new DebeziumEngine.ConnectorCallback() {
                    @Override
                    public void taskStarted() {
                        err.println("debezium-capture: task started (server id " + a.serverId + ")");
                    }
                })
                .using((success, message, error) -> {
                    if (!success) {
                        failure.set(message + (error != null ? ": " + error : ""));
                    }
                    done.countDown();
                })
                .notifying(record -> {
                    if (record.value() == null) {
                        return;
                    }
                    try {
                        out.println(json.writeValueAsString(line(json, json.readTree(record.value()))));
                    } catch (IOException e) {
                        throw new IllegalStateException("event of " + record.destination() + ": " + e, e);
                    }
                })
                .build();
        ExecutorService executor = Executors.newSingleThreadExecutor();
        executor.execute(engine);
        Thread hook = new Thread(() -> closeQuietly(engine, err));
        Runtime.getRuntime().addShutdownHook(hook);
        boolean ended = a.durationSeconds > 0 ? done.await(a.durationSeconds, TimeUnit.SECONDS) : awaitForever(done);
        if (!ended) {
            closeQuietly(engine, err);
            done.await(60, TimeUnit.SECONDS);
        }
        executor.shutdownNow();
        if (failure.get() != null) {
            err.println("debezium-capture: engine failed: " + failure.get());
            return 1;
        }
        return 0;
    }

    private static boolean awaitForever(CountDownLatch done) throws InterruptedException {
        done.await();
        return true;
    }

    /** The event's rows and its position in the binary log. */
    private static ObjectNode line(ObjectMapper json, JsonNode v) {
        JsonNode src = v.path("source");
        ObjectNode o = json.createObjectNode();
        o.set("table", src.path("table"));
        o.set("op", v.path("op"));
        o.set("file", src.path("file"));
        o.set("pos", src.path("pos"));
        o.set("row", src.path("row"));
        o.set("gtid", src.path("gtid"));
        o.set("ts_ms", v.path("ts_ms"));
        o.set("before", v.path("before"));
        o.set("after", v.path("after"));
        return o;
    }

    private static void closeQuietly(DebeziumEngine<?> engine, PrintStream err) {
        try {
            engine.close();
        } catch (IOException e) {
            err.println("debezium-capture: close: " + e);
        } catch (IllegalStateException e) {
            // Already shut down (it failed, or the duration ended first).
        }
    }

    private static void deleteTree(Path dir) {
        try (Stream<Path> s = Files.walk(dir)) {
            s.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (IOException e) {
            // A temporary folder left behind is harmless.
        }
    }
}
