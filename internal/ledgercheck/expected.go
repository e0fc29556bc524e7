package ledgercheck

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"time"
)

// FileVersion is the version of the expected-ledger file format written by
// [WriteFile]. [ReadFile] also reads version 1 (fixed windows that never
// close, no ledger entries) and rejects any other.
const FileVersion = 2

// Event is one well-formed billing event as the service's decoder yields it.
// OccurredAt may carry any location; the model uses its UTC instant.
type Event struct {
	EventID     string
	AccountID   string
	AmountMinor int64
	Currency    string
	OccurredAt  time.Time
}

// Version is an event as a version of its EventID (docs/corrections.md):
// a revision, and whether it is a tombstone (then only EventID is set).
type Version struct {
	Event
	Revision  int64
	Cancelled bool
}

// BalanceRow is one row of account_balances.
type BalanceRow struct {
	AccountID    string `json:"account_id"`
	Currency     string `json:"currency"`
	BalanceMinor int64  `json:"balance_minor"`
	EventCount   int64  `json:"event_count"`
}

// Key returns the row's primary key.
func (r BalanceRow) Key() BalanceKey { return BalanceKey{r.AccountID, r.Currency} }

// WindowRow is one row of billing_windows (or window_adjustments).
// WindowStart is in UTC.
type WindowRow struct {
	AccountID   string    `json:"account_id"`
	Currency    string    `json:"currency"`
	WindowStart time.Time `json:"window_start"`
	AmountMinor int64     `json:"amount_minor"`
	EventCount  int64     `json:"event_count"`
}

// Key returns the row's primary key.
func (r WindowRow) Key() WindowKey {
	return WindowKey{r.AccountID, r.Currency, r.WindowStart.UnixMicro()}
}

// BalanceKey is the primary key of account_balances.
type BalanceKey struct {
	AccountID string
	Currency  string
}

// String formats the key for messages; the account id is quoted because it
// may hold arbitrary bytes.
func (k BalanceKey) String() string { return fmt.Sprintf("%q/%s", k.AccountID, k.Currency) }

// WindowKey is the primary key of billing_windows; StartMicros is the window
// start in microseconds since the Unix epoch (DATETIME(6) precision).
type WindowKey struct {
	AccountID   string
	Currency    string
	StartMicros int64
}

// Start returns the window start as a UTC time.
func (k WindowKey) Start() time.Time { return time.UnixMicro(k.StartMicros).UTC() }

// String formats the key for messages.
func (k WindowKey) String() string {
	return fmt.Sprintf("%q/%s@%s", k.AccountID, k.Currency, k.Start().Format(time.RFC3339Nano))
}

// Produced counts what the generator wrote to Kafka. It is informational:
// [Compare] does not use it.
type Produced struct {
	// Records committed to the topic (everything below except Aborted).
	Records int64 `json:"records"`
	// Valid distinct billable events (the -events flag; excludes overflow
	// cases).
	Valid int64 `json:"valid"`
	// Duplicates: exact re-sends of valid events, of which
	// CrossPartitionDuplicates were keyed to land on another partition.
	Duplicates               int64 `json:"duplicates"`
	CrossPartitionDuplicates int64 `json:"cross_partition_duplicates"`
	// Conflicts: same event id as a counted event, different content.
	Conflicts int64 `json:"conflicts"`
	// Malformed records, all kinds.
	Malformed int64 `json:"malformed"`
	// Aborted records, in AbortedTransactions aborted transactions.
	Aborted             int64 `json:"aborted"`
	AbortedTransactions int64 `json:"aborted_transactions"`
	// OverflowEvents: records of the overflow cases (counted or not).
	OverflowEvents int64 `json:"overflow_events"`
	// Late: valid events whose occurred_at was moved to an older window.
	Late int64 `json:"late"`
	// Future: records dated far in the future (event_time_in_future dead
	// letters), each followed by its correction, which counts.
	Future int64 `json:"future,omitempty"`
	// Versions: records that are versions of an event (amendments,
	// cancellations, their repeats), in any order; the ledger counts
	// each event's highest revision.
	Versions int64 `json:"versions,omitempty"`
}

