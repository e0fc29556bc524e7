package billing.jvm.flinkread;

import java.util.ArrayList;
import java.util.EnumMap;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import org.apache.flink.types.RowKind;

/**
 * Applies a changelog (rows with their RowKind, as Flink emits them) to a
 * table keyed by the primary key, the way a downstream Flink job's state
 * would, and checks the changelog while doing so: an insert (+I, +U) must
 * find its key absent, a retraction (-U, -D) must name exactly the row
 * currently held. Over debezium-json this is the spec's chain check: a u
 * event whose before is not the previous after, or a c event for a key that
 * already has a row, is reported.
 */
final class Materializer {
    private final List<Integer> keyIndexes;
    private final Map<List<Object>, List<Object>> rows = new HashMap<>();
    private final List<String> violations = new ArrayList<>();
    private final Map<RowKind, Integer> counts = new EnumMap<>(RowKind.class);
    private long applied;

    Materializer(List<Integer> keyIndexes) {
        this.keyIndexes = keyIndexes;
    }

    private List<Object> keyOf(List<Object> row) {
        List<Object> k = new ArrayList<>(keyIndexes.size());
        for (int i : keyIndexes) {
            k.add(row.get(i));
        }
        return k;
    }

    void apply(RowKind kind, List<Object> row) {
        applied++;
        counts.merge(kind, 1, Integer::sum);
        List<Object> key = keyOf(row);
        List<Object> held = rows.get(key);
        switch (kind) {
            case INSERT, UPDATE_AFTER -> {
                if (held != null) {
                    violation(kind, key, "key already holds " + held + ", new row " + row);
                }
                rows.put(key, row);
            }
            case UPDATE_BEFORE, DELETE -> {
                if (held == null) {
                    violation(kind, key, "retracts " + row + " but the key holds no row");
                } else if (!Objects.equals(held, row)) {
                    violation(kind, key, "retracts " + row + " but the key holds " + held);
                }
                rows.remove(key);
            }
        }
    }

    private void violation(RowKind kind, List<Object> key, String what) {
        // Bounded: a broken stream reports its first problems, not millions.
        if (violations.size() < 100) {
            violations.add("changelog row " + applied + " (" + kind.shortString() + ") of key " + key + ": " + what);
        }
    }

    Map<List<Object>, List<Object>> rows() {
        return rows;
    }

    List<String> violations() {
        return violations;
    }

    String counts() {
        StringBuilder b = new StringBuilder();
        for (RowKind k : RowKind.values()) {
            b.append(b.isEmpty() ? "" : " ").append(k.shortString()).append(' ').append(counts.getOrDefault(k, 0));
        }
        return b.toString();
    }
}
