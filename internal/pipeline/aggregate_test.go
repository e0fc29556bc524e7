package pipeline

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/billing/ledger/internal/event"
)

func TestAddInt64(t *testing.T) {
	tests := []struct {
		a, b int64
		ok   bool
	}{
		{1, 2, true},
		{math.MaxInt64, 0, true},
		{math.MaxInt64, 1, false},
		{math.MaxInt64, -1, true},
		{math.MinInt64, -1, false},
		{math.MinInt64, 1, true},
		{math.MinInt64, math.MaxInt64, true},
		{-1, math.MinInt64, false},
		{math.MaxInt64, math.MaxInt64, false},
	}
	for _, tt := range tests {
		s, ok := addInt64(tt.a, tt.b)
		if ok != tt.ok || (ok && s != tt.a+tt.b) {
			t.Errorf("addInt64(%d, %d) = %d, %v; want ok=%v", tt.a, tt.b, s, ok, tt.ok)
		}
	}
}

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

var hourly = event.MustFixed(time.Hour)

// An event is counted in its balance and its window together or not at all:
// a window sum that would overflow refuses the event even when the balance
// would not.
func TestAggregateBothOrNeither(t *testing.T) {
	a := newAggregate(hourly)
	a.seedBalance(balanceKey{"a", "EUR"}, total{exists: true})
	e1 := event.Event{EventID: "1", AccountID: "a", Currency: "EUR", AmountMinor: math.MaxInt64, OccurredAt: at("2026-11-29T10:00:00Z")}
	e2 := event.Event{EventID: "2", AccountID: "a", Currency: "EUR", AmountMinor: -math.MaxInt64, OccurredAt: at("2026-11-29T11:00:00Z")}
	e3 := event.Event{EventID: "3", AccountID: "a", Currency: "EUR", AmountMinor: 1, OccurredAt: at("2026-11-29T10:30:00Z")}
	if !a.add(&e1, false) || !a.add(&e2, false) {
		t.Fatal("valid events refused")
	}
	if a.add(&e3, false) {
		t.Fatal("event that overflows its window sum was counted")
	}
	b := a.balanceRows()
	if len(b) != 1 || b[0].amount != 0 || b[0].count != 2 {
		t.Fatalf("balance = %+v, want 0 over 2 events", b)
	}
	w := a.windowRows()
	if len(w) != 2 || w[0].amount != math.MaxInt64 || w[0].count != 1 || w[1].amount != -math.MaxInt64 {
		t.Fatalf("windows = %+v", w)
	}
	// Late, the same event counts in the adjustment of its window, whose
	// sum is its own: a late event overflowing the adjustment sum is
	// refused the same way, and the window's sum is not touched.
	if !a.add(&e3, true) {
		t.Fatal("a late event that fits its adjustment was refused")
	}
	e4 := event.Event{EventID: "4", AccountID: "a", Currency: "EUR", AmountMinor: math.MaxInt64, OccurredAt: at("2026-11-29T10:45:00Z")}
	if a.add(&e4, true) {
		t.Fatal("a late event that overflows its adjustment sum was counted")
	}
	adj := a.adjustRows()
	if len(adj) != 1 || adj[0].amount != 1 || adj[0].count != 1 || a.windowRows()[0].count != 1 {
		t.Fatalf("adjustments = %+v, windows = %+v", adj, a.windowRows())
	}
	if b := a.balanceRows(); b[0].amount != 1 || b[0].count != 3 {
		t.Fatalf("balance = %+v, want 1 over 3 events", b)
	}
}

// Window keys follow event.Window: tumbling, UTC, aligned to the epoch; a
// late event lands in its own (old) window.
func TestAggregateWindows(t *testing.T) {
	a := newAggregate(hourly)
	for _, s := range []string{"2026-11-29T13:05:00Z", "2026-11-29T13:59:59Z", "2026-11-29T14:00:00+01:00", "2026-11-29T09:00:00Z"} {
		e := event.Event{EventID: s, AccountID: "a", Currency: "EUR", AmountMinor: 1, OccurredAt: at(s).UTC()}
		if !a.add(&e, false) {
			t.Fatal("refused")
		}
	}
	w := a.windowRows()
	want := []struct {
		start string
		n     int64
	}{{"2026-11-29T09:00:00Z", 1}, {"2026-11-29T13:00:00Z", 3}}
	if len(w) != len(want) {
		t.Fatalf("windows = %+v", w)
	}
	for i, x := range want {
		if time.Unix(w[i].start, 0).UTC().Format(time.RFC3339) != x.start || w[i].count != x.n {
			t.Errorf("window %d = %+v, want %s x%d", i, w[i], x.start, x.n)
		}
	}
}

