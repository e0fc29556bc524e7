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

// Retention keeps up (issue 18): a backlog of old entries
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
	if err := migrations.Up(context.Background(), db2.DB, testenv.Logger(), nil); err != nil {
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

// Cleanup holds no connection a checkpoint needs, and emptying a
// generation's table never holds up a checkpoint (issues 18 and 21): the
// pool of checkpoints is MYSQL_BRANCHES + 8 connections, 8 of them held by
// the branches between checkpoints. A prepared branch (another
// coordinator's, left in doubt) holds the table of generation 1, whose
// keys have all expired: the upkeep tries to empty it again and again, each
// time holding the generations' state and waiting about a second for the
// table's metadata lock, and gives up. Meanwhile checkpoints claim in the
// current generation, lock-read the one before and look up repeats of
// stored keys, and not one of their requests for a connection waits: the
// upkeep is on the cleanup pool, which never holds more than its
// DefaultCleanupConns. No rotation takes the table meanwhile; once the
// branch is resolved, the next pass empties it.
func TestCleanupNeverTakesACheckpointsConnection(t *testing.T) {
	e := newEnv(t, 1)
	const branches = 8
	sink, d := openSink(t, sinkConfig{DSNs: []string{e.dsn}, Config: txsink.Config{Branches: branches, Group: "g-" + e.topic, Topic: e.topic,
		StepTimeout: 10 * time.Second, Logger: testenv.Logger()}})
	t.Cleanup(func() { sink.Close(); d.Close() })
	main, cleanup := d.Server(0).DB(), d.Server(0).CleanupDB()
	if got := cleanup.Stats().MaxOpenConnections; got != mysqldriver.DefaultCleanupConns {
		t.Fatalf("cleanup pool of %d connections, want %d", got, mysqldriver.DefaultCleanupConns)
	}

	// Generation 3 (dedup_keys' table) current, generation 2 live,
	// generation 1 expired an hour ago and due to be emptied.
	e.db.MustExec(`UPDATE dedup_generations SET current_gen = 3, current_since = UTC_TIMESTAMP(6),
		previous_since = UTC_TIMESTAMP(6) - INTERVAL 2 HOUR, emptied_gen = 0, lifetime_us = 3600000000`)
	now := time.Now().UTC()
	resolve := holdPrepared(t, e.db, "dedup_keys_g1")
	defer resolve()

	// Keys the checkpoints' records repeat: each claim meets a stored key,
	// and its ids are looked up on the pool.
	var stored []any
	for k := range 200 {
		fp := seenEvent(k, fmt.Sprintf("seen-%d", k)).Fingerprint()
		stored = append(stored, fmt.Sprintf("seen-%d", k), fp[:], now.Add(time.Hour))
	}
	e.db.MustExec(`INSERT INTO dedup_keys (event_id, fingerprint, expires_at) VALUES `+strings.TrimSuffix(strings.Repeat("(?,?,?),", 200), ","), stored...)

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
	wg.Go(func() { Keeper(ctx, sink, d.Stores(), 10*time.Millisecond, testenv.Logger()) })
	var busiest atomic.Int64
	wg.Go(func() {
		for ctx.Err() == nil {
			busiest.Store(max(busiest.Load(), int64(cleanup.Stats().InUse)))
			time.Sleep(5 * time.Millisecond)
		}
	})
	testenv.Eventually(t, 30*time.Second, "the upkeep holding the state and emptying", func() (bool, string) {
		return busiest.Load() >= 2, fmt.Sprint(busiest.Load())
	})
	waits := main.Stats().WaitCount
	for round := 1; round <= 10; round++ {
		checkpoint(round)
	}
	if n := main.Stats().WaitCount - waits; n != 0 {
		t.Errorf("%d requests for a connection of the checkpoints' pool waited while the upkeep ran", n)
	}
	if b := busiest.Load(); b > mysqldriver.DefaultCleanupConns {
		t.Errorf("cleanup held %d connections, over its share of %d", b, mysqldriver.DefaultCleanupConns)
	}
	if d := ck.Stats().Duplicates.Load(); d != 11*20 {
		t.Errorf("%d duplicates dropped, want 220: the lookups did not run", d)
	}
	s, err := sink.KeyGenerations(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if s.Emptied != 0 || s.Current != 3 {
		t.Fatalf("while a prepared branch held generation 1's table: state %+v, want it unchanged (current 3, emptied 0)", s)
	}
	resolve()
	testenv.Eventually(t, 30*time.Second, "generation 1 emptied once the branch was resolved", func() (bool, string) {
		s, err := sink.KeyGenerations(t.Context())
		return err == nil && s.Emptied >= 1, fmt.Sprintf("%+v %v", s, err)
	})
}

// holdPrepared leaves a prepared XA branch that wrote a row to table, as
// another coordinator in doubt would; resolve rolls it back (once).
func holdPrepared(t *testing.T, db *sqlx.DB, table string) (resolve func()) {
	t.Helper()
	held, err := db.Connx(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	xid := "'" + testenv.RandomName("held-") + "'" // XA ids are the server's, not the database's
	for _, q := range []string{`XA START ` + xid, `INSERT INTO ` + table + ` (event_id, fingerprint, expires_at) VALUES ('held', REPEAT('x', 16), UTC_TIMESTAMP(6))`,
		`XA END ` + xid, `XA PREPARE ` + xid} {
		if _, err := held.ExecContext(t.Context(), q); err != nil {
			_ = held.Close()
			t.Fatal(err)
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if _, err := held.ExecContext(context.Background(), `XA ROLLBACK `+xid); err != nil {
				t.Error(err)
			}
			_ = held.Close()
		})
	}
}

// seenEvent is the event of id that TestCleanupNeverTakesACheckpointsConnection
// sends as the k-th of its kind (its account depends on k).
func seenEvent(k int, id string) event.Event {
	return event.Event{EventID: id, AccountID: fmt.Sprintf("acct-%d", k%9), AmountMinor: 1, Currency: "EUR", OccurredAt: ts(t0)}
}
