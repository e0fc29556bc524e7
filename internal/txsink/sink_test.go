package txsink

import (
	"context"
	"testing"
	"time"

	"github.com/billing/ledger/internal/testenv"

	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

func memSink(t *testing.T, c *memdriver.Cluster, now func() time.Time) *Sink {
	t.Helper()
	s, err := New(context.Background(), Config{Branches: 1, Group: "g", Topic: "t", StepTimeout: time.Second, Now: now,
		Logger: testenv.Logger()}, c.As("billing"), []driver.Server{c.As("billing")})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Decision rows are pruned only when old, and only once no branch of their
// checkpoint is in doubt anywhere: with a server unreachable, not at all.
func TestPruneDecisionsKeepsInDoubt(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	c := memdriver.New(memdriver.Options{Now: func() time.Time { return now }})
	s := memSink(t, c, func() time.Time { return now })
	for _, g := range []string{"blg1-aa-1-1", "blg1-aa-2-1", "blg1-aa-3-1"} {
		if _, err := s.decide(ctx, g, driver.Aborted); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(time.Hour)
	if _, err := s.decide(ctx, "blg1-aa-4-1", driver.Committed); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PruneDecisions(ctx, time.Minute, map[string]bool{"?server0": true}, 100); err == nil {
		t.Fatal("pruned with an unreachable server")
	}
	n, err := s.PruneDecisions(ctx, time.Minute, map[string]bool{"blg1-aa-2-1": true}, 100)
	if err != nil || n != 2 {
		t.Fatalf("pruned %d, %v; want the 2 old ones not in doubt", n, err)
	}
	left := c.Decisions()
	if _, ok := left["blg1-aa-2-1"]; !ok || len(left) != 2 {
		t.Fatalf("decisions left: %v; want the one in doubt and the young one", left)
	}
}