// A key whose running sum leaves the range between 0 and its final value is
// risky (the server, seeing only the final sum, could miss an intermediate
// overflow); one that stays inside is not.
func TestRiskyKeys(t *testing.T) {
	mk := func(amounts ...int64) []*record {
		var recs []*record
		for i, a := range amounts {
			recs = append(recs, &record{ev: event.Event{EventID: fmt.Sprint(i), AccountID: "a", Currency: "EUR", AmountMinor: a, OccurredAt: at("2026-11-29T10:00:00Z")}})
		}
		return recs
	}
	tests := []struct {
		name    string
		amounts []int64
		risky   bool
	}{
		{"monotone up", []int64{1, 2, 3}, false},
		{"monotone down", []int64{-1, -2}, false},
		{"up then down", []int64{1, -1}, true},
		{"down then up", []int64{-5, 3}, true},
		{"running sum overflows", []int64{math.MaxInt64, 1, -1}, true},
		{"zero", []int64{0, 0}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAggregate(hourly)
			rb, rw, ra := a.riskyKeys(mk(tt.amounts...), false)
			if got := len(rb) == 1 && len(rw) == 1; got != tt.risky || len(ra) != 0 {
				t.Fatalf("risky = %v/%v/%v, want %v", rb, rw, ra, tt.risky)
			}
			rb, _, _ = a.riskyKeys(mk(tt.amounts...), true)
			if len(rb) != 1 {
				t.Fatal("all: key not seeded")
			}
			// Late, the same walk is an adjustment key's.
			late := mk(tt.amounts...)
			for _, r := range late {
				r.late = true
			}
			rb, rw, ra = a.riskyKeys(late, false)
			if got := len(rb) == 1 && len(ra) == 1; got != tt.risky || len(rw) != 0 {
				t.Fatalf("late: risky = %v/%v/%v, want %v", rb, rw, ra, tt.risky)
			}
			if rb, rw, ra = a.riskyKeys(late, true); len(rb) != 1 || len(ra) != 1 || len(rw) != 0 {
				t.Fatalf("late, all: %v/%v/%v, want the balance and the adjustment seeded", rb, rw, ra)
			}
		})
	}
}

// lockOrder widens the risky keys to every key the checkpoint writes up
// to its last risky one, in one order over every participant
// (participant, then the table in the order the writes lock them:
// balances, windows, adjustments, then the key), and to no key after it:
// over random checkpoints, the seeded keys are exactly the prefix of the
// written keys that ends at the last risky key.
func TestLockOrderSeedsAPrefixOfTheWrites(t *testing.T) {
	rnd := rand.New(rand.NewPCG(21, 5))
	r := hashRouter(3)
	// rank places a key in the lock order.
	type ranked struct {
		participant int
		table       int // 0 balances, 1 windows, 2 adjustments
		w           windowKey
	}
	less := func(x, y ranked) bool {
		if x.participant != y.participant {
			return x.participant < y.participant
		}
		return x.table < y.table || x.table == y.table && compareWindowKey(x.w, y.w) < 0
	}
	for round := range 500 {
		var recs []*record
		for i := range 1 + rnd.IntN(40) {
			recs = append(recs, &record{ev: event.Event{EventID: fmt.Sprint(i), AccountID: fmt.Sprintf("acct-%d", rnd.IntN(8)),
				Currency: "EUR", AmountMinor: rnd.Int64N(11) - 5, OccurredAt: at("2026-11-29T10:00:00Z").Add(time.Duration(rnd.IntN(3)) * time.Hour)},
				late: rnd.IntN(4) == 0})
		}
		a := newAggregate(hourly)
		var risky riskySet
		risky.balances, risky.windows, risky.adjusts = a.riskyKeys(recs, false)
		got := lockOrder(risky, a, recs, r)
		var all riskySet
		all.balances, all.windows, all.adjusts = a.riskyKeys(recs, true)
		ranks := func(s riskySet) map[ranked]bool {
			out := map[ranked]bool{}
			for k := range s.balances {
				out[ranked{r.Route(k.account), 0, windowKey{k.account, k.currency, 0}}] = true
			}
			for k := range s.windows {
				out[ranked{r.Route(k.account), 1, k}] = true
			}
			for k := range s.adjusts {
				out[ranked{r.Route(k.account), 2, k}] = true
			}
			return out
		}
		written, riskyR, seeded := ranks(all), ranks(risky), ranks(got)
		var last *ranked
		for k := range riskyR {
			if last == nil || less(*last, k) {
				last = &k
			}
		}
		for k := range written {
			if want := last != nil && !less(*last, k); seeded[k] != want {
				t.Fatalf("round %d: key %+v seeded %v, want %v (last risky %+v)", round, k, seeded[k], want, last)
			}
		}
		for k := range seeded {
			if !written[k] {
				t.Fatalf("round %d: %+v seeded but not written", round, k)
			}
		}
	}
}
