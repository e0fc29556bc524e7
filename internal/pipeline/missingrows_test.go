package pipeline

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// accountOn is an account without a row whose balance routes to
// participant p of m, other than the accounts taken.
func accountOn(m *memLedger, p int, taken ...string) string {
	for i := 100; ; i++ {
		id := fmt.Sprintf("acct-%d", i)
		if m.sink.Route(id) == p && !slices.Contains(taken, id) {
			return id
		}
	}
}

// A key with no row yet, across two servers: A's checkpoint has a risky
// key on K2 (server 1, stored) and adds to K1 (server 0, no row), which
// comes first in the lock order; B's adds to K1 and K2. A's seed takes K1
// first, then K2; B writes K1, then K2. Had A's seed only read K1 (a
// locking read of a missing row locks nothing), B would insert K1, then
// wait for K2, held by A's seed, while A's write of K1 waits for B: a
// cycle across the servers, ended by the lock wait timeout, an attempt
// aborted. A's seed creates K1 (at zero) in order before it locks K2, so
// B waits for K1 holding nothing: no attempt fails, every event counts
// once, and K1 is the row a plain insert would have left.
func TestMissingRowsLockInOneOrderAcrossServers(t *testing.T) {
	const lockWait = 2 * time.Second
	// hold: A's seed and A's write each wait it out at most once, within
	// B's wait
	gate := &lockGate{hold: lockWait / 4, first: map[string]string{}, claimed: map[string]chan struct{}{}}
	a, b, acct := twoServers(t, gate, lockWait)
	k1, k2 := accountOn(a, 0, acct[:]...), acct[1]
	gate.first["balance/"+k1], gate.first["balance/"+k2] = "A", "A"
	gate.beforeWrite = func(inst string) { // A writes once B waits for a lock
		for end := time.Now().Add(gate.hold); inst == "A" && a.servers[0].LockWaits()+a.servers[1].LockWaits() == 0 && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
	}

	checkpointTogether(t, []*memLedger{a, b}, [][]Record{
		{event1("a-1", k1, 2, 0, 0), event1("a-2", k2, 5, 0, 0), event1("a-3", k2, -5, 0, 0)},
		{event1("b-1", k1, 3, 1, 0), event1("b-2", k2, 4, 1, 0)},
	})
	if b1, b2 := a.balance(k1), a.balance(k2); b1.Amount != 5 || b1.Count != 2 || b2.Amount != 5 || b2.Count != 4 {
		t.Errorf("balances %+v and %+v, want 5 in 2 events and 5 in 4", b1, b2)
	}
	if w := a.servers[0].Tables().Windows; len(w) != 2 || w[1].Account != k1 && w[0].Account != k1 {
		t.Errorf("windows of server 0 %+v, want %s's and %s's", w, acct[0], k1)
	}
}

// The same on one participant: A's checkpoint has a risky key on Y
// (stored) and adds to X (no row), before Y in key order; B's adds to X
// and Y. Had A's seed only read X, B would insert X and wait for Y, held
// by A's seed, while A's write of X waits for B: a deadlock the server
// ends at once (1213; memdriver reports it as well), an attempt aborted.
// A's seed creates X before it locks Y: B waits for X holding nothing.
func TestMissingRowsLockInWriteOrder(t *testing.T) {
	const lockWait = 2 * time.Second
	cl := memdriver.New(memdriver.Options{AttachPrepared: true, LockWait: lockWait})
	gate := &lockGate{hold: lockWait / 4, first: map[string]string{}, claimed: map[string]chan struct{}{}}
	a, b := gatedInstance(t, cl, gate, "A", 1), gatedInstance(t, cl, gate, "B", 1)
	x, y := "acct-x", "acct-y" // x before y
	if ok, err := a.checkpoint(t, event1("y-0", y, 1, 0, 0)); !ok || err != nil {
		t.Fatalf("first checkpoint: decided %v, %v", ok, err)
	}
	gate.claimed = map[string]chan struct{}{}
	gate.first["balance/"+x], gate.first["balance/"+y] = "A", "A"
	gate.beforeWrite = func(inst string) { // A writes once B waits for a lock
		for end := time.Now().Add(gate.hold); inst == "A" && cl.LockWaits() == 0 && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
	}

	checkpointTogether(t, []*memLedger{a, b}, [][]Record{
		{event1("a-1", x, 2, 0, 0), event1("a-2", y, 5, 0, 0), event1("a-3", y, -5, 0, 0)},
		{event1("b-1", x, 3, 1, 0), event1("b-2", y, 4, 1, 0)},
	})
	if bx, by := a.balance(x), a.balance(y); bx.Amount != 5 || bx.Count != 2 || by.Amount != 5 || by.Count != 4 {
		t.Errorf("balances %+v and %+v, want 5 in 2 events and 5 in 4", bx, by)
	}
}

