package event

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Mapping says where each of the contract's values is in a decoded
// record: a path of member names from the record's root (data.customer.id
// is member "id" of member "customer" of member "data"). The five values
// of an event are required; revision and cancelled, which make a record a
// version of its event (docs/corrections.md), are optional. The zero
// Mapping is not valid; DefaultMapping has the contract's names at the top
// level.
//
// A Mapping reads a tree of decoded values as the decoders of every format
// build it: map[string]any for objects and records, []any, string,
// json.Number, the signed and unsigned integer types, *big.Rat (decimals),
// time.Time (timestamps), []byte, bool and nil. Each value is converted as
// producers write it (see [Mapping.Event]); the result is the same Event,
// with the same [Event.Fingerprint], whatever format carried it.
type Mapping struct {
	paths [numFields][]string
	set   uint8 // bit f: field f was named in the spec
}

// DefaultMapping reads each value from the member of its contract name at
// the top level of the record.
func DefaultMapping() Mapping {
	var m Mapping
	for f := range numFields {
		m.paths[f] = []string{fieldNames[f]}
	}
	return m
}

// FieldNames returns the contract's field names in validation order: the
// five required ones, then the optional revision and cancelled.
func FieldNames() []string { return fieldNames[:] }

// ParseMapping reads a mapping spec: comma-separated field=path pairs
// ("account_id=data.customer.id,amount_minor=data.amount"), field being a
// contract field name and path member names joined by dots. A field not
// named keeps its default path (its own name at the top level). The empty
// spec is DefaultMapping.
func ParseMapping(spec string) (Mapping, error) {
	m := DefaultMapping()
	if strings.TrimSpace(spec) == "" {
		return m, nil
	}
	for pair := range strings.SplitSeq(spec, ",") {
		name, path, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok {
			return Mapping{}, fmt.Errorf("%q is not field=path", pair)
		}
		f := lookupField([]byte(strings.TrimSpace(name)))
		if f < 0 {
			return Mapping{}, fmt.Errorf("%q is not a field: one of %s", name, strings.Join(fieldNames[:], ", "))
		}
		if m.set&(1<<f) != 0 {
			return Mapping{}, fmt.Errorf("field %s is mapped twice", fieldNames[f])
		}
		segs := strings.Split(strings.TrimSpace(path), ".")
		for _, s := range segs {
			if s == "" {
				return Mapping{}, fmt.Errorf("%s=%s: a path is member names joined by dots, none empty", fieldNames[f], path)
			}
		}
		m.paths[f] = segs
		m.set |= 1 << f
	}
	return m, nil
}

// IsDefault reports whether every field is read from its own name at the
// top level (the JSON decoder's fast path applies).
func (m Mapping) IsDefault() bool {
	for f := range numFields {
		if len(m.paths[f]) != 1 || m.paths[f][0] != fieldNames[f] {
			return false
		}
	}
	return true
}

// Under returns m with every field that the spec did not name read from
// below prefix instead of the top level (the data of a CloudEvent).
func (m Mapping) Under(prefix ...string) Mapping {
	for f := range numFields {
		if m.set&(1<<f) == 0 {
			m.paths[f] = append(append([]string{}, prefix...), fieldNames[f])
		}
	}
	return m
}

// Named reports whether the spec named the field (a contract field name).
func (m Mapping) Named(field string) bool {
	f := lookupField([]byte(field))
	return f >= 0 && m.set&(1<<f) != 0
}

// String renders m as a spec that ParseMapping reads back.
func (m Mapping) String() string {
	parts := make([]string, numFields)
	for f := range numFields {
		parts[f] = fieldNames[f] + "=" + strings.Join(m.paths[f], ".")
	}
	return strings.Join(parts, ",")
}

// Path returns the path of a contract field, dot-joined ("" for an unknown
// field name).
func (m Mapping) Path(field string) string {
	f := lookupField([]byte(field))
	if f < 0 {
		return ""
	}
	return strings.Join(m.paths[f], ".")
}

