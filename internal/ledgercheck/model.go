package ledgercheck

import (
	"errors"
	"fmt"
	"time"
)

// Outcome is what the service does with one well-formed event.
type Outcome int

// Outcomes of [Model.Add].
const (
	// Counted: added to its balance and window; its id is remembered.
	Counted Outcome = iota + 1
	// Duplicate: same id and content as a counted event; dropped.
	Duplicate
	// Conflict: same id as a counted event, different content; dead letter
	// conflicting_duplicate.
	Conflict
	// Overflow: would overflow its balance or window sum; dead letter
	// amount_overflow.
	Overflow
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Counted:
		return "counted"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return ReasonConflictingDuplicate
	case Overflow:
		return ReasonAmountOverflow
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// content is the part of an event that decides whether a repeated id is an
// exact or a conflicting duplicate (the service's fingerprint).
type content struct {
	accountID string
	amount    int64
	currency  string
	sec       int64
	nsec      int
}

func contentOf(e Event) content {
	return content{e.AccountID, e.AmountMinor, e.Currency, e.OccurredAt.Unix(), e.OccurredAt.Nanosecond()}
}

// totals is an amount and an event count.
type totals struct {
	amount int64
	count  int64
}

// Model is the contract's model of the service's result tables. It is not
// safe for concurrent use. Memory grows with the number of distinct event ids
// (about 100 bytes each), since every counted id is remembered.
type Model struct {
	opt      Options
	balances map[BalanceKey]totals
	windows  map[WindowKey]totals
	adjusts  map[WindowKey]totals
	seen     map[string]content
	dead     map[string]int64
	counted  int64
	// watermark is the latest occurred_at of every event added (whatever
	// became of it); frontier the closing frontier it justified so far.
	watermark, frontier time.Time
	digest              uint64
}

// Options configure a [Model] as the service is configured.
type Options struct {
	// Period is BILLING_WINDOW and BILLING_TIMEZONE.
	Period Period
	// CloseAfter is WINDOW_CLOSE_AFTER; 0: windows never close.
	CloseAfter time.Duration
	// SplitExact: the events are all on one partition, fed in its order,
	// so the model knows which events are late: each is judged against
	// the frontier of the events before and including it, as the service
	// judges one partition's events. Otherwise each window's events are
	// kept as one sum (window and adjustment together).
	SplitExact bool
	// Entries: the service writes ledger entries (LEDGER_ENTRIES=true).
	Entries bool
}

// NewModel returns an empty model with tumbling windows of the given size,
// which must be a positive whole number of microseconds, that never close.
func NewModel(window time.Duration) (*Model, error) {
	p, err := Fixed(window)
	if err != nil {
		return nil, err
	}
	return NewModelWith(Options{Period: p})
}

// NewModelWith returns an empty model with the given options.
func NewModelWith(o Options) (*Model, error) {
	if o.Period.unit == "" && o.Period.size == 0 {
		return nil, errors.New("ledgercheck: a period is required")
	}
	if o.CloseAfter < 0 {
		return nil, errors.New("ledgercheck: CloseAfter is negative")
	}
	return &Model{
		opt:      o,
		balances: make(map[BalanceKey]totals),
		windows:  make(map[WindowKey]totals),
		adjusts:  make(map[WindowKey]totals),
		seen:     make(map[string]content),
		dead:     make(map[string]int64),
	}, nil
}

// Window returns the model's window size (0 for calendar periods).
func (l *Model) Window() time.Duration { return l.opt.Period.size }

// Period returns the model's period.
func (l *Model) Period() Period { return l.opt.Period }

// Add applies the contract to one well-formed event and returns what
// happened to it (see the package documentation). It does not validate e:
// the caller must only pass events the decoder accepts, every one of them
// (repeats too: their times move the watermark). Dedup is checked before
// overflow, so an exact duplicate is dropped even if counting it again
// would overflow.
func (l *Model) Add(e Event) Outcome {
	if e.OccurredAt.After(l.watermark) {
		l.watermark = e.OccurredAt
		if l.opt.CloseAfter > 0 {
			if f := l.opt.Period.Start(l.watermark.Add(-l.opt.CloseAfter)); f.After(l.frontier) {
				l.frontier = f
			}
		}
	}
	c := contentOf(e)
	if prev, ok := l.seen[e.EventID]; ok {
		if prev == c {
			return Duplicate
		}
		l.dead[ReasonConflictingDuplicate]++
		return Conflict
	}
	start := l.opt.Period.Start(e.OccurredAt)
	bk := BalanceKey{e.AccountID, e.Currency}
	wk := WindowKey{e.AccountID, e.Currency, start.UnixMicro()}
	sums := l.windows
	if l.opt.CloseAfter > 0 && l.opt.SplitExact && start.Before(l.frontier) {
		sums = l.adjusts
	}
	b, w := l.balances[bk], sums[wk]
	nb, ok1 := addInt64(b.amount, e.AmountMinor)
	nw, ok2 := addInt64(w.amount, e.AmountMinor)
	if !ok1 || !ok2 {
		l.dead[ReasonAmountOverflow]++
		return Overflow
	}
	// Event counts cannot realistically reach 2^63; no check needed.
	l.balances[bk] = totals{nb, b.count + 1}
	sums[wk] = totals{nw, w.count + 1}
	l.seen[e.EventID] = c
	l.counted++
	l.digest += EntryDigest(e)
	return Counted
}

// DeadLetter records one record rejected with reason (a malformed record the
// decoder refuses). It has no other effect: the record's id, if any, is not
// remembered.
func (l *Model) DeadLetter(reason string) { l.dead[reason]++ }

// Counted returns the number of events counted so far.
func (l *Model) Counted() int64 { return l.counted }

// Expected returns the model's current tables as a new [Expected] with
// Version, the settings, EventsValid, Balances, Windows, Adjustments and
// DeadLetters filled in and sorted; the caller adds the run's metadata.
func (l *Model) Expected() *Expected {
	e := &Expected{
		Version:       FileVersion,
		Window:        l.opt.Period.Window(),
		Timezone:      l.opt.Period.Zone(),
		CloseAfter:    Duration(l.opt.CloseAfter),
		SplitExact:    l.opt.CloseAfter > 0 && l.opt.SplitExact,
		LedgerEntries: l.opt.Entries,
		EventsValid:   l.counted,
		DeadLetters:   make(map[string]int64, len(l.dead)),
		Balances:      make([]BalanceRow, 0, len(l.balances)),
		Windows:       make([]WindowRow, 0, len(l.windows)),
	}
	if l.opt.Entries {
		e.EntriesDigest = l.digest
	}
	if l.opt.CloseAfter > 0 && !l.watermark.IsZero() {
		w, f := l.watermark.UTC(), l.frontier.UTC()
		e.Watermark, e.ClosedBefore = &w, &f
	}
	for r, n := range l.dead {
		e.DeadLetters[r] = n
	}
	for k, t := range l.balances {
		e.Balances = append(e.Balances, BalanceRow{k.AccountID, k.Currency, t.amount, t.count})
	}
	for k, t := range l.windows {
		e.Windows = append(e.Windows, WindowRow{k.AccountID, k.Currency, k.Start(), t.amount, t.count})
	}
	for k, t := range l.adjusts {
		e.Adjustments = append(e.Adjustments, WindowRow{k.AccountID, k.Currency, k.Start(), t.amount, t.count})
	}
	sortBalances(e.Balances)
	sortWindows(e.Windows)
	sortWindows(e.Adjustments)
	return e
}
