package mysqldriver

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/billing/ledger/internal/testenv"
)

// Marking decisions applied reaches their commit log rows by
// checkpoint_id's unique index, whatever the table holds (MarkApplied says
// why; one unapplied row among applied ones is the shape that tempted
// MariaDB 10.11 to the index on applied_at). The plan is read with
// EXPLAIN, as the lock waits and deadlocks it causes depend on timing.
func TestMarkAppliedGoesByCheckpointID(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, db := testenv.LedgerDB(t)
	for _, c := range []struct {
		unapplied, applied int
	}{{1, 2}, {1, 50}, {0, 3}, {40, 1}} {
		if _, err := db.ExecContext(ctx, `DELETE FROM checkpoint_commits`); err != nil {
			t.Fatal(err)
		}
		for i := range c.unapplied + c.applied {
			if _, err := db.ExecContext(ctx, `INSERT INTO checkpoint_commits (commit_seq, checkpoint_id, committed_at, applied_at)
				VALUES (?, ?, UTC_TIMESTAMP(6), IF(?, NULL, UTC_TIMESTAMP(6)))`, i+1, fmt.Sprintf("g-%03d", i), i < c.unapplied); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.ExecContext(ctx, `ANALYZE TABLE checkpoint_commits`); err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{1, 3, 128} {
			args := make([]any, n)
			for i := range args {
				args[i] = fmt.Sprintf("g-%03d", i)
			}
			rows, err := db.QueryxContext(ctx, `EXPLAIN `+markAppliedQuery(n), args...)
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for rows.Next() {
				row := map[string]any{}
				if err := rows.MapScan(row); err != nil {
					t.Fatal(err)
				}
				k, _ := row["key"].([]byte)
				keys = append(keys, string(k))
			}
			if err := rows.Close(); err != nil {
				t.Fatal(err)
			}
			if len(keys) != 1 || keys[0] != "checkpoint_commits_checkpoint" {
				t.Errorf("%d unapplied, %d applied, %d gtrids: marking goes by %q, want checkpoint_commits_checkpoint", c.unapplied, c.applied, n, keys)
			}
		}
	}
}