// A checkpoint beside other instances whose only event on a key without a
// row is refused for overflow: the seed created the key's row (it is
// before the last risky key in the lock order), no counted event writes
// it, so the attempt is aborted and retried without creating it, and no
// row is left behind, as a checkpoint alone leaves none.
func TestRowCreatedForNoCountedEventIsNotLeft(t *testing.T) {
	gate := &lockGate{hold: time.Second, first: map[string]string{}, claimed: map[string]chan struct{}{}}
	a, _, acct := twoServers(t, gate, 2*time.Second)
	x, y := acct[0], acct[1]
	if ok, err := a.checkpoint(t, event1("max", x, math.MaxInt64-1, 0, 0)); !ok || err != nil {
		t.Fatalf("checkpoint to the maximum: decided %v, %v", ok, err)
	}
	before := len(a.attempts())
	// h-1 counts in a window of x without a row, and overflows x's
	// balance; y's sum goes up and back (risky, on the later participant).
	ok, err := a.checkpoint(t, event1("h-1", x, 1, 0, 120), event1("h-2", y, 5, 0, 0), event1("h-3", y, -5, 0, 0))
	if !ok || err != nil {
		t.Fatalf("decided %v, %v", ok, err)
	}
	for _, w := range a.servers[0].Tables().Windows {
		if w.Account == x && w.Count == 0 {
			t.Errorf("window row %+v left behind with no event", w)
		}
	}
	if bx, by := a.balance(x), a.balance(y); bx.Amount != math.MaxInt64 || bx.Count != 2 || by.Amount != 1 || by.Count != 3 {
		t.Errorf("balances %+v and %+v, want the maximum in 2 events and 1 in 3", bx, by)
	}
	if got := reasons(a.servers[0].Tables())["amount_overflow"] + reasons(a.servers[1].Tables())["amount_overflow"]; got != 1 {
		t.Errorf("%d overflow dead letters, want 1", got)
	}
	infos := a.attempts()[before:]
	var u *uncountedError
	if len(infos) != 2 || !errors.As(infos[0].Err, &u) || len(u.keys) != 1 || infos[1].Err != nil || !infos[1].Decided {
		t.Errorf("attempts %+v, want one aborted for the row created for nothing, then one decided", infos)
	}
	if len(infos) > 0 && !errors.Is(infos[0].Err, ErrCreatedUncounted) {
		t.Errorf("the aborted attempt's error %v is not ErrCreatedUncounted (the metrics' cause created_uncounted)", infos[0].Err)
	}
}

// The rows a checkpoint beside other instances creates in its seed end as
// the rows the same checkpoints alone leave, and their changes are the
// same: one instance checkpoints the same records alone and beside others
// (new accounts, risky sums that widen the seed over keys without rows,
// late events in adjustments, windows that close and are sealed), at the
// same instants; the stored rows (updated_at, closed_at, checkpoint_id
// included) and the outbox's changes (a created row's a create) match.
func TestCreatedRowsEndAsTheRowsAlone(t *testing.T) {
	run := func(shared bool) (map[string][]string, []string) {
		var now time.Time
		l := newChangelogLedger(t, 2, 2, 1, func(c *Config) {
			c.LedgerEntries, c.WindowCloseAfter = true, 30*time.Minute
			c.Clock = func() time.Time { return now }
		})
		m := l.inst[0]
		m.ck.alone.Store(!shared)
		rng := rand.New(rand.NewPCG(7, 3))
		base := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
		now = base.Add(48 * time.Hour)
		minute := 0
		for ck := range 12 {
			now = now.Add(time.Minute)
			var recs []Record
			for i := range 1 + rng.IntN(8) {
				acct := fmt.Sprintf("acct-%d", rng.IntN(6))
				if rng.IntN(3) == 0 {
					acct = fmt.Sprintf("new-%d-%d", ck, rng.IntN(2))
				}
				minute += rng.IntN(15)
				at := base.Add(time.Duration(minute) * time.Minute)
				if rng.IntN(5) == 0 {
					at = at.Add(-3 * time.Hour) // late
				}
				amount := rng.Int64N(100) + 1
				for j, a := range []int64{amount, -amount} { // risky: up and back
					if j == 1 && rng.IntN(2) == 0 {
						break
					}
					ev := event.Event{EventID: fmt.Sprintf("c%d-%d-%d", ck, i, j), AccountID: acct, AmountMinor: a, Currency: "EUR", OccurredAt: at}
					v, _ := json.Marshal(ev)
					recs = append(recs, Record{Event: ev, Partition: 0, Key: []byte(acct), Value: v})
				}
			}
			if ok, err := m.checkpoint(t, recs...); !ok || err != nil {
				t.Fatalf("shared %v, checkpoint %d: decided %v, %v", shared, ck, ok, err)
			}
		}
		// The checkpoints' ids, which differ between the runs, by their
		// order.
		var ids []string
		for _, info := range m.attempts() {
			if info.Err != nil {
				t.Fatalf("shared %v: an attempt failed in %s: %v", shared, info.FailedPhase, info.Err)
			}
			if info.Decided {
				ids = append(ids, info.Gtrid)
			}
		}
		norm := func(s string) string {
			for i, id := range ids {
				s = strings.ReplaceAll(s, id, fmt.Sprintf("checkpoint-%d", i))
			}
			return s
		}
		rows := l.tableRows(t)
		for tb := range rows {
			for i := range rows[tb] {
				rows[tb][i] = norm(rows[tb][i])
			}
		}
		evs, _ := l.outboxEvents(t)
		var changes []string
		for _, ev := range evs {
			b, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			changes = append(changes, norm(string(b)))
		}
		return rows, changes
	}
	aloneRows, aloneChanges := run(false)
	sharedRows, sharedChanges := run(true)
	for tb, want := range aloneRows {
		if got := sharedRows[tb]; !slices.Equal(got, want) {
			t.Errorf("%s beside others:\n%s\nalone:\n%s", tb, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	if len(aloneChanges) == 0 || !slices.Equal(sharedChanges, aloneChanges) {
		t.Errorf("changes beside others:\n%s\nalone:\n%s", strings.Join(sharedChanges, "\n"), strings.Join(aloneChanges, "\n"))
	}
	creates := 0
	for _, c := range aloneChanges {
		if strings.Contains(c, `"Op":"c"`) && !strings.Contains(c, "ledger_entries") && !strings.Contains(c, "closed_windows") {
			creates++
		}
	}
	if creates == 0 {
		t.Error("no sums row created: the generation exercised nothing")
	}
}
