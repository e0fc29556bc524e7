package event

import (
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"
)

func mustMapping(t *testing.T, spec string) Mapping {
	t.Helper()
	m, err := ParseMapping(spec)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The default mapping over the JSON tree accepts what the fast decoder
// accepts, with the same event: every format reads through a Mapping, so
// this is what makes their events (and fingerprints) the JSON path's.
func TestDefaultMappingAgreesWithDecoder(t *testing.T) {
	m := DefaultMapping()
	if !m.IsDefault() {
		t.Fatal("DefaultMapping is not default")
	}
	for _, c := range acceptCases {
		tree, derr := ParseJSON([]byte(c.in))
		if derr != nil {
			t.Errorf("%s: ParseJSON: %v", c.name, derr)
			continue
		}
		got, err := m.Event(tree, "")
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got != c.want || got.Fingerprint() != c.want.Fingerprint() {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestMappingPaths(t *testing.T) {
	m := mustMapping(t, "event_id=id, account_id=data.customer.id,amount_minor=data.amount,currency=data.cur,occurred_at=time")
	if m.IsDefault() || m.Path("account_id") != "data.customer.id" || !m.Named("currency") || m.Named("nothing") {
		t.Fatalf("mapping %s", m)
	}
	back, err := ParseMapping(m.String())
	if err != nil || back.String() != m.String() {
		t.Fatalf("round trip %q: %v", back.String(), err)
	}
	in := `{"id":"e-7f3a","time":"2026-11-29T13:05:00Z","data":{"customer":{"id":"acct-42"},"amount":1250,"cur":"EUR"}}`
	tree, derr := ParseJSON([]byte(in))
	if derr != nil {
		t.Fatal(derr)
	}
	got, err := m.Event(tree, "")
	if err != nil || got != baseEvent {
		t.Fatalf("got %+v, %v", got, err)
	}
	for _, c := range []struct{ in, field, detail string }{
		{`{"id":"e","time":"2026-11-29T13:05:00Z","data":{"customer":{},"amount":1,"cur":"EUR"}}`, "account_id", "account_id (at data.customer.id) is missing"},
		{`{"id":"e","time":"2026-11-29T13:05:00Z","data":{"customer":"x","amount":1,"cur":"EUR"}}`, "account_id", "data.customer is string, not an object"},
		{`{"id":"e","time":"2026-11-29T13:05:00Z","data":{"customer":{"id":"a"},"amount":true,"cur":"EUR"}}`, "amount_minor", "amount_minor (at data.amount) must be"},
		{`{"id":"e","data":{"customer":{"id":"a"},"amount":1,"cur":"EUR"}}`, "occurred_at", "occurred_at (at time) is missing"},
	} {
		tree, derr := ParseJSON([]byte(c.in))
		if derr != nil {
			t.Fatal(derr)
		}
		_, err := m.Event(tree, "")
		var de *DecodeError
		if !errors.As(err, &de) || de.Field != c.field || !strings.Contains(de.Detail, c.detail) || de.EventID != "e" {
			t.Errorf("%s: got %#v, want field %s detail containing %q", c.in, de, c.field, c.detail)
		}
	}
	for _, bad := range []string{"event_id", "nofield=x", "event_id=a..b", "event_id=a,event_id=b", "currency="} {
		if _, err := ParseMapping(bad); err == nil {
			t.Errorf("ParseMapping(%q) accepted", bad)
		}
	}
}

func treeWith(field string, v any) map[string]any {
	tree := map[string]any{"event_id": "e-7f3a", "account_id": "acct-42", "amount_minor": int64(1250), "currency": "EUR",
		"occurred_at": "2026-11-29T13:05:00Z"}
	tree[field] = v
	return tree
}

func rat(s string) *big.Rat { r, _ := new(big.Rat).SetString(s); return r }

// Amounts as producers write them convert exactly, or are rejected: never
// rounded.
func TestMappingAmounts(t *testing.T) {
	m := DefaultMapping()
	ok := []struct {
		name string
		v    any
		cur  string
		want int64
	}{
		{"int32", int32(-1250), "EUR", -1250},
		{"int64 max", int64(1<<63 - 1), "EUR", 1<<63 - 1},
		{"uint8", uint8(7), "EUR", 7},
		{"uint64", uint64(1250), "EUR", 1250},
		{"json integer", jsonNum("1250"), "EUR", 1250},
		{"decimal string", "12.50", "EUR", 1250},
		{"decimal string trailing zeros", "12.5000", "EUR", 1250},
		{"decimal string no point", "12", "EUR", 1200},
		{"negative decimal", "-0.01", "EUR", -1},
		{"yen", "1250", "JPY", 1250},
		{"dinar", "1.234", "BHD", 1234},
		{"avro decimal", rat("1250/100"), "EUR", 1250},
		{"avro decimal scale 4", rat("125000/10000"), "EUR", 1250},
		{"decimal at int64 max", "92233720368547758.07", "EUR", 1<<63 - 1},
	}
	for _, c := range ok {
		tree := treeWith("amount_minor", c.v)
		tree["currency"] = c.cur
		got, err := m.Event(tree, "")
		if err != nil || got.AmountMinor != c.want {
			t.Errorf("%s: got %d, %v; want %d", c.name, got.AmountMinor, err, c.want)
		}
	}
	bad := []struct {
		name string
		v    any
		cur  string
		want Reason
	}{
		{"too many decimals", "12.505", "EUR", ReasonAmountInexact},
		{"yen with fraction", "12.5", "JPY", ReasonAmountInexact},
		{"avro decimal too fine", rat("12505/1000"), "EUR", ReasonAmountInexact},
		{"json fraction", jsonNum("12.5"), "EUR", ReasonAmountNotInteger},
		{"json exponent", jsonNum("1e3"), "EUR", ReasonAmountNotInteger},
		{"json too big", jsonNum("9223372036854775808"), "EUR", ReasonAmountOutOfRange},
		{"uint64 too big", uint64(1 << 63), "EUR", ReasonAmountOutOfRange},
		{"decimal too big", "92233720368547758.08", "EUR", ReasonAmountOutOfRange},
		{"float", 12.5, "EUR", ReasonInvalidField},
		{"not a decimal", "12,50", "EUR", ReasonInvalidField},
		{"exponent string", "1e3", "EUR", ReasonInvalidField},
		{"plus sign", "+1", "EUR", ReasonInvalidField},
		{"null", nil, "EUR", ReasonInvalidField},
		{"decimal with bad currency", "12.50", "eur", ReasonInvalidCurrency},
	}
	for _, c := range bad {
		tree := treeWith("amount_minor", c.v)
		tree["currency"] = c.cur
		_, err := m.Event(tree, "")
		var de *DecodeError
		if !errors.As(err, &de) || de.Reason != c.want || de.EventID != "e-7f3a" {
			t.Errorf("%s: got %v, want %s", c.name, err, c.want)
		}
	}
}

func jsonNum(s string) any {
	tree, err := ParseJSON([]byte(s))
	if err != nil {
		panic(err)
	}
	return tree
}

func TestMappingTimesAndIDs(t *testing.T) {
	m := DefaultMapping()
	at := baseEvent.OccurredAt
	paris, _ := time.LoadLocation("Europe/Paris")
	for _, c := range []struct {
		name string
		v    any
	}{
		{"rfc3339", "2026-11-29T14:05:00+01:00"},
		{"time in a zone with monotonic reading", at.In(paris).Add(0)},
		{"epoch millis int64", at.UnixMilli()},
		{"epoch millis json", jsonNum("1795957500000")},
	} {
		got, err := m.Event(treeWith("occurred_at", c.v), "")
		if err != nil || got != baseEvent {
			t.Errorf("%s: got %+v, %v", c.name, got, err)
		}
	}
	for _, c := range []struct {
		name string
		v    any
		want Reason
	}{
		{"year 10000", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), ReasonInvalidTime},
		{"epoch before year 1000", int64(-40000000000000), ReasonInvalidTime},
		{"bool", true, ReasonInvalidField},
		{"bad string", "yesterday", ReasonInvalidTime},
	} {
		_, err := m.Event(treeWith("occurred_at", c.v), "")
		var de *DecodeError
		if !errors.As(err, &de) || de.Reason != c.want {
			t.Errorf("%s: got %v, want %s", c.name, err, c.want)
		}
	}
	got, err := m.Event(treeWith("account_id", int64(42)), "")
	if err != nil || got.AccountID != "42" {
		t.Errorf("integer account id: %+v %v", got, err)
	}
	got, err = m.Event(treeWith("event_id", "ignored"), "src e-1")
	if err != nil || got.EventID != "src e-1" {
		t.Errorf("event id from the envelope: %+v %v", got, err)
	}
	for _, c := range []struct {
		name string
		v    any
		want Reason
	}{
		{"invalid utf-8", "a\xffb", ReasonInvalidUTF8},
		{"control", "a\x01b", ReasonInvalidField},
		{"too long", strings.Repeat("a", 65), ReasonIDTooLong},
		{"empty", "", ReasonInvalidField},
		{"float", 1.5, ReasonInvalidField},
	} {
		_, err := m.Event(treeWith("account_id", c.v), "")
		var de *DecodeError
		if !errors.As(err, &de) || de.Reason != c.want || de.Field != "account_id" {
			t.Errorf("%s: got %v, want %s", c.name, err, c.want)
		}
	}
}

// The same event written in different types has the same fingerprint, so
// a re-encoding is a repeat, not a conflicting duplicate.
func TestMappingFingerprintIndependentOfTypes(t *testing.T) {
	m := DefaultMapping()
	a, errA := m.Event(map[string]any{"event_id": "e", "account_id": "acct-42", "amount_minor": "12.50", "currency": "EUR", "occurred_at": at1()}, "")
	b, errB := m.Event(map[string]any{"event_id": "e", "account_id": "acct-42", "amount_minor": int32(1250), "currency": "EUR", "occurred_at": at1().UnixMilli()}, "")
	if errA != nil || errB != nil || a != b || a.Fingerprint() != b.Fingerprint() {
		t.Fatalf("%+v %v / %+v %v", a, errA, b, errB)
	}
}

func at1() time.Time { return baseEvent.OccurredAt }

func TestParseJSONStrict(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Reason
	}{
		{`{"a":{"b":1},"a":2}`, ReasonDuplicateKey},
		{`{"a":"\ud800"}`, ReasonInvalidUTF8},
		{`{"a":1}x`, ReasonInvalidJSON},
		{`  `, ReasonInvalidJSON},
		{`{"a":[1,]}`, ReasonInvalidJSON},
		{strings.Repeat("[", MaxTreeDepth+1) + strings.Repeat("]", MaxTreeDepth+1), ReasonInvalidJSON},
		{strings.Repeat(`{"a":`, 100000), ReasonInvalidJSON},
	} {
		_, err := ParseJSON([]byte(c.in))
		if err == nil || err.Reason != c.want {
			t.Errorf("%.40s: got %v, want %s", c.in, err, c.want)
		}
	}
	// A key repeated below the top level is only an error on a mapped path.
	m := mustMapping(t, "account_id=a.b")
	tree, derr := ParseJSON([]byte(strings.Replace(baseRecord, "{", `{"a":{"b":"x","b":"y"},"c":{"d":1,"d":2},`, 1)))
	if derr != nil {
		t.Fatal(derr)
	}
	var de *DecodeError
	if _, err := m.Event(tree, ""); !errors.As(err, &de) || de.Reason != ReasonDuplicateKey || de.Field != "account_id" {
		t.Errorf("path through a repeated key: %v", err)
	}
	if _, err := ParseJSON([]byte(strings.Repeat("[", MaxTreeDepth) + strings.Repeat("]", MaxTreeDepth))); err != nil {
		t.Errorf("depth %d rejected: %v", MaxTreeDepth, err)
	}
}

// Versions read through a Mapping as the contract's decoder reads them:
// the same events for the same JSON, the same rejections (reason and
// field) except null, which the mapping takes for absent (an Avro union
// with null, a nullable JSON Schema type), where the contract's decoder
// refuses it.
func TestMappingVersionsAgreeWithDecoder(t *testing.T) {
	m := DefaultMapping()
	for _, in := range []string{
		baseRecord, plus(`"revision":3`), plus(`"revision":3,"cancelled":false`), plus(`"revision":9223372036854775807`),
		`{"event_id":"e-7f3a","revision":2,"cancelled":true}`,
		`{"event_id":"e-7f3a","revision":2,"cancelled":true,"amount_minor":"x","currency":"eur"}`,
		`{"event_id":"e-7f3a","cancelled":true}`,
		plus(`"revision":-1`), plus(`"revision":-0`), plus(`"revision":1.0`), plus(`"revision":"1"`), plus(`"revision":9223372036854775808`),
		plus(`"cancelled":"true"`), plus(`"revision":-1,"cancelled":true`), `{"event_id":"e-7f3a","revision":2,"cancelled":false}`,
	} {
		want, werr := NewDecoder(0).Decode([]byte(in))
		tree, derr := ParseJSON([]byte(in))
		if derr != nil {
			t.Fatalf("%s: %v", in, derr)
		}
		got, gerr := m.Event(tree, "")
		var wd, gd *DecodeError
		errors.As(werr, &wd)
		errors.As(gerr, &gd)
		switch {
		case (wd == nil) != (gd == nil):
			t.Errorf("%s: decoder %v, mapping %v", in, werr, gerr)
		case wd != nil && (wd.Reason != gd.Reason || wd.Field != gd.Field || wd.EventID != gd.EventID):
			t.Errorf("%s: decoder %+v, mapping %+v", in, wd, gd)
		case got != want:
			t.Errorf("%s: decoder %+v, mapping %+v", in, want, got)
		}
	}
	for _, in := range []string{plus(`"revision":null`), plus(`"cancelled":null`)} {
		tree, _ := ParseJSON([]byte(in))
		if got, err := m.Event(tree, ""); err != nil || got != baseEvent {
			t.Errorf("%s: %+v %v, want the original", in, got, err)
		}
	}
}

// revision and cancelled at paths of their own, in every integer width
// the decoders of the formats produce; a negative or too large revision
// and a cancelled that is no boolean are invalid_field naming the path.
func TestMappingVersionTypes(t *testing.T) {
	m := mustMapping(t, "revision=meta.rev,cancelled=meta.void")
	tree := func(rev, void any) map[string]any {
		meta := map[string]any{}
		if rev != nil {
			meta["rev"] = rev
		}
		if void != nil {
			meta["void"] = void
		}
		return map[string]any{"event_id": "e-7f3a", "account_id": "acct-42", "amount_minor": int64(1250), "currency": "EUR",
			"occurred_at": baseEvent.OccurredAt, "meta": meta}
	}
	for _, rev := range []any{int8(5), int16(5), int32(5), int64(5), int(5), uint8(5), uint16(5), uint32(5), uint64(5), uint(5), json.Number("5")} {
		got, err := m.Event(tree(rev, false), "")
		if err != nil || got.Revision != 5 || got.Cancelled || got.AccountID != "acct-42" {
			t.Errorf("revision %T: %+v %v", rev, got, err)
		}
	}
	got, err := m.Event(tree(int32(2), true), "")
	if err != nil || got != (Event{EventID: "e-7f3a", Revision: 2, Cancelled: true}) {
		t.Errorf("tombstone: %+v %v", got, err)
	}
	if got, err := m.Event(map[string]any{"event_id": "e-7f3a", "meta": map[string]any{"void": true}}, ""); err != nil || !got.Cancelled {
		t.Errorf("tombstone without content: %+v %v", got, err)
	}
	if got, err := m.Event(tree(nil, nil), ""); err != nil || got.Revision != 0 || got.Cancelled {
		t.Errorf("absent: %+v %v", got, err)
	}
	for _, c := range []struct {
		rev, void any
		field     string
	}{
		{int32(-1), nil, "revision"}, {int64(-9), true, "revision"}, {uint64(1 << 63), nil, "revision"}, {"3", nil, "revision"},
		{3.0, nil, "revision"}, {true, nil, "revision"}, {nil, "true", "cancelled"}, {nil, int64(1), "cancelled"},
	} {
		_, err := m.Event(tree(c.rev, c.void), "")
		var de *DecodeError
		if !errors.As(err, &de) || de.Reason != ReasonInvalidField || de.Field != c.field || de.EventID != "e-7f3a" || !strings.Contains(de.Detail, "(at meta.") {
			t.Errorf("revision %#v, cancelled %#v: %v", c.rev, c.void, err)
		}
	}
}
