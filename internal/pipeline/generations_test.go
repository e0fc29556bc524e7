package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/ledgerclock"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// The dedup keys' generations in the pipeline (issue 21), over the
// in-memory driver on a clock the tests move: repeats across a rotation,
// a rotation during a checkpoint, and the upkeep over many rotations.

// fakeClock is the control server's clock, and every instance's (the
// ledger's clock is the server's, package ledgerclock).
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

var genBase = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// genLedger is a memLedger on the fake clock with the dedup cache off (the
// tables are the arbiter, as for a repeat that reaches another instance)
// and a DedupTTL of ttl.
func genLedger(t *testing.T, clk *fakeClock, ttl time.Duration, fps *failpoint.Set) *memLedger {
	return newMemLedgerOn(t, 1, 2, memdriver.Options{AttachPrepared: true, LockWait: time.Second, Now: clk.Now}, fps, func(c *Config) {
		c.DedupTTL, c.DedupCacheKeys = ttl, 0
	})
}

// keep runs the upkeep until it has nothing left to do.
func (m *memLedger) keep(t *testing.T) {
	t.Helper()
	for i := 0; keepStep(context.Background(), m.sink, m.ck.pools, testenv.Logger()); i++ {
		if i > 10 {
			t.Fatal("the upkeep does not settle")
		}
	}
}

func (m *memLedger) generations(t *testing.T) driver.KeyGenerations {
	t.Helper()
	s, err := m.sink.KeyGenerations(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A repeat that comes after a rotation, just inside the TTL, is found in
// the earlier generation by the claim's locking read and dropped; the key
// the claim inserted into the current generation is taken back (a repeat
// does not extend the TTL). The earlier table is emptied once its keys
// expired, and the next generation then fills and reads in turn.
func TestRepeatAcrossARotationIsDropped(t *testing.T) {
	const ttl = time.Hour
	clk := &fakeClock{now: genBase}
	m := genLedger(t, clk, ttl, nil)
	m.servers[0].SetKeyGenerations(driver.KeyGenerations{Since: genBase.Add(-30 * time.Minute), Emptied: -1})
	if ok, err := m.checkpoint(t, event1("e1", "acct", 5, 0, 0)); !ok || err != nil {
		t.Fatalf("first arrival: %v %v", ok, err)
	}
	lifetime := ttl + ledgerclock.Margin
	clk.set(genBase.Add(30*time.Minute + lifetime - ttl + time.Second))
	m.keep(t)
	if s := m.generations(t); s.Current != 1 {
		t.Fatalf("generation %d after a lifetime, want 1 (%+v)", s.Current, s)
	}
	clk.set(genBase.Add(ttl - time.Second)) // just inside e1's TTL
	if ok, err := m.checkpoint(t, event1("e1", "acct", 5, 0, 0), event1("e2", "acct", 7, 0, 0)); !ok || err != nil {
		t.Fatalf("the repeat: %v %v", ok, err)
	}
	if b := m.balance("acct"); b.Count != 2 || b.Amount != 12 {
		t.Fatalf("balance %+v, want e1 and e2 once each", b)
	}
	tb := m.tables()
	if !slices.Equal(idsOf(tb.Keys[0]), []string{"e1"}) || !slices.Equal(idsOf(tb.Keys[1]), []string{"e2"}) {
		t.Fatalf("keys by table: %v %v %v, want e1 in generation 0's only, e2 in generation 1's", idsOf(tb.Keys[0]), idsOf(tb.Keys[1]), idsOf(tb.Keys[2]))
	}
	s := m.generations(t)
	clk.set(s.Since.Add(s.Lifetime + ledgerclock.Margin))
	m.keep(t)
	if s := m.generations(t); s.Current != 2 || s.Emptied != 0 {
		t.Fatalf("after a second lifetime: %+v, want generation 2 with generation 0's table emptied", s)
	}
	if n := len(m.tables().Keys[0]); n != 0 {
		t.Fatalf("%d keys left in generation 0's table", n)
	}
	clk.set(genBase.Add(2*ttl - 2*time.Second)) // inside e2's TTL
	if ok, err := m.checkpoint(t, event1("e2", "acct", 7, 0, 0)); !ok || err != nil {
		t.Fatalf("e2's repeat: %v %v", ok, err)
	}
	if b := m.balance("acct"); b.Count != 2 || m.ck.Stats().Duplicates.Load() != 2 {
		t.Fatalf("balance %+v, %d duplicates: want e2's repeat dropped from generation 1", b, m.ck.Stats().Duplicates.Load())
	}
}

func idsOf(ks []driver.DedupKey) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.ID
	}
	return out
}

