package event

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

const baseRecord = `{"event_id":"e-7f3a","account_id":"acct-42","amount_minor":1250,"currency":"EUR","occurred_at":"2026-11-29T13:05:00Z"}`

var baseEvent = Event{
	EventID:     "e-7f3a",
	AccountID:   "acct-42",
	AmountMinor: 1250,
	Currency:    "EUR",
	OccurredAt:  time.Date(2026, 11, 29, 13, 5, 0, 0, time.UTC),
}

var baseFields = [][2]string{
	{"event_id", `"e-7f3a"`},
	{"account_id", `"acct-42"`},
	{"amount_minor", `1250`},
	{"currency", `"EUR"`},
	{"occurred_at", `"2026-11-29T13:05:00Z"`},
}

// with returns the base record with the raw JSON value of field replaced.
func with(field, raw string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, kv := range baseFields {
		if i > 0 {
			b.WriteByte(',')
		}
		v := kv[1]
		if kv[0] == field {
			v = raw
		}
		fmt.Fprintf(&b, "%q:%s", kv[0], v)
	}
	b.WriteByte('}')
	return b.String()
}

// without returns the base record without field.
func without(field string) string {
	var parts []string
	for _, kv := range baseFields {
		if kv[0] != field {
			parts = append(parts, fmt.Sprintf("%q:%s", kv[0], kv[1]))
		}
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// plus returns the base record with extra raw members appended.
func plus(members string) string {
	return strings.TrimSuffix(baseRecord, "}") + "," + members + "}"
}

// ev returns baseEvent modified by mod.
func ev(mod func(*Event)) Event {
	e := baseEvent
	mod(&e)
	return e
}

type acceptCase struct {
	name string
	in   string
	want Event
}

var acceptCases = []acceptCase{
	{"base", baseRecord, baseEvent},
	{"white space everywhere", " \t\r\n{ \"event_id\" : \"e-7f3a\" ,\n\"account_id\":\"acct-42\",\t\"amount_minor\" :1250 , \"currency\":\"EUR\",\"occurred_at\":\"2026-11-29T13:05:00Z\"\r\n}\n ", baseEvent},
	{"member order irrelevant", `{"occurred_at":"2026-11-29T13:05:00Z","currency":"EUR","amount_minor":1250,"account_id":"acct-42","event_id":"e-7f3a"}`, baseEvent},
	{"unknown fields ignored", plus(`"source":"web","v":2.5e10,"meta":{"a":[1,{"b":null}],"a":true},"tags":[],"o":{},"n":null,"f":false,"s":"\u00e9\ud83d\ude00\n"`), baseEvent},
	{"unknown field first", `{"x":[[[[{}]]]],` + baseRecord[1:], baseEvent},
	{"case-different key is unknown", plus(`"EVENT_ID":"other","Event_Id":"x"`), baseEvent},
	{"escaped known key", strings.Replace(baseRecord, `"event_id"`, `"event\u005fid"`, 1), baseEvent},
	{"twenty distinct unknown keys", plus(manyKeys(20, false)), baseEvent},

	{"amount max int64", with("amount_minor", "9223372036854775807"), ev(func(e *Event) { e.AmountMinor = 1<<63 - 1 })},
	{"amount min int64", with("amount_minor", "-9223372036854775808"), ev(func(e *Event) { e.AmountMinor = -1 << 63 })},
	{"amount zero", with("amount_minor", "0"), ev(func(e *Event) { e.AmountMinor = 0 })},
	{"amount minus zero", with("amount_minor", "-0"), ev(func(e *Event) { e.AmountMinor = 0 })},
	{"amount refund", with("amount_minor", "-1250"), ev(func(e *Event) { e.AmountMinor = -1250 })},

	{"event_id 128 bytes", with("event_id", `"`+strings.Repeat("a", 128)+`"`), ev(func(e *Event) { e.EventID = strings.Repeat("a", 128) })},
	{"event_id 1 byte", with("event_id", `"x"`), ev(func(e *Event) { e.EventID = "x" })},
	{"event_id 128 bytes multibyte", with("event_id", `"`+strings.Repeat("é", 64)+`"`), ev(func(e *Event) { e.EventID = strings.Repeat("é", 64) })},
	{"event_id 128 decoded bytes from escapes", with("event_id", `"`+strings.Repeat(`\u00e9`, 64)+`"`), ev(func(e *Event) { e.EventID = strings.Repeat("é", 64) })},
	{"account_id 64 bytes", with("account_id", `"`+strings.Repeat("b", 64)+`"`), ev(func(e *Event) { e.AccountID = strings.Repeat("b", 64) })},
	{"unicode escapes in ids", with("event_id", `"e\u00e9\ud83d\ude00\/\"\\\u0041"`), ev(func(e *Event) { e.EventID = "eé😀/\"\\A" })},
	{"raw unicode in id", with("account_id", `"acct-日本"`), ev(func(e *Event) { e.AccountID = "acct-日本" })},
	{"U+00A0 is not a control", with("account_id", `"a\u00a0b"`), ev(func(e *Event) { e.AccountID = "a\u00a0b" })},
	{"escaped currency", with("currency", `"\u0045UR"`), baseEvent},

	{"offset plus converted to UTC", with("occurred_at", `"2026-11-29T14:05:00+01:00"`), baseEvent},
	{"offset minus converted to UTC", with("occurred_at", `"2026-11-29T07:35:00-05:30"`), baseEvent},
	{"offset crossing date", with("occurred_at", `"2026-11-30T13:04:00+23:59"`), ev(func(e *Event) { e.OccurredAt = time.Date(2026, 11, 29, 13, 5, 0, 0, time.UTC) })},
	{"offset -00:00", with("occurred_at", `"2026-11-29T13:05:00-00:00"`), baseEvent},
	{"offset +00:00", with("occurred_at", `"2026-11-29T13:05:00+00:00"`), baseEvent},
	{"lower-case t and z", with("occurred_at", `"2026-11-29t13:05:00z"`), baseEvent},
	{"fraction 1 digit", with("occurred_at", `"2026-11-29T13:05:00.5Z"`), ev(func(e *Event) { e.OccurredAt = e.OccurredAt.Add(500 * time.Millisecond) })},
	{"fraction 9 digits", with("occurred_at", `"2026-11-29T13:05:00.000000001Z"`), ev(func(e *Event) { e.OccurredAt = e.OccurredAt.Add(1) })},
	{"escaped time", with("occurred_at", `"2026-11-29T13:05:00\u005a"`), baseEvent},
	{"leap day", with("occurred_at", `"2024-02-29T00:00:00Z"`), ev(func(e *Event) { e.OccurredAt = time.Date(2024, 2, 29, 0, 0, 0, 0, time.UTC) })},
	{"year 1000", with("occurred_at", `"1000-01-01T00:00:00Z"`), ev(func(e *Event) { e.OccurredAt = time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC) })},
	{"year 9999", with("occurred_at", `"9999-12-31T23:59:59.999999999Z"`), ev(func(e *Event) { e.OccurredAt = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC) })},
	{"before 1970", with("occurred_at", `"1969-12-31T23:59:59+00:00"`), ev(func(e *Event) { e.OccurredAt = time.Unix(-1, 0).UTC() })},
}

