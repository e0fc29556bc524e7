package changelog

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Row is a table row by column name: string for String, int64 for Int,
// bool for Bool, time.Time for Time, nil for NULL. It is the form tests
// and checkers work with; the service works with the binary form.
type Row map[string]any

// Event is one change event of a table, as Go values.
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

// Encode returns the record key and value of ev as the spec lays them out:
// the rows go through their binary form, as the service's do.
func Encode(ev Event) (key, value []byte, err error) {
	c, err := ToChange(ev)
	if err != nil {
		return nil, nil, err
	}
	t, _ := ByID(c.Table)
	var e Encoder
	if err := e.decode(t, c); err != nil {
		return nil, nil, err
	}
	return e.encode(t, ev.Op, ev.TsMs, ev.Source)
}

// ToChange is ev as the outbox keeps it, checked: the shape of the op and
// every column's value.
func ToChange(ev Event) (Change, error) {
	t, ok := Lookup(ev.Table)
	if !ok {
		return Change{}, &FormatError{Table: ev.Table, Reason: "no such table"}
	}
	if err := shape(t, ev.Op, ev.Before != nil, ev.After != nil); err != nil {
		return Change{}, err
	}
	snapshot := ev.Source.Snapshot
	if snapshot == "" {
		snapshot = "false"
	}
	if err := snapshotShape(t, ev.Op, snapshot); err != nil {
		return Change{}, err
	}
	c := Change{Table: t.ID, Op: ev.Op}
	var err error
	if ev.Before != nil {
		if c.Before, err = EncodeRow(t, ev.Before); err != nil {
			return Change{}, err
		}
	}
	if ev.After != nil {
		if c.After, err = EncodeRow(t, ev.After); err != nil {
			return Change{}, err
		}
	}
	return c, nil
}

// EncodeRow is r in the binary form, checked: exactly t's columns, each of
// its kind (strings valid UTF-8, instants to the microsecond within
// DATETIME's range, NULL only where the column takes it).
func EncodeRow(t Table, r Row) ([]byte, error) {
	if len(r) != len(t.Columns) {
		var extra []string
		for k := range r {
			if !slices.ContainsFunc(t.Columns, func(c Column) bool { return c.Name == k }) {
				extra = append(extra, k)
			}
		}
		if len(extra) > 0 {
			slices.Sort(extra)
			return nil, &FormatError{Table: t.Name, Reason: "unknown columns " + strings.Join(extra, ", ")}
		}
	}
	var b []byte
	for _, c := range t.Columns {
		v, ok := r[c.Name]
		if !ok {
			return nil, &FormatError{Table: t.Name, Column: c.Name, Reason: "missing"}
		}
		var err error
		if b, err = appendValue(b, t, c, v); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func appendValue(b []byte, t Table, c Column, v any) ([]byte, error) {
	bad := func(reason string) ([]byte, error) {
		return nil, &FormatError{Table: t.Name, Column: c.Name, Reason: reason}
	}
	if v == nil {
		if !c.Nullable {
			return bad("NULL in a NOT NULL column")
		}
		return AppendNull(b), nil
	}
	switch c.Kind {
	case String:
		s, ok := v.(string)
		if !ok {
			return bad(fmt.Sprintf("want string, got %T", v))
		}
		if !utf8.ValidString(s) {
			return bad("not valid UTF-8")
		}
		return AppendString(b, s), nil
	case Int:
		n, ok := v.(int64)
		if !ok {
			return bad(fmt.Sprintf("want int64, got %T", v))
		}
		return AppendInt(b, n), nil
	case Bool:
		x, ok := v.(bool)
		if !ok {
			return bad(fmt.Sprintf("want bool, got %T", v))
		}
		return AppendBool(b, x), nil
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
		return AppendTime(b, x), nil
	}
	return bad(fmt.Sprintf("unknown kind %d", c.Kind))
}

// RowOf decodes a binary row of t into a Row.
func RowOf(t Table, raw []byte) (Row, error) {
	vals, err := DecodeRow(t, raw, nil)
	if err != nil {
		return nil, err
	}
	r := make(Row, len(vals))
	for i, c := range t.Columns {
		v := vals[i]
		switch {
		case v.Null:
			r[c.Name] = nil
		case c.Kind == String:
			r[c.Name] = string(v.S)
		case c.Kind == Int:
			r[c.Name] = v.I
		case c.Kind == Bool:
			r[c.Name] = v.B
		case c.Kind == Time:
			r[c.Name] = v.Time()
		}
	}
	return r, nil
}

// Canonical is r as the JSON object of t's columns in their order: two rows
// are equal exactly when their Canonical forms are.
func Canonical(t Table, r Row) (string, error) {
	return viaBinary(t, r, appendJSONRow)
}

// KeyOf is the record key of r, a row of t (its primary key's JSON).
func KeyOf(t Table, r Row) (string, error) {
	return viaBinary(t, r, appendJSONKey)
}

// RawKey is the record key (the primary key's JSON) of raw, a binary row
// of t: the key the publisher gives the row's events.
func RawKey(t Table, raw []byte) (string, error) {
	vals, err := DecodeRow(t, raw, nil)
	if err != nil {
		return "", err
	}
	b, err := appendJSONKey(nil, t, vals)
	return string(b), err
}

// Sealed says whether raw, a binary billing_windows row, has closed_at set.
func Sealed(raw []byte) (bool, error) {
	vals, err := DecodeRow(tables[TWindows], raw, nil)
	if err != nil {
		return false, err
	}
	return !vals[colClosedAt].Null, nil
}

// viaBinary writes r, a row of t, with write after a round trip through
// the binary form, so that a row read back from JSON is written exactly as
// the publisher writes one from the outbox.
func viaBinary(t Table, r Row, write func([]byte, Table, []Value) ([]byte, error)) (string, error) {
	raw, err := EncodeRow(t, r)
	if err != nil {
		return "", err
	}
	vals, err := DecodeRow(t, raw, nil)
	if err != nil {
		return "", err
	}
	b, err := write(nil, t, vals)
	return string(b), err
}