// A rotation between a checkpoint's claims and its decision: the decision
// is refused (the keys were claimed under the generation left, whose
// expiry bound no longer covers them) and the checkpoint is retried at
// once under the new generation, which reads the old one: every event
// counts once, and its key is in the new generation's table.
func TestRotationDuringACheckpointIsRetried(t *testing.T) {
	clk := &fakeClock{now: genBase}
	slow, err := failpoint.Parse("after-prepare=sleep:300ms@2") // the second checkpoint's decision
	if err != nil {
		t.Fatal(err)
	}
	m := genLedger(t, clk, time.Hour, slow)
	if ok, err := m.checkpoint(t, event1("first", "acct", 1, 0, 0)); !ok || err != nil {
		t.Fatalf("first checkpoint: %v %v", ok, err)
	}
	rotated := make(chan error, 1)
	go func() {
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			for _, b := range m.servers[0].Branches() {
				if len(b) > 0 && contains(b, "prepared") {
					ok, err := m.sink.RotateKeys(context.Background(), 0)
					if err == nil && !ok {
						err = errors.New("rotation refused")
					}
					rotated <- err
					return
				}
			}
			time.Sleep(time.Millisecond)
		}
		rotated <- errors.New("no prepared branch seen")
	}()
	ok, err := m.checkpoint(t, event1("during", "acct", 2, 0, 0), event1("first", "acct", 1, 0, 0))
	if rerr := <-rotated; rerr != nil {
		t.Fatal(rerr)
	}
	if !ok || err != nil {
		t.Fatalf("the checkpoint across the rotation: %v %v", ok, err)
	}
	var refused bool
	for _, info := range m.infos {
		refused = refused || errors.Is(info.Err, driver.ErrKeysMoved) && info.Retrying
	}
	if !refused {
		t.Fatalf("no attempt was refused for the rotation: %+v", m.infos)
	}
	if b := m.balance("acct"); b.Count != 2 || b.Amount != 3 {
		t.Fatalf("balance %+v, want each event once", b)
	}
	tb := m.tables()
	if !slices.Equal(idsOf(tb.Keys[0]), []string{"first"}) || !slices.Equal(idsOf(tb.Keys[1]), []string{"during"}) {
		t.Fatalf("keys by table: %v %v, want first in generation 0's, during in generation 1's", idsOf(tb.Keys[0]), idsOf(tb.Keys[1]))
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// Property (exactly once across generations, generated): events and their
// repeats (each repeat within the TTL of its first arrival, on the
// ledger's clock) arrive in random checkpoints while the clock moves by
// random steps and the upkeep runs between checkpoints, through many
// rotations and emptied tables: every event counts once, and the tables
// hold at most the keys of about two lifetimes.
func TestExactlyOnceAcrossGenerations(t *testing.T) {
	for seed := range uint64(5) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			const ttl = 10 * time.Minute
			r := rand.New(rand.NewPCG(seed, 7))
			clk := &fakeClock{now: genBase}
			m := genLedger(t, clk, ttl, nil)
			type pending struct {
				id    string
				first time.Time
			}
			var open []pending
			counted, distinct := int64(0), 0
			maxKeys := 0
			for step := 0; step < 400; step++ {
				clk.set(clk.Now().Add(time.Duration(r.Int64N(int64(ttl / 8)))))
				m.keep(t)
				now := clk.Now()
				var recs []Record
				for range 1 + r.IntN(5) {
					id := fmt.Sprintf("ev-%d-%d", seed, distinct)
					distinct++
					recs = append(recs, event1(id, "acct", 1, int32(r.IntN(3)), 0))
					open = append(open, pending{id, now})
				}
				var keep []pending
				for _, p := range open {
					// Repeats only while comfortably inside the TTL.
					if now.Sub(p.first) < ttl-time.Second {
						keep = append(keep, p)
						if r.IntN(3) == 0 {
							recs = append(recs, event1(p.id, "acct", 1, int32(r.IntN(3)), 0))
						}
					}
				}
				open = keep
				r.Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
				if ok, err := m.checkpoint(t, recs...); !ok || err != nil {
					t.Fatalf("step %d: %v %v", step, ok, err)
				}
				tb := m.tables()
				maxKeys = max(maxKeys, len(tb.Keys[0])+len(tb.Keys[1])+len(tb.Keys[2]))
			}
			counted = m.balance("acct").Count
			if counted != int64(distinct) {
				t.Fatalf("%d events counted, want %d (each once)", counted, distinct)
			}
			s := m.generations(t)
			if s.Current < 5 {
				t.Fatalf("only %d rotations", s.Current)
			}
			// At most 5 events per step, steps of ttl/16 on average: about
			// 80 events per TTL; the tables hold two lifetimes and a step.
			if maxKeys > 400 {
				t.Fatalf("the tables held up to %d keys", maxKeys)
			}
		})
	}
}

