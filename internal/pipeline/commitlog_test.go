package pipeline

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// The commit log as the pipeline writes and prunes it (the protocol's side
// is txsink's commit_log.txt and the drivertest suite; the README's
// queries are integration.TestInvoicingQueriesOfTheREADME).

// Every upsert of an adjustment names its checkpoint, whose commit log
// record then gives the row's place in commit order.
func TestAdjustmentsNameTheirCheckpoint(t *testing.T) {
	e := newEnv(t, 1)
	var mu sync.Mutex
	var late []CheckpointInfo // committed checkpoints that counted late events
	start(t, e, func(c *Config, s *sinkConfig) {
		closing(30*time.Minute, false)(c, s)
		c.OnCheckpoint = func(info CheckpointInfo) {
			if info.Err == nil && info.Late > 0 {
				mu.Lock()
				late = append(late, info)
				mu.Unlock()
			}
		}
	})
	type row struct {
		Amount int64  `db:"amount_minor"`
		ID     string `db:"checkpoint_id"`
		Seq    int64  `db:"commit_seq"`
	}
	adjustment := func() row {
		t.Helper()
		var r []row
		if err := e.db.Select(&r, `SELECT a.amount_minor, a.checkpoint_id, c.commit_seq FROM window_adjustments a
			JOIN checkpoint_commits c ON c.checkpoint_id = a.checkpoint_id`); err != nil {
			t.Fatal(err)
		}
		if len(r) != 1 {
			t.Fatalf("%d adjustment rows joined with the commit log, want 1", len(r))
		}
		return r[0]
	}
	lastLate := func() CheckpointInfo {
		mu.Lock()
		defer mu.Unlock()
		return late[len(late)-1]
	}
	produce(t, e,
		ev{"n-1", "acct-n", 100, "EUR", "2026-11-29T10:05:00Z"}.record(""),
		ev{"n-2", "acct-n", 1, "EUR", "2026-11-29T11:30:00Z"}.record(""),
		ev{"n-3", "acct-n", 10, "EUR", "2026-11-29T10:10:00Z"}.record(""), // late
	)
	waitCounted(t, e.db, 3, 0)
	first := lastLate()
	if r := adjustment(); r.Amount != 10 || r.ID != first.Gtrid || r.Seq != first.CommitSeq || r.Seq == 0 {
		t.Fatalf("adjustment %+v, want 10 written by %s (number %d)", r, first.Gtrid, first.CommitSeq)
	}
	produce(t, e, ev{"n-4", "acct-n", 7, "EUR", "2026-11-29T10:20:00Z"}.record(""))
	waitCounted(t, e.db, 4, 0)
	second := lastLate()
	if r := adjustment(); r.Amount != 17 || r.ID != second.Gtrid || r.Seq != second.CommitSeq || r.Seq <= first.CommitSeq {
		t.Fatalf("adjustment %+v, want 17 written by %s (number %d, after %d)", r, second.Gtrid, second.CommitSeq, first.CommitSeq)
	}
}

// The retention of the commit log deletes the old records from the lowest
// number up, never the record at the visible position nor one that is not
// applied, at most commitLogPruneBudget × commitLogPruneBatch per pass.
func TestCommitLogRetention(t *testing.T) {
	dsn, db := testenv.LedgerDB(t)
	sink, d := openSink(t, sinkConfig{DSNs: []string{dsn}, Config: txsink.Config{Branches: 1, Group: "g", Topic: "t", StepTimeout: 10 * time.Second, Logger: testenv.Logger()}})
	defer d.Close()
	defer sink.Close()
	ctx := context.Background()
	const old = commitLogPruneBudget*commitLogPruneBatch + 500
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// old records of two days ago, applied, then three young ones.
	exec(`INSERT INTO checkpoint_commits (commit_seq, checkpoint_id, committed_at, applied_at)
		SELECT n, CONCAT('old-', n), UTC_TIMESTAMP(6) - INTERVAL 2 DAY, UTC_TIMESTAMP(6) - INTERVAL 2 DAY
		FROM (SELECT a.d + 10*b.d + 100*c.d + 1000*e.d + 10000*f.d + 100000*g.d + 1 AS n
		      FROM (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) a,
		           (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) b,
		           (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) c,
		           (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) e,
		           (SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) f,
		           (SELECT 0 d UNION ALL SELECT 1) g) n
		WHERE n <= ?`, old)
	exec(`UPDATE commit_sequence SET last_seq = ?`, old)
	commit := func() int64 {
		t.Helper()
		tx := sink.Begin(uint64(time.Now().UnixNano()))
		if err := tx.Decide(ctx, nil, nil, nil); err != nil {
			t.Fatal(err)
		}
		return tx.CommitSeq()
	}
	for range 3 {
		commit()
	}
	pos := func() txsink.CommitPosition {
		t.Helper()
		p, err := mysqldriver.ReadCommitPosition(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := pos(); p.Visible != old+3 || p.RetainedFrom != 1 {
		t.Fatalf("before pruning: %+v", p)
	}
	// One pass deletes its budget and stops.
	if n := PruneCommitLog(ctx, sink, 24*time.Hour, testenv.Logger()); n != commitLogPruneBudget*commitLogPruneBatch {
		t.Fatalf("the first pass deleted %d records, want its budget of %d", n, commitLogPruneBudget*commitLogPruneBatch)
	}
	if n := PruneCommitLog(ctx, sink, 24*time.Hour, testenv.Logger()); n != 500 {
		t.Fatalf("the second pass deleted %d records, want the 500 old ones left", n)
	}
	if p := pos(); p.RetainedFrom != old+1 || p.Visible != old+3 || p.Decided != old+3 {
		t.Fatalf("after pruning the old records: %+v", p)
	}
	// Aged, the young ones go too, but for the one at the visible
	// position; an unapplied one stops the prefix.
	exec(`UPDATE checkpoint_commits SET committed_at = committed_at - INTERVAL 2 DAY`)
	unapplied := commit() // applied at its decision: mark it unapplied, as if a branch were in doubt
	exec(`UPDATE checkpoint_commits SET applied_at = NULL, committed_at = committed_at - INTERVAL 2 DAY WHERE commit_seq = ?`, unapplied)
	commit()
	exec(`UPDATE checkpoint_commits SET committed_at = committed_at - INTERVAL 2 DAY WHERE commit_seq > ?`, unapplied)
	if n := PruneCommitLog(ctx, sink, 24*time.Hour, testenv.Logger()); n != 2 {
		t.Fatalf("deleted %d records, want 2: the record at the visible position (%d) and the unapplied one stay", n, unapplied-1)
	}
	if p := pos(); p.RetainedFrom != old+3 || p.Visible != unapplied-1 {
		t.Fatalf("after pruning up to the visible position: %+v", p)
	}
	// Nothing more goes while the unapplied record holds the position.
	if n := PruneCommitLog(ctx, sink, 24*time.Hour, testenv.Logger()); n != 0 {
		t.Fatalf("deleted %d more", n)
	}
}
