package ledgercheck

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Table names, as used in [Diff.Table].
const (
	TableBalances    = "account_balances"
	TableWindows     = "billing_windows"
	TableAdjustments = "window_adjustments"
	TableDeadLetters = "dead_letters"
	TableEntries     = "ledger_entries"
	// TableWindowSums names the sums of billing_windows and
	// window_adjustments per window, compared when the split between the
	// two depends on timing.
	TableWindowSums = "billing_windows+window_adjustments"
)

// Actual is what the service's tables hold, possibly read from several
// servers (Shard is the index of the server a row was read from).
type Actual struct {
	Balances    []ActualBalance
	Windows     []ActualWindow
	Adjustments []ActualWindow
	DeadLetters []DeadLetterRow
	// Entries summarises ledger_entries; nil when not read.
	Entries *Entries
}

// Entries summarises the ledger_entries rows (see ReadEntries).
type Entries struct {
	// Count is the number of rows, a version's retraction counting -1
	// (the events the entries count), DistinctIDs that of the event ids
	// whose entries count 1, Unbalanced that of those whose entries count
	// neither 0 nor 1; Digest is the sum of EntryDigest over the rows, a
	// retraction's taken back (the digest of the entry it retracts).
	Count, DistinctIDs, Unbalanced int64
	Digest                         uint64
	// Timely and Late sum, per window, the entries counted in
	// billing_windows and those counted in window_adjustments.
	Timely, Late map[WindowKey]Sum
}

// Sum is an amount and an event count.
type Sum struct{ Amount, Count int64 }

// ActualBalance is a balance row and the server it was read from.
type ActualBalance struct {
	BalanceRow
	Shard int
}

// ActualWindow is a window (or adjustment) row and the server it was read
// from; for billing_windows, when it was sealed (nil: open) and last
// updated.
type ActualWindow struct {
	WindowRow
	Shard     int
	ClosedAt  *time.Time
	UpdatedAt time.Time
}

// DeadLetterRow identifies one dead_letters row: its Kafka position (unique
// per server) and reason.
type DeadLetterRow struct {
	Shard     int
	Topic     string
	Partition int32
	Offset    int64
	Reason    string
}

// DiffKind classifies a [Diff].
type DiffKind int

// Kinds of difference.
const (
	// Missing: an expected row (or dead-letter reason) is absent.
	Missing DiffKind = iota + 1
	// Extra: a row (or reason) is present that is not expected.
	Extra
	// Different: the row exists on both sides with different values.
	Different
	// DuplicateRow: the same primary key (or Kafka position, for dead
	// letters) was read from more than one server. Values of the copies are
	// summed for the other comparisons.
	DuplicateRow
	// Violation: an invariant of the contract does not hold (a window
	// sealed or open against the frontier, a sealed row changed, ledger
	// entries disagreeing with the sums); Note says which.
	Violation
)

