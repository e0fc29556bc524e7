package pipeline

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
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
			p, err := New(cfg, sink, Pools(d))
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