// Event reads the contract's values from tree and converts them:
//
//   - event_id and account_id: a string (valid UTF-8, the contract's
//     lengths, no control characters), or an integer, taken in decimal.
//     eventID, when not empty, is the event id instead of the value at
//     the path (a CloudEvent's source and id).
//   - amount_minor: an integer of any width (json.Number without fraction
//     or exponent, Go integer types) is minor units, as today; a decimal
//     (a string such as "12.50", or *big.Rat, an Avro decimal) is major
//     units of the currency and is converted to minor units exactly with
//     the currency's ISO 4217 exponent (CurrencyExponent): a value with
//     more non-zero fraction digits than that is rejected
//     (ReasonAmountInexact), never rounded. A JSON number with a fraction
//     or exponent is rejected as today (ReasonAmountNotInteger): a
//     producer's float is no exact decimal.
//   - currency: a string of three upper-case ASCII letters.
//   - occurred_at: an RFC 3339 string (as Decoder.Decode), a time.Time
//     (Avro timestamp-millis/-micros, google.protobuf.Timestamp), or an
//     integer of epoch milliseconds; years MinYear-MaxYear in UTC.
//   - revision (optional): a non-negative integer of any width within the
//     signed 64-bit range; absent, 0 (the original).
//   - cancelled (optional): a boolean; absent, false. A cancelled version
//     is a tombstone: it needs no other value but the event id, and the
//     others are not read (every tombstone of one revision is the same
//     Event), as Decoder.Decode.
//
// An optional value that is absent, or null (what an Avro union with
// null or a nullable JSON Schema type writes for none), takes its
// default; a revision or cancelled of another type, or a negative
// revision, is ReasonInvalidField. The event id is read first, then the
// version, then the content, as Decoder.Decode does.
//
// A path that does not lead to a value is ReasonMissingField, a value of
// a type that does not convert ReasonInvalidField; the detail names the
// path. Errors are *DecodeError, with EventID set once the event id was
// read.
func (m *Mapping) Event(tree any, eventID string) (Event, error) {
	var e Event
	var err *DecodeError
	if eventID != "" {
		e.EventID, err = checkID(fEventID, eventID, MaxEventIDLen, "")
	} else {
		e.EventID, err = m.id(tree, fEventID, MaxEventIDLen)
	}
	if err != nil {
		return Event{}, err
	}
	revision, cancelled, err := m.version(tree)
	if err == nil && cancelled {
		return Event{EventID: e.EventID, Revision: revision, Cancelled: true}, nil
	}
	if err == nil {
		e, err = m.rest(tree, e)
	}
	if err != nil {
		err.EventID = e.EventID
		return Event{}, err
	}
	e.Revision = revision
	return e, nil
}

// version reads the optional revision and cancelled.
func (m *Mapping) version(tree any) (int64, bool, *DecodeError) {
	var revision int64
	v, err := m.optional(tree, fRevision)
	if err != nil {
		return 0, false, err
	}
	if v != nil {
		const negative = "is negative: a revision is a non-negative integer (0, the original, higher for each later version)"
		const tooLarge = "does not fit a signed 64-bit integer"
		switch x := v.(type) {
		case json.Number:
			if !IsIntText(string(x)) {
				return 0, false, m.badType(fRevision, v, "a non-negative integer")
			}
			if x[0] == '-' { // -0 too, as the contract's decoder
				return 0, false, m.badRevision(string(x), negative)
			}
			n, perr := strconv.ParseInt(string(x), 10, 64)
			if perr != nil {
				return 0, false, m.badRevision(string(x), tooLarge)
			}
			revision = n
		case uint64:
			if x > math.MaxInt64 {
				return 0, false, m.badRevision(strconv.FormatUint(x, 10), tooLarge)
			}
			revision = int64(x)
		case uint:
			if uint64(x) > math.MaxInt64 {
				return 0, false, m.badRevision(strconv.FormatUint(uint64(x), 10), tooLarge)
			}
			revision = int64(x)
		default:
			n, ok := asInt64(v)
			if !ok {
				return 0, false, m.badType(fRevision, v, "a non-negative integer")
			}
			if n < 0 {
				return 0, false, m.badRevision(strconv.FormatInt(n, 10), negative)
			}
			revision = n
		}
	}
	v, err = m.optional(tree, fCancelled)
	if err != nil || v == nil {
		return revision, false, err
	}
	c, ok := v.(bool)
	if !ok {
		return 0, false, m.badType(fCancelled, v, "a boolean")
	}
	return revision, c, nil
}

