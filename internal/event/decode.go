package event

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// DefaultMaxPayload is the record-value size limit used when
// Decoder.MaxPayload is not positive.
const DefaultMaxPayload = 64 << 10

// DecodeError is the only error type returned by [Decoder.Decode]; retrieve
// it with errors.As. Reason is one of the decoder reasons of this package.
// Field is the contract field name ("event_id", "account_id",
// "amount_minor", "currency", "occurred_at") the problem is attributed to,
// or "" when it concerns the record as a whole. Detail is a human-readable
// explanation naming the field and the problem; quoted input in it is
// truncated, and its wording is not stable: match on Reason and Field.
// EventID is the record's event id when it was present and valid although
// another field was not, so that the dead letter can be found by it; it is
// empty otherwise.
type DecodeError struct {
	Reason  Reason
	Field   string
	Detail  string
	EventID string
}

// Error returns "event: <reason>: <detail>".
func (e *DecodeError) Error() string {
	return "event: " + string(e.Reason) + ": " + e.Detail
}

// Decoder decodes and validates record values. The zero value is ready to
// use. A Decoder is never modified by Decode, so one value may be shared by
// any number of goroutines.
type Decoder struct {
	// MaxPayload is the largest accepted record value in bytes; larger
	// values are rejected with ReasonPayloadTooLarge before any parsing.
	// Zero or negative means DefaultMaxPayload.
	MaxPayload int
}

// NewDecoder returns a Decoder with the given MaxPayload (zero or negative
// means DefaultMaxPayload).
func NewDecoder(maxPayload int) *Decoder {
	return &Decoder{MaxPayload: maxPayload}
}

// Contract field indexes, in validation (and error precedence) order.
const (
	fEventID = iota
	fAccountID
	fAmount
	fCurrency
	fOccurredAt
	numRequired // the optional fields follow
	fRevision   = numRequired
	fCancelled  = numRequired + 1
	numFields   = numRequired + 2
)

var fieldNames = [numFields]string{"event_id", "account_id", "amount_minor", "currency", "occurred_at", "revision", "cancelled"}

func lookupField(key []byte) int {
	switch string(key) {
	case "event_id":
		return fEventID
	case "account_id":
		return fAccountID
	case "amount_minor":
		return fAmount
	case "currency":
		return fCurrency
	case "occurred_at":
		return fOccurredAt
	case "revision":
		return fRevision
	case "cancelled":
		return fCancelled
	}
	return -1
}

// Value kinds, named by the first byte of the JSON value.
const (
	kindString = '"'
	kindNumber = '0'
)

// rawValue locates the value of a contract field in the input.
type rawValue struct {
	start, end int  // value bytes; for strings, the content between the quotes
	kind       byte // kindString, kindNumber, or the first byte: 't', 'f', 'n', '{', '['
	escaped    bool // string contains escape sequences
	isInt      bool // number has no fraction or exponent
}

// Decode parses and validates one record value against the contract
// documented in the package comment and returns the event.
//
// On any invalid input it returns the zero Event and a non-nil error of
// type *DecodeError; it never panics, whatever the input. Which reason is
// reported when several apply is described on the Reason constants.
// Decode does not retain value or any part of it: the caller may reuse the
// buffer as soon as Decode returns. A valid event costs one allocation (the
// shared backing of its three string fields) as long as the record has at
// most 16 unknown members and no escaped keys. A nil *Decoder behaves like
// the zero Decoder.
func (d *Decoder) Decode(value []byte) (Event, error) {
	limit := DefaultMaxPayload
	if d != nil && d.MaxPayload > 0 {
		limit = d.MaxPayload
	}
	if len(value) == 0 {
		return Event{}, &DecodeError{Reason: ReasonEmptyPayload, Detail: "record value is empty"}
	}
	if len(value) > limit {
		return Event{}, &DecodeError{
			Reason: ReasonPayloadTooLarge,
			Detail: fmt.Sprintf("record value is %d bytes, max %d", len(value), limit),
		}
	}
	var vals [numFields]rawValue
	seen, derr := scanObject(value, &vals)
	if derr != nil {
		return Event{}, derr
	}
	ev, derr := buildEvent(value, &vals, seen)
	if derr != nil {
		return Event{}, derr
	}
	return ev, nil
}

// keySet detects repeated unknown top-level keys without allocating for up
// to len(small) of them.
type keySet struct {
	small [16][]byte
	n     int
	m     map[string]struct{}
}

