package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"github.com/billing/ledger/internal/config"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/deadletters"
	"github.com/billing/ledger/internal/reinject"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// lettersLedger is a ledger of two in-memory servers with dead letters:
// two on the control server, one on the shard, created a minute apart in
// the order c1, s1, c2.
func lettersLedger(t *testing.T, at time.Time) []*memdriver.Cluster {
	t.Helper()
	c, s := memdriver.New(memdriver.Options{}), memdriver.New(memdriver.Options{})
	seed := func(cl *memdriver.Cluster, offset int64, event, reason string, age time.Duration) {
		v := []byte(`{"event_id":"` + event + `"}`)
		cl.SeedDeadLetter("billing-events", "ck", driver.DeadLetter{Partition: 2, Offset: offset, Reason: reason, EventID: event,
			Key: []byte("acct-1"), Payload: v, Size: len(v), SHA256: sha256.Sum256(v)}, at.Add(-age))
	}
	seed(c, 10, "c1", "invalid_json", 3*time.Minute)
	seed(s, 11, "s1", "missing_field", 2*time.Minute)
	seed(c, 12, "c2", "invalid_json", time.Minute)
	return []*memdriver.Cluster{c, s}
}

// deadletters list: the letters of every server, newest first, named by
// server and id; --reason and --pending filter, --limit cuts and says so.
func TestDeadLettersListOnEveryServer(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)
	ls := lettersLedger(t, at)
	servers := []letterLister{ls[0].As("billing").Letters(), ls[1].As("billing").Letters()}
	list := func(reason string, limit int, pending bool) []string {
		var out bytes.Buffer
		if err := printDeadLetters(ctx, servers, reason, limit, pending, &out); err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSpace(out.String()), "\n")
	}
	ids := func(lines []string) []string {
		var out []string
		for _, l := range lines[1:] {
			if f := strings.Fields(l); len(f) > 0 && !strings.HasPrefix(l, "(") {
				out = append(out, f[0]+" "+f[4])
			}
		}
		return out
	}
	if got, want := strings.Join(ids(list("", 50, false)), ", "), "2 c2, 1:1 s1, 1 c1"; got != want {
		t.Errorf("list = %s, want %s", got, want)
	}
	if got, want := strings.Join(ids(list("invalid_json", 50, false)), ", "), "2 c2, 1 c1"; got != want {
		t.Errorf("list --reason invalid_json = %s, want %s", got, want)
	}
	lines := list("", 2, false)
	if got, want := strings.Join(ids(lines), ", "), "2 c2, 1:1 s1"; got != want || !strings.Contains(lines[len(lines)-1], "first 2") {
		t.Errorf("list --limit 2 = %q, want %s and the note that more may exist", lines, want)
	}
	// Re-injected: left out of --pending, shown with its instant.
	l := servers[0].(memdriver.Letters)
	r, err := l.Get(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := l.Mark(ctx, r, deadletters.Audit{At: at, By: "ops"}); err != nil || !ok {
		t.Fatalf("mark: %v %v", ok, err)
	}
	if got, want := strings.Join(ids(list("", 50, true)), ", "), "1:1 s1, 1 c1"; got != want {
		t.Errorf("list --pending = %s, want %s", got, want)
	}
	if all := list("", 50, false); !strings.Contains(all[1], "2026-11-29T13:00:00Z") {
		t.Errorf("a re-injected letter's line %q does not show when", all[1])
	}
}

// deadletters show: one letter whole, with its re-injection audit and its
// payload, found on its server.
func TestDeadLettersShowOneLetter(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)
	ls := lettersLedger(t, at)
	servers := []reinject.Server{{Letters: ls[0].As("billing").Letters()}, {Letters: ls[1].As("billing").Letters()}}
	l := servers[1].Letters
	r, err := l.Get(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := l.Mark(ctx, r, deadletters.Audit{At: at, By: "ops@host", Forced: true}); err != nil || !ok {
		t.Fatalf("mark: %v %v", ok, err)
	}
	if err := l.Landed(ctx, 1, at, 2, 99); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := printDeadLetter(ctx, config.Config{}, servers, reinject.ID{Server: 1, N: 1}, 1024, "", &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"id:", "1:1", "billing-events/2/11", "missing_field", "event_id:", "s1", "acct-1",
		"2026-11-29T13:00:00Z by ops@host (forced) to billing-events/2/99", `{"event_id":"s1"}`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("show lacks %q:\n%s", want, out.String())
		}
	}
	if err := printDeadLetter(ctx, config.Config{}, servers, reinject.ID{Server: 0, N: 7}, 1024, "", &out); err == nil || !strings.Contains(err.Error(), "no dead letter 7") {
		t.Errorf("show of no letter: %v", err)
	}
}