// manyKeys returns n members "k0":0,...; with dup, the last key repeats the first.
func manyKeys(n int, dup bool) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"k%d":%d`, i, i)
	}
	if dup {
		parts[n-1] = `"k0":1`
	}
	return strings.Join(parts, ",")
}

func TestDecodeAccepts(t *testing.T) {
	var d Decoder
	for _, tc := range acceptCases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := d.Decode([]byte(tc.in))
			if err != nil {
				t.Fatalf("Decode(%s) error: %v", quote([]byte(tc.in)), err)
			}
			assertEvent(t, got, tc.want)
		})
	}
}

func assertEvent(t *testing.T, got, want Event) {
	t.Helper()
	if got.EventID != want.EventID || got.AccountID != want.AccountID || got.AmountMinor != want.AmountMinor ||
		got.Currency != want.Currency || !got.OccurredAt.Equal(want.OccurredAt) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	if got.OccurredAt.Location() != time.UTC {
		t.Fatalf("OccurredAt location = %v, want UTC", got.OccurredAt.Location())
	}
	if got != want { // also same representation: UTC, no monotonic reading
		t.Fatalf("Event not == (representation differs): got %#v want %#v", got.OccurredAt, want.OccurredAt)
	}
}

type rejectCase struct {
	name   string
	in     string
	reason Reason
	field  string
}

var rejectCases = []rejectCase{
	{"empty", "", ReasonEmptyPayload, ""},
	{"white space only", " \n\t", ReasonInvalidJSON, ""},
	{"array", `[` + baseRecord + `]`, ReasonInvalidJSON, ""},
	{"null", `null`, ReasonInvalidJSON, ""},
	{"string", `"x"`, ReasonInvalidJSON, ""},
	{"number", `1`, ReasonInvalidJSON, ""},
	{"BOM", "\ufeff" + baseRecord, ReasonInvalidJSON, ""},
	{"trailing garbage", baseRecord + "x", ReasonInvalidJSON, ""},
	{"trailing object", baseRecord + "{}", ReasonInvalidJSON, ""},
	{"trailing comma after object", baseRecord + ",", ReasonInvalidJSON, ""},
	{"trailing NUL", baseRecord + "\x00", ReasonInvalidJSON, ""},
	{"truncated", baseRecord[:len(baseRecord)-1], ReasonInvalidJSON, ""},
	{"trailing comma in object", plus(`"x":1,`), ReasonInvalidJSON, ""},
	{"missing colon", `{"event_id" "e"}`, ReasonInvalidJSON, ""},
	{"single quotes", `{'event_id':'e'}`, ReasonInvalidJSON, ""},
	{"unquoted key", `{event_id:"e"}`, ReasonInvalidJSON, ""},
	{"unterminated string", `{"event_id":"e`, ReasonInvalidJSON, "event_id"},
	{"raw control char in string", with("event_id", "\"a\x01b\""), ReasonInvalidJSON, "event_id"},
	{"raw newline in string", with("event_id", "\"a\nb\""), ReasonInvalidJSON, "event_id"},
	{"invalid escape", with("event_id", `"a\xb"`), ReasonInvalidJSON, "event_id"},
	{"short unicode escape", with("event_id", `"a\u12"`), ReasonInvalidJSON, "event_id"},
	{"bad unknown value", plus(`"x":[1,]`), ReasonInvalidJSON, ""},
	{"bad nested literal", plus(`"x":{"a":tru}`), ReasonInvalidJSON, ""},
	{"unclosed nested", plus(`"x":[{"a":1}`), ReasonInvalidJSON, ""},
	{"mismatched bracket", plus(`"x":[1}`), ReasonInvalidJSON, ""},

	{"amount leading zero", with("amount_minor", "012"), ReasonInvalidJSON, ""},
	{"amount leading zero negative", with("amount_minor", "-012"), ReasonInvalidJSON, ""},
	{"amount plus sign", with("amount_minor", "+12"), ReasonInvalidJSON, "amount_minor"},
	{"amount lone minus", with("amount_minor", "-"), ReasonInvalidJSON, "amount_minor"},
	{"amount leading dot", with("amount_minor", ".5"), ReasonInvalidJSON, "amount_minor"},
	{"amount trailing dot", with("amount_minor", "1."), ReasonInvalidJSON, "amount_minor"},
	{"amount bare exponent", with("amount_minor", "1e"), ReasonInvalidJSON, "amount_minor"},
	{"amount NaN", with("amount_minor", "NaN"), ReasonInvalidJSON, "amount_minor"},
	{"amount hex", with("amount_minor", "0x10"), ReasonInvalidJSON, ""},
	{"amount 12.0", with("amount_minor", "12.0"), ReasonAmountNotInteger, "amount_minor"},
	{"amount 1e3", with("amount_minor", "1e3"), ReasonAmountNotInteger, "amount_minor"},
	{"amount 1E+3", with("amount_minor", "1E+3"), ReasonAmountNotInteger, "amount_minor"},
	{"amount 0e0", with("amount_minor", "0e0"), ReasonAmountNotInteger, "amount_minor"},
	{"amount -0.0", with("amount_minor", "-0.0"), ReasonAmountNotInteger, "amount_minor"},
	{"amount 12.5", with("amount_minor", "12.5"), ReasonAmountNotInteger, "amount_minor"},
	{"amount huge float", with("amount_minor", "1e400"), ReasonAmountNotInteger, "amount_minor"},
	{"amount quoted", with("amount_minor", `"12"`), ReasonInvalidField, "amount_minor"},
	{"amount null", with("amount_minor", "null"), ReasonInvalidField, "amount_minor"},
	{"amount bool", with("amount_minor", "true"), ReasonInvalidField, "amount_minor"},
	{"amount object", with("amount_minor", `{"v":1}`), ReasonInvalidField, "amount_minor"},
	{"amount max+1", with("amount_minor", "9223372036854775808"), ReasonAmountOutOfRange, "amount_minor"},
	{"amount min-1", with("amount_minor", "-9223372036854775809"), ReasonAmountOutOfRange, "amount_minor"},
	{"amount 2^64", with("amount_minor", "18446744073709551616"), ReasonAmountOutOfRange, "amount_minor"},
	{"amount very long", with("amount_minor", strings.Repeat("9", 400)), ReasonAmountOutOfRange, "amount_minor"},

	{"event_id empty", with("event_id", `""`), ReasonInvalidField, "event_id"},
	{"event_id 129 bytes", with("event_id", `"`+strings.Repeat("a", 129)+`"`), ReasonIDTooLong, "event_id"},
	{"event_id 129 bytes via escape", with("event_id", `"`+strings.Repeat("a", 127)+`\u00e9"`), ReasonIDTooLong, "event_id"},
	{"event_id 130 bytes multibyte", with("event_id", `"`+strings.Repeat("é", 65)+`"`), ReasonIDTooLong, "event_id"},
	{"event_id number", with("event_id", `7`), ReasonInvalidField, "event_id"},
	{"event_id null", with("event_id", `null`), ReasonInvalidField, "event_id"},
	{"event_id array", with("event_id", `["e"]`), ReasonInvalidField, "event_id"},
	{"event_id escaped NUL", with("event_id", `"a\u0000b"`), ReasonInvalidField, "event_id"},
	{"event_id escaped newline", with("event_id", `"a\nb"`), ReasonInvalidField, "event_id"},
	{"event_id escaped tab", with("event_id", `"a\tb"`), ReasonInvalidField, "event_id"},
	{"event_id raw DEL", with("event_id", "\"a\x7fb\""), ReasonInvalidField, "event_id"},
	{"event_id escaped DEL", with("event_id", `"a\u007fb"`), ReasonInvalidField, "event_id"},
	{"event_id raw C1 NEL", with("event_id", "\"a\u0085b\""), ReasonInvalidField, "event_id"},
	{"event_id escaped C1 U+009F", with("event_id", `"a\u009f"`), ReasonInvalidField, "event_id"},
	{"account_id empty", with("account_id", `""`), ReasonInvalidField, "account_id"},
	{"account_id 65 bytes", with("account_id", `"`+strings.Repeat("b", 65)+`"`), ReasonIDTooLong, "account_id"},
	{"account_id control", with("account_id", `"a\rb"`), ReasonInvalidField, "account_id"},
	{"account_id number", with("account_id", `42`), ReasonInvalidField, "account_id"},

	{"invalid UTF-8 in id", with("event_id", "\"a\xffb\""), ReasonInvalidUTF8, "event_id"},
	{"truncated UTF-8 in id", with("event_id", "\"a\xc3\""), ReasonInvalidUTF8, "event_id"},
	{"overlong UTF-8", with("account_id", "\"\xc0\x80\""), ReasonInvalidUTF8, "account_id"},
	{"UTF-8 encoded surrogate", with("event_id", "\"\xed\xa0\x80\""), ReasonInvalidUTF8, "event_id"},
	{"invalid UTF-8 in unknown value", plus("\"x\":\"\xfe\""), ReasonInvalidUTF8, ""},
	{"invalid UTF-8 in nested unknown", plus("\"x\":{\"y\":[\"\x80\"]}"), ReasonInvalidUTF8, ""},
	{"invalid UTF-8 in key", plus("\"\xff\":1"), ReasonInvalidUTF8, ""},
	{"lone high surrogate", with("event_id", `"\ud800"`), ReasonInvalidUTF8, "event_id"},
	{"lone low surrogate", with("event_id", `"\udc00x"`), ReasonInvalidUTF8, "event_id"},
	{"high surrogate then non-surrogate", with("event_id", `"\ud800\u0041"`), ReasonInvalidUTF8, "event_id"},
	{"reversed surrogates", with("event_id", `"\ude00\ud83d"`), ReasonInvalidUTF8, "event_id"},
	{"lone surrogate in unknown", plus(`"x":"\udfff"`), ReasonInvalidUTF8, ""},

	{"duplicate event_id same value", plus(`"event_id":"e-7f3a"`), ReasonDuplicateKey, "event_id"},
	{"duplicate amount", plus(`"amount_minor":1`), ReasonDuplicateKey, "amount_minor"},
	{"duplicate via escape", plus(`"occurred\u005fat":"2026-11-29T13:05:00Z"`), ReasonDuplicateKey, "occurred_at"},
	{"duplicate unknown", plus(`"x":1,"x":1`), ReasonDuplicateKey, ""},
	{"duplicate unknown via escape", plus(`"x":1,"\u0078":1`), ReasonDuplicateKey, ""},
	{"duplicate among many unknown", plus(manyKeys(40, true)), ReasonDuplicateKey, ""},
	{"duplicate wins over missing field", `{"x":1,"x":2}`, ReasonDuplicateKey, ""},
	{"syntax error wins over earlier duplicate", plus(`"event_id":"e","y":tru`), ReasonInvalidJSON, ""},

	{"missing event_id", without("event_id"), ReasonMissingField, "event_id"},
	{"missing account_id", without("account_id"), ReasonMissingField, "account_id"},
	{"missing amount_minor", without("amount_minor"), ReasonMissingField, "amount_minor"},
	{"missing currency", without("currency"), ReasonMissingField, "currency"},
	{"missing occurred_at", without("occurred_at"), ReasonMissingField, "occurred_at"},
	{"empty object", `{}`, ReasonMissingField, "event_id"},
	{"missing reported in field order", `{"currency":"EUR"}`, ReasonMissingField, "event_id"},

	{"currency lower case", with("currency", `"eur"`), ReasonInvalidCurrency, "currency"},
	{"currency two letters", with("currency", `"EU"`), ReasonInvalidCurrency, "currency"},
	{"currency four letters", with("currency", `"EURO"`), ReasonInvalidCurrency, "currency"},
	{"currency empty", with("currency", `""`), ReasonInvalidCurrency, "currency"},
	{"currency digit", with("currency", `"E1R"`), ReasonInvalidCurrency, "currency"},
	{"currency non-ASCII", with("currency", `"ÉUR"`), ReasonInvalidCurrency, "currency"},
	{"currency padded", with("currency", `" EUR"`), ReasonInvalidCurrency, "currency"},
	{"currency number", with("currency", `978`), ReasonInvalidField, "currency"},
	{"currency null", with("currency", `null`), ReasonInvalidField, "currency"},

	{"time without offset", with("occurred_at", `"2026-11-29T13:05:00"`), ReasonInvalidTime, "occurred_at"},
	{"time date only", with("occurred_at", `"2026-11-29"`), ReasonInvalidTime, "occurred_at"},
	{"time space separator", with("occurred_at", `"2026-11-29 13:05:00Z"`), ReasonInvalidTime, "occurred_at"},
	{"time Feb 30", with("occurred_at", `"2026-02-30T13:05:00Z"`), ReasonInvalidTime, "occurred_at"},
	{"time Feb 29 non-leap", with("occurred_at", `"2100-02-29T13:05:00Z"`), ReasonInvalidTime, "occurred_at"},
	{"time month 13", with("occurred_at", `"2026-13-01T13:05:00Z"`), ReasonInvalidTime, "occurred_at"},
	{"time hour 24", with("occurred_at", `"2026-11-29T24:00:00Z"`), ReasonInvalidTime, "occurred_at"},
	{"time leap second", with("occurred_at", `"2016-12-31T23:59:60Z"`), ReasonInvalidTime, "occurred_at"},
	{"time offset hour 24", with("occurred_at", `"2026-11-29T13:05:00+24:00"`), ReasonInvalidTime, "occurred_at"},
	{"time offset minute 60", with("occurred_at", `"2026-11-29T13:05:00+01:60"`), ReasonInvalidTime, "occurred_at"},
	{"time offset without colon", with("occurred_at", `"2026-11-29T13:05:00+0100"`), ReasonInvalidTime, "occurred_at"},
	{"time offset hours only", with("occurred_at", `"2026-11-29T13:05:00+01"`), ReasonInvalidTime, "occurred_at"},
	{"time 10 fraction digits", with("occurred_at", `"2026-11-29T13:05:00.0000000001Z"`), ReasonInvalidTime, "occurred_at"},
	{"time comma fraction", with("occurred_at", `"2026-11-29T13:05:00,5Z"`), ReasonInvalidTime, "occurred_at"},
	{"time empty fraction", with("occurred_at", `"2026-11-29T13:05:00.Z"`), ReasonInvalidTime, "occurred_at"},
	{"time one-digit hour", with("occurred_at", `"2026-11-29T3:05:00Z"`), ReasonInvalidTime, "occurred_at"},
	{"time 5-digit year", with("occurred_at", `"12026-11-29T13:05:00Z"`), ReasonInvalidTime, "occurred_at"},
	{"time signed year", with("occurred_at", `"+2026-11-29T13:05:00Z"`), ReasonInvalidTime, "occurred_at"},
	{"time trailing space", with("occurred_at", `"2026-11-29T13:05:00Z "`), ReasonInvalidTime, "occurred_at"},
	{"time before year 1000 in UTC", with("occurred_at", `"1000-01-01T00:00:00+00:01"`), ReasonInvalidTime, "occurred_at"},
	{"year 0999 is outside DATETIME", with("occurred_at", `"0999-12-31T23:59:59Z"`), ReasonInvalidTime, "occurred_at"},
	{"time after year 9999 in UTC", with("occurred_at", `"9999-12-31T23:59:59-00:01"`), ReasonInvalidTime, "occurred_at"},
	{"time unix number", with("occurred_at", `1795957500`), ReasonInvalidField, "occurred_at"},
	{"time empty", with("occurred_at", `""`), ReasonInvalidTime, "occurred_at"},
	{"time Unicode digits", with("occurred_at", `"２026-11-29T13:05:00Z"`), ReasonInvalidTime, "occurred_at"},

	{"first failing field wins", `{"event_id":"","account_id":"","amount_minor":1.5,"currency":"x","occurred_at":"x"}`, ReasonInvalidField, "event_id"},
}