// add records key and reports whether it was not present before.
func (s *keySet) add(key []byte) bool {
	if s.m != nil {
		if _, ok := s.m[string(key)]; ok {
			return false
		}
		s.m[string(key)] = struct{}{}
		return true
	}
	for _, k := range s.small[:s.n] {
		if string(k) == string(key) {
			return false
		}
	}
	if s.n < len(s.small) {
		s.small[s.n] = key
		s.n++
		return true
	}
	s.m = make(map[string]struct{}, 2*len(s.small))
	for _, k := range s.small {
		s.m[string(k)] = struct{}{}
	}
	s.m[string(key)] = struct{}{}
	return true
}

// scanObject validates that data is exactly one JSON object (plus
// surrounding space) and records where the contract fields' values are.
// seen has bit i set if field i is present. Syntax and UTF-8 errors take
// precedence over a duplicate key, wherever they occur.
func scanObject(data []byte, vals *[numFields]rawValue) (seen uint8, _ *DecodeError) {
	p := skipSpace(data, 0)
	if p >= len(data) {
		return 0, syntaxError(p, "record value contains only white space")
	}
	if data[p] != '{' {
		return 0, syntaxError(p, "record value is not a JSON object: invalid character %s", describeByte(data[p]))
	}
	p = skipSpace(data, p+1)
	var dup *DecodeError
	var others keySet
	if p < len(data) && data[p] == '}' {
		p++
	} else {
		for {
			if p >= len(data) || data[p] != '"' {
				return 0, unexpected(data, p, "string key")
			}
			keyStart := p
			end, escaped, err := scanString(data, p)
			if err != nil {
				return 0, err
			}
			key := data[keyStart+1 : end-1]
			if escaped {
				key = appendUnescaped(nil, key)
			}
			f := lookupField(key)
			if dup == nil {
				if f >= 0 && seen&(1<<f) != 0 || f < 0 && !others.add(key) {
					dup = &DecodeError{
						Reason: ReasonDuplicateKey,
						Detail: fmt.Sprintf("duplicate key %s at offset %d", quote(key), keyStart),
					}
					if f >= 0 {
						dup.Field = fieldNames[f]
					}
				}
			}
			p = skipSpace(data, end)
			if p >= len(data) || data[p] != ':' {
				return 0, unexpected(data, p, "':' after object key")
			}
			p = skipSpace(data, p+1)
			if p >= len(data) {
				return 0, unexpected(data, p, "value")
			}
			if f < 0 || seen&(1<<f) != 0 {
				if p, err = skipValue(data, p); err != nil {
					return 0, err
				}
			} else {
				v := rawValue{start: p, kind: data[p]}
				switch c := data[p]; {
				case c == '"':
					p, v.escaped, err = scanString(data, p)
					v.start++
					v.end = p - 1
				case c == '-' || '0' <= c && c <= '9':
					v.kind = kindNumber
					p, v.isInt, err = scanNumber(data, p)
					v.end = p
				default:
					p, err = skipValue(data, p)
					v.end = p
				}
				if err != nil {
					err.Field = fieldNames[f]
					err.Detail = fieldNames[f] + ": " + err.Detail
					return 0, err
				}
				vals[f] = v
				seen |= 1 << f
			}
			p = skipSpace(data, p)
			if p < len(data) && data[p] == ',' {
				p = skipSpace(data, p+1)
				continue
			}
			if p < len(data) && data[p] == '}' {
				p++
				break
			}
			return 0, unexpected(data, p, "',' or '}' after object member")
		}
	}
	if p = skipSpace(data, p); p != len(data) {
		return 0, syntaxError(p, "trailing data after JSON object")
	}
	if dup != nil {
		return 0, dup
	}
	return seen, nil
}

// buildEvent validates the located field values in field order and
// assembles the Event.
func buildEvent(data []byte, vals *[numFields]rawValue, seen uint8) (Event, *DecodeError) {
	if seen&(1<<fEventID) == 0 {
		return Event{}, missing(fEventID)
	}
	// The three string fields are decoded into one buffer that becomes the
	// single allocation of a valid event.
	var buf [MaxEventIDLen + MaxAccountIDLen + 3]byte
	b := buf[:0]

	var err *DecodeError
	if b, err = appendID(b, data, vals, fEventID, MaxEventIDLen); err != nil {
		return Event{}, err
	}
	idEnd := len(b)
	revision, cancelled, err := parseVersion(data, vals, seen)
	if err == nil && cancelled {
		// A tombstone needs no content: whatever else it carries is
		// ignored, so that every tombstone of one revision is the same.
		return Event{EventID: string(b), Revision: revision, Cancelled: true}, nil
	}
	var ev Event
	if err == nil {
		ev, err = buildRest(data, vals, seen, b, idEnd)
	}
	if err != nil {
		err.EventID = string(buf[:idEnd])
		return Event{}, err
	}
	ev.Revision = revision
	return ev, nil
}

