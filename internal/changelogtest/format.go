package changelogtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

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
}

// Table is one of the changelog's topics: the table's columns in their
// order, the primary key in its order, and whether the topic is
// append-only (op c only, one event per row) rather than the table's change
// stream (one chain of events per key).
type Table struct {
	Name    string
	Columns []Column
	Key     []string
	Append  bool
}

// The spec's tables.
const (
	AccountBalances   = "account_balances"
	BillingWindows    = "billing_windows"
	WindowAdjustments = "window_adjustments"
	ClosedWindows     = "closed_windows"
	LedgerEntries     = "ledger_entries"
)

// Tables returns the spec's tables (a new slice every call).
func Tables() []Table {
	s := func(n string) Column { return Column{Name: n, Kind: String} }
	i := func(n string) Column { return Column{Name: n, Kind: Int} }
	t := func(n string) Column { return Column{Name: n, Kind: Time} }
	window := func() []Column {
		return []Column{s("account_id"), s("currency"), t("window_start"), i("amount_minor"),
			i("event_count"), t("updated_at"), {Name: "closed_at", Kind: Time, Nullable: true}}
	}
	windowKey := []string{"account_id", "currency", "window_start"}
	return []Table{
		{Name: AccountBalances, Columns: []Column{s("account_id"), s("currency"), i("balance_minor"),
			i("event_count"), t("updated_at")}, Key: []string{"account_id", "currency"}},
		{Name: BillingWindows, Columns: window(), Key: windowKey},
		{Name: WindowAdjustments, Columns: []Column{s("account_id"), s("currency"), t("window_start"),
			i("amount_minor"), i("event_count"), t("updated_at"),
			{Name: "checkpoint_id", Kind: String, Nullable: true}}, Key: slices.Clone(windowKey)},
		{Name: ClosedWindows, Columns: window(), Key: slices.Clone(windowKey), Append: true},
		{Name: LedgerEntries, Columns: []Column{s("kafka_topic"), i("kafka_partition"), i("kafka_offset"),
			s("event_id"), s("account_id"), s("currency"), i("amount_minor"), t("occurred_at"),
			t("window_start"), {Name: "late", Kind: Bool}, s("checkpoint_id"), t("created_at")},
			Key: []string{"kafka_topic", "kafka_partition", "kafka_offset"}, Append: true},
	}
}

// Lookup returns the spec's table of that name.
func Lookup(name string) (Table, bool) {
	for _, t := range Tables() {
		if t.Name == name {
			return t, true
		}
	}
	return Table{}, false
}

// Row is a table row by column name: string for String, int64 for Int,
// bool for Bool, time.Time for Time, nil for NULL.
type Row map[string]any

// Op is an event's op.
type Op string

// The ops of the spec; the current tables never emit OpDelete.
const (
	OpCreate Op = "c"
	OpUpdate Op = "u"
	OpDelete Op = "d"
	OpRead   Op = "r"
)

// Source is the envelope's source block, apart from what Encode fills in
// (connector, table).
type Source struct {
	Version    string
	Name       string // the topic prefix
	Ledger     string
	Checkpoint string // the gtrid
	CommitSeq  int64
	TsMs       int64
	// Snapshot is "false" for a change, "true" for a snapshot read, "last"
	// for the last snapshot read of a table; empty means "false".
	Snapshot string
}

// Event is one change event of a table.
type Event struct {
	Table  string
	Op     Op
	Before Row // nil for c and r
	After  Row // nil for d
	TsMs   int64
	Source Source
}

// FormatError is an event that the spec's format cannot carry.
type FormatError struct {
	Table  string
	Column string // empty for a problem of the whole event
	Reason string
}

func (e *FormatError) Error() string {
	if e.Column == "" {
		return fmt.Sprintf("changelog event of %s: %s", e.Table, e.Reason)
	}
	return fmt.Sprintf("changelog event of %s, column %s: %s", e.Table, e.Column, e.Reason)
}

// Encode returns the record key and value of ev as the spec lays them out.
func Encode(ev Event) (key, value []byte, err error) {
	t, ok := Lookup(ev.Table)
	if !ok {
		return nil, nil, &FormatError{Table: ev.Table, Reason: "no such table"}
	}
	if err := checkShape(t, ev); err != nil {
		return nil, nil, err
	}
	keyRow := ev.After
	if ev.Op == OpDelete {
		keyRow = ev.Before
	}
	key, err = encodeKey(t, keyRow)
	if err != nil {
		return nil, nil, err
	}
	if ev.Op == OpUpdate {
		bk, err := encodeKey(t, ev.Before)
		if err != nil {
			return nil, nil, err
		}
		if !bytes.Equal(bk, key) {
			return nil, nil, &FormatError{Table: t.Name, Reason: fmt.Sprintf("u event changes the key from %s to %s", bk, key)}
		}
	}
	var b bytes.Buffer
	b.WriteString(`{"before":`)
	if err := writeRow(&b, t, ev.Before); err != nil {
		return nil, nil, err
	}
	b.WriteString(`,"after":`)
	if err := writeRow(&b, t, ev.After); err != nil {
		return nil, nil, err
	}
	snapshot := ev.Source.Snapshot
	if snapshot == "" {
		snapshot = "false"
	}
	fmt.Fprintf(&b, `,"op":%s,"ts_ms":%d,"source":{"connector":"billing-ledger","version":%s,"name":%s,`+
		`"ledger":%s,"table":%s,"checkpoint":%s,"commit_seq":%d,"ts_ms":%d,"snapshot":%s}}`,
		jsonString(string(ev.Op)), ev.TsMs, jsonString(ev.Source.Version), jsonString(ev.Source.Name),
		jsonString(ev.Source.Ledger), jsonString(t.Name), jsonString(ev.Source.Checkpoint),
		ev.Source.CommitSeq, ev.Source.TsMs, jsonString(snapshot))
	for _, s := range []string{ev.Source.Version, ev.Source.Name, ev.Source.Ledger, ev.Source.Checkpoint} {
		if !utf8.ValidString(s) {
			return nil, nil, &FormatError{Table: t.Name, Reason: "source field is not valid UTF-8"}
		}
	}
	return key, b.Bytes(), nil
}