// Expected is the expected-ledger file: the exact content the service's
// result tables must reach once it has consumed the run.
type Expected struct {
	Version int `json:"version"`
	// Seed that reproduces the run (with Params).
	Seed uint64 `json:"seed"`
	// Topic and Partitions the run was produced to (informational).
	Topic      string `json:"topic,omitempty"`
	Partitions int    `json:"partitions,omitempty"`
	// Window and Timezone must equal the service's BILLING_WINDOW (a
	// duration such as "1h0m0s", day or month) and BILLING_TIMEZONE (""
	// for UTC).
	Window   string `json:"window"`
	Timezone string `json:"timezone,omitempty"`
	// CloseAfter must equal the service's WINDOW_CLOSE_AFTER (0: windows
	// never close, and no adjustment may exist).
	CloseAfter Duration `json:"close_after,omitempty"`
	// WindowsClose says windows close when CloseAfter is not known: a
	// comparison of two ledgers knows whether their windows close (each
	// ledger stores it) but not after how long. Not in the file.
	WindowsClose bool `json:"-"`
	// Watermark is the latest occurred_at of the records that decode, and
	// ClosedBefore the closing frontier it justifies once every partition
	// is consumed: every window starting before it is closed (its row
	// sealed), every later one open. Both nil without closing.
	Watermark    *time.Time `json:"watermark,omitempty"`
	ClosedBefore *time.Time `json:"closed_before,omitempty"`
	// SplitExact says Windows holds the billing_windows rows and
	// Adjustments the window_adjustments rows, exactly: the run is on one
	// partition, where which events are late does not depend on timing.
	// Otherwise Windows holds, per window, the sum of both tables (each
	// event counts in its window or its adjustment, which one depends on
	// the timing of the partitions), and Adjustments is empty.
	SplitExact bool `json:"split_exact,omitempty"`
	// LedgerEntries says the service writes ledger_entries
	// (LEDGER_ENTRIES=true); EntriesDigest is the digest of the counted
	// events (see EntryDigest).
	LedgerEntries bool   `json:"ledger_entries,omitempty"`
	EntriesDigest uint64 `json:"entries_digest,omitempty"`
	// EventsValid is the number of events counted: the sum of event_count
	// over Balances (and over Windows and Adjustments).
	EventsValid int64 `json:"events_valid"`
	// DeadLetters counts dead_letters rows by reason.
	DeadLetters map[string]int64 `json:"dead_letters"`
	Produced    Produced         `json:"produced"`
	// Params are the generator's flags, for replay.
	Params map[string]string `json:"params,omitempty"`
	// Balances, Windows and Adjustments are sorted by primary key (byte
	// order of the account id, then currency, then window start).
	Balances    []BalanceRow `json:"balances"`
	Windows     []WindowRow  `json:"windows"`
	Adjustments []WindowRow  `json:"adjustments,omitempty"`
}

// Closes reports whether windows close.
func (e *Expected) Closes() bool { return e.CloseAfter > 0 || e.WindowsClose }

// Period is the billing window the file was made for.
func (e *Expected) Period() (Period, error) { return NewPeriod(e.Window, e.Timezone) }

// DeadLetterTotal returns the number of dead letters expected.
func (e *Expected) DeadLetterTotal() int64 {
	var n int64
	for _, c := range e.DeadLetters {
		n += c
	}
	return n
}