// parseVersion decodes the optional revision (a non-negative JSON integer
// within the signed 64-bit range; absent: 0) and cancelled (a JSON
// boolean; absent: false).
func parseVersion(data []byte, vals *[numFields]rawValue, seen uint8) (int64, bool, *DecodeError) {
	var revision int64
	if seen&(1<<fRevision) != 0 {
		v := &vals[fRevision]
		num := data[v.start:v.end]
		if v.kind != kindNumber || !v.isInt || num[0] == '-' {
			return 0, false, &DecodeError{Reason: ReasonInvalidField, Field: "revision",
				Detail: fmt.Sprintf("revision %s is not a non-negative JSON integer", quote(num))}
		}
		var u uint64
		for _, c := range num {
			if u > (1<<63-1-uint64(c-'0'))/10 {
				return 0, false, &DecodeError{Reason: ReasonInvalidField, Field: "revision",
					Detail: fmt.Sprintf("revision %s does not fit a signed 64-bit integer", quote(num))}
			}
			u = u*10 + uint64(c-'0')
		}
		revision = int64(u)
	}
	if seen&(1<<fCancelled) == 0 {
		return revision, false, nil
	}
	switch v := &vals[fCancelled]; {
	case v.kind == 't':
		return revision, true, nil
	case v.kind == 'f':
		return revision, false, nil
	default:
		return 0, false, &DecodeError{Reason: ReasonInvalidField, Field: "cancelled",
			Detail: fmt.Sprintf("cancelled must be a JSON boolean, got %s", kindName(v.kind))}
	}
}

func missing(f int) *DecodeError {
	return &DecodeError{
		Reason: ReasonMissingField,
		Field:  fieldNames[f],
		Detail: fmt.Sprintf("required field %s is missing", fieldNames[f]),
	}
}

// buildRest decodes the fields after the event id, which b holds (idEnd
// bytes), into the event.
func buildRest(data []byte, vals *[numFields]rawValue, seen uint8, b []byte, idEnd int) (Event, *DecodeError) {
	for f := range numRequired {
		if seen&(1<<f) == 0 {
			return Event{}, missing(f)
		}
	}
	var err *DecodeError
	if b, err = appendID(b, data, vals, fAccountID, MaxAccountIDLen); err != nil {
		return Event{}, err
	}
	accountEnd := len(b)

	amount, err := parseAmount(data, &vals[fAmount])
	if err != nil {
		return Event{}, err
	}

	v := &vals[fCurrency]
	if v.kind != kindString {
		return Event{}, typeError(fCurrency, v.kind)
	}
	b = appendStringValue(b, data, v)
	if cur := b[accountEnd:]; !isCurrency(cur) {
		return Event{}, &DecodeError{
			Reason: ReasonInvalidCurrency,
			Field:  "currency",
			Detail: fmt.Sprintf("currency %s is not 3 upper-case ASCII letters", quote(cur)),
		}
	}

	v = &vals[fOccurredAt]
	if v.kind != kindString {
		return Event{}, typeError(fOccurredAt, v.kind)
	}
	ts := data[v.start:v.end]
	var tsBuf [40]byte
	if v.escaped {
		ts = appendUnescaped(tsBuf[:0], ts)
	}
	at, problem := parseRFC3339(ts)
	if problem != "" {
		return Event{}, &DecodeError{
			Reason: ReasonInvalidTime,
			Field:  "occurred_at",
			Detail: fmt.Sprintf("occurred_at %s is not an RFC 3339 date-time with zone offset: %s", quote(ts), problem),
		}
	}

	s := string(b)
	return Event{
		EventID:     s[:idEnd],
		AccountID:   s[idEnd:accountEnd],
		AmountMinor: amount,
		Currency:    s[accountEnd:],
		OccurredAt:  at,
	}, nil
}

