package pipeline

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/ledgerclock"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Clock skew between instances (issue 18, item 5). Every age and expiry
// that one instance writes and another judges is on the ledger's clock
// (package ledgerclock), whatever the hosts' clocks say. Each test skews
// the host clock of two instances in opposite directions; a control case
// runs the same on the hosts' own clocks and shows that the skew would
// otherwise do the damage.

// hostClock is a host whose clock is skew off the true time (monotonic
// readings kept, as a host's would be).
func hostClock(skew time.Duration) func() time.Time {
	return func() time.Time { return time.Now().Add(skew) }
}

// openSkewed opens a sink for an instance on a host whose clock is skew
// off. The instance judges time by the ledger's clock, measured against
// the control server once the sink is open, as the service does; or, for
// the control case, by the host's own clock. It returns the clock.
func openSkewed(t *testing.T, e *env, skew time.Duration, ledger bool, branches int, fps *failpoint.Set) (*txsink.Sink, *mysqldriver.Driver, func() time.Time) {
	t.Helper()
	now := hostClock(skew)
	var clk *ledgerclock.Clock
	if ledger {
		clk = ledgerclock.New(now)
		now = clk.Now
	}
	sink, d := openSink(t, sinkConfig{DSNs: []string{e.dsn}, Config: txsink.Config{Branches: branches, Group: "g-" + e.topic, Topic: e.topic,
		StepTimeout: 10 * time.Second, Logger: testenv.Logger(), Failpoints: fps, Now: now}})
	t.Cleanup(func() { sink.Close(); d.Close() })
	if clk != nil {
		if err := clk.Sync(context.Background(), d.Server(0)); err != nil {
			t.Fatal(err)
		}
	}
	return sink, d, now
}

// A repeat that arrives just inside DEDUP_TTL on an instance whose clock is
// behind is still dropped, while the upkeep of the dedup keys' generations
// (Keeper) of an instance whose clock is ahead runs all along, and rotates
// and empties tables meanwhile: the state says generation 0 has been
// current for longer than a lifetime, so the first claim's registration of
// the lifetime makes a rotation due at once, and the table the key went to
// is emptied as soon as the rules allow. The upkeep judges by the control
// server's clock only (the state's Now and Since), so neither the ledger's
// clock nor the hosts' skewed ones make it forget the key early: both
// cases count the event once. (Before generations, the hosts' clocks case
// counted twice: a janitor whose clock was ahead deleted the key as soon as
// it was written.) The cache is off, as for a repeat that lands on another
// instance: MySQL is the arbiter.
func TestRepeatInsideTheTTLSurvivesAnUpkeepWhoseClockIsAhead(t *testing.T) {
	const skew, ttl = 3 * time.Second, 4 * time.Second
	for _, tc := range []struct {
		name         string
		ledger       bool
		countedTwice bool
	}{{"ledger clock", true, false}, {"hosts' clocks", false, false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 1)
			ctx := context.Background()
			if _, err := e.db.ExecContext(ctx, `UPDATE dedup_generations SET current_since = UTC_TIMESTAMP(6) - INTERVAL 10 SECOND`); err != nil {
				t.Fatal(err)
			}
			behindSink, behindDB, behind := openSkewed(t, e, -skew, tc.ledger, 2, nil)
			cfg := testConfig(e)
			cfg.DedupTTL, cfg.DedupCacheKeys, cfg.Clock = ttl, 0, behind
			c, err := NewCheckpointer(cfg, behindSink, behindDB.Stores())
			if err != nil {
				t.Fatal(err)
			}
			pos, err := behindSink.Claim(ctx, []int32{0})
			if err != nil {
				t.Fatal(err)
			}

			// The other instance: only its upkeep matters here.
			aheadSink, aheadDB, _ := openSkewed(t, e, skew, tc.ledger, 1, nil)
			jctx, stop := context.WithCancel(ctx)
			keeperDone := make(chan struct{})
			go func() {
				defer close(keeperDone)
				Keeper(jctx, aheadSink, aheadDB.Stores(), 50*time.Millisecond, testenv.Logger())
			}()
			t.Cleanup(func() { stop(); <-keeperDone })

			rec := func(offset int64) Record {
				return Record{Partition: 0, Offset: offset, Event: event.Event{EventID: "skewed-1", AccountID: "acct-k", AmountMinor: 5, Currency: "EUR", OccurredAt: ts(t0)}}
			}
			cut := func(next int64) []txsink.PartitionCut {
				return []txsink.PartitionCut{{Partition: 0, Epoch: pos[0].Epoch, NextOffset: next}}
			}
			first := time.Now()
			// The rotation that the first claim's registration makes due
			// may come between its claim and its decision: refused, and
			// retried at once by the checkpointer.
			ok, err := c.Checkpoint(ctx, []Record{rec(0)}, cut(1))
			if !ok || err != nil {
				t.Fatalf("first arrival: %v %v", ok, err)
			}
			time.Sleep(time.Until(first.Add(ttl - 250*time.Millisecond))) // just inside the TTL
			if ok, err := c.Checkpoint(ctx, []Record{rec(1)}, cut(2)); !ok || err != nil {
				t.Fatalf("the repeat: %v %v", ok, err)
			}
			if since := time.Since(first); since >= ttl {
				t.Fatalf("the repeat came %v after the first arrival, not inside the TTL of %v: the machine is too slow for this test", since, ttl)
			}
			b := balances(t, e.db)["acct-k/EUR"]
			if twice := b.Count == 2; twice != tc.countedTwice {
				t.Fatalf("the event counted %d times (duplicates dropped: %d)", b.Count, c.Stats().Duplicates.Load())
			}
			var current int64
			if err := e.db.Get(&current, `SELECT current_gen FROM dedup_generations`); err != nil || current < 1 {
				t.Fatalf("generation %d (%v): no rotation happened during the test, which then proves nothing", current, err)
			}
		})
	}
}

