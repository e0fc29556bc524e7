package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strconv"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

// referenceDecode is an independent, slow implementation of the contract on
// top of encoding/json, used as an oracle: Decode must accept exactly the
// inputs it accepts and produce the same Event.
func referenceDecode(value []byte, maxPayload int) (Event, bool) {
	if len(value) == 0 || len(value) > maxPayload {
		return Event{}, false
	}
	// encoding/json neither rejects invalid UTF-8 nor unpaired surrogate
	// escapes (it substitutes U+FFFD), so check those separately.
	if !utf8.Valid(value) || !json.Valid(value) || hasUnpairedSurrogateEscape(value) {
		return Event{}, false
	}
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return Event{}, false
	}
	members := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return Event{}, false
		}
		key := tok.(string)
		if _, dup := members[key]; dup {
			return Event{}, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return Event{}, false
		}
		members[key] = raw
	}

	str := func(name string) (string, bool) {
		raw, ok := members[name]
		if !ok || raw[0] != '"' {
			return "", false
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return s, true
	}
	id := func(name string, max int) (string, bool) {
		s, ok := str(name)
		if !ok || len(s) < 1 || len(s) > max {
			return "", false
		}
		for _, r := range s {
			if unicode.Is(unicode.Cc, r) {
				return "", false
			}
		}
		return s, true
	}
	var e Event
	var ok bool
	if e.EventID, ok = id("event_id", 128); !ok {
		return Event{}, false
	}
	if e.AccountID, ok = id("account_id", 64); !ok {
		return Event{}, false
	}
	amount, ok := members["amount_minor"]
	if !ok || !integerRE.Match(amount) {
		return Event{}, false
	}
	n, err := strconv.ParseInt(string(amount), 10, 64)
	if err != nil {
		return Event{}, false
	}
	e.AmountMinor = n
	if e.Currency, ok = str("currency"); !ok || !currencyRE.MatchString(e.Currency) {
		return Event{}, false
	}
	ts, ok := str("occurred_at")
	if !ok || !rfc3339RE.MatchString(ts) {
		return Event{}, false
	}
	// Offset range is not validated by time.Parse.
	if z := ts[len(ts)-1]; z != 'Z' && z != 'z' {
		off := ts[len(ts)-5:]
		if off[0:2] > "23" || off[3:5] > "59" {
			return Event{}, false
		}
	}
	upper := []byte(ts)
	upper[10] = 'T'
	if upper[len(upper)-1] == 'z' {
		upper[len(upper)-1] = 'Z'
	}
	at, err := time.Parse(time.RFC3339Nano, string(upper))
	if err != nil {
		return Event{}, false
	}
	e.OccurredAt = at.UTC()
	if y := e.OccurredAt.Year(); y < MinYear || y > MaxYear {
		return Event{}, false
	}
	return e, true
}