func (m *Mapping) badRevision(text, problem string) *DecodeError {
	return &DecodeError{Reason: ReasonInvalidField, Field: "revision",
		Detail: fmt.Sprintf("%s %s %s", m.where(fRevision), text, problem)}
}

// optional is the value of an optional field, nil when its path leads to
// no value (or to null).
func (m *Mapping) optional(tree any, f int) (any, *DecodeError) {
	// Absent is the common case (an original): said without building
	// lookup's error, which is formatted text.
	v := tree
	for _, seg := range m.paths[f] {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, nil
		}
		if v, ok = obj[seg]; !ok {
			return nil, nil
		}
		if _, dup := v.(ambiguous); dup {
			return m.lookup(tree, f) // its error names the duplicate key
		}
	}
	return v, nil
}

func (m *Mapping) rest(tree any, e Event) (Event, *DecodeError) {
	var err *DecodeError
	if e.AccountID, err = m.id(tree, fAccountID, MaxAccountIDLen); err != nil {
		return e, err
	}
	amount, aerr := m.lookup(tree, fAmount)
	if aerr != nil {
		return e, aerr
	}
	// A decimal amount needs the currency's exponent, so the currency is
	// read first; its problems are reported after the amount's own.
	cur, cerr := m.currency(tree)
	if e.AmountMinor, err = m.amount(amount, cur, cerr); err != nil {
		return e, err
	}
	if cerr != nil {
		return e, cerr
	}
	e.Currency = cur
	if e.OccurredAt, err = m.time(tree); err != nil {
		return e, err
	}
	return e, nil
}

// errDetail prefixes a detail with the field and, when it is not the
// field's own name, its path.
func (m *Mapping) where(f int) string {
	p := strings.Join(m.paths[f], ".")
	if p == fieldNames[f] {
		return fieldNames[f]
	}
	return fieldNames[f] + " (at " + p + ")"
}

func (m *Mapping) lookup(tree any, f int) (any, *DecodeError) {
	v := tree
	for i, seg := range m.paths[f] {
		obj, ok := v.(map[string]any)
		if !ok {
			at := "the record"
			if i > 0 {
				at = strings.Join(m.paths[f][:i], ".")
			}
			return nil, &DecodeError{Reason: ReasonMissingField, Field: fieldNames[f],
				Detail: fmt.Sprintf("required field %s is missing: %s is %s, not an object", m.where(f), at, kindOf(v))}
		}
		if v, ok = obj[seg]; !ok {
			return nil, &DecodeError{Reason: ReasonMissingField, Field: fieldNames[f],
				Detail: fmt.Sprintf("required field %s is missing", m.where(f))}
		}
		if _, dup := v.(ambiguous); dup {
			return nil, &DecodeError{Reason: ReasonDuplicateKey, Field: fieldNames[f],
				Detail: fmt.Sprintf("%s: key %s occurs more than once", m.where(f), quote([]byte(strings.Join(m.paths[f][:i+1], "."))))}
		}
	}
	return v, nil
}

func (m *Mapping) badType(f int, v any, want string) *DecodeError {
	return &DecodeError{Reason: ReasonInvalidField, Field: fieldNames[f],
		Detail: fmt.Sprintf("%s must be %s, got %s", m.where(f), want, kindOf(v))}
}

