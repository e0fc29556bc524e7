package pipeline

import (
	"cmp"
	"slices"
	"strings"

	"github.com/billing/ledger/internal/event"
)

type balanceKey struct {
	account, currency string
}

type windowKey struct {
	account, currency string
	start             int64 // Unix seconds, UTC
}

// compareBalanceKey and compareWindowKey are the primary keys' order on
// the server (the account is VARBINARY, the currency ascii_bin): the order
// every writer locks rows in.
func compareBalanceKey(x, y balanceKey) int {
	return cmp.Or(strings.Compare(x.account, y.account), strings.Compare(x.currency, y.currency))
}

func compareWindowKey(x, y windowKey) int {
	return cmp.Or(strings.Compare(x.account, y.account), strings.Compare(x.currency, y.currency), cmp.Compare(x.start, y.start))
}

// total is a running sum and count. absolute says it started from the
// value stored in MySQL (read under a row lock), so it is written as is;
// otherwise it started from zero and is added to the stored value.
type total struct {
	amount, count int64
	exists        bool // MySQL had a row when it was seeded
	absolute      bool
	insert        bool // seeded without a row, with images: a plain insert
	touched       bool // an event changed it (a version's retraction and addition may leave the count)
}

// aggregate is the keyed aggregation operator of one checkpoint: balances
// per (account, currency), and sums per (account, currency, window), in
// billing_windows for an event counted while its window was open, in
// window_adjustments for a late one (see eventtime.go).
//
// Overflow is judged per event, in arrival order: an event whose addition
// would take its balance or its window sum (or adjustment sum) beyond 64
// bits is refused. Most
// keys can be added to MySQL as a delta (an upsert adding the checkpoint's
// sum): if the checkpoint's running sum for a key never leaves the range
// between 0 and its final value, any intermediate overflow would also
// overflow the final sum, which the server refuses (error 1690) and the
// checkpoint is retried with every key seeded. A key whose running sum does
// leave that range (say +1 then -1 on a balance at the maximum) is "risky":
// its stored value is read under a row lock first (seed), and each event is
// checked against it exactly.
type aggregate struct {
	period event.Windows
	// images: every key is seeded (the changelog's before images), and a
	// key seeded without a row is inserted, not added to: its row cannot
	// have appeared since the locking read without the insert failing
	// (a duplicate: the checkpoint is retried, and its seeding then finds
	// the row). A row no event changed is not written.
	images   bool
	balances map[balanceKey]*total
	windows  map[windowKey]*total
	adjusts  map[windowKey]*total // window_adjustments
}

func newAggregate(period event.Windows) *aggregate {
	return &aggregate{period: period, balances: map[balanceKey]*total{}, windows: map[windowKey]*total{}, adjusts: map[windowKey]*total{}}
}

func (a *aggregate) keys(ev *event.Event) (balanceKey, windowKey) {
	b := balanceKey{ev.AccountID, ev.Currency}
	return b, windowKey{ev.AccountID, ev.Currency, a.period.Start(ev.OccurredAt).Unix()}
}

// sums is the window map a late or timely event counts in.
func (a *aggregate) sums(late bool) map[windowKey]*total {
	if late {
		return a.adjusts
	}
	return a.windows
}

// seed records the stored value of a key, read under a row lock, before any
// event is added; the key is then written as an absolute value. A key
// without a stored row starts from zero and stays a delta: nothing locks a
// row that does not exist (READ COMMITTED takes no gap locks), so another
// transaction may create it meanwhile, and only an adding upsert keeps its
// contribution. A row the seed created (beside other instances: lockOrder)
// is stored, at zero, and locked: absolute.
func (a *aggregate) seedBalance(k balanceKey, t total) {
	t.absolute, t.insert = t.exists, a.images && !t.exists
	a.balances[k] = &t
}

func (a *aggregate) seedWindow(k windowKey, t total, late bool) {
	t.absolute, t.insert = t.exists, a.images && !t.exists
	a.sums(late)[k] = &t
}