func TestDecodeRejects(t *testing.T) {
	d := NewDecoder(0)
	for _, tc := range rejectCases {
		t.Run(tc.name, func(t *testing.T) {
			assertReject(t, d, []byte(tc.in), tc.reason, tc.field)
		})
	}
}

func assertReject(t *testing.T, d *Decoder, in []byte, reason Reason, field string) {
	t.Helper()
	got, err := d.Decode(in)
	if err == nil {
		t.Fatalf("Decode(%s) = %+v, want %s error", quote(in), got, reason)
	}
	if got != (Event{}) {
		t.Errorf("Decode returned non-zero Event %+v with error", got)
	}
	var de *DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("error %T %v is not a *DecodeError", err, err)
	}
	if de.Reason != reason || de.Field != field {
		t.Fatalf("Decode(%s): reason %q field %q, want reason %q field %q (%v)", quote(in), de.Reason, de.Field, reason, field, err)
	}
	if de.Detail == "" || err.Error() != "event: "+string(reason)+": "+de.Detail {
		t.Fatalf("bad message %q", err.Error())
	}
	if field != "" && !strings.Contains(de.Detail, field) {
		t.Errorf("Detail %q does not name field %q", de.Detail, field)
	}
}

func TestDecodeNil(t *testing.T) {
	var d Decoder
	assertReject(t, &d, nil, ReasonEmptyPayload, "")
	var nilDecoder *Decoder // behaves like the zero Decoder
	if _, err := nilDecoder.Decode([]byte(baseRecord)); err != nil {
		t.Fatal(err)
	}
}