func (m *Mapping) id(tree any, f, maxLen int) (string, *DecodeError) {
	v, err := m.lookup(tree, f)
	if err != nil {
		return "", err
	}
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case json.Number:
		if !IsIntText(string(x)) {
			return "", m.badType(f, v, "a string or an integer")
		}
		s = string(x)
	default:
		n, ok := asInt64(v)
		if !ok {
			if u, isU := v.(uint64); isU {
				s = strconv.FormatUint(u, 10)
				break
			}
			return "", m.badType(f, v, "a string or an integer")
		}
		s = strconv.FormatInt(n, 10)
	}
	return checkID(f, s, maxLen, m.where(f))
}

// checkID applies the contract's rules for ids to s.
func checkID(f int, s string, maxLen int, where string) (string, *DecodeError) {
	name := fieldNames[f]
	if where == "" {
		where = name
	}
	switch {
	case !utf8.ValidString(s):
		return "", &DecodeError{Reason: ReasonInvalidUTF8, Field: name, Detail: where + " is not valid UTF-8: " + quote([]byte(s))}
	case len(s) == 0:
		return "", &DecodeError{Reason: ReasonInvalidField, Field: name, Detail: where + " is empty"}
	case len(s) > maxLen:
		return "", &DecodeError{Reason: ReasonIDTooLong, Field: name,
			Detail: fmt.Sprintf("%s is %d bytes, max %d: %s", where, len(s), maxLen, quote([]byte(s)))}
	}
	if i, r := findControl([]byte(s)); i >= 0 {
		return "", &DecodeError{Reason: ReasonInvalidField, Field: name,
			Detail: fmt.Sprintf("%s contains control character %U at byte %d: %s", where, r, i, quote([]byte(s)))}
	}
	return s, nil
}

func (m *Mapping) currency(tree any) (string, *DecodeError) {
	v, err := m.lookup(tree, fCurrency)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", m.badType(fCurrency, v, "a string")
	}
	if !isCurrency([]byte(s)) {
		return "", &DecodeError{Reason: ReasonInvalidCurrency, Field: "currency",
			Detail: fmt.Sprintf("%s %s is not 3 upper-case ASCII letters", m.where(fCurrency), quote([]byte(s)))}
	}
	return s, nil
}

func (m *Mapping) amount(v any, cur string, curErr *DecodeError) (int64, *DecodeError) {
	outOfRange := func(text string) *DecodeError {
		return &DecodeError{Reason: ReasonAmountOutOfRange, Field: "amount_minor",
			Detail: fmt.Sprintf("%s %s does not fit a signed 64-bit integer of minor units", m.where(fAmount), text)}
	}
	switch x := v.(type) {
	case json.Number:
		if !IsIntText(string(x)) {
			return 0, &DecodeError{Reason: ReasonAmountNotInteger, Field: "amount_minor",
				Detail: fmt.Sprintf("%s %s is not a JSON integer (fraction or exponent present); write a decimal as a string", m.where(fAmount), quote([]byte(x)))}
		}
		n, err := strconv.ParseInt(string(x), 10, 64)
		if err != nil {
			return 0, outOfRange(string(x))
		}
		return n, nil
	case uint64:
		if x > math.MaxInt64 {
			return 0, outOfRange(strconv.FormatUint(x, 10))
		}
		return int64(x), nil
	case string, *big.Rat:
		if curErr != nil {
			return 0, curErr // the decimal cannot be scaled without it
		}
		r, text, ok := decimalOf(x)
		if !ok {
			return 0, &DecodeError{Reason: ReasonInvalidField, Field: "amount_minor",
				Detail: fmt.Sprintf("%s %s is not a decimal number (-?digits[.digits])", m.where(fAmount), quote([]byte(text)))}
		}
		exp := CurrencyExponent(cur)
		r.Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(exp)), nil)))
		if !r.IsInt() {
			return 0, &DecodeError{Reason: ReasonAmountInexact, Field: "amount_minor",
				Detail: fmt.Sprintf("%s %s %s has more decimals than the currency's %d: not a whole number of minor units", m.where(fAmount), text, cur, exp)}
		}
		if !r.Num().IsInt64() {
			return 0, outOfRange(text)
		}
		return r.Num().Int64(), nil
	}
	if n, ok := asInt64(v); ok {
		return n, nil
	}
	return 0, m.badType(fAmount, v, "an integer of minor units or a decimal (string or decimal type)")
}

