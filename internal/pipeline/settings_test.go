package pipeline

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
)

// An instance whose settings are no longer the ledger's (billing periods
// change ran beside it) stops as soon as it finds out, and checkpoints
// nothing more: after a claim, before anything of the partitions is
// fetched; after the change fenced its partitions, when it claims them
// again (without that check it would commit on the new claim, with its old
// settings); and at the periodic check. Run returns why.
func TestChangedSettingsStopTheInstance(t *testing.T) {
	errChanged := errors.New("the ledger's period settings changed")
	for _, tc := range []struct {
		name     string
		before   bool          // changed before the first claim
		fence    bool          // the change raises the epochs, as billing periods change does
		interval time.Duration // RecoveryInterval: the periodic check
		counted  int64
	}{
		{"at the first claim", true, false, time.Second, 0},
		{"when claiming again after the change fenced it", false, true, time.Minute, 1},
		{"at the periodic check", false, false, time.Second, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 1)
			var changed atomic.Bool
			changed.Store(tc.before)
			cfg := testConfig(e)
			cfg.RecoveryInterval = tc.interval
			cfg.CheckSettings = func(context.Context) error {
				if changed.Load() {
					return errChanged
				}
				return nil
			}
			scfg := sinkConfig{DSNs: []string{e.dsn}}
			scfg.Branches, scfg.Group, scfg.Topic, scfg.StepTimeout, scfg.Logger = 2, cfg.Group, e.topic, 10*time.Second, cfg.Logger
			sink, d := openSink(t, scfg)
			t.Cleanup(func() { sink.Close(); d.Close() })
			p, err := New(cfg, sink, d.Stores())
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- p.Run(ctx) }()
			if !tc.before {
				produce(t, e, ev{"s-1", "acct-s", 1, "EUR", t0}.record(""))
				waitCounted(t, e.db, 1, 0)
				changed.Store(true)
				if tc.fence {
					if _, err := e.db.Exec(`UPDATE partition_offsets SET epoch = epoch + 1`); err != nil {
						t.Fatal(err)
					}
				}
			}
			if tc.before || tc.fence {
				// Its checkpoint must never commit (without a fence the
				// instance goes on until the periodic check: the change
				// fences every partition).
				produce(t, e, ev{"s-2", "acct-s", 1, "EUR", t0}.record(""))
			}
			select {
			case err := <-done:
				if !errors.Is(err, errChanged) {
					t.Fatalf("Run returned %v, want the settings' error", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the instance did not stop")
			}
			var n int64
			if err := e.db.Get(&n, `SELECT COALESCE(SUM(event_count), 0) FROM account_balances`); err != nil || n != tc.counted {
				t.Fatalf("%d events counted (%v), want %d: the instance went on after it found out", n, err, tc.counted)
			}
		})
	}
}

// WINDOW_CLOSE_AFTER may differ between instances: the frontier only
// rises and each checkpoint judges against the stored one, whoever raised
// it, so the instance with the smallest value closes windows for all, and
// one with a larger value counts a late event of a closed window in its
// adjustment, leaving the sealed row as it was.
func TestMixedCloseAfterActsAsTheSmallest(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	open := func(name string, part int32, closeAfter time.Duration) (*Checkpointer, txsink.PartitionCut) {
		sink, d := openSink(t, sinkConfig{DSNs: []string{e.dsn}, Config: txsink.Config{Branches: 1, Group: "g-" + e.topic, Topic: e.topic,
			StepTimeout: 10 * time.Second, Logger: testenv.Logger(), Instance: name}})
		t.Cleanup(func() { sink.Close(); d.Close() })
		cfg := testConfig(e)
		cfg.WindowCloseAfter = closeAfter
		c, err := NewCheckpointer(cfg, sink, d.Stores())
		if err != nil {
			t.Fatal(err)
		}
		pos, err := sink.Claim(ctx, []int32{part})
		if err != nil {
			t.Fatal(err)
		}
		return c, txsink.PartitionCut{Partition: part, Epoch: pos[part].Epoch}
	}
	short, shortCut := open("short", 0, time.Hour)
	long, longCut := open("long", 1, 48*time.Hour)
	rec := func(p int32, off int64, id, at string) Record {
		return Record{Partition: p, Offset: off, Event: event.Event{EventID: id, AccountID: "acct-m", AmountMinor: 1, Currency: "EUR", OccurredAt: ts(at)}}
	}
	checkpoint := func(c *Checkpointer, cut txsink.PartitionCut, recs ...Record) {
		t.Helper()
		cut.NextOffset, cut.CaughtUp = recs[len(recs)-1].Offset+1, true
		if ok, err := c.Checkpoint(ctx, recs, []txsink.PartitionCut{cut}); !ok || err != nil {
			t.Fatalf("checkpoint: %v %v", ok, err)
		}
	}
	checkpoint(long, longCut, rec(1, 0, "m-1", "2026-11-29T10:10:00Z"))
	checkpoint(short, shortCut, rec(0, 0, "m-2", "2026-11-29T12:05:00Z")) // 10:00 closes: 12:05 - 1h
	checkpoint(short, shortCut, rec(0, 1, "m-3", "2026-11-29T12:06:00Z")) // and is sealed
	sealed := windowRows(t, e.db, "billing_windows")["acct-m/EUR@2026-11-29T10:00:00Z"]
	if sealed.Closed == nil {
		t.Fatalf("10:00 not sealed by the instance with the smaller WINDOW_CLOSE_AFTER: %+v", sealed)
	}
	// The instance with 48 hours: by its own value 10:00 is open for two
	// days more, but the ledger's frontier says closed.
	checkpoint(long, longCut, rec(1, 1, "m-4", "2026-11-29T10:20:00Z"))
	if again := windowRows(t, e.db, "billing_windows")["acct-m/EUR@2026-11-29T10:00:00Z"]; again.Amount != sealed.Amount || !again.Updated.Equal(sealed.Updated) {
		t.Fatalf("the sealed row changed: %+v, was %+v", again, sealed)
	}
	if a := windowRows(t, e.db, "window_adjustments")["acct-m/EUR@2026-11-29T10:00:00Z"]; a.Count != 1 {
		t.Fatalf("the late event of the instance with the larger value: adjustment %+v", a)
	}
	checkSplit(t, e.db, false)
}