// add counts ev, late or not, unless its amount would overflow the balance
// or the window sum (the adjustment sum when late); it reports whether ev
// was counted. Either both sums take the event or neither does.
func (a *aggregate) add(ev *event.Event, late bool) bool {
	bk, wk := a.keys(ev)
	b := a.balances[bk]
	if b == nil {
		b = &total{}
		a.balances[bk] = b
	}
	m := a.sums(late)
	w := m[wk]
	if w == nil {
		w = &total{}
		m[wk] = w
	}
	nb, ok1 := addInt64(b.amount, ev.AmountMinor)
	nw, ok2 := addInt64(w.amount, ev.AmountMinor)
	cb, ok3 := addInt64(b.count, 1)
	cw, ok4 := addInt64(w.count, 1)
	if !(ok1 && ok2 && ok3 && ok4) {
		return false
	}
	b.amount, w.amount, b.count, w.count = nb, nw, cb, cw
	b.touched, w.touched = true, true
	return true
}

// walk follows a key's running sum within one checkpoint.
type walk struct {
	sum, lo, hi int64
	broken      bool // the running sum itself overflowed
}

func (w *walk) step(x int64) {
	s, ok := addInt64(w.sum, x)
	if !ok {
		w.broken = true
		return
	}
	w.sum, w.lo, w.hi = s, min(w.lo, s), max(w.hi, s)
}

// risky reports whether an intermediate overflow could go unnoticed by the
// server when only the final sum is added.
func (w *walk) risky() bool {
	return w.broken || w.hi > max(0, w.sum) || w.lo < min(0, w.sum)
}

// riskyKeys returns the keys of the records' events (in arrival order) that
// need seeding: balances, windows and adjustments; with all set, every key
// does.
func (a *aggregate) riskyKeys(recs []*record, all bool) (rb map[balanceKey]bool, rw, ra map[windowKey]bool) {
	if all { // no walk needed (the changelog seeds every key)
		rb, rw, ra = map[balanceKey]bool{}, map[windowKey]bool{}, map[windowKey]bool{}
		for _, r := range recs {
			bk, wk := a.keys(&r.ev)
			rb[bk] = true
			if r.late {
				ra[wk] = true
			} else {
				rw[wk] = true
			}
		}
		return rb, rw, ra
	}
	bw := map[balanceKey]*walk{}
	ww := [2]map[windowKey]*walk{{}, {}} // timely, late
	for _, r := range recs {
		bk, wk := a.keys(&r.ev)
		if bw[bk] == nil {
			bw[bk] = &walk{}
		}
		m := ww[b2i(r.late)]
		if m[wk] == nil {
			m[wk] = &walk{}
		}
		bw[bk].stepOf(r)
		m[wk].stepOf(r)
	}
	rb, rw, ra = map[balanceKey]bool{}, map[windowKey]bool{}, map[windowKey]bool{}
	for k, w := range bw {
		if all || w.risky() {
			rb[k] = true
		}
	}
	for i, out := range []map[windowKey]bool{rw, ra} {
		for k, w := range ww[i] {
			if all || w.risky() {
				out[k] = true
			}
		}
	}
	return rb, rw, ra
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
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
		if t.count == 0 && !t.touched && (!t.exists || a.images) {
			continue
		}
		rows = append(rows, balanceRow{k, *t})
	}
	slices.SortFunc(rows, func(x, y balanceRow) int { return compareBalanceKey(x.balanceKey, y.balanceKey) })
	return rows
}

// windowRows are the billing_windows rows to write, adjustRows the
// window_adjustments rows, in key order.
func (a *aggregate) windowRows() []windowRow { return sortedWindowRows(a.windows, a.images) }

func (a *aggregate) adjustRows() []windowRow { return sortedWindowRows(a.adjusts, a.images) }

func sortedWindowRows(m map[windowKey]*total, images bool) []windowRow {
	rows := make([]windowRow, 0, len(m))
	for k, t := range m {
		if t.count == 0 && !t.touched && (!t.exists || images) {
			continue
		}
		rows = append(rows, windowRow{k, *t})
	}
	slices.SortFunc(rows, func(x, y windowRow) int { return compareWindowKey(x.windowKey, y.windowKey) })
	return rows
}