func TestDecodeMaxPayload(t *testing.T) {
	n := len(baseRecord)
	d := NewDecoder(n)
	if _, err := d.Decode([]byte(baseRecord)); err != nil {
		t.Fatalf("record of exactly MaxPayload bytes rejected: %v", err)
	}
	assertReject(t, d, []byte(baseRecord+" "), ReasonPayloadTooLarge, "")
	// Size is checked before syntax.
	assertReject(t, NewDecoder(4), []byte("{{{{{"), ReasonPayloadTooLarge, "")

	var def Decoder
	big := plus(`"pad":"` + strings.Repeat("x", DefaultMaxPayload) + `"`)
	assertReject(t, &def, []byte(big), ReasonPayloadTooLarge, "")
	fit := plus(`"pad":"` + strings.Repeat("x", DefaultMaxPayload-len(baseRecord)-9) + `"`)
	if len(fit) != DefaultMaxPayload {
		t.Fatalf("test bug: len %d", len(fit))
	}
	if _, err := def.Decode([]byte(fit)); err != nil {
		t.Fatalf("record of DefaultMaxPayload bytes rejected: %v", err)
	}
	if _, err := NewDecoder(-1).Decode([]byte(fit)); err != nil {
		t.Fatalf("negative MaxPayload should mean default: %v", err)
	}
}