// A checkpoint of an instance whose clock is behind, slow between its
// prepare and its decision but well within CHECKPOINT_TIMEOUT, is not
// aborted by the recovery of an instance whose clock is ahead. On the
// hosts' clocks its branches look older than CHECKPOINT_TIMEOUT from the
// start (the gtrid carries the coordinator's clock), the recoverer decides
// abort, and the coordinator's decision is refused.
func TestHealthyCheckpointSurvivesARecovererWhoseClockIsAhead(t *testing.T) {
	const skew, timeout = 2 * time.Second, 4 * time.Second
	for _, tc := range []struct {
		name    string
		ledger  bool
		aborted bool
	}{{"ledger clock", true, false}, {"hosts' clocks (control)", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 1)
			ctx := context.Background()
			slow, err := failpoint.Parse("after-prepare=sleep:1500ms@1")
			if err != nil {
				t.Fatal(err)
			}
			sink, d, behind := openSkewed(t, e, -skew, tc.ledger, 2, slow)
			cfg := testConfig(e)
			cfg.CheckpointTimeout, cfg.Clock = timeout, behind
			c, err := NewCheckpointer(cfg, sink, d.Stores())
			if err != nil {
				t.Fatal(err)
			}
			pos, err := sink.Claim(ctx, []int32{0})
			if err != nil {
				t.Fatal(err)
			}

			recoverer, _, _ := openSkewed(t, e, skew, tc.ledger, 1, nil)
			rcfg := cfg // the recoverer's settings are the same
			rctx, stop := context.WithCancel(ctx)
			aborts := make(chan int, 1)
			go func() {
				n := 0
				defer func() { aborts <- n }()
				for rctx.Err() == nil {
					res, _ := recoverer.Recover(rctx, rcfg.abortAfter())
					n += res.RolledBack
					time.Sleep(20 * time.Millisecond)
				}
			}()

			rec := Record{Partition: 0, Offset: 0, Event: event.Event{EventID: "slow-1", AccountID: "acct-s", AmountMinor: 5, Currency: "EUR", OccurredAt: ts(t0)}}
			decided, err := c.Checkpoint(ctx, []Record{rec}, []txsink.PartitionCut{{Partition: 0, Epoch: pos[0].Epoch, NextOffset: 1}})
			stop()
			<-aborts
			if tc.aborted {
				if decided || !errors.Is(err, txsink.ErrAborted) {
					t.Fatalf("control: the checkpoint was not aborted by the recoverer (decided %v, %v): the skew did nothing", decided, err)
				}
				return
			}
			if !decided || err != nil {
				t.Fatalf("the healthy checkpoint: decided %v, %v", decided, err)
			}
			if n := c.Stats().Aborts.Load(); n != 0 {
				t.Fatalf("%d attempts aborted", n)
			}
			if b := balances(t, e.db)["acct-s/EUR"]; b.Count != 1 {
				t.Fatalf("balance %+v, want the event once", b)
			}
		})
	}
}
