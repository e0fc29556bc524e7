package ledgercheck

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Table names, as used in [Diff.Table].
const (
	TableBalances    = "account_balances"
	TableWindows     = "billing_windows"
	TableDeadLetters = "dead_letters"
)

// Actual is what the service's tables hold, possibly read from several
// servers (Shard is the index of the server a row was read from).
type Actual struct {
	Balances    []ActualBalance
	Windows     []ActualWindow
	DeadLetters []DeadLetterRow
}

// ActualBalance is a balance row and the server it was read from.
type ActualBalance struct {
	BalanceRow
	Shard int
}

// ActualWindow is a window row and the server it was read from.
type ActualWindow struct {
	WindowRow
	Shard int
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
}

// Exact reports whether the tables match the expectation exactly.
func (r *Report) Exact() bool { return len(r.Diffs) == 0 }

// Verdict returns the one-line summary: "EXACT: ..." or "MISMATCH: ...".
func (r *Report) Verdict() string {
	if r.Exact() {
		return fmt.Sprintf("EXACT: %d balances, %d windows, %d dead letters, %d events",
			r.ActualBalances, r.ActualWindows, r.ActualDeadLetters, r.ActualEvents)
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

	// Windows.
	expW := make(map[WindowKey]WindowRow, len(exp.Windows))
	for _, w := range exp.Windows {
		expW[w.Key()] = w
		r.ExpectedWindowEvents += w.EventCount
	}
	actW := make(map[WindowKey]*merged, len(act.Windows))
	for _, w := range act.Windows {
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
	r.ActualWindows = len(actW)
	for _, k := range unionKeys(expW, actW, compareWindowKeys) {
		e, inExp := expW[k]
		a := actW[k]
		d, lost, twice := diffRow(TableWindows, k.String(), inExp, e.AmountMinor, e.EventCount, a)
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
			r.Diffs = append(r.Diffs, Diff{Table: TableWindows, Kind: DuplicateRow, Key: k.String(), Note: shardNote(a.shards)})
		}
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

// diffRow compares one key's expected row (if inExp) with its merged actual
// rows (a, nil if absent) and returns the difference, if any, and the events
// lost and counted twice.
func diffRow(table, key string, inExp bool, expAmount, expCount int64, a *merged) (d *Diff, lost, twice int64) {
	switch {
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