// appendID appends the decoded id field f to b after checking its type,
// length (1..maxLen bytes) and the absence of control characters.
func appendID(b []byte, data []byte, vals *[numFields]rawValue, f int, maxLen int) ([]byte, *DecodeError) {
	v := &vals[f]
	if v.kind != kindString {
		return b, typeError(f, v.kind)
	}
	n0 := len(b)
	b = appendStringValue(b, data, v)
	id := b[n0:]
	name := fieldNames[f]
	switch {
	case len(id) == 0:
		return b, &DecodeError{Reason: ReasonInvalidField, Field: name, Detail: name + " is empty"}
	case len(id) > maxLen:
		return b, &DecodeError{
			Reason: ReasonIDTooLong,
			Field:  name,
			Detail: fmt.Sprintf("%s is %d bytes, max %d: %s", name, len(id), maxLen, quote(id)),
		}
	}
	if i, r := findControl(id); i >= 0 {
		return b, &DecodeError{
			Reason: ReasonInvalidField,
			Field:  name,
			Detail: fmt.Sprintf("%s contains control character %U at byte %d: %s", name, r, i, quote(id)),
		}
	}
	return b, nil
}

func appendStringValue(b []byte, data []byte, v *rawValue) []byte {
	if v.escaped {
		return appendUnescaped(b, data[v.start:v.end])
	}
	return append(b, data[v.start:v.end]...)
}

// findControl returns the byte index and value of the first Unicode control
// character (general category Cc: U+0000-U+001F, U+007F-U+009F) in the
// valid UTF-8 string s, or -1.
func findControl(s []byte) (int, rune) {
	for i, c := range s {
		switch {
		case c < 0x20 || c == 0x7f:
			return i, rune(c)
		case c == 0xc2 && i+1 < len(s) && s[i+1] <= 0x9f:
			// U+0080..U+009F are encoded as C2 80..C2 9F.
			return i, rune(s[i+1])
		}
	}
	return -1, 0
}

func isCurrency(s []byte) bool {
	return len(s) == 3 &&
		'A' <= s[0] && s[0] <= 'Z' &&
		'A' <= s[1] && s[1] <= 'Z' &&
		'A' <= s[2] && s[2] <= 'Z'
}

func parseAmount(data []byte, v *rawValue) (int64, *DecodeError) {
	if v.kind != kindNumber {
		return 0, typeError(fAmount, v.kind)
	}
	num := data[v.start:v.end]
	if !v.isInt {
		return 0, &DecodeError{
			Reason: ReasonAmountNotInteger,
			Field:  "amount_minor",
			Detail: fmt.Sprintf("amount_minor %s is not a JSON integer (fraction or exponent present)", quote(num)),
		}
	}
	neg := num[0] == '-'
	digits := num
	if neg {
		digits = num[1:]
	}
	// limit is |math.MinInt64| for negative numbers, math.MaxInt64 otherwise.
	limit := uint64(1<<63 - 1)
	if neg {
		limit = 1 << 63
	}
	var u uint64
	for _, c := range digits {
		d := uint64(c - '0')
		if u > (limit-d)/10 {
			return 0, &DecodeError{
				Reason: ReasonAmountOutOfRange,
				Field:  "amount_minor",
				Detail: fmt.Sprintf("amount_minor %s does not fit a signed 64-bit integer", quote(num)),
			}
		}
		u = u*10 + d
	}
	if neg {
		return int64(-u), nil // -(1<<63) wraps to math.MinInt64 as intended
	}
	return int64(u), nil
}

func typeError(f int, kind byte) *DecodeError {
	want := "string"
	if f == fAmount {
		want = "number"
	}
	return &DecodeError{
		Reason: ReasonInvalidField,
		Field:  fieldNames[f],
		Detail: fmt.Sprintf("%s must be a JSON %s, got %s", fieldNames[f], want, kindName(kind)),
	}
}

func kindName(kind byte) string {
	switch kind {
	case kindString:
		return "string"
	case kindNumber:
		return "number"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return "invalid value"
}

// maxQuoted bounds the input echoed into a Detail.
const maxQuoted = 64

// quote renders untrusted input for a Detail: Go-quoted, cut at a rune
// boundary after maxQuoted bytes.
func quote(s []byte) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(string(s))
	}
	n := maxQuoted
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return strconv.Quote(string(s[:n])) + fmt.Sprintf("... (%d bytes)", len(s))
}
