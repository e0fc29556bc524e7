package pipeline

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/billing/ledger/internal/event"
)

type balanceKey struct {
	account, currency string
}

type windowKey struct {
	account, currency string
	start             int64 // Unix seconds, UTC
}

// total is a running sum and count. base holds what MySQL had when the
// checkpoint read it (careful mode); exists says MySQL had a row.
type total struct {
	amount, count int64
	exists        bool
}

// aggregate is the keyed aggregation operator of one checkpoint: balances
// per (account, currency) and sums per (account, currency, window).
//
// In fast mode it starts every key at zero and the checkpoint adds its sums
// to MySQL's with an upsert. In careful mode it starts every key at the
// value read from MySQL under a row lock and writes absolute values, so that
// it can refuse exactly the events whose addition would overflow 64 bits
// (detected per event, never by the database halfway through a statement).
type aggregate struct {
	window   time.Duration
	careful  bool
	balances map[balanceKey]*total
	windows  map[windowKey]*total
}

func newAggregate(window time.Duration, careful bool) *aggregate {
	return &aggregate{window: window, careful: careful, balances: map[balanceKey]*total{}, windows: map[windowKey]*total{}}
}

func (a *aggregate) keys(ev *event.Event) (balanceKey, windowKey) {
	b := balanceKey{ev.AccountID, ev.Currency}
	return b, windowKey{ev.AccountID, ev.Currency, event.Window(ev.OccurredAt, a.window).Unix()}
}

// seed records the stored value of a key before any event is added.
func (a *aggregate) seedBalance(k balanceKey, amount, count int64) {
	a.balances[k] = &total{amount: amount, count: count, exists: true}
}

func (a *aggregate) seedWindow(k windowKey, amount, count int64) {
	a.windows[k] = &total{amount: amount, count: count, exists: true}
}

// add counts ev unless its amount would overflow the balance or the window
// sum; it reports whether ev was counted. Either both sums take the event or
// neither does.
func (a *aggregate) add(ev *event.Event) bool {
	bk, wk := a.keys(ev)
	b := a.balances[bk]
	if b == nil {
		b = &total{}
		a.balances[bk] = b
	}
	w := a.windows[wk]
	if w == nil {
		w = &total{}
		a.windows[wk] = w
	}
	nb, ok1 := addInt64(b.amount, ev.AmountMinor)
	nw, ok2 := addInt64(w.amount, ev.AmountMinor)
	cb, ok3 := addInt64(b.count, 1)
	cw, ok4 := addInt64(w.count, 1)
	if !(ok1 && ok2 && ok3 && ok4) {
		return false
	}
	b.amount, w.amount, b.count, w.count = nb, nw, cb, cw
	return true
}

// addInt64 returns a+b and whether it did not overflow.
func addInt64(a, b int64) (int64, bool) {
	s := a + b
	// Overflow iff a and b have the same sign and s has the other.
	return s, (a >= 0) != (b >= 0) || (s >= 0) == (a >= 0)
}

type balanceRow struct {
	balanceKey
	total
}

type windowRow struct {
	windowKey
	total
}

// balanceRows returns the balances to write, in key order (one lock order
// for every writer).
func (a *aggregate) balanceRows() []balanceRow {
	rows := make([]balanceRow, 0, len(a.balances))
	for k, t := range a.balances {
		if t.count == 0 && !t.exists {
			continue
		}
		rows = append(rows, balanceRow{k, *t})
	}
	slices.SortFunc(rows, func(x, y balanceRow) int {
		return cmp.Or(strings.Compare(x.account, y.account), strings.Compare(x.currency, y.currency))
	})
	return rows
}

func (a *aggregate) windowRows() []windowRow {
	rows := make([]windowRow, 0, len(a.windows))
	for k, t := range a.windows {
		if t.count == 0 && !t.exists {
			continue
		}
		rows = append(rows, windowRow{k, *t})
	}
	slices.SortFunc(rows, func(x, y windowRow) int {
		return cmp.Or(strings.Compare(x.account, y.account), strings.Compare(x.currency, y.currency), cmp.Compare(x.start, y.start))
	})
	return rows
}