// checkShape: which of before and after an op carries, and on which kind
// of topic.
func checkShape(t Table, ev Event) error {
	bad := func(reason string) error { return &FormatError{Table: t.Name, Reason: reason} }
	switch ev.Op {
	case OpCreate, OpRead:
		if ev.Before != nil || ev.After == nil {
			return bad(fmt.Sprintf("op %s needs after and no before", ev.Op))
		}
	case OpUpdate:
		if ev.Before == nil || ev.After == nil {
			return bad("op u needs before and after")
		}
	case OpDelete:
		if ev.Before == nil || ev.After != nil {
			return bad("op d needs before and no after")
		}
	default:
		return bad(fmt.Sprintf("unknown op %q", ev.Op))
	}
	if t.Append && ev.Op != OpCreate {
		return bad(fmt.Sprintf("append-only topic carries op c only, not %s", ev.Op))
	}
	switch ev.Source.Snapshot {
	case "", "false":
		if ev.Op == OpRead {
			return bad(`op r is a snapshot read: source.snapshot "true" or "last"`)
		}
	case "true", "last":
		if ev.Op != OpRead {
			return bad(fmt.Sprintf("source.snapshot %q on op %s", ev.Source.Snapshot, ev.Op))
		}
	default:
		return bad(fmt.Sprintf("source.snapshot %q", ev.Source.Snapshot))
	}
	return nil
}

func encodeKey(t Table, r Row) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, name := range t.Key {
		c := column(t, name)
		v, err := encodeValue(t, c, r[name])
		if err != nil {
			return nil, err
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(jsonString(name))
		b.WriteByte(':')
		b.WriteString(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func column(t Table, name string) Column {
	for _, c := range t.Columns {
		if c.Name == name {
			return c
		}
	}
	panic("changelogtest: table " + t.Name + " has no column " + name) // Tables is wrong
}

// writeRow writes r as a JSON object of t's columns in their order, null
// for a nil row. A row must have exactly t's columns.
func writeRow(b *bytes.Buffer, t Table, r Row) error {
	if r == nil {
		b.WriteString("null")
		return nil
	}
	if len(r) != len(t.Columns) {
		var extra []string
		for k := range r {
			if !slices.ContainsFunc(t.Columns, func(c Column) bool { return c.Name == k }) {
				extra = append(extra, k)
			}
		}
		if len(extra) > 0 {
			slices.Sort(extra)
			return &FormatError{Table: t.Name, Reason: "unknown columns " + strings.Join(extra, ", ")}
		}
	}
	b.WriteByte('{')
	for i, c := range t.Columns {
		v, ok := r[c.Name]
		if !ok {
			return &FormatError{Table: t.Name, Column: c.Name, Reason: "missing"}
		}
		s, err := encodeValue(t, c, v)
		if err != nil {
			return err
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(jsonString(c.Name))
		b.WriteByte(':')
		b.WriteString(s)
	}
	b.WriteByte('}')
	return nil
}

// DatetimeRange returns the earliest and latest DATETIME(6) values MySQL
// and MariaDB store.
func DatetimeRange() (lo, hi time.Time) {
	return time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
}

func encodeValue(t Table, c Column, v any) (string, error) {
	bad := func(reason string) (string, error) {
		return "", &FormatError{Table: t.Name, Column: c.Name, Reason: reason}
	}
	if v == nil {
		if !c.Nullable {
			return bad("NULL in a NOT NULL column")
		}
		return "null", nil
	}
	switch c.Kind {
	case String:
		s, ok := v.(string)
		if !ok {
			return bad(fmt.Sprintf("want string, got %T", v))
		}
		// encoding/json would turn invalid UTF-8 into U+FFFD silently.
		if !utf8.ValidString(s) {
			return bad("not valid UTF-8")
		}
		return jsonString(s), nil
	case Int:
		n, ok := v.(int64)
		if !ok {
			return bad(fmt.Sprintf("want int64, got %T", v))
		}
		return fmt.Sprint(n), nil
	case Bool:
		x, ok := v.(bool)
		if !ok {
			return bad(fmt.Sprintf("want bool, got %T", v))
		}
		return fmt.Sprint(x), nil
	case Time:
		x, ok := v.(time.Time)
		if !ok {
			return bad(fmt.Sprintf("want time.Time, got %T", v))
		}
		x = x.UTC()
		if x.Nanosecond()%1000 != 0 {
			return bad("finer than a microsecond: DATETIME(6) holds microseconds")
		}
		if lo, hi := DatetimeRange(); x.Before(lo) || x.After(hi) {
			return bad(fmt.Sprintf("%s outside DATETIME's range", x.Format(time.RFC3339Nano)))
		}
		return `"` + x.Format(TimeLayout) + `"`, nil
	}
	return bad(fmt.Sprintf("unknown kind %d", c.Kind))
}

// jsonString is s as a JSON string, without HTML escaping (any JSON parser
// reads either; this one is what a reader of the topic sees).
func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}

// Canonical is r as the JSON object of t's columns in their order: two rows
// are equal exactly when their Canonical forms are.
func Canonical(t Table, r Row) (string, error) {
	var b bytes.Buffer
	if err := writeRow(&b, t, r); err != nil {
		return "", err
	}
	return b.String(), nil
}