var (
	integerRE  = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)
	currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)
	rfc3339RE  = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})$`)
)

// hasUnpairedSurrogateEscape reports whether a syntactically valid JSON
// text contains a \u escape of a surrogate that is not part of a
// high-low pair.
func hasUnpairedSurrogateEscape(data []byte) bool {
	inString := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case !inString:
			inString = c == '"'
		case c == '"':
			inString = false
		case c == '\\':
			if data[i+1] != 'u' {
				i++
				continue
			}
			v, _ := strconv.ParseUint(string(data[i+2:i+6]), 16, 16)
			i += 5
			switch {
			case v >= 0xdc00 && v <= 0xdfff:
				return true
			case v >= 0xd800 && v <= 0xdbff:
				if i+6 >= len(data) || data[i+1] != '\\' || data[i+2] != 'u' {
					return true
				}
				w, _ := strconv.ParseUint(string(data[i+3:i+7]), 16, 16)
				if w < 0xdc00 || w > 0xdfff {
					return true
				}
				i += 6
			}
		}
	}
	return false
}

var decoderReasons = map[Reason]bool{
	ReasonEmptyPayload: true, ReasonPayloadTooLarge: true, ReasonInvalidJSON: true, ReasonInvalidUTF8: true,
	ReasonDuplicateKey: true, ReasonMissingField: true, ReasonInvalidField: true, ReasonIDTooLong: true,
	ReasonAmountNotInteger: true, ReasonAmountOutOfRange: true, ReasonInvalidCurrency: true, ReasonInvalidTime: true,
}

var contractFields = map[string]bool{"": true, "event_id": true, "account_id": true, "amount_minor": true, "currency": true, "occurred_at": true}

// fuzzMaxPayload is small so that the size limit is exercised too.
const fuzzMaxPayload = 4096

func FuzzDecode(f *testing.F) {
	for _, tc := range acceptCases {
		f.Add([]byte(tc.in))
	}
	for _, tc := range rejectCases {
		if len(tc.in) <= fuzzMaxPayload+16 {
			f.Add([]byte(tc.in))
		}
	}
	f.Add([]byte(`{"event_id":"\ud83d\ude00","account_id":"a\"b","amount_minor":-0,"currency":"USD","occurred_at":"1999-12-31T23:59:59.999999999-23:59","x":[{"y":[1,-2.5e-3,true,false,null,"z"]}]}`))
	f.Add([]byte(`{"event_id":"e","account_id":"a","amount_minor":-9223372036854775808,"currency":"ZZZ","occurred_at":"0000-01-01T00:00:00-00:01"}`))
	f.Add([]byte(`{"event_id":"e","account_id":"a","amount_minor":1,"currency":"AAA","occurred_at":"9999-12-31T23:59:59+00:01"}`))

	f.Fuzz(func(t *testing.T, value []byte) {
		checkDecode(t, value)
	})
}

// FuzzDecodeFields composes records from per-field raw JSON fragments, so
// that mutations concentrate on field validation rather than on syntax.
func FuzzDecodeFields(f *testing.F) {
	f.Add(`"e-7f3a"`, `"acct-42"`, `1250`, `"EUR"`, `"2026-11-29T13:05:00Z"`, ``)
	f.Add(`"\u00e9\ud83d\ude00"`, `"a\u0000"`, `-9223372036854775808`, `"\u0045UR"`, `"2026-11-29t14:05:00.123456789+01:00"`, `"x":{"y":[]}`)
	f.Add(`""`, `"`+string(make128('a'))+`"`, `12.0`, `"eur"`, `"2016-12-31T23:59:60Z"`, `"event_id":"e"`)
	f.Add(`7`, `null`, `"12"`, `978`, `"0000-01-01T00:00:00+00:01"`, `"\ud800":1`)
	f.Fuzz(func(t *testing.T, eventID, accountID, amount, currency, occurredAt, extra string) {
		rec := `{"event_id":` + eventID + `,"account_id":` + accountID + `,"amount_minor":` + amount +
			`,"currency":` + currency + `,"occurred_at":` + occurredAt
		if extra != "" {
			rec += "," + extra
		}
		checkDecode(t, []byte(rec+"}"))
	})
}

// checkDecode checks every property of Decode that holds for all inputs:
// no panic, agreement with referenceDecode, well-formed errors, invariants
// of accepted events, and the encoding/json round trip.
func checkDecode(t *testing.T, value []byte) {
	t.Helper()
	d := NewDecoder(fuzzMaxPayload)
	in := bytes.Clone(value)
	got, err := d.Decode(value)
	if !bytes.Equal(in, value) {
		t.Fatal("Decode modified its input")
	}
	want, refOK := referenceDecode(value, fuzzMaxPayload)
	if err != nil {
		var de *DecodeError
		if !errors.As(err, &de) {
			t.Fatalf("error %T is not *DecodeError", err)
		}
		if !decoderReasons[de.Reason] || !contractFields[de.Field] || de.Detail == "" {
			t.Fatalf("malformed error %#v", de)
		}
		if got != (Event{}) {
			t.Fatalf("non-zero Event with error")
		}
		if refOK {
			t.Fatalf("rejected (%v) but the reference accepts: %+v", err, want)
		}
		return
	}
	if !refOK {
		t.Fatalf("accepted %+v but the reference rejects", got)
	}
	if got != want {
		t.Fatalf("got %#v\nreference %#v", got, want)
	}
	checkInvariants(t, got)

	// Re-encoding through encoding/json yields a record that decodes to
	// the same Event.
	re, merr := json.Marshal(got)
	if merr != nil {
		t.Fatalf("json.Marshal(%+v): %v", got, merr)
	}
	again, err := NewDecoder(1 << 20).Decode(re)
	if err != nil {
		t.Fatalf("re-encoded %s rejected: %v", re, err)
	}
	if again != got || again.Fingerprint() != got.Fingerprint() {
		t.Fatalf("round trip changed the event:\n%#v\n%#v", got, again)
	}
}

func checkInvariants(t *testing.T, e Event) {
	t.Helper()
	if n := len(e.EventID); n < 1 || n > MaxEventIDLen {
		t.Fatalf("event_id length %d", n)
	}
	if n := len(e.AccountID); n < 1 || n > MaxAccountIDLen {
		t.Fatalf("account_id length %d", n)
	}
	for _, s := range []string{e.EventID, e.AccountID} {
		if !utf8.ValidString(s) {
			t.Fatalf("invalid UTF-8 in %q", s)
		}
		for _, r := range s {
			if unicode.IsControl(r) {
				t.Fatalf("control character in %q", s)
			}
		}
	}
	if !currencyRE.MatchString(e.Currency) {
		t.Fatalf("currency %q", e.Currency)
	}
	if e.OccurredAt.Location() != time.UTC || e.OccurredAt != e.OccurredAt.Round(0) {
		t.Fatalf("OccurredAt not plain UTC: %#v", e.OccurredAt)
	}
}

// TestReferenceAgreesOnTables keeps the fuzz oracle honest: it must agree
// with the hand-written expectations.
func TestReferenceAgreesOnTables(t *testing.T) {
	for _, tc := range acceptCases {
		got, ok := referenceDecode([]byte(tc.in), DefaultMaxPayload)
		if !ok || !got.OccurredAt.Equal(tc.want.OccurredAt) || got.EventID != tc.want.EventID ||
			got.AccountID != tc.want.AccountID || got.AmountMinor != tc.want.AmountMinor || got.Currency != tc.want.Currency {
			t.Errorf("reference on accept case %q: %+v %v", tc.name, got, ok)
		}
	}
	for _, tc := range rejectCases {
		if _, ok := referenceDecode([]byte(tc.in), DefaultMaxPayload); ok {
			t.Errorf("reference accepts reject case %q", tc.name)
		}
	}
}
