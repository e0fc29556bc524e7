package ledgercheck

import (
	"errors"
	"fmt"
	"math"
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
	// Amended: a higher revision of a counted event (or of a tombstone):
	// the counted version retracted, this one counted (a tombstone:
	// nothing).
	Amended
	// Stale: a lower revision than the event's current one: dropped.
	Stale
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
	case Amended:
		return "amended"
	case Stale:
		return "stale_revision"
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
	versions map[string]version // events that had a version other than an original
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
		versions: make(map[string]version),
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
	l.observe(e.OccurredAt)
	if _, ok := l.versions[e.EventID]; ok {
		return l.AddVersion(Version{Event: e})
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

// observe moves the watermark, and the frontier it justifies, to at.
func (l *Model) observe(at time.Time) {
	if at.After(l.watermark) {
		l.watermark = at
		if l.opt.CloseAfter > 0 {
			if f := l.opt.Period.Start(l.watermark.Add(-l.opt.CloseAfter)); f.After(l.frontier) {
				l.frontier = f
			}
		}
	}
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
	// A row that holds nothing is left out: a corrected event may leave
	// one or not depending on the order of its versions (Compare takes it
	// for no row).
	for k, t := range l.balances {
		if t == (totals{}) {
			continue
		}
		e.Balances = append(e.Balances, BalanceRow{k.AccountID, k.Currency, t.amount, t.count})
	}
	for k, t := range l.windows {
		if t == (totals{}) {
			continue
		}
		e.Windows = append(e.Windows, WindowRow{k.AccountID, k.Currency, k.Start(), t.amount, t.count})
	}
	for k, t := range l.adjusts {
		if t == (totals{}) {
			continue
		}
		e.Adjustments = append(e.Adjustments, WindowRow{k.AccountID, k.Currency, k.Start(), t.amount, t.count})
	}
	sortBalances(e.Balances)
	sortWindows(e.Windows)
	sortWindows(e.Adjustments)
	return e
}

// version is an event's current version, once it had one other than an
// original.
type version struct {
	revision  int64
	cancelled bool
	content   content
}

// AddVersion applies the versions' contract (docs/corrections.md): an
// event counts its highest revision seen, whatever order the versions come
// in. The model assumes every version comes within the version horizon
// and that windows and adjustments are kept as one sum (not SplitExact:
// a retraction counts in the adjustments of a window closed when its
// checkpoint began, which the model cannot know).
func (l *Model) AddVersion(e Version) Outcome {
	l.observe(e.OccurredAt)
	next := version{revision: e.Revision, cancelled: e.Cancelled}
	if !e.Cancelled {
		next.content = contentOf(e.Event)
	}
	cur, ok := l.versions[e.EventID]
	if !ok {
		if c, counted := l.seen[e.EventID]; counted {
			cur, ok = version{content: c}, true
		}
	}
	switch {
	case !ok:
		if !e.Cancelled && !l.count(e.EventID, next.content, 1) {
			l.dead[ReasonAmountOverflow]++
			return Overflow
		}
		l.versions[e.EventID] = next
		return Counted
	case e.Revision == cur.revision:
		if cur.cancelled == e.Cancelled && (e.Cancelled || cur.content == next.content) {
			return Duplicate
		}
		l.dead[ReasonConflictingDuplicate]++
		return Conflict
	case e.Revision < cur.revision:
		return Stale
	}
	if !cur.cancelled && !l.count(e.EventID, cur.content, -1) {
		l.dead[ReasonAmountOverflow]++
		return Overflow
	}
	if !e.Cancelled && !l.count(e.EventID, next.content, 1) {
		l.count(e.EventID, cur.content, 1) // both or neither
		l.dead[ReasonAmountOverflow]++
		return Overflow
	}
	l.versions[e.EventID] = next
	return Amended
}

// count adds (sign 1) or takes back (sign -1) one version's content in
// its balance and its window, unless that overflows; in the entries'
// digest, a retraction entry takes back the digest of the entry it
// retracts.
func (l *Model) count(id string, c content, sign int64) bool {
	at := time.Unix(c.sec, int64(c.nsec)).UTC()
	bk := BalanceKey{c.accountID, c.currency}
	wk := WindowKey{c.accountID, c.currency, l.opt.Period.Start(at).UnixMicro()}
	b, w := l.balances[bk], l.windows[wk]
	amount := c.amount
	if sign < 0 {
		if amount == math.MinInt64 {
			return false
		}
		amount = -amount
	}
	nb, ok1 := addInt64(b.amount, amount)
	nw, ok2 := addInt64(w.amount, amount)
	if !ok1 || !ok2 {
		return false
	}
	l.balances[bk] = totals{nb, b.count + sign}
	l.windows[wk] = totals{nw, w.count + sign}
	l.counted += sign
	l.digest += uint64(sign) * EntryDigest(Event{EventID: id, AccountID: c.accountID, Currency: c.currency, AmountMinor: c.amount, OccurredAt: at})
	return true
}