// decimalOf reads a decimal string or a *big.Rat (a copy, the caller may
// change it).
func decimalOf(v any) (r *big.Rat, text string, ok bool) {
	switch x := v.(type) {
	case *big.Rat:
		if x == nil {
			return nil, "null", false
		}
		return new(big.Rat).Set(x), x.FloatString(8), true
	case string:
		if !isDecimalText(x) {
			return nil, x, false
		}
		r, ok := new(big.Rat).SetString(x)
		return r, x, ok
	}
	return nil, "", false
}

// IsIntText reports whether s matches -?[0-9]+ (a JSON number's text that
// is an integer's).
func IsIntText(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// isDecimalText reports s matches -?[0-9]+(\.[0-9]+)?, at most 64 bytes
// (a longer one is no amount, and big.Rat's work grows with it).
func isDecimalText(s string) bool {
	if len(s) > 64 {
		return false
	}
	i, f, hasPoint := strings.Cut(s, ".")
	return IsIntText(i) && (!hasPoint || f != "" && IsIntText(f) && f[0] != '-')
}

func asInt64(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint:
		return int64(x), uint64(x) <= math.MaxInt64
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	}
	return 0, false
}

func (m *Mapping) time(tree any) (time.Time, *DecodeError) {
	v, err := m.lookup(tree, fOccurredAt)
	if err != nil {
		return time.Time{}, err
	}
	bad := func(text, problem string) *DecodeError {
		return &DecodeError{Reason: ReasonInvalidTime, Field: "occurred_at",
			Detail: fmt.Sprintf("%s %s: %s", m.where(fOccurredAt), text, problem)}
	}
	var t time.Time
	switch x := v.(type) {
	case string:
		at, problem := parseRFC3339([]byte(x))
		if problem != "" {
			return time.Time{}, bad(quote([]byte(x)), "not an RFC 3339 date-time with zone offset: "+problem)
		}
		return at, nil
	case time.Time:
		t = x
	case json.Number:
		n, perr := strconv.ParseInt(string(x), 10, 64)
		if perr != nil {
			return time.Time{}, m.badType(fOccurredAt, v, "an RFC 3339 string, a timestamp or integer epoch milliseconds")
		}
		t = time.UnixMilli(n)
	default:
		n, ok := asInt64(v)
		if !ok {
			return time.Time{}, m.badType(fOccurredAt, v, "an RFC 3339 string, a timestamp or integer epoch milliseconds")
		}
		t = time.UnixMilli(n)
	}
	t = t.Round(0).UTC()
	if y := t.Year(); y < MinYear || y > MaxYear {
		return time.Time{}, bad(t.Format(time.RFC3339Nano), fmt.Sprintf("year outside %d-%d", MinYear, MaxYear))
	}
	return t, nil
}

// kindOf names the type of a tree value for a detail.
func kindOf(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case json.Number:
		return "number " + string(x)
	case bool:
		return "boolean"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case []byte:
		return "bytes"
	case *big.Rat:
		return "decimal"
	case time.Time:
		return "timestamp"
	case float32, float64:
		return "floating-point number"
	}
	if _, ok := asInt64(v); ok {
		return "integer"
	}
	return fmt.Sprintf("%T", v)
}

// CurrencyExponent returns the number of decimals of the currency's minor
// unit per ISO 4217 (JPY 0, EUR 2, BHD 3, CLF 4); a code that the table
// does not list has 2. It converts decimal amounts to minor units.
func CurrencyExponent(code string) int {
	switch code {
	case "BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND", "VUV", "XAF", "XOF", "XPF":
		return 0
	case "BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND":
		return 3
	case "CLF", "UYW":
		return 4
	}
	return 2
}
