package pipeline

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
	"github.com/billing/ledger/migrations"
)

// Guarantee 3 (overflow): an event whose addition would overflow a 64-bit
// sum becomes an amount_overflow dead letter, whether the overflow shows in
// the checkpoint's own sums or only against the stored value (which only
// the database would notice), and it never blocks the partition.
func TestOverflowIsDeadLettered(t *testing.T) {
	e := newEnv(t, 1)
	in := start(t, e, nil)
	produce(t, e, ev{"big", "acct-o", math.MaxInt64, "EUR", t0}.record(""))
	waitCounted(t, e.db, 1, 0)
	// Only the server can see this one: the checkpoint adds +1 to a stored
	// maximum, the upsert fails with 1690, and the careful retry refuses
	// exactly that event.
	produce(t, e, ev{"plus-one", "acct-o", 1, "EUR", t0}.record(""))
	waitCounted(t, e.db, 1, 1)
	if in.p.Stats().Aborts.Load() == 0 {
		t.Error("the server-detected overflow did not go through a refused fast attempt")
	}
	// +1 then -1: the net sum fits, but +1 alone would overflow: refused
	// per event, -1 counts.
	produce(t, e,
		ev{"plus-two", "acct-o", 1, "EUR", t0}.record(""),
		ev{"minus-one", "acct-o", -1, "EUR", t0}.record(""),
	)
	waitCounted(t, e.db, 2, 2)
	// Inside one checkpoint: the in-memory sums overflow.
	produce(t, e,
		ev{"x1", "acct-p", math.MaxInt64, "USD", t0}.record(""),
		ev{"x2", "acct-p", 5, "USD", t0}.record(""),
		ev{"x3", "acct-p", -5, "USD", t0}.record(""),
	)
	waitCounted(t, e.db, 4, 3)
	got := balances(t, e.db)
	if b := got["acct-o/EUR"]; b.Amount != math.MaxInt64-1 || b.Count != 2 {
		t.Errorf("acct-o = %+v", b)
	}
	if b := got["acct-p/USD"]; b.Amount != math.MaxInt64-5 || b.Count != 2 {
		t.Errorf("acct-p = %+v", b)
	}
	var ids []string
	if err := e.db.Select(&ids, `SELECT event_id FROM dead_letters WHERE reason = 'amount_overflow' ORDER BY event_id`); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ids) != "[plus-one plus-two x2]" {
		t.Errorf("overflow dead letters = %v", ids)
	}
	// A dead-lettered event is not remembered as seen: sent again (after
	// the balance went down), it counts.
	produce(t, e, ev{"plus-one", "acct-o", 1, "EUR", t0}.record(""))
	waitCounted(t, e.db, 5, 3)
}

