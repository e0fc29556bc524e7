package pipeline

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
	"github.com/billing/ledger/migrations"
)

// insertEntries stores n ledger entries of partition p created at created,
// offsets from first, in statements of 1000 rows.
func insertEntries(t *testing.T, db *sqlx.DB, p, first, n int, created time.Time) {
	t.Helper()
	for lo := 0; lo < n; lo += 1000 {
		hi := min(lo+1000, n)
		var args []any
		for i := lo; i < hi; i++ {
			args = append(args, p, first+i, fmt.Sprintf("e-%d-%d", p, first+i), created, created, created)
		}
		if _, err := db.Exec(`INSERT INTO ledger_entries (kafka_topic, kafka_partition, kafka_offset, event_id, account_id, currency, amount_minor, occurred_at, window_start, late, checkpoint_id, created_at) VALUES `+
			strings.TrimSuffix(strings.Repeat("('t', ?, ?, ?, 'a', 'EUR', 1, ?, ?, FALSE, 'c', ?),", hi-lo), ","), args...); err != nil {
			t.Fatal(err)
		}
	}
}

// Retention keeps up like the janitor (issue 18): a backlog of old entries
// far larger than one pass (100 statements of DedupCleanupBatch rows per
// server) is deleted at once on every server, each on its own deadline,
// and no entry younger than the retention is touched. With one pass per
// interval (an hour here) it would take 20 hours; before, the passes of
// all servers also shared one deadline of one interval.
func TestRetentionWorksOffABacklogAtOnce(t *testing.T) {
	e := newEnv(t, 1)
	second := testenv.NewDatabase(t)
	db2, err := mysqldriver.OpenDB(second, 5*time.Second, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	if err := migrations.Up(context.Background(), db2.DB, testenv.Logger()); err != nil {
		t.Fatal(err)
	}
	d, err := mysqldriver.Open(context.Background(), []string{e.dsn, second}, mysqldriver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const batch, old = 2, 2 * 100 * 20 // 20 passes
	now := time.Now().UTC()
	for _, db := range []*sqlx.DB{e.db, db2} {
		insertEntries(t, db, 0, 0, old, now.Add(-time.Hour))
		insertEntries(t, db, 1, 0, 50, now)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Retention(ctx, d.Stores(), time.Now, time.Hour, 10*time.Minute, batch, testenv.Logger())
	}()
	defer func() { cancel(); <-done }()
	count := func(db *sqlx.DB, partition int) int {
		var n int
		_ = db.Get(&n, `SELECT COUNT(*) FROM ledger_entries WHERE kafka_partition = ?`, partition)
		return n
	}
	testenv.Eventually(t, time.Minute, "old entries deleted on both servers", func() (bool, string) {
		a, b := count(e.db, 0), count(db2, 0)
		return a == 0 && b == 0, fmt.Sprintf("%d and %d of %d left", a, b, old)
	})
	for i, db := range []*sqlx.DB{e.db, db2} {
		if n := count(db, 1); n != 50 {
			t.Errorf("server %d: %d young entries left, want 50", i, n)
		}
	}
}

// Cleanup holds no connection a checkpoint needs (issue 18): with
// MYSQL_BRANCHES=8 the janitor runs 8 workers per server, and the pool of
// checkpoints is MYSQL_BRANCHES + 8 connections, 8 of them held by the
// branches between checkpoints. While the janitor works off a backlog with
// all its workers, checkpoints whose ids need lookups (repeats of stored
// keys) and a decision run, and not one of their requests for a
// connection waits: the janitor's workers are on the cleanup pool, which
// never holds more than its MYSQL_BRANCHES + 1. Before, the janitor's 8
// took the pool's last 8 and every lookup and decision queued behind it.
func TestCleanupNeverTakesACheckpointsConnection(t *testing.T) {
	e := newEnv(t, 1)
	const branches = 8
	sink, d := openSink(t, sinkConfig{DSNs: []string{e.dsn}, Config: txsink.Config{Branches: branches, Group: "g-" + e.topic, Topic: e.topic,
		StepTimeout: 10 * time.Second, Logger: testenv.Logger()}})
	t.Cleanup(func() { sink.Close(); d.Close() })
	main, cleanup := d.Server(0).DB(), d.Server(0).CleanupDB()
	if got := cleanup.Stats().MaxOpenConnections; got != branches+1 {
		t.Fatalf("cleanup pool of %d connections, want MYSQL_BRANCHES + 1 = %d", got, branches+1)
	}

	const keys = 400_000
	seedJanitorBacklog(t, e, keys)
	ck, err := NewCheckpointer(testConfig(e), sink, d.Stores())
	if err != nil {
		t.Fatal(err)
	}
	pos, err := sink.Claim(t.Context(), []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	offset := int64(0)
	checkpoint := func(round int) {
		t.Helper()
		var recs []Record
		for i := range 40 {
			ev := seenEvent(i/2, fmt.Sprintf("new-%d-%d", round, i))
			if i%2 == 0 {
				k := (round*20 + i/2) % 200
				ev = seenEvent(k, fmt.Sprintf("seen-%d", k))
			}
			recs = append(recs, Record{Partition: 0, Offset: offset, Event: ev})
			offset++
		}
		if decided, err := ck.Checkpoint(t.Context(), recs, []txsink.PartitionCut{{Partition: 0, Epoch: pos[0].Epoch, NextOffset: offset}}); !decided || err != nil {
			t.Fatalf("checkpoint %d: decided %v, %v", round, decided, err)
		}
	}
	checkpoint(0) // the branches take their connections

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { Janitor(ctx, d.Stores(), time.Now, time.Hour, 5, branches, testenv.Logger()) })
	// busiest: the most cleanup connections in use at once; during: the
	// same over the checkpoints' rounds only (sampled, so a worker between
	// two statements is not mistaken for a janitor that finished).
	var busiest, during atomic.Int64
	var measuring atomic.Bool
	wg.Go(func() {
		for ctx.Err() == nil {
			in := int64(cleanup.Stats().InUse)
			busiest.Store(max(busiest.Load(), in))
			if measuring.Load() {
				during.Store(max(during.Load(), in))
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	testenv.Eventually(t, 30*time.Second, "the janitor's workers busy", func() (bool, string) {
		return busiest.Load() >= branches, fmt.Sprint(busiest.Load())
	})
	waits := main.Stats().WaitCount
	measuring.Store(true)
	for round := 1; round <= 10; round++ {
		checkpoint(round)
	}
	measuring.Store(false)
	var left int
	if err := e.db.Get(&left, `SELECT COUNT(*) FROM dedup_keys WHERE event_id LIKE 'old-%'`); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the checkpoints: %d of %d expired keys left, at most %d cleanup connections in use during them", left, keys, during.Load())
	if left == 0 || during.Load() < branches/2 {
		t.Fatalf("the janitor was not busy all along the checkpoints (%d expired keys left, at most %d cleanup connections in use during them): the backlog is too small to tell", left, during.Load())
	}
	if n := main.Stats().WaitCount - waits; n != 0 {
		t.Errorf("%d requests for a connection of the checkpoints' pool waited while the janitor ran", n)
	}
	if b := busiest.Load(); b > branches+1 {
		t.Errorf("cleanup held %d connections, over its share of %d", b, branches+1)
	}
	if d := ck.Stats().Duplicates.Load(); d != 11*20 {
		t.Errorf("%d duplicates dropped, want 220: the lookups did not run", d)
	}
}

// seedJanitorBacklog stores keys expired dedup keys in journal rows of 50
// (the janitor's backlog, deleted 5 per statement in
// TestCleanupNeverTakesACheckpointsConnection) and 200 live keys that the
// test's records repeat: each claim meets a stored key, and its ids are
// looked up on the pool.
func seedJanitorBacklog(t *testing.T, e *env, keys int) {
	t.Helper()
	now := time.Now().UTC()
	const perRow = 50
	for lo := 0; lo < keys; lo += 2000 {
		var args []any
		var rows []any
		var blob []byte
		for i := lo; i < lo+2000; i++ {
			id := fmt.Sprintf("old-%07d", i)
			args = append(args, id, make([]byte, 16), now.Add(-time.Minute))
			blob = append(append(blob, byte(len(id))), id...)
			if (i+1)%perRow == 0 {
				rows = append(rows, now.Add(-time.Minute), blob)
				blob = nil
			}
		}
		e.db.MustExec(`INSERT INTO dedup_keys (event_id, fingerprint, expires_at) VALUES `+strings.TrimSuffix(strings.Repeat("(?,?,?),", 2000), ","), args...)
		e.db.MustExec(`INSERT INTO dedup_expiry (expires_at, event_ids) VALUES `+strings.TrimSuffix(strings.Repeat("(?,?),", len(rows)/2), ","), rows...)
	}
	var stored []any
	for k := range 200 {
		fp := seenEvent(k, fmt.Sprintf("seen-%d", k)).Fingerprint()
		stored = append(stored, fmt.Sprintf("seen-%d", k), fp[:], now.Add(time.Hour))
	}
	e.db.MustExec(`INSERT INTO dedup_keys (event_id, fingerprint, expires_at) VALUES `+strings.TrimSuffix(strings.Repeat("(?,?,?),", 200), ","), stored...)
}

// seenEvent is the event of id that TestCleanupNeverTakesACheckpointsConnection
// sends as the k-th of its kind (its account depends on k).
func seenEvent(k int, id string) event.Event {
	return event.Event{EventID: id, AccountID: fmt.Sprintf("acct-%d", k%9), AmountMinor: 1, Currency: "EUR", OccurredAt: ts(t0)}
}