// Validate checks the internal consistency of e: version, window, sorted and
// unique keys, aligned windows, positive counts, and that the windows and
// adjustments of each (account, currency) add up to its balance, in amount
// and count, and that all add up to EventsValid. A file that fails Validate
// cannot be compared meaningfully.
func (e *Expected) Validate() error {
	if e.Version != FileVersion && e.Version != 1 {
		return fmt.Errorf("unsupported version %d (want %d or 1)", e.Version, FileVersion)
	}
	p, err := e.Period()
	if err != nil {
		return err
	}
	if e.CloseAfter < 0 {
		return fmt.Errorf("close_after %v is negative", time.Duration(e.CloseAfter))
	}
	if len(e.Adjustments) > 0 && !e.SplitExact {
		return errors.New("adjustments are only listed with split_exact")
	}
	type sum struct{ amount, count int64 }
	sums := make(map[BalanceKey]sum, len(e.Balances))
	var total int64
	for i, b := range e.Balances {
		if i > 0 && compareBalanceKeys(e.Balances[i-1].Key(), b.Key()) >= 0 {
			return fmt.Errorf("balances not sorted or not unique at row %d (%v)", i, b.Key())
		}
		if b.EventCount <= 0 {
			return fmt.Errorf("balance %v: event_count %d is not positive", b.Key(), b.EventCount)
		}
		total += b.EventCount
		sums[b.Key()] = sum{}
	}
	if total != e.EventsValid {
		return fmt.Errorf("balances count %d events, events_valid is %d", total, e.EventsValid)
	}
	total = 0
	for _, table := range []struct {
		name string
		rows []WindowRow
	}{{"windows", e.Windows}, {"adjustments", e.Adjustments}} {
		for i, r := range table.rows {
			if i > 0 && compareWindowKeys(table.rows[i-1].Key(), r.Key()) >= 0 {
				return fmt.Errorf("%s not sorted or not unique at row %d (%v)", table.name, i, r.Key())
			}
			if r.EventCount <= 0 {
				return fmt.Errorf("%s %v: event_count %d is not positive", table.name, r.Key(), r.EventCount)
			}
			if !p.aligned(r.WindowStart) {
				return fmt.Errorf("%s %v: start is not aligned to %v", table.name, r.Key(), p)
			}
			bk := BalanceKey{r.AccountID, r.Currency}
			s, ok := sums[bk]
			if !ok {
				return fmt.Errorf("%s %v has no balance row", table.name, r.Key())
			}
			// Partial sums may leave the int64 range while the total
			// (which is a balance) does not; two's complement wrapping
			// addition is exact modulo 2^64, so the wrapped total is
			// the true total.
			s.amount += r.AmountMinor
			s.count += r.EventCount
			sums[bk] = s
			total += r.EventCount
		}
	}
	if total != e.EventsValid {
		return fmt.Errorf("windows and adjustments count %d events, events_valid is %d", total, e.EventsValid)
	}
	for _, b := range e.Balances {
		s := sums[b.Key()]
		if s.amount != b.BalanceMinor || s.count != b.EventCount {
			return fmt.Errorf("balance %v (%d, %d events) differs from the sum of its windows and adjustments (%d, %d events)",
				b.Key(), b.BalanceMinor, b.EventCount, s.amount, s.count)
		}
	}
	for reason, n := range e.DeadLetters {
		if reason == "" || n < 0 {
			return fmt.Errorf("dead_letters: invalid entry %q: %d", reason, n)
		}
	}
	return nil
}

// Duration is a time.Duration that encodes to JSON as a Go duration string
// ("1h0m0s").
type Duration time.Duration

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("window: %w", err)
	}
	*d = Duration(v)
	return nil
}

// WindowStart returns the start of the tumbling window of the given size
// that contains t: the greatest multiple of size since the Unix epoch that is
// not after t, in UTC. It floors (rather than truncating towards zero), so it
// is also correct before 1970, and it is exact for every time.Time. It panics
// if size is not positive.
func WindowStart(t time.Time, size time.Duration) time.Time {
	if size <= 0 {
		panic("ledgercheck: window size must be positive")
	}
	sec, nsec := t.Unix(), int64(t.Nanosecond()) // 0 <= nsec < 1e9
	if size%time.Second == 0 {
		s := int64(size / time.Second)
		return time.Unix(floorDiv(sec, s)*s, 0).UTC()
	}
	// General case, on the exact nanosecond count (which may not fit in an
	// int64). big.Int's Div and DivMod are Euclidean: for a positive divisor
	// they floor and the modulus is non-negative.
	n := new(big.Int).Mul(big.NewInt(sec), big.NewInt(1e9))
	n.Add(n, big.NewInt(nsec))
	d := big.NewInt(int64(size))
	n.Div(n, d).Mul(n, d)
	s, ns := new(big.Int).DivMod(n, big.NewInt(1e9), new(big.Int))
	return time.Unix(s.Int64(), ns.Int64()).UTC()
}

// floorDiv returns floor(a/b) for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// checkWindow reports whether w is usable as a window size: positive and a
// whole number of microseconds (window_start is a DATETIME(6)).
func checkWindow(w time.Duration) error {
	if w <= 0 || w%time.Microsecond != 0 {
		return fmt.Errorf("window %v must be a positive whole number of microseconds", w)
	}
	return nil
}

