package billing.jvm.flinkread;

import java.util.ArrayList;
import java.util.List;
import java.util.stream.Collectors;

/**
 * The Flink SQL table definitions of the two readings, and the query each
 * reading runs. These are the statements docs/changelog.md shows a consumer
 * (`flink-read --print-ddl` prints them).
 */
final class Ddl {
    private Ddl() {}

    /** How a table topic is read. */
    enum Reading {
        /**
         * The Debezium envelope as a changelog: c and r become +I, u becomes
         * -U (before) and +U (after), d becomes -D.
         */
        DEBEZIUM_JSON("debezium-json"),
        /**
         * The upsert-kafka convention: the record key is the primary key and
         * the latest value per key (here the envelope's after) is the row.
         */
        UPSERT_KAFKA("upsert-kafka");

        final String label;

        Reading(String label) {
            this.label = label;
        }

        static Reading parse(String s) {
            for (Reading r : values()) {
                if (r.label.equals(s)) {
                    return r;
                }
            }
            throw new IllegalArgumentException("unknown reading " + s + " (want debezium-json or upsert-kafka)");
        }
    }

    /** Settings shared by every definition. */
    record Source(String brokers, String timestampType) {}

    static String tableName(Schemas.Table t, Reading r) {
        return (r == Reading.DEBEZIUM_JSON ? "dbz_" : "ups_") + t.name();
    }

    static String type(Schemas.Column c, String timestampType) {
        return switch (c.kind()) {
            case STRING -> "STRING";
            case BIGINT -> "BIGINT";
            case BOOLEAN -> "BOOLEAN";
            case TIMESTAMP -> timestampType;
        };
    }

    private static String q(String ident) {
        return "`" + ident.replace("`", "``") + "`";
    }

    /** A SQL string literal. */
    private static String lit(String s) {
        return "'" + s.replace("'", "''") + "'";
    }

    private static String columns(Schemas.Table t, String ts, String indent) {
        return t.columns().stream()
                .map(c -> indent + q(c.name()) + " " + type(c, ts))
                .collect(Collectors.joining(",\n"));
    }

    /** The Kafka options every reading shares: read_committed, earliest to the end as of the start. */
    private static List<String> kafkaOptions(Source src, String topic) {
        List<String> o = new ArrayList<>();
        o.add("'topic' = " + lit(topic));
        o.add("'properties.bootstrap.servers' = " + lit(src.brokers()));
        o.add("'properties.isolation.level' = 'read_committed'");
        o.add("'scan.bounded.mode' = 'latest-offset'");
        return o;
    }

    private static String with(List<String> options) {
        return "WITH (\n  " + String.join(",\n  ", options) + "\n)";
    }

    static String create(Schemas.Table t, Reading r, Source src, String topic) {
        String ts = src.timestampType();
        List<String> o = new ArrayList<>();
        if (r == Reading.DEBEZIUM_JSON) {
            o.add("'connector' = 'kafka'");
            o.addAll(kafkaOptions(src, topic));
            o.add("'scan.startup.mode' = 'earliest-offset'");
            o.add("'format' = 'debezium-json'");
            o.add("'debezium-json.timestamp-format.standard' = 'ISO-8601'");
            // A record that does not parse fails the job: nothing is skipped.
            o.add("'debezium-json.ignore-parse-errors' = 'false'");
            return "CREATE TEMPORARY TABLE " + q(tableName(t, r)) + " (\n"
                    + columns(t, ts, "  ") + "\n) " + with(o);
        }
        // upsert-kafka: the key columns come from the record key (a JSON
        // object of the primary-key columns), the rest of the row from the
        // value, of which only `after` is declared (json ignores the other
        // fields of the envelope). upsert-kafka always starts from the
        // earliest offset.
        o.add("'connector' = 'upsert-kafka'");
        o.addAll(kafkaOptions(src, topic));
        o.add("'key.format' = 'json'");
        o.add("'key.json.timestamp-format.standard' = 'ISO-8601'");
        o.add("'value.format' = 'json'");
        o.add("'value.json.timestamp-format.standard' = 'ISO-8601'");
        o.add("'value.fields-include' = 'EXCEPT_KEY'");
        String key = t.key().stream()
                .map(k -> "  " + q(k) + " " + type(t.column(k), ts))
                .collect(Collectors.joining(",\n"));
        String after = t.columns().stream()
                .map(c -> q(c.name()) + " " + type(c, ts))
                .collect(Collectors.joining(", "));
        return "CREATE TEMPORARY TABLE " + q(tableName(t, r)) + " (\n"
                + key + ",\n"
                + "  " + q("after") + " ROW<" + after + ">,\n"
                + "  PRIMARY KEY (" + t.key().stream().map(Ddl::q).collect(Collectors.joining(", "))
                + ") NOT ENFORCED\n) " + with(o);
    }

    /**
     * The query of a reading. debezium-json: the table's columns.
     * upsert-kafka: the key columns (from the record key), then the columns
     * of after, so the reader can check that the two agree.
     */
    static String select(Schemas.Table t, Reading r) {
        if (r == Reading.DEBEZIUM_JSON) {
            return "SELECT " + t.columns().stream().map(c -> q(c.name())).collect(Collectors.joining(", "))
                    + " FROM " + q(tableName(t, r));
        }
        List<String> cols = new ArrayList<>();
        for (String k : t.key()) {
            cols.add(q(k));
        }
        for (Schemas.Column c : t.columns()) {
            cols.add(q("after") + "." + q(c.name()));
        }
        return "SELECT " + String.join(", ", cols) + " FROM " + q(tableName(t, r));
    }
}
