package billing.jvm.flinkread;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.net.URI;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.DeploymentOptions;
import org.apache.flink.configuration.RestOptions;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;
import org.apache.flink.table.api.EnvironmentSettings;
import org.apache.flink.table.api.TableEnvironment;
import org.apache.flink.table.api.TableResult;
import org.apache.flink.types.Row;
import org.apache.flink.types.RowKind;
import org.apache.flink.util.CloseableIterator;

/**
 * flink-read: reads the ledger's changelog topics with Flink SQL, as a
 * downstream Flink job would, and prints what it read as JSON lines.
 *
 * <pre>
 * flink-read --brokers HOST:PORT[,HOST:PORT] [--reading debezium-json|upsert-kafka]...
 *            [--timestamp-type 'TIMESTAMP_LTZ(6)'] [--print-ddl] TABLE=TOPIC...
 * </pre>
 *
 * TABLE is one of the spec's tables (Schemas). Each topic is read
 * read_committed from the earliest offset to the end as it was when the job
 * started, in streaming mode (changelog rows allowed), one Flink job per
 * topic and reading, all at once in one local session cluster. Readings
 * (default: both):
 * debezium-json for every topic; upsert-kafka for the table topics.
 *
 * Output, on stdout, one JSON object a line, every one with "reading" and
 * "table": for a table topic the final row of every key, materialised from
 * the changelog (Materializer), sorted by key; for an append-only topic
 * every row in the order read (duplicates would show). A changelog that
 * breaks the chain (Materializer) gives "violation" lines and exit status 3.
 * Integers are JSON numbers, timestamps ISO-8601 UTC strings with
 * microseconds and Z, as in the spec. A record Flink cannot parse fails the
 * job: its error chain goes to stderr, exit status 1. Usage errors: 2.
 */
public final class FlinkRead {
    private FlinkRead() {}

    private static final DateTimeFormatter TS =
            DateTimeFormatter.ofPattern("uuuu-MM-dd'T'HH:mm:ss.SSSSSS'Z'").withZone(ZoneOffset.UTC);

    private record Target(Schemas.Table table, String topic) {}

    public static void main(String[] args) {
        // UTF-8 whatever the locale: the ledger's strings are not ASCII.
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        PrintStream err = new PrintStream(new FileOutputStream(FileDescriptor.err), true, StandardCharsets.UTF_8);
        int rc;
        try {
            rc = run(args, out, err);
        } catch (UsageException e) {
            err.println("flink-read: " + e.getMessage());
            rc = 2;
        } catch (Exception e) {
            err.println("flink-read: failed: " + e);
            for (Throwable c = e.getCause(); c != null; c = c.getCause()) {
                err.println("  caused by: " + c);
            }
            rc = 1;
        }
        out.flush();
        err.flush();
        // The mini cluster leaves non-daemon threads behind; exit explicitly.
        System.exit(rc);
    }

    static final class UsageException extends Exception {
        UsageException(String msg) {
            super(msg);
        }
    }

    private static int run(String[] args, PrintStream out, PrintStream err) throws Exception {
        String brokers = null;
        String tsType = "TIMESTAMP_LTZ(6)";
        boolean printDdl = false;
        List<Ddl.Reading> readings = new ArrayList<>();
        List<Target> targets = new ArrayList<>();
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            switch (a) {
                case "--brokers" -> brokers = value(args, ++i, a);
                case "--reading" -> {
                    try {
                        readings.add(Ddl.Reading.parse(value(args, ++i, a)));
                    } catch (IllegalArgumentException e) {
                        throw new UsageException(e.getMessage());
                    }
                }
                case "--timestamp-type" -> tsType = value(args, ++i, a);
                case "--print-ddl" -> printDdl = true;
                default -> {
                    int eq = a.indexOf('=');
                    if (a.startsWith("-") || eq <= 0 || eq == a.length() - 1) {
                        throw new UsageException("unexpected argument " + a + " (want TABLE=TOPIC)");
                    }
                    Schemas.Table t = Schemas.TABLES.get(a.substring(0, eq));
                    if (t == null) {
                        throw new UsageException("unknown table " + a.substring(0, eq) + ", want one of "
                                + new java.util.TreeSet<>(Schemas.TABLES.keySet()));
                    }
                    targets.add(new Target(t, a.substring(eq + 1)));
                }
            }
        }
        if (brokers == null || targets.isEmpty()) {
            throw new UsageException("usage: flink-read --brokers HOST:PORT [--reading debezium-json|upsert-kafka]... "
                    + "[--timestamp-type TYPE] [--print-ddl] TABLE=TOPIC...");
        }
        if (readings.isEmpty()) {
            readings = List.of(Ddl.Reading.DEBEZIUM_JSON, Ddl.Reading.UPSERT_KAFKA);
        }
        Ddl.Source src = new Ddl.Source(brokers, tsType);