func TestDecodeDeepNesting(t *testing.T) {
	d := NewDecoder(1 << 20)
	depth := 20000
	deep := plus(`"x":` + strings.Repeat("[", depth) + strings.Repeat("]", depth))
	if _, err := d.Decode([]byte(deep)); err != nil {
		t.Fatalf("deeply nested unknown field rejected: %v", err)
	}
	unbalanced := plus(`"x":` + strings.Repeat(`{"a":[`, depth))
	assertReject(t, d, []byte(unbalanced), ReasonInvalidJSON, "")
}

func TestDecodeDoesNotAliasInput(t *testing.T) {
	var d Decoder
	buf := []byte(baseRecord)
	got, err := d.Decode(buf)
	if err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = 'X'
	}
	assertEvent(t, got, baseEvent)
}

func TestDecodeAllocs(t *testing.T) {
	var d Decoder
	in := []byte(baseRecord)
	if n := testing.AllocsPerRun(100, func() { _, _ = d.Decode(in) }); n > 1 {
		t.Errorf("Decode of a valid record: %v allocs, want <= 1", n)
	}
	escaped := []byte(with("event_id", `"e\u00e9-\"1\""`))
	if n := testing.AllocsPerRun(100, func() { _, _ = d.Decode(escaped) }); n > 1 {
		t.Errorf("Decode with escapes: %v allocs, want <= 1", n)
	}
	unknown := []byte(plus(manyKeys(16, false)))
	if n := testing.AllocsPerRun(100, func() { _, _ = d.Decode(unknown) }); n > 1 {
		t.Errorf("Decode with 16 unknown keys: %v allocs, want <= 1", n)
	}
}

