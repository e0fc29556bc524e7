package billing.jvm.flinkread;

import java.util.List;
import java.util.Map;

/**
 * The tables of the changelog format (issue 20, the lead's spec), as a
 * consumer declares them: column names and the Flink SQL types that parse
 * the format's values as they are. This is the consumer's own reading of the
 * spec, written independently of the Go side that produces the changelog:
 * where the two disagree, a test fails.
 */
final class Schemas {
    private Schemas() {}

    /** The kinds of column in the spec, and how each is declared to Flink. */
    enum Kind {
        /** Strings of the ledger (valid UTF-8). */
        STRING,
        /** BIGINT and INT columns: JSON numbers, parsed as 64-bit integers. */
        BIGINT,
        BOOLEAN,
        /** DATETIME(6) columns: ISO-8601 UTC strings with microseconds and a trailing Z. */
        TIMESTAMP
    }

    record Column(String name, Kind kind) {}

    /**
     * A table of the spec. changeStream: a table topic (c, u, r events, one
     * chain per key); otherwise an append-only topic (c events only), whose
     * rows are printed one by one, duplicates included.
     */
    record Table(String name, List<Column> columns, List<String> key, boolean changeStream) {
        Column column(String name) {
            for (Column c : columns) {
                if (c.name().equals(name)) {
                    return c;
                }
            }
            throw new IllegalArgumentException(this.name + " has no column " + name);
        }
    }

    private static Column s(String n) {
        return new Column(n, Kind.STRING);
    }

    private static Column i(String n) {
        return new Column(n, Kind.BIGINT);
    }

    private static Column t(String n) {
        return new Column(n, Kind.TIMESTAMP);
    }

    private static final List<Column> WINDOW =
            List.of(s("account_id"), s("currency"), t("window_start"), i("amount_minor"),
                    i("event_count"), t("updated_at"), t("closed_at"));

    static final Map<String, Table> TABLES = Map.of(
            "account_balances", new Table("account_balances",
                    List.of(s("account_id"), s("currency"), i("balance_minor"), i("event_count"),
                            t("updated_at")),
                    List.of("account_id", "currency"), true),
            "billing_windows", new Table("billing_windows", WINDOW,
                    List.of("account_id", "currency", "window_start"), true),
            "window_adjustments", new Table("window_adjustments",
                    List.of(s("account_id"), s("currency"), t("window_start"), i("amount_minor"),
                            i("event_count"), t("updated_at"), s("checkpoint_id")),
                    List.of("account_id", "currency", "window_start"), true),
            "closed_windows", new Table("closed_windows", WINDOW,
                    List.of("account_id", "currency", "window_start"), false),
            "ledger_entries", new Table("ledger_entries",
                    List.of(s("kafka_topic"), i("kafka_partition"), i("kafka_offset"), s("event_id"),
                            s("account_id"), s("currency"), i("amount_minor"), t("occurred_at"),
                            t("window_start"), new Column("late", Kind.BOOLEAN), s("checkpoint_id"),
                            t("created_at"), i("entry"), i("revision")),
                    List.of("kafka_topic", "kafka_partition", "kafka_offset", "entry"), false));
}
