package format

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/event"
)

var want = event.Event{EventID: "e-7f3a", AccountID: "acct-42", AmountMinor: 1250, Currency: "EUR",
	OccurredAt: time.Date(2026, 11, 29, 13, 5, 0, 0, time.UTC)}

const base = `{"event_id":"e-7f3a","account_id":"acct-42","amount_minor":1250,"currency":"EUR","occurred_at":"2026-11-29T13:05:00Z"}`

func newDecoder(t *testing.T, o Options) *Decoder {
	t.Helper()
	d, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func mapping(t *testing.T, spec string) *event.Mapping {
	t.Helper()
	m, err := event.ParseMapping(spec)
	if err != nil {
		t.Fatal(err)
	}
	return &m
}

func reasonOf(err error) event.Reason {
	var de *event.DecodeError
	if errors.As(err, &de) {
		return de.Reason
	}
	return ""
}

func TestJSONFastPathAndMapping(t *testing.T) {
	ctx := context.Background()
	d := newDecoder(t, Options{})
	if !d.Fast() {
		t.Fatal("default options do not use the contract's decoder")
	}
	if got, err := d.Decode(ctx, []byte(base), nil); err != nil || got != want {
		t.Fatalf("fast: %+v %v", got, err)
	}
	m := newDecoder(t, Options{Mapping: mapping(t, "account_id=customer.id,amount_minor=total")})
	if m.Fast() {
		t.Fatal("a mapping uses the fast path")
	}
	in := `{"event_id":"e-7f3a","customer":{"id":"acct-42"},"total":"12.50","currency":"EUR","occurred_at":1795957500000}`
	got, err := m.Decode(ctx, []byte(in), nil)
	if err != nil || got != want {
		t.Fatalf("mapped: %+v %v", got, err)
	}
	for _, c := range []struct {
		in   string
		want event.Reason
	}{
		{"", event.ReasonEmptyPayload},
		{strings.Repeat(" ", event.DefaultMaxPayload+1), event.ReasonPayloadTooLarge},
		{`{"event_id":"e"`, event.ReasonInvalidJSON},
		{`{"event_id":"e","customer":{},"total":1,"currency":"EUR","occurred_at":1}`, event.ReasonMissingField},
	} {
		if _, err := m.Decode(ctx, []byte(c.in), nil); reasonOf(err) != c.want {
			t.Errorf("%.30q: %v, want %s", c.in, err, c.want)
		}
	}
}

func hdrs(kv ...string) []kgo.RecordHeader {
	var h []kgo.RecordHeader
	for i := 0; i < len(kv); i += 2 {
		h = append(h, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return h
}

const ceData = `{"account_id":"acct-42","amount_minor":1250,"currency":"EUR","occurred_at":"2026-11-29T13:05:00Z"}`

func TestCloudEvents(t *testing.T) {
	ctx := context.Background()
	d := newDecoder(t, Options{CloudEvents: true, CloudEventTypes: []string{"com.example.charge"}})
	ceWant := want
	ceWant.EventID = "/shop/checkout e-7f3a"
	structured := `{"specversion":"1.0","id":"e-7f3a","source":"/shop/checkout","type":"com.example.charge","time":"2026-11-29T13:05:00Z","data":` + ceData + `}`
	ct := hdrs("content-type", "application/cloudevents+json; charset=UTF-8")
	if got, err := d.Decode(ctx, []byte(structured), ct); err != nil || got != ceWant {
		t.Fatalf("structured: %+v %v", got, err)
	}
	b64 := `{"specversion":"1.0","id":"e-7f3a","source":"/shop/checkout","type":"com.example.charge","data_base64":"` + base64.StdEncoding.EncodeToString([]byte(ceData)) + `"}`
	if got, err := d.Decode(ctx, []byte(b64), ct); err != nil || got != ceWant {
		t.Fatalf("structured data_base64: %+v %v", got, err)
	}
	bin := hdrs("ce_specversion", "1.0", "ce_id", "e-7f3a", "ce_source", "/shop/checkout", "ce_type", "com.example.charge", "content-type", "application/json")
	got, err := d.Decode(ctx, []byte(ceData), bin)
	if err != nil || got != ceWant {
		t.Fatalf("binary: %+v %v", got, err)
	}
	// Same event in both modes: the same fingerprint and id (a repeat).
	if got.Fingerprint() != want.Fingerprint() {
		t.Fatal("fingerprint differs from the plain JSON event")
	}

	other := strings.Replace(structured, "com.example.charge", "com.example.refund", 1)
	if _, err := d.Decode(ctx, []byte(other), ct); !errors.Is(err, ErrSkipped) {
		t.Errorf("filtered type: %v", err)
	}
	binOther := hdrs("ce_specversion", "1.0", "ce_id", "x", "ce_source", "/s", "ce_type", "com.example.refund")
	if _, err := d.Decode(ctx, []byte("not even json"), binOther); !errors.Is(err, ErrSkipped) {
		t.Errorf("filtered type in binary mode is decoded: %v", err)
	}
	if _, err := newDecoder(t, Options{CloudEvents: true}).Decode(ctx, []byte(other), ct); err != nil {
		t.Errorf("no filter: %v", err)
	}

	for _, c := range []struct {
		name  string
		value string
		h     []kgo.RecordHeader
		want  event.Reason
	}{
		{"no mode", ceData, nil, event.ReasonInvalidCloudEvent},
		{"structured xml", structured, hdrs("content-type", "application/cloudevents+xml"), event.ReasonInvalidCloudEvent},
		{"structured not json", "{", ct, event.ReasonInvalidJSON},
		{"structured array", "[]", ct, event.ReasonInvalidCloudEvent},
		{"missing id", strings.Replace(structured, `"id":"e-7f3a",`, "", 1), ct, event.ReasonInvalidCloudEvent},
		{"specversion 0.3", strings.Replace(structured, `"1.0"`, `"0.3"`, 1), ct, event.ReasonInvalidCloudEvent},
		{"source with space", strings.Replace(structured, "/shop/checkout", "/shop checkout", 1), ct, event.ReasonInvalidCloudEvent},
		{"data and data_base64", strings.Replace(structured, `"data":`, `"data_base64":"e30=","data":`, 1), ct, event.ReasonInvalidCloudEvent},
		{"data missing a field", strings.Replace(structured, `"currency":"EUR",`, "", 1), ct, event.ReasonMissingField},
		{"binary data not json", "{", bin, event.ReasonInvalidJSON},
		{"binary empty", "", bin, event.ReasonEmptyPayload},
		{"binary duplicate header", ceData, append(bin, kgo.RecordHeader{Key: "ce_id", Value: []byte("y")}), event.ReasonInvalidCloudEvent},
		{"binary header not utf-8", ceData, append(hdrs("ce_specversion", "1.0", "ce_source", "/s", "ce_type", "com.example.charge"), kgo.RecordHeader{Key: "ce_id", Value: []byte{0xff}}), event.ReasonInvalidCloudEvent},
		{"binary id too long", ceData, hdrs("ce_specversion", "1.0", "ce_id", strings.Repeat("i", 120), "ce_source", "/shop/checkout", "ce_type", "com.example.charge"), event.ReasonIDTooLong},
	} {
		_, err := d.Decode(ctx, []byte(c.value), c.h)
		if reasonOf(err) != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
	// A data error is attributed to the envelope's event id.
	_, err = d.Decode(ctx, []byte("{"), bin)
	if de, ok := err.(*event.DecodeError); !ok || de.EventID != "/shop/checkout e-7f3a" {
		t.Errorf("data error without the event id: %#v", err)
	}

	// The mapping reads the envelope; unnamed fields from below data.
	m := newDecoder(t, Options{CloudEvents: true, Mapping: mapping(t, "occurred_at=time")})
	noTime := strings.Replace(structured, `,"occurred_at":"2026-11-29T13:05:00Z"`, "", 1)
	if got, err := m.Decode(ctx, []byte(noTime), ct); err != nil || got != ceWant {
		t.Errorf("occurred_at=time: %+v %v", got, err)
	}
	if _, err := New(Options{CloudEvents: true, Mapping: mapping(t, "event_id=data.id")}); err == nil {
		t.Error("event_id mapped under CloudEvents accepted")
	}
	if _, err := New(Options{CloudEventTypes: []string{"x"}}); err == nil {
		t.Error("a type filter without CloudEvents accepted")
	}
	if _, err := New(Options{Format: "xml"}); err == nil {
		t.Error("unknown format accepted")
	}
}
