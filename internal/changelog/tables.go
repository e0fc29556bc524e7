package changelog

import "slices"

// Kind is the kind of a column's values and fixes their JSON form.
type Kind int

const (
	// String columns (VARBINARY, VARCHAR, CHAR) hold valid UTF-8 and are
	// JSON strings.
	String Kind = iota
	// Int columns (BIGINT, INT) are JSON numbers that fit in int64.
	Int
	// Bool columns (BOOLEAN) are JSON true or false.
	Bool
	// Time columns (DATETIME(6)) are ISO-8601 UTC strings with
	// microseconds and Z, e.g. "2026-11-29T13:05:00.000000Z".
	Time
)

// TimeLayout is the text of a Time value.
const TimeLayout = "2006-01-02T15:04:05.000000Z"

// Column is one column of a table.
type Column struct {
	Name     string
	Kind     Kind
	Nullable bool
	// Added: the column came after the table's first columns, last, with
	// a zero default (0, false, an empty string): a binary row written
	// before it (an outbox row of an older version) ends before it, and
	// reads as that default.
	Added bool
}

// Table is one of the changelog's topics: the table's columns in their
// order, the primary key in its order, and whether the topic is
// append-only (op c, or r from a snapshot; one event per row) rather than
// the table's change stream (one chain of events per key).
type Table struct {
	ID      TableID
	Name    string
	Columns []Column
	Key     []string
	Append  bool

	keyIdx []int    // Key's columns, by index
	names  [][]byte // each column's name as JSON, with its colon
}

// TableID numbers the tables in the binary encoding of the outbox.
type TableID uint8

// The tables, in the order of Tables.
const (
	TBalances TableID = iota
	TWindows
	TAdjustments
	TClosedWindows
	TEntries
	numTables
)

// The tables' names (and their topics' suffixes).
const (
	AccountBalances   = "account_balances"
	BillingWindows    = "billing_windows"
	WindowAdjustments = "window_adjustments"
	ClosedWindows     = "closed_windows"
	LedgerEntries     = "ledger_entries"
)

// The column positions the publisher reads in every row of a table (see
// version): the same in every table that has them.
const (
	colAccount    = 0 // account_id, in every table but ledger_entries
	colEventCount = 4 // event_count, in the three sums tables
	colClosedAt   = 6 // closed_at, in billing_windows and closed_windows
	colEntryAcct  = 4 // account_id in ledger_entries
)

var tables = buildTables()

func buildTables() [numTables]Table {
	s := func(n string) Column { return Column{Name: n, Kind: String} }
	i := func(n string) Column { return Column{Name: n, Kind: Int} }
	t := func(n string) Column { return Column{Name: n, Kind: Time} }
	window := func() []Column {
		return []Column{s("account_id"), s("currency"), t("window_start"), i("amount_minor"),
			i("event_count"), t("updated_at"), {Name: "closed_at", Kind: Time, Nullable: true}}
	}
	windowKey := []string{"account_id", "currency", "window_start"}
	out := [numTables]Table{
		{ID: TBalances, Name: AccountBalances, Columns: []Column{s("account_id"), s("currency"), i("balance_minor"),
			i("event_count"), t("updated_at")}, Key: []string{"account_id", "currency"}},
		{ID: TWindows, Name: BillingWindows, Columns: window(), Key: windowKey},
		{ID: TAdjustments, Name: WindowAdjustments, Columns: []Column{s("account_id"), s("currency"), t("window_start"),
			i("amount_minor"), i("event_count"), t("updated_at"),
			{Name: "checkpoint_id", Kind: String, Nullable: true}}, Key: slices.Clone(windowKey)},
		{ID: TClosedWindows, Name: ClosedWindows, Columns: window(), Key: slices.Clone(windowKey), Append: true},
		// entry and revision: a version's entries (migration 00011,
		// docs/corrections.md), 0 in every entry of an original.
		{ID: TEntries, Name: LedgerEntries, Columns: []Column{s("kafka_topic"), i("kafka_partition"), i("kafka_offset"),
			s("event_id"), s("account_id"), s("currency"), i("amount_minor"), t("occurred_at"),
			t("window_start"), {Name: "late", Kind: Bool}, s("checkpoint_id"), t("created_at"),
			{Name: "entry", Kind: Int, Added: true}, {Name: "revision", Kind: Int, Added: true}},
			Key: []string{"kafka_topic", "kafka_partition", "kafka_offset", "entry"}, Append: true},
	}
	for i := range out {
		tb := &out[i]
		for _, c := range tb.Columns {
			n, _ := appendJSONString(nil, c.Name)
			tb.names = append(tb.names, append(n, ':'))
		}
		for _, k := range tb.Key {
			tb.keyIdx = append(tb.keyIdx, slices.IndexFunc(tb.Columns, func(c Column) bool { return c.Name == k }))
		}
	}
	return out
}

// Tables returns the spec's tables (a new slice every call).
func Tables() []Table {
	out := make([]Table, numTables)
	for i, t := range tables {
		out[i] = t
		out[i].Columns, out[i].Key = slices.Clone(t.Columns), slices.Clone(t.Key)
	}
	return out
}

// Lookup returns the spec's table of that name.
func Lookup(name string) (Table, bool) {
	for _, t := range tables {
		if t.Name == name {
			return t, true
		}
	}
	return Table{}, false
}

// ByID returns the table numbered id.
func ByID(id TableID) (Table, bool) {
	if id >= numTables {
		return Table{}, false
	}
	return tables[id], true
}

// column returns the column called name (the tables are fixed: a missing
// column is a bug here).
func (t Table) column(name string) (int, Column) {
	for i, c := range t.Columns {
		if c.Name == name {
			return i, c
		}
	}
	panic("changelog: table " + t.Name + " has no column " + name)
}