        if (printDdl) {
            for (Target tg : targets) {
                for (Ddl.Reading r : readings) {
                    if (applies(tg.table(), r)) {
                        out.println(Ddl.create(tg.table(), r, src, tg.topic()) + ";\n");
                        out.println(Ddl.select(tg.table(), r) + ";\n");
                    }
                }
            }
            return 0;
        }

        // One local session cluster for every job, with a slot per job so
        // that all of them run at once. TableEnvironment's own local
        // execution starts a cluster per job and shuts it down as the job
        // ends, racing the collect sink's last fetch ("Some data might be
        // lost").
        List<Job> jobs = new ArrayList<>();
        for (Target tg : targets) {
            for (Ddl.Reading r : readings) {
                if (applies(tg.table(), r)) {
                    jobs.add(new Job(tg, r));
                }
            }
        }
        Configuration clusterConf = new Configuration();
        clusterConf.set(RestOptions.BIND_ADDRESS, "127.0.0.1");
        clusterConf.set(RestOptions.ADDRESS, "127.0.0.1");
        clusterConf.set(RestOptions.BIND_PORT, "0");
        long t0 = System.nanoTime();
        try (MiniCluster cluster = new MiniCluster(new MiniClusterConfiguration.Builder()
                .setConfiguration(clusterConf)
                .setNumTaskManagers(1)
                .setNumSlotsPerTaskManager(jobs.size())
                .build())) {
            cluster.start();
            URI rest = cluster.getRestAddress().get();
            Configuration conf = new Configuration();
            conf.set(DeploymentOptions.TARGET, "remote");
            conf.set(DeploymentOptions.ATTACHED, true);
            conf.set(RestOptions.ADDRESS, rest.getHost());
            conf.set(RestOptions.PORT, rest.getPort());
            // One task per job: the topics are small and the machine is shared.
            conf.setString("parallelism.default", "1");
            conf.setString("table.local-time-zone", "UTC");
            TableEnvironment env = TableEnvironment.create(
                    EnvironmentSettings.newInstance().inStreamingMode().withConfiguration(conf).build());
            for (Job j : jobs) {
                env.executeSql(Ddl.create(j.target.table(), j.reading, src, j.target.topic()));
                j.result = env.executeSql(Ddl.select(j.target.table(), j.reading));
            }
            err.printf("flink-read: %d jobs submitted in %d ms%n", jobs.size(), (System.nanoTime() - t0) / 1_000_000);
            ObjectMapper json = new ObjectMapper();
            int violations = 0;
            for (Job j : jobs) {
                violations += read(j.target.table(), j.reading, j.target.topic(), j.result, json, out, err);
            }
            err.printf("flink-read: all read in %d ms%n", (System.nanoTime() - t0) / 1_000_000);
            return violations > 0 ? 3 : 0;
        }
    }

    private static final class Job {
        final Target target;
        final Ddl.Reading reading;
        TableResult result;

        Job(Target target, Ddl.Reading reading) {
            this.target = target;
            this.reading = reading;
        }
    }
    private static boolean applies(Schemas.Table t, Ddl.Reading r) {
        return r == Ddl.Reading.DEBEZIUM_JSON || t.changeStream();
    }

    private static String value(String[] args, int i, String flag) throws UsageException {
        if (i >= args.length) {
            throw new UsageException(flag + " needs a value");
        }
        return args[i];
    }

    /** Reads one job's results, prints them; returns the number of violations. */
    private static int read(Schemas.Table t, Ddl.Reading r, String topic, TableResult result, ObjectMapper json,
            PrintStream out, PrintStream err) throws Exception {
        int width = t.columns().size();
        // upsert-kafka's query selects the key columns first (from the record
        // key), then the columns of after.
        int offset = r == Ddl.Reading.UPSERT_KAFKA ? t.key().size() : 0;
        List<Integer> keyIdx = new ArrayList<>();
        for (String k : t.key()) {
            keyIdx.add(t.columns().indexOf(t.column(k)));
        }
        Materializer m = new Materializer(keyIdx);
        List<String> violations = new ArrayList<>();
        long n = 0;
        try (CloseableIterator<Row> it = result.collect()) {
            while (it.hasNext()) {
                Row row = it.next();
                n++;
                List<Object> values = new ArrayList<>(width);
                for (int i = 0; i < width; i++) {
                    values.add(row.getField(offset + i));
                }
                if (offset > 0) {
                    for (int i = 0; i < t.key().size(); i++) {
                        Object fromKey = row.getField(i);
                        Object fromAfter = values.get(keyIdx.get(i));
                        if (!java.util.Objects.equals(fromKey, fromAfter) && violations.size() < 100) {
                            violations.add("record key " + t.key().get(i) + "=" + fromKey
                                    + " differs from after's " + fromAfter);
                        }
                    }
                }
                if (t.changeStream()) {
                    m.apply(row.getKind(), values);
                } else {
                    if (row.getKind() != RowKind.INSERT && violations.size() < 100) {
                        violations.add("append-only topic gave a " + row.getKind().shortString() + " row " + values);
                    }
                    out.println(json.writeValueAsString(line(r, t, values)));
                }
            }
        }
        if (t.changeStream()) {
            violations.addAll(m.violations());
            List<List<Object>> rows = new ArrayList<>(m.rows().values());
            rows.sort(Comparator.comparing(v -> keyString(keyIdx, v)));
            for (List<Object> v : rows) {
                out.println(json.writeValueAsString(line(r, t, v)));
            }
            err.printf("flink-read: %s %s (%s): %d changelog rows (%s), %d keys%n", r.label, t.name(), topic, n,
                    m.counts(), rows.size());
        } else {
            err.printf("flink-read: %s %s (%s): %d rows%n", r.label, t.name(), topic, n);
        }
        for (String v : violations) {
            Map<String, Object> o = new LinkedHashMap<>();
            o.put("reading", r.label);
            o.put("table", t.name());
            o.put("violation", v);
            out.println(json.writeValueAsString(o));
        }
        return violations.size();
    }

    private static String keyString(List<Integer> keyIdx, List<Object> v) {
        StringBuilder b = new StringBuilder();
        for (int i : keyIdx) {
            b.append(format(v.get(i))).append('\u0000');
        }
        return b.toString();
    }

    private static Map<String, Object> line(Ddl.Reading r, Schemas.Table t, List<Object> values) {
        Map<String, Object> o = new LinkedHashMap<>();
        o.put("reading", r.label);
        o.put("table", t.name());
        for (int i = 0; i < values.size(); i++) {
            o.put(t.columns().get(i).name(), format(values.get(i)));
        }
        return o;
    }

    /** Timestamps back to the spec's text; everything else as it is. */
    private static Object format(Object v) {
        if (v instanceof Instant ins) {
            return TS.format(ins);
        }
        if (v instanceof LocalDateTime ldt) {
            return TS.format(ldt.toInstant(ZoneOffset.UTC));
        }
        return v;
    }
}
