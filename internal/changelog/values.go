package changelog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// The binary form of a row, as the outbox stores it: its columns in the
// table's order, each a tag byte and its value. It is about a third of
// the row's JSON, and the publisher turns it into JSON without building a
// map per row.
const (
	tagNull   = 0
	tagString = 1 // uvarint length, bytes
	tagInt    = 2 // zigzag varint
	tagFalse  = 3
	tagTrue   = 4
	tagTime   = 5 // zigzag varint of Unix microseconds
)

// AppendNull appends a NULL column.
func AppendNull(b []byte) []byte { return append(b, tagNull) }

// AppendString appends a string column.
func AppendString(b []byte, s string) []byte {
	b = append(b, tagString)
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// AppendInt appends an integer column.
func AppendInt(b []byte, v int64) []byte {
	return binary.AppendVarint(append(b, tagInt), v)
}

// AppendBool appends a boolean column.
func AppendBool(b []byte, v bool) []byte {
	if v {
		return append(b, tagTrue)
	}
	return append(b, tagFalse)
}

// AppendTime appends a DATETIME(6) column: the instant to the microsecond
// (a DATETIME(6) holds no more; callers pass instants as the column
// keeps them).
func AppendTime(b []byte, t time.Time) []byte {
	return binary.AppendVarint(append(b, tagTime), t.UnixMicro())
}

// AppendNullTime appends a nullable DATETIME(6) column: NULL for the zero
// instant.
func AppendNullTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return AppendNull(b)
	}
	return AppendTime(b, t)
}

// AppendNullString appends a nullable string column: NULL for "".
func AppendNullString(b []byte, s string) []byte {
	if s == "" {
		return AppendNull(b)
	}
	return AppendString(b, s)
}

// Value is one column of a decoded row. S aliases the encoded bytes.
type Value struct {
	Null bool
	S    []byte // String
	I    int64  // Int; Time: Unix microseconds
	B    bool   // Bool
}

// Time is a Time value as an instant (UTC).
func (v Value) Time() time.Time { return time.UnixMicro(v.I).UTC() }

var errTruncated = errors.New("truncated")

// DecodeRow decodes the binary row raw of table t into vals (reused; its
// length becomes the number of columns), checking every column's kind and
// nullability.
func DecodeRow(t Table, raw []byte, vals []Value) ([]Value, error) {
	vals = vals[:0]
	for _, c := range t.Columns {
		if len(raw) == 0 && c.Added {
			vals = append(vals, Value{}) // a row from before the column: its default
			continue
		}
		if len(raw) == 0 {
			return vals, fmt.Errorf("row of %s: %w at column %s", t.Name, errTruncated, c.Name)
		}
		tag := raw[0]
		raw = raw[1:]
		var v Value
		var ok bool
		switch tag {
		case tagNull:
			v.Null, ok = true, c.Nullable
		case tagString:
			n, k := binary.Uvarint(raw)
			if k <= 0 || uint64(len(raw)-k) < n {
				return vals, fmt.Errorf("row of %s: %w in column %s", t.Name, errTruncated, c.Name)
			}
			v.S, raw, ok = raw[k:k+int(n)], raw[k+int(n):], c.Kind == String
		case tagInt, tagTime:
			x, k := binary.Varint(raw)
			if k <= 0 {
				return vals, fmt.Errorf("row of %s: %w in column %s", t.Name, errTruncated, c.Name)
			}
			v.I, raw, ok = x, raw[k:], (tag == tagInt) == (c.Kind == Int) && (c.Kind == Int || c.Kind == Time)
		case tagFalse, tagTrue:
			v.B, ok = tag == tagTrue, c.Kind == Bool
		}
		if !ok {
			return vals, fmt.Errorf("row of %s: column %s: tag %d does not fit a column of kind %d (nullable %v)", t.Name, c.Name, tag, c.Kind, c.Nullable)
		}
		vals = append(vals, v)
	}
	if len(raw) != 0 {
		return vals, fmt.Errorf("row of %s: %d bytes after the last column", t.Name, len(raw))
	}
	return vals, nil
}