// String returns the kind's name.
func (k DiffKind) String() string {
	switch k {
	case Missing:
		return "missing"
	case Extra:
		return "extra"
	case Different:
		return "different"
	case DuplicateRow:
		return "duplicate"
	case Violation:
		return "violation"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Diff is one difference between the expected and the actual tables. For
// dead letters Key is the reason and only the counts are used.
type Diff struct {
	Table string
	Kind  DiffKind
	Key   string
	// Expected and actual amount and event count (dead letters: count).
	ExpAmount, ExpCount int64
	ActAmount, ActCount int64
	// Note adds detail (the servers holding a duplicated row).
	Note string
}

// String formats d on one line.
func (d Diff) String() string {
	val := func(amount, count int64) string {
		switch d.Table {
		case TableDeadLetters:
			return fmt.Sprintf("%d", count)
		case TableBalances:
			return fmt.Sprintf("balance %d, %d %s", amount, count, plural(count, "event"))
		}
		return fmt.Sprintf("amount %d, %d %s", amount, count, plural(count, "event"))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-9s %s %s: ", d.Kind, d.Table, d.Key)
	switch d.Kind {
	case Missing:
		fmt.Fprintf(&b, "expected %s, actual none", val(d.ExpAmount, d.ExpCount))
	case Extra:
		fmt.Fprintf(&b, "expected none, actual %s", val(d.ActAmount, d.ActCount))
	case Different:
		fmt.Fprintf(&b, "expected %s, actual %s", val(d.ExpAmount, d.ExpCount), val(d.ActAmount, d.ActCount))
		if d.Table != TableDeadLetters {
			switch delta := d.ActCount - d.ExpCount; {
			case delta < 0:
				fmt.Fprintf(&b, " (lost %d)", -delta)
			case delta > 0:
				fmt.Fprintf(&b, " (counted twice %d)", delta)
			default:
				b.WriteString(" (amount only)")
			}
		}
	case DuplicateRow:
		b.WriteString("present more than once")
	case Violation:
		b.WriteString("invariant broken")
	}
	if d.Note != "" {
		fmt.Fprintf(&b, " [%s]", d.Note)
	}
	return b.String()
}

// Report is the result of [Compare].
type Report struct {
	// Diffs in reporting order: balances, windows, dead letters, each by key.
	Diffs []Diff

	// Row counts and totals on each side. ActualEvents sums event_count
	// over balances, ActualWindowEvents over windows.
	ExpectedBalances, ExpectedWindows        int
	ExpectedDeadLetters, ExpectedEvents      int64
	ActualBalances, ActualWindows            int
	ActualDeadLetters, ActualEvents          int64
	ExpectedWindowEvents, ActualWindowEvents int64

	// Lost and CountedTwice sum, over balance rows, the events counted
	// fewer (missing rows count fully) and more times (extra rows count
	// fully) than expected. An event booked under the wrong key shows as
	// one of each.
	Lost, CountedTwice int64
	// WindowLost and WindowCountedTwice are the same over window rows; they
	// differ from Lost and CountedTwice when events are in the wrong window.
	WindowLost, WindowCountedTwice int64
	// BalanceAmountDiffs and WindowAmountDiffs count rows whose event count
	// is right but whose amount is not.
	BalanceAmountDiffs, WindowAmountDiffs int
	// DeadLettersMissing and DeadLettersExtra sum, over reasons, the dead
	// letters fewer and more than expected.
	DeadLettersMissing, DeadLettersExtra int64
	// Duplicates counts rows read from more than one server.
	Duplicates int
	// Violations counts broken invariants (see [Violation]).
	Violations int
	// ActualAdjustments and ActualSealed count window_adjustments rows and
	// sealed billing_windows rows; ActualEntries ledger_entries rows (-1:
	// not read).
	ActualAdjustments, ActualSealed int
	ActualEntries                   int64
}

// Exact reports whether the tables match the expectation exactly.
func (r *Report) Exact() bool { return len(r.Diffs) == 0 }

// Verdict returns the one-line summary: "EXACT: ..." or "MISMATCH: ...".
func (r *Report) Verdict() string {
	if r.Exact() {
		v := fmt.Sprintf("EXACT: %d balances, %d windows, %d dead letters, %d events",
			r.ActualBalances, r.ActualWindows, r.ActualDeadLetters, r.ActualEvents)
		if r.ActualAdjustments > 0 || r.ActualSealed > 0 {
			v += fmt.Sprintf(", %d sealed windows, %d adjustments", r.ActualSealed, r.ActualAdjustments)
		}
		if r.ActualEntries >= 0 {
			v += fmt.Sprintf(", %d ledger entries", r.ActualEntries)
		}
		return v
	}
	var parts []string
	add := func(format string, n int64, what string) {
		if n != 0 {
			parts = append(parts, fmt.Sprintf(format, n, plural(n, what)))
		}
	}
	add("lost %d %s", r.Lost, "event")
	add("counted twice %d %s", r.CountedTwice, "event")
	add("%d %s with a wrong amount", int64(r.BalanceAmountDiffs), "balance")
	if r.WindowLost != r.Lost || r.WindowCountedTwice != r.CountedTwice {
		// Events in the wrong window, or windows disagreeing with balances.
		parts = append(parts, fmt.Sprintf("windows: lost %d, counted twice %d %s",
			r.WindowLost, r.WindowCountedTwice, plural(r.WindowCountedTwice, "event")))
	}
	add("%d %s with a wrong amount", int64(r.WindowAmountDiffs), "window")
	add("%d dead %s missing", r.DeadLettersMissing, "letter")
	add("%d extra dead %s", r.DeadLettersExtra, "letter")
	add("%d %s on more than one server", int64(r.Duplicates), "row")
	add("%d broken %s", int64(r.Violations), "invariant")
	return fmt.Sprintf("MISMATCH: %d %s (%s); actual %d balances, %d windows, %d dead letters, %d events; expected %d, %d, %d, %d",
		len(r.Diffs), plural(int64(len(r.Diffs)), "difference"), strings.Join(parts, ", "),
		r.ActualBalances, r.ActualWindows, r.ActualDeadLetters, r.ActualEvents,
		r.ExpectedBalances, r.ExpectedWindows, r.ExpectedDeadLetters, r.ExpectedEvents)
}

func plural(n int64, s string) string {
	if n == 1 || n == -1 {
		return s
	}
	return s + "s"
}

// WriteDiffs writes the first max differences (all if max <= 0), one per
// line, and a line saying how many were left out.
func (r *Report) WriteDiffs(w io.Writer, max int) error {
	n := len(r.Diffs)
	if max > 0 && n > max {
		n = max
	}
	for _, d := range r.Diffs[:n] {
		if _, err := fmt.Fprintln(w, d); err != nil {
			return fmt.Errorf("write differences: %w", err)
		}
	}
	if n < len(r.Diffs) {
		if _, err := fmt.Fprintf(w, "... and %d more differences\n", len(r.Diffs)-n); err != nil {
			return fmt.Errorf("write differences: %w", err)
		}
	}
	return nil
}

// merged is the union of one key's actual rows over servers.
type merged struct {
	amount, count int64
	shards        []int
}

// Compare diffs act against exp: every balance and window row by primary
// key (amount and event count), and dead letters by count per reason. Rows
// read from several servers are unioned; a key present on more than one
// server is reported as [DuplicateRow] and its copies are summed (amounts
// with wrapping arithmetic, which only matters for rows that are wrong
// anyway). The result does not retain exp or act.
func Compare(exp *Expected, act *Actual) *Report {
	r := &Report{
		ExpectedBalances:    len(exp.Balances),
		ExpectedWindows:     len(exp.Windows),
		ExpectedDeadLetters: exp.DeadLetterTotal(),
		ExpectedEvents:      exp.EventsValid,
	}

	// Balances.
	expB := make(map[BalanceKey]BalanceRow, len(exp.Balances))
	for _, b := range exp.Balances {
		expB[b.Key()] = b
	}
	actB := make(map[BalanceKey]*merged, len(act.Balances))
	for _, b := range act.Balances {
		m := actB[b.Key()]
		if m == nil {
			m = &merged{}
			actB[b.Key()] = m
		}
		m.amount += b.BalanceMinor
		m.count += b.EventCount
		m.shards = append(m.shards, b.Shard)
		r.ActualEvents += b.EventCount
	}
	r.ActualBalances = len(actB)
	bkeys := unionKeys(expB, actB, compareBalanceKeys)
	for _, k := range bkeys {
		e, inExp := expB[k]
		a := actB[k]
		d, lost, twice := diffRow(TableBalances, k.String(), inExp, e.BalanceMinor, e.EventCount, a)
		r.Lost += lost
		r.CountedTwice += twice
		if d != nil {
			if d.Kind == Different && d.ActCount == d.ExpCount {
				r.BalanceAmountDiffs++
			}
			r.Diffs = append(r.Diffs, *d)
		}
		if a != nil && len(a.shards) > 1 {
			r.Duplicates++
			r.Diffs = append(r.Diffs, Diff{Table: TableBalances, Kind: DuplicateRow, Key: k.String(), Note: shardNote(a.shards)})
		}
	}

	// Windows: each table exactly, or their sums per window.
	if exp.SplitExact || !exp.Closes() {
		r.compareWindows(TableWindows, exp.Windows, act.Windows)
		r.compareWindows(TableAdjustments, exp.Adjustments, act.Adjustments)
	} else {
		r.compareWindows(TableWindowSums, exp.Windows, sumWindows(act.Windows, act.Adjustments))
	}
	r.ActualAdjustments = len(act.Adjustments)
	for _, w := range act.Windows {
		if w.ClosedAt != nil {
			r.ActualSealed++
		}
	}
	r.checkClosing(exp, act)
	r.ActualEntries = -1
	if exp.LedgerEntries && act.Entries != nil {
		r.ActualEntries = act.Entries.Count
		r.checkEntries(exp, act)
	}

	// Dead letters: counts per reason, plus positions seen on two servers.
	type pos struct {
		topic     string
		partition int32
		offset    int64
	}
	seen := make(map[pos][]int, len(act.DeadLetters))
	actD := make(map[string]int64)
	for _, d := range act.DeadLetters {
		p := pos{d.Topic, d.Partition, d.Offset}
		seen[p] = append(seen[p], d.Shard)
		actD[d.Reason]++
		r.ActualDeadLetters++
	}
	var dups []Diff
	for p, shards := range seen {
		if len(shards) > 1 {
			r.Duplicates++
			dups = append(dups, Diff{Table: TableDeadLetters, Kind: DuplicateRow,
				Key: fmt.Sprintf("%s/%d@%d", p.topic, p.partition, p.offset), Note: shardNote(shards)})
		}
	}
	slices.SortFunc(dups, func(a, b Diff) int { return cmp.Compare(a.Key, b.Key) })
	reasons := make([]string, 0, len(exp.DeadLetters)+len(actD))
	for k, n := range exp.DeadLetters {
		if n != 0 {
			reasons = append(reasons, k)
		}
	}
	for k := range actD {
		if exp.DeadLetters[k] == 0 {
			reasons = append(reasons, k)
		}
	}
	slices.Sort(reasons)
	for _, reason := range reasons {
		e, a := exp.DeadLetters[reason], actD[reason]
		switch {
		case e == a:
			continue
		case a == 0:
			r.Diffs = append(r.Diffs, Diff{Table: TableDeadLetters, Kind: Missing, Key: reason, ExpCount: e})
		case e == 0:
			r.Diffs = append(r.Diffs, Diff{Table: TableDeadLetters, Kind: Extra, Key: reason, ActCount: a})
		default:
			r.Diffs = append(r.Diffs, Diff{Table: TableDeadLetters, Kind: Different, Key: reason, ExpCount: e, ActCount: a})
		}
		if a < e {
			r.DeadLettersMissing += e - a
		} else {
			r.DeadLettersExtra += a - e
		}
	}
	r.Diffs = append(r.Diffs, dups...)
	return r
}

// compareWindows diffs one table of window rows (or the sums of two)
// against the expected rows, by key.
func (r *Report) compareWindows(table string, exp []WindowRow, act []ActualWindow) {
	expW := make(map[WindowKey]WindowRow, len(exp))
	for _, w := range exp {
		expW[w.Key()] = w
		r.ExpectedWindowEvents += w.EventCount
	}
	actW := make(map[WindowKey]*merged, len(act))
	for _, w := range act {
		m := actW[w.Key()]
		if m == nil {
			m = &merged{}
			actW[w.Key()] = m
		}
		m.amount += w.AmountMinor
		m.count += w.EventCount
		m.shards = append(m.shards, w.Shard)
		r.ActualWindowEvents += w.EventCount
	}
	if table != TableAdjustments {
		r.ActualWindows += len(actW)
		r.ExpectedWindows = len(exp)
	}
	for _, k := range unionKeys(expW, actW, compareWindowKeys) {
		e, inExp := expW[k]
		a := actW[k]
		d, lost, twice := diffRow(table, k.String(), inExp, e.AmountMinor, e.EventCount, a)
		r.WindowLost += lost
		r.WindowCountedTwice += twice
		if d != nil {
			if d.Kind == Different && d.ActCount == d.ExpCount {
				r.WindowAmountDiffs++
			}
			r.Diffs = append(r.Diffs, *d)
		}
		if a != nil && len(a.shards) > 1 {
			r.Duplicates++
			r.Diffs = append(r.Diffs, Diff{Table: table, Kind: DuplicateRow, Key: k.String(), Note: shardNote(a.shards)})
		}
	}
}

// sumWindows adds each server's adjustment rows to its window rows of the
// same key: one row per key and server.
func sumWindows(windows, adjusts []ActualWindow) []ActualWindow {
	type at struct {
		k     WindowKey
		shard int
	}
	idx := make(map[at]int, len(windows))
	out := make([]ActualWindow, 0, len(windows)+len(adjusts))
	for _, w := range windows {
		idx[at{w.Key(), w.Shard}] = len(out)
		out = append(out, w)
	}
	for _, a := range adjusts {
		if i, ok := idx[at{a.Key(), a.Shard}]; ok {
			out[i].AmountMinor += a.AmountMinor
			out[i].EventCount += a.EventCount
			continue
		}
		idx[at{a.Key(), a.Shard}] = len(out)
		out = append(out, a)
	}
	return out
}

func (r *Report) violation(table, key, note string) {
	r.Violations++
	r.Diffs = append(r.Diffs, Diff{Table: table, Kind: Violation, Key: key, Note: note})
}

// checkClosing checks the closing invariants. Without closing, no row is
// sealed and no adjustment exists. With it, once the run is consumed,
// every window before the expected frontier is sealed and every later one
// open; adjustments exist only for windows before it; and a sealed row
// was not changed after it was sealed (sealing sets updated_at to
// closed_at; any later write would move updated_at).
func (r *Report) checkClosing(exp *Expected, act *Actual) {
	if !exp.Closes() {
		for _, w := range act.Windows {
			if w.ClosedAt != nil {
				r.violation(TableWindows, w.Key().String(), "sealed, but windows never close (WINDOW_CLOSE_AFTER empty)")
			}
		}
		for _, a := range act.Adjustments {
			r.violation(TableAdjustments, a.Key().String(), "an adjustment, but windows never close (WINDOW_CLOSE_AFTER empty)")
		}
		return
	}
	// Without an expected frontier (a ledger compared with another, not
	// with a run), only what holds of each row is checked.
	known := exp.ClosedBefore != nil
	var frontier time.Time
	if known {
		frontier = *exp.ClosedBefore
	}
	f := frontier.UTC().Format(time.RFC3339)
	for _, w := range act.Windows {
		closed := w.WindowStart.Before(frontier)
		switch {
		case known && closed && w.ClosedAt == nil:
			r.violation(TableWindows, w.Key().String(), "open, but every window before "+f+" is closed")
		case known && !closed && w.ClosedAt != nil:
			r.violation(TableWindows, w.Key().String(), "sealed, but windows from "+f+" on are open")
		case w.ClosedAt != nil && !w.UpdatedAt.Equal(*w.ClosedAt):
			r.violation(TableWindows, w.Key().String(), fmt.Sprintf("updated at %s, after it was sealed at %s",
				w.UpdatedAt.UTC().Format(time.RFC3339Nano), w.ClosedAt.UTC().Format(time.RFC3339Nano)))
		}
	}
	for _, a := range act.Adjustments {
		if known && !a.WindowStart.Before(frontier) {
			r.violation(TableAdjustments, a.Key().String(), "an adjustment of a window that is open (from "+f+" on)")
		}
	}
}

// checkEntries checks ledger_entries: one row per counted event, and
// for each version that changed one a retraction and an addition (count,
// distinct ids, the digest of their content, a retraction taking back
// the entry it retracts), and, per window, the entries counted in it sum
// to its billing_windows row and the late ones to its window_adjustments
// row (a retraction counting -1 event).
func (r *Report) checkEntries(exp *Expected, act *Actual) {
	en := act.Entries
	if en.Count != exp.EventsValid {
		r.Diffs = append(r.Diffs, Diff{Table: TableEntries, Kind: Different, Key: "rows", ExpCount: exp.EventsValid, ActCount: en.Count})
	}
	if en.DistinctIDs != en.Count || en.Unbalanced != 0 {
		r.violation(TableEntries, "event_id", fmt.Sprintf("the entries count %d events of %d distinct event ids, %d ids counted neither once nor not at all: an event has more than one entry", en.Count, en.DistinctIDs, en.Unbalanced))
	}
	if en.Digest != exp.EntriesDigest {
		r.Diffs = append(r.Diffs, Diff{Table: TableEntries, Kind: Different, Key: "digest",
			Note: fmt.Sprintf("digest of the entries %016x, of the counted events %016x: an entry's content differs from its event", en.Digest, exp.EntriesDigest)})
	}
	for _, t := range []struct {
		table string
		rows  []ActualWindow
		sums  map[WindowKey]Sum
		what  string
	}{{TableWindows, act.Windows, en.Timely, "entries counted in the window"}, {TableAdjustments, act.Adjustments, en.Late, "late entries"}} {
		rows := make(map[WindowKey]Sum, len(t.rows))
		for _, w := range t.rows {
			s := rows[w.Key()]
			rows[w.Key()] = Sum{s.Amount + w.AmountMinor, s.Count + w.EventCount}
		}
		for _, k := range unionKeys(rows, t.sums, compareWindowKeys) {
			if a, b := rows[k], t.sums[k]; a != b {
				r.violation(t.table, k.String(), fmt.Sprintf("the row holds %d over %d events, its %s %d over %d", a.Amount, a.Count, t.what, b.Amount, b.Count))
			}
		}
	}
}

// diffRow compares one key's expected row (if inExp) with its merged actual
// rows (a, nil if absent) and returns the difference, if any, and the events
// lost and counted twice.
//
// A row that holds nothing (0 over 0 events) equals no row: whether a
// corrected event leaves one depends on the order its versions came in
// (an amendment that moved it elsewhere leaves its old row at zero; the
// same versions in the other order never create that row).
func diffRow(table, key string, inExp bool, expAmount, expCount int64, a *merged) (d *Diff, lost, twice int64) {
	switch {
	case inExp && a == nil && expAmount == 0 && expCount == 0, !inExp && a != nil && a.amount == 0 && a.count == 0:
		return nil, 0, 0
	case inExp && a == nil:
		return &Diff{Table: table, Kind: Missing, Key: key, ExpAmount: expAmount, ExpCount: expCount}, expCount, 0
	case !inExp:
		return &Diff{Table: table, Kind: Extra, Key: key, ActAmount: a.amount, ActCount: a.count}, 0, a.count
	case a.amount == expAmount && a.count == expCount:
		return nil, 0, 0
	}
	d = &Diff{Table: table, Kind: Different, Key: key, ExpAmount: expAmount, ExpCount: expCount, ActAmount: a.amount, ActCount: a.count}
	if a.count < expCount {
		lost = expCount - a.count
	} else {
		twice = a.count - expCount
	}
	return d, lost, twice
}

// unionKeys returns the keys of both maps, sorted by cmpKeys.
func unionKeys[K comparable, V1, V2 any](a map[K]V1, b map[K]V2, cmpKeys func(K, K) int) []K {
	keys := make([]K, 0, len(a)+len(b))
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, cmpKeys)
	return keys
}

func shardNote(shards []int) string {
	s := make([]string, len(shards))
	for i, n := range shards {
		s[i] = fmt.Sprintf("%d", n)
	}
	return "servers " + strings.Join(s, ", ")
}