func TestAllReasons(t *testing.T) {
	all := AllReasons()
	seen := map[Reason]bool{}
	for _, r := range all {
		if seen[r] {
			t.Errorf("duplicate reason %q", r)
		}
		seen[r] = true
		for _, c := range string(r) {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
				t.Errorf("reason %q is not snake_case", r)
			}
		}
	}
	for _, tc := range rejectCases {
		if !seen[tc.reason] {
			t.Errorf("reason %q used but not in AllReasons", tc.reason)
		}
	}
	if !seen["conflicting_duplicate"] || !seen["amount_overflow"] {
		t.Error("reserved reasons missing")
	}
	all[0] = "mutated"
	if AllReasons()[0] == "mutated" {
		t.Error("AllReasons exposes shared state")
	}
}

func TestDecodeErrorDetails(t *testing.T) {
	var d Decoder
	_, err := d.Decode([]byte(with("currency", `"eur"`)))
	if want := `event: invalid_currency: currency "eur" is not 3 upper-case ASCII letters`; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	// Echoed input is bounded.
	_, err = d.Decode([]byte(with("event_id", `"`+strings.Repeat("é", 5000)+`"`)))
	if err == nil || len(err.Error()) > 300 {
		t.Errorf("detail not truncated: %d bytes", len(err.Error()))
	}
	_, err = d.Decode([]byte(plus(`"x":1,"` + strings.Repeat("k", 5000) + `":1,"` + strings.Repeat("k", 5000) + `":1`)))
	if err == nil || len(err.Error()) > 300 {
		t.Errorf("detail not truncated: %v", err)
	}
}

// A rejected record whose event id is valid carries it, so that its dead
// letter can be found by it; a record without a valid id carries none.
func TestDecodeErrorCarriesEventID(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{"bad currency", with("currency", `"eur"`), "e-7f3a"},
		{"bad amount", with("amount_minor", `1.5`), "e-7f3a"},
		{"missing account", without("account_id"), "e-7f3a"},
		{"bad time", with("occurred_at", `"yesterday"`), "e-7f3a"},
		{"missing event id", without("event_id"), ""},
		{"event id too long", with("event_id", `"`+strings.Repeat("a", 129)+`"`), ""},
		{"event id not a string", with("event_id", `7`), ""},
		{"invalid json", `{"event_id":"e-7f3a",`, ""},
	}
	d := NewDecoder(0)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.Decode([]byte(tc.in))
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("Decode(%s) = %v, want a *DecodeError", tc.in, err)
			}
			if de.EventID != tc.want {
				t.Fatalf("Decode(%s): EventID %q, want %q (%v)", tc.in, de.EventID, tc.want, err)
			}
		})
	}
}