// addInt64 returns a+b and true, or 0 and false if the sum overflows int64.
func addInt64(a, b int64) (int64, bool) {
	if (b > 0 && a > math.MaxInt64-b) || (b < 0 && a < math.MinInt64-b) {
		return 0, false
	}
	return a + b, true
}

func compareBalanceKeys(a, b BalanceKey) int {
	return cmp.Or(cmp.Compare(a.AccountID, b.AccountID), cmp.Compare(a.Currency, b.Currency))
}

func compareWindowKeys(a, b WindowKey) int {
	return cmp.Or(cmp.Compare(a.AccountID, b.AccountID), cmp.Compare(a.Currency, b.Currency),
		cmp.Compare(a.StartMicros, b.StartMicros))
}

func sortBalances(rows []BalanceRow) {
	slices.SortFunc(rows, func(a, b BalanceRow) int { return compareBalanceKeys(a.Key(), b.Key()) })
}

func sortWindows(rows []WindowRow) {
	slices.SortFunc(rows, func(a, b WindowRow) int { return compareWindowKeys(a.Key(), b.Key()) })
}

// Merge adds o's tables to e's: o describes events disjoint from e's (say,
// records a test produced beside the generator's). The settings must be the
// same. Rows with the same key are summed; the counts, dead letters and
// entry digests add up; the watermark is the later one; e stays sorted.
// Unless both split their windows exactly, the result holds each window's
// sum (window and adjustment together).
func (e *Expected) Merge(o *Expected) error {
	if e.Window != o.Window || e.Timezone != o.Timezone || e.CloseAfter != o.CloseAfter || e.LedgerEntries != o.LedgerEntries {
		return fmt.Errorf("merge: settings differ (window %s/%s in %q/%q, close after %s/%s, entries %v/%v)",
			e.Window, o.Window, e.Timezone, o.Timezone, time.Duration(e.CloseAfter), time.Duration(o.CloseAfter), e.LedgerEntries, o.LedgerEntries)
	}
	e.EventsValid += o.EventsValid
	e.EntriesDigest += o.EntriesDigest
	if e.DeadLetters == nil {
		e.DeadLetters = map[string]int64{}
	}
	for r, n := range o.DeadLetters {
		e.DeadLetters[r] += n
	}
	if o.Watermark != nil && (e.Watermark == nil || o.Watermark.After(*e.Watermark)) {
		w := *o.Watermark
		e.Watermark = &w
	}
	if o.ClosedBefore != nil && (e.ClosedBefore == nil || o.ClosedBefore.After(*e.ClosedBefore)) {
		f := *o.ClosedBefore
		e.ClosedBefore = &f
	}
	e.Balances = mergeRows(e.Balances, o.Balances, BalanceRow.Key, func(a *BalanceRow, b BalanceRow) {
		a.BalanceMinor += b.BalanceMinor
		a.EventCount += b.EventCount
	})
	addWindow := func(a *WindowRow, b WindowRow) {
		a.AmountMinor += b.AmountMinor
		a.EventCount += b.EventCount
	}
	if e.SplitExact && o.SplitExact {
		e.Adjustments = mergeRows(e.Adjustments, o.Adjustments, WindowRow.Key, addWindow)
	} else {
		e.Windows = mergeRows(e.Windows, e.Adjustments, WindowRow.Key, addWindow)
		e.Windows = mergeRows(e.Windows, o.Adjustments, WindowRow.Key, addWindow)
		e.Adjustments, e.SplitExact = nil, false
	}
	e.Windows = mergeRows(e.Windows, o.Windows, WindowRow.Key, addWindow)
	sortBalances(e.Balances)
	sortWindows(e.Windows)
	sortWindows(e.Adjustments)
	return e.Validate()
}

// mergeRows adds the rows of b to a: a row whose key a has is summed into
// it (add), the others appended.
func mergeRows[R any, K comparable](a, b []R, key func(R) K, add func(*R, R)) []R {
	at := make(map[K]int, len(a))
	for i, r := range a {
		at[key(r)] = i
	}
	for _, r := range b {
		if i, ok := at[key(r)]; ok {
			add(&a[i], r)
		} else {
			a = append(a, r)
		}
	}
	return a
}