// A table a prepared branch holds is not emptied under it: the upkeep's
// step fails (logged, tried again), no rotation takes the table meanwhile,
// and once the branch is resolved the next pass empties it.
func TestUpkeepWaitsForAPreparedBranch(t *testing.T) {
	const ttl = time.Hour
	clk := &fakeClock{now: genBase}
	m := genLedger(t, clk, ttl, nil)
	if ok, err := m.checkpoint(t, event1("a", "acct", 1, 0, 0)); !ok || err != nil {
		t.Fatal(ok, err)
	}
	lifetime := ttl + ledgerclock.Margin
	clk.set(genBase.Add(lifetime + ledgerclock.Margin + time.Millisecond)) // the registered lifetime is rounded up
	m.keep(t)                                                              // generation 1
	if s := m.generations(t); s.Current != 1 {
		t.Fatalf("state %+v, want generation 1", s)
	}
	// A straggler of generation 0 prepared, and never decided.
	ctx := context.Background()
	srv := m.servers[0].As("billing")
	conn, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	x := driver.Xid{Format: 1, Gtrid: "straggler", Bqual: "0"}
	for _, step := range []func() error{
		func() error { return conn.XA(ctx, driver.Start, x) },
		func() error {
			_, err := conn.Store().ClaimKeys(ctx, 0, []driver.DedupKey{{ID: "late", ExpiresAt: genBase}})
			return err
		},
		func() error { return conn.XA(ctx, driver.End, x) },
		func() error { return conn.XA(ctx, driver.Prepare, x) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	s := m.generations(t)
	clk.set(s.Since.Add(2 * (lifetime + ledgerclock.Margin)))
	keepStep(ctx, m.sink, m.ck.pools, testenv.Logger()) // fails to empty, may rotate
	if s2 := m.generations(t); s2.Emptied != -1 || !slices.Contains(idsOf(m.tables().Keys[0]), "a") {
		t.Fatalf("state %+v, table 0 %v: the upkeep emptied a table a prepared branch holds", s2, idsOf(m.tables().Keys[0]))
	}
	m.keep(t) // the rotation to 2 is allowed (it takes table 2); not to 3
	if s2 := m.generations(t); s2.Current != 2 || s2.Emptied != -1 {
		t.Fatalf("state %+v, want generation 2 with nothing emptied", s2)
	}
	if err := conn.XA(ctx, driver.Rollback, x); err != nil {
		t.Fatal(err)
	}
	conn.Close(true)
	m.keep(t)
	if s2 := m.generations(t); s2.Emptied < 0 || len(m.tables().Keys[0]) != 0 {
		t.Fatalf("after the branch ended: %+v, %d keys in table 0", s2, len(m.tables().Keys[0]))
	}
}
