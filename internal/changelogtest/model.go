package changelogtest

import (
	"fmt"
	"maps"
	"slices"

	"github.com/billing/ledger/internal/changelog"
)

// Model is what a read_committed consumer of the changelog holds once it
// has read every committed event: for a table topic the last row of each
// key, for an append-only topic every row. Apply checks each event against
// the spec's chain rule as it goes, so a Model also is the consumer check.
type Model struct {
	rows    map[string]map[string]changelog.Row // table -> encoded key -> row
	appends map[string][]changelog.Row
}

// ChainError is an event that breaks its key's chain: a first event that is
// not c or r, a c or r for a key that already has a row, a u or d whose
// before is not the previous after.
type ChainError struct {
	Table  string
	Key    string // the encoded key
	Reason string
}

func (e *ChainError) Error() string {
	return fmt.Sprintf("changelog chain of %s key %s: %s", e.Table, e.Key, e.Reason)
}

// NewModel returns an empty model: a consumer that has read nothing.
func NewModel() *Model {
	return &Model{rows: map[string]map[string]changelog.Row{}, appends: map[string][]changelog.Row{}}
}

// Clone returns an independent copy (rows are shared: Apply never changes
// a row in place).
func (m *Model) Clone() *Model {
	c := NewModel()
	for t, rows := range m.rows {
		c.rows[t] = maps.Clone(rows)
	}
	for t, rows := range m.appends {
		c.appends[t] = slices.Clone(rows)
	}
	return c
}

// Apply applies one committed event, or returns why the event cannot follow
// the ones applied before (Encode's errors, or a *ChainError).
func (m *Model) Apply(ev changelog.Event) error {
	if _, _, err := changelog.Encode(ev); err != nil {
		return err
	}
	t, _ := changelog.Lookup(ev.Table)
	if t.Append {
		m.appends[t.Name] = append(m.appends[t.Name], ev.After)
		return nil
	}
	keyRow := ev.After
	if ev.Op == changelog.OpDelete {
		keyRow = ev.Before
	}
	key, _ := changelog.KeyOf(t, keyRow)
	held, ok := m.rows[t.Name][key]
	chain := func(reason string) error { return &ChainError{Table: t.Name, Key: key, Reason: reason} }
	switch ev.Op {
	case changelog.OpCreate, changelog.OpRead:
		if ok {
			return chain(fmt.Sprintf("op %s for a key that holds a row", ev.Op))
		}
	case changelog.OpUpdate, changelog.OpDelete:
		if !ok {
			return chain(fmt.Sprintf("op %s for a key without a row", ev.Op))
		}
		hb, _ := changelog.Canonical(t, held)
		bb, _ := changelog.Canonical(t, ev.Before)
		if hb != bb {
			return chain(fmt.Sprintf("before %s is not the previous after %s", bb, hb))
		}
	}
	if m.rows[t.Name] == nil {
		m.rows[t.Name] = map[string]changelog.Row{}
	}
	if ev.Op == changelog.OpDelete {
		delete(m.rows[t.Name], key)
	} else {
		m.rows[t.Name][key] = ev.After
	}
	return nil
}

// Get returns the row the key columns of key name, if the table holds one.
func (m *Model) Get(table string, key changelog.Row) (changelog.Row, bool) {
	t, ok := changelog.Lookup(table)
	if !ok {
		return nil, false
	}
	k, err := changelog.KeyOf(t, key)
	if err != nil {
		return nil, false
	}
	r, ok := m.rows[table][k]
	return r, ok
}

// Canonical returns the table's rows (Canonical forms) in sorted order: the
// final rows of a table topic, every row of an append-only one.
func (m *Model) Canonical(table string) []string {
	t, _ := changelog.Lookup(table)
	var rows []changelog.Row
	if t.Append {
		rows = m.appends[table]
	} else {
		rows = slices.Collect(maps.Values(m.rows[table]))
	}
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		c, _ := changelog.Canonical(t, r) // every row was encoded by Apply
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// Diff compares two multisets of rows (Canonical forms) and describes the
// rows missing from got and the rows got has in excess, at most limit of
// each; nil when they are equal.
func Diff(want, got []string, limit int) []string {
	count := map[string]int{}
	for _, w := range want {
		count[w]++
	}
	for _, g := range got {
		count[g]--
	}
	var missing, extra []string
	for _, k := range slices.Sorted(maps.Keys(count)) {
		for n := count[k]; n > 0; n-- {
			missing = append(missing, "missing: "+k)
		}
		for n := count[k]; n < 0; n++ {
			extra = append(extra, "unexpected: "+k)
		}
	}
	trim := func(s []string) []string {
		if len(s) > limit {
			return append(s[:limit:limit], fmt.Sprintf("... and %d more", len(s)-limit))
		}
		return s
	}
	return append(trim(missing), trim(extra)...)
}