// Guarantee 5 (several participants on several servers): accounts and event
// ids are placed by hash on two MySQL "servers" (two databases here); every
// account lives on exactly one, totals are exact, and a repeat routed by its
// event id is caught wherever its account lives.
func TestShardedOverTwoServers(t *testing.T) {
	e := newEnv(t, 3)
	second := testenv.NewDatabase(t)
	db2, err := mysqldriver.OpenDB(second, 5*time.Second, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	if err := migrations.Up(context.Background(), db2.DB, testenv.Logger(), nil); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	want := map[string]int64{}
	for i := range 400 {
		acct := fmt.Sprintf("acct-%d", i%37)
		x := ev{fmt.Sprintf("s-%d", i), acct, int64(i), "EUR", t0}
		recs = append(recs, x.record(""))
		want[acct] += int64(i)
		if i%4 == 0 { // the same event again, with another key
			recs = append(recs, x.record(fmt.Sprintf("k-%d", i)))
		}
	}
	produce(t, e, recs...)
	start(t, e, func(c *Config, s *sinkConfig) {
		s.DSNs = []string{e.dsn, second}
		s.Branches = 2
	})
	deadline := time.Now().Add(60 * time.Second)
	var n1, n2 int64
	for time.Now().Before(deadline) {
		_ = e.db.Get(&n1, `SELECT COALESCE(SUM(event_count),0) FROM account_balances`)
		_ = db2.Get(&n2, `SELECT COALESCE(SUM(event_count),0) FROM account_balances`)
		if n1+n2 >= 400 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	b1, b2 := balances(t, e.db), balances(t, db2)
	if len(b1) == 0 || len(b2) == 0 {
		t.Fatalf("accounts not spread: %d and %d", len(b1), len(b2))
	}
	for acct, sum := range want {
		x, in1 := b1[acct+"/EUR"]
		y, in2 := b2[acct+"/EUR"]
		if in1 == in2 {
			t.Fatalf("%s on both or neither server", acct)
		}
		got := x
		if in2 {
			got = y
		}
		if got.Amount != sum {
			t.Errorf("%s = %d, want %d", acct, got.Amount, sum)
		}
	}
	var k1, k2 int64
	_ = e.db.Get(&k1, `SELECT COUNT(*) FROM dedup_keys`)
	_ = db2.Get(&k2, `SELECT COUNT(*) FROM dedup_keys`)
	if k1+k2 != 400 || k1 == 0 || k2 == 0 {
		t.Fatalf("dedup keys %d + %d, want 400 spread over both", k1, k2)
	}
}

// Guarantee 2 (TTL): a repeat within DEDUP_TTL is dropped; after the TTL the
// key is forgotten, deleted from MySQL by the cleanup, and a repeat counts
// again.
func TestDedupKeysExpire(t *testing.T) {
	e := newEnv(t, 1)
	start(t, e, func(c *Config, _ *sinkConfig) {
		c.DedupTTL = 2 * time.Second
		c.DedupCleanupInterval = 200 * time.Millisecond
	})
	produce(t, e, ev{"ttl-1", "acct-t", 10, "EUR", t0}.record(""))
	waitCounted(t, e.db, 1, 0)
	produce(t, e, ev{"ttl-1", "acct-t", 10, "EUR", t0}.record(""))
	time.Sleep(500 * time.Millisecond)
	waitCounted(t, e.db, 1, 0)
	deadline := time.Now().Add(20 * time.Second)
	var keys int64 = -1
	for time.Now().Before(deadline) && keys != 0 {
		time.Sleep(200 * time.Millisecond)
		_ = e.db.Get(&keys, `SELECT COUNT(*) FROM dedup_keys`)
	}
	if keys != 0 {
		t.Fatalf("%d expired keys left in MySQL", keys)
	}
	produce(t, e, ev{"ttl-1", "acct-t", 10, "EUR", t0}.record(""))
	waitCounted(t, e.db, 2, 0)
}

// Guarantee 2 across the migration to generations (issue 21): a ledger
// whose dedup_keys holds keys of the version before generations, with
// their expiry journal (dedup_expiry), is not rebuilt. Those keys stay
// deduplicated until they expire, through rotations (generation 0's table
// is dedup_keys, read by every claim until it is emptied, and it is not
// emptied while a journal row may be live), and are forgotten after: the
// table and its journal are then emptied whole. The state says generation
// 0 has been current for an hour, so rotations are due as soon as the
// first claim registers its lifetime.
func TestKeysOfTheVersionBeforeGenerationsDrainByAge(t *testing.T) {
	e := newEnv(t, 1)
	ctx := t.Context()
	sink, d := openSink(t, sinkConfig{DSNs: []string{e.dsn}, Config: txsink.Config{Branches: 2, Group: "g-" + e.topic,
		Topic: e.topic, StepTimeout: 10 * time.Second, Logger: testenv.Logger()}})
	t.Cleanup(func() { sink.Close(); d.Close() })
	e.db.MustExec(`UPDATE dedup_generations SET current_since = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR`)
	var dbNow time.Time
	if err := e.db.Get(&dbNow, `SELECT UTC_TIMESTAMP(6)`); err != nil {
		t.Fatal(err)
	}
	// As the version before left them: 50 live keys (expiring in 6 s, far
	// beyond the TTL below and two rotations) and their journal row.
	const old = 50
	oldExpiry := dbNow.Add(6 * time.Second)
	var blob []byte
	tx := e.db.MustBegin()
	for k := range old {
		id := fmt.Sprintf("old-%d", k)
		fp := seenEvent(k, id).Fingerprint()
		tx.MustExec(`INSERT INTO dedup_keys (event_id, fingerprint, expires_at) VALUES (?, ?, ?)`, id, fp[:], oldExpiry)
		blob = append(append(blob, byte(len(id))), id...)
	}
	tx.MustExec(`INSERT INTO dedup_expiry (expires_at, event_ids) VALUES (?, ?)`, oldExpiry, blob)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	cfg := testConfig(e)
	cfg.DedupTTL, cfg.DedupCacheKeys = time.Second, 0
	ck, err := NewCheckpointer(cfg, sink, d.Stores())
	if err != nil {
		t.Fatal(err)
	}
	pos, err := sink.Claim(ctx, []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	kctx, stop := context.WithCancel(ctx)
	keeperDone := make(chan struct{})
	go func() {
		defer close(keeperDone)
		Keeper(kctx, sink, d.Stores(), 50*time.Millisecond, testenv.Logger())
	}()
	t.Cleanup(func() { stop(); <-keeperDone })

	offset := int64(0)
	counted := func(round string) int64 {
		t.Helper()
		var recs []Record
		for k := range old {
			recs = append(recs, Record{Partition: 0, Offset: offset, Event: seenEvent(k, fmt.Sprintf("old-%d", k))})
			offset++
		}
		before := ck.Stats().Duplicates.Load()
		cut := []txsink.PartitionCut{{Partition: 0, Epoch: pos[0].Epoch, NextOffset: offset}}
		decided, err := ck.Checkpoint(ctx, recs, cut) // a rotation between claim and decision is retried inside
		if !decided || err != nil {
			t.Fatalf("%s: decided %v, %v", round, decided, err)
		}
		return int64(old) - (ck.Stats().Duplicates.Load() - before)
	}
	gens := func() driver.KeyGenerations {
		t.Helper()
		s, err := sink.KeyGenerations(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if n := counted("generation 0"); n != 0 {
		t.Fatalf("under generation 0, %d of %d repeats of the old keys counted", n, old)
	}
	testenv.Eventually(t, 5*time.Second, "two rotations", func() (bool, string) {
		s := gens()
		return s.Current >= 2, fmt.Sprintf("%+v", s)
	})
	if s := gens(); time.Now().Add(time.Second).After(oldExpiry) || s.Emptied >= 0 {
		t.Fatalf("too late to test the old keys while live (state %+v, old keys expire at %v): the machine is too slow for this test", s, oldExpiry)
	}
	if n := counted("generation 2"); n != 0 {
		t.Fatalf("two rotations later, %d of %d repeats of the live old keys counted", n, old)
	}
	testenv.Eventually(t, 20*time.Second, "dedup_keys and its journal emptied once the old keys expired", func() (bool, string) {
		var keys, journal int
		_ = e.db.Get(&keys, `SELECT COUNT(*) FROM dedup_keys`)
		_ = e.db.Get(&journal, `SELECT COUNT(*) FROM dedup_expiry`)
		s := gens()
		return s.Emptied >= 0 && keys == 0 && journal == 0, fmt.Sprintf("state %+v, %d keys, %d journal rows", s, keys, journal)
	})
	var now time.Time
	_ = e.db.Get(&now, `SELECT UTC_TIMESTAMP(6)`)
	if now.Before(oldExpiry) {
		t.Fatalf("dedup_keys emptied at %v, before its old keys expired at %v", now, oldExpiry)
	}
	if n := counted("after expiry"); n != old {
		t.Fatalf("after the old keys expired, %d of %d repeats counted, want all", n, old)
	}
}

// Guarantee 4 (timeout): a checkpoint that cannot finish within
// CHECKPOINT_TIMEOUT aborts; its records are replayed and counted once.
func TestCheckpointTimeoutAborts(t *testing.T) {
	e := newEnv(t, 2)
	fp, err := failpoint.Parse("before-prepare=sleep:2500ms@1")
	if err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 100 {
		recs = append(recs, ev{fmt.Sprintf("to-%d", i), fmt.Sprintf("a-%d", i%7), 1, "EUR", t0}.record(""))
	}
	produce(t, e, recs...)
	in := start(t, e, func(c *Config, s *sinkConfig) {
		c.CheckpointTimeout = 2 * time.Second
		s.Failpoints = fp
	})
	waitCounted(t, e.db, 100, 0)
	if in.p.Stats().Aborts.Load() == 0 {
		t.Fatal("the slow checkpoint was not aborted")
	}
}

// Guarantee 10 (bounded memory): with a cache budget far below the number
// of keys, the cache stays within its budget and repeats from earlier
// checkpoints are still caught, through MySQL.
func TestCacheBudgetBoundsMemory(t *testing.T) {
	e := newEnv(t, 2)
	in := start(t, e, func(c *Config, _ *sinkConfig) { c.DedupCacheKeys = 10 })
	var first, again []*kgo.Record
	for i := range 300 {
		x := ev{fmt.Sprintf("b-%d", i), fmt.Sprintf("a-%d", i%11), 1, "EUR", t0}
		first = append(first, x.record(""))
		again = append(again, x.record("other"))
	}
	produce(t, e, first...)
	waitCounted(t, e.db, 300, 0)
	produce(t, e, again...)
	deadline := time.Now().Add(30 * time.Second)
	for in.p.Stats().Duplicates.Load() < 300 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	waitCounted(t, e.db, 300, 0)
	if d := in.p.Stats().Duplicates.Load(); d != 300 {
		t.Fatalf("duplicates = %d, want 300", d)
	}
	if n := in.p.DedupCacheKeys(); n > 10 {
		t.Fatalf("cache holds %d keys, budget 10", n)
	}
}
