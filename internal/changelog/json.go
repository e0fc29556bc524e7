package changelog

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// The JSON of the envelope, appended without reflection: strings escaped
// as encoding/json escapes them without HTML escaping (the text a reader
// of the topic sees), integers as numbers, instants as TimeLayout.

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string; it reports false if s is
// not valid UTF-8 (encoding/json would turn it into U+FFFD silently: the
// row would no longer be the row).
func appendJSONString[S ~string | ~[]byte](b []byte, s S) ([]byte, bool) {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := decodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			return b, false
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"'), true
}

func decodeRune[S ~string | ~[]byte](s S) (rune, int) {
	switch v := any(s).(type) {
	case string:
		return utf8.DecodeRuneInString(v)
	case []byte:
		return utf8.DecodeRune(v)
	}
	return utf8.RuneError, 1
}

// The DATETIME(6) range in Unix microseconds (DatetimeRange's; a test
// holds them equal).
const (
	datetimeMinMicros = -30610224000000000 // 1000-01-01 00:00:00.000000
	datetimeMaxMicros = 253402300799999999 // 9999-12-31 23:59:59.999999
)

// appendJSONTime appends a DATETIME(6) value of Unix microseconds as
// TimeLayout writes it (digit by digit: time.Time.AppendFormat was the
// publisher's largest cost); it reports false outside DATETIME's range.
func appendJSONTime(b []byte, micros int64) ([]byte, bool) {
	if micros < datetimeMinMicros || micros > datetimeMaxMicros {
		return b, false
	}
	t := time.UnixMicro(micros).UTC()
	year, month, day := t.Date()
	hour, minute, sec := t.Clock()
	frac := int(micros % 1_000_000)
	if frac < 0 {
		frac += 1_000_000
	}
	b = append(b, '"')
	b = appendDigits(b, year, 4)
	b = append(b, '-')
	b = appendDigits(b, int(month), 2)
	b = append(b, '-')
	b = appendDigits(b, day, 2)
	b = append(b, 'T')
	b = appendDigits(b, hour, 2)
	b = append(b, ':')
	b = appendDigits(b, minute, 2)
	b = append(b, ':')
	b = appendDigits(b, sec, 2)
	b = append(b, '.')
	b = appendDigits(b, frac, 6)
	return append(b, 'Z', '"'), true
}

// appendDigits appends x (0 <= x < 10^width) in width decimal digits.
func appendDigits(b []byte, x, width int) []byte {
	n := len(b)
	for range width {
		b = append(b, 0)
	}
	for i := n + width - 1; i >= n; i-- {
		b[i] = byte('0' + x%10)
		x /= 10
	}
	return b
}

// DatetimeRange returns the earliest and latest DATETIME(6) values MySQL
// and MariaDB store.
func DatetimeRange() (lo, hi time.Time) {
	return time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)
}

// appendJSONValue appends one column's value.
func appendJSONValue(b []byte, t Table, c Column, v Value) ([]byte, error) {
	if v.Null {
		return append(b, "null"...), nil
	}
	var ok bool
	switch c.Kind {
	case String:
		if b, ok = appendJSONString(b, v.S); !ok {
			return b, &FormatError{Table: t.Name, Column: c.Name, Reason: "not valid UTF-8"}
		}
	case Int:
		b = strconv.AppendInt(b, v.I, 10)
	case Bool:
		b = strconv.AppendBool(b, v.B)
	case Time:
		if b, ok = appendJSONTime(b, v.I); !ok {
			return b, &FormatError{Table: t.Name, Column: c.Name, Reason: v.Time().Format(time.RFC3339Nano) + " outside DATETIME's range"}
		}
	}
	return b, nil
}

// appendJSONRow appends a decoded row as the JSON object of t's columns in
// their order (nil: null).
func appendJSONRow(b []byte, t Table, vals []Value) ([]byte, error) {
	if vals == nil {
		return append(b, "null"...), nil
	}
	b = append(b, '{')
	for i, c := range t.Columns {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, t.names[i]...)
		var err error
		if b, err = appendJSONValue(b, t, c, vals[i]); err != nil {
			return b, err
		}
	}
	return append(b, '}'), nil
}

// appendJSONKey appends the JSON object of t's primary key columns of a
// decoded row, in the key's order.
func appendJSONKey(b []byte, t Table, vals []Value) ([]byte, error) {
	b = append(b, '{')
	for i, idx := range t.keyIdx {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, t.names[idx]...)
		var err error
		if b, err = appendJSONValue(b, t, t.Columns[idx], vals[idx]); err != nil {
			return b, err
		}
	}
	return append(b, '}'), nil
}
