package format

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/billing/ledger/internal/event"
)

// contractDecoder returns an Encoder and a Decoder of format f's contract
// schema (CloudEvents in mode ce, "" for none) over an in-process registry
// that holds the schema as id 7.
func contractDecoder(t *testing.T, f, ce string) (*Encoder, *Decoder) {
	t.Helper()
	enc, s, err := newEncoder(context.Background(), f, ce, 4096)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Format: f, CloudEvents: ce != "", MaxPayload: 4096}
	if NeedsRegistry(f) {
		enc.id = 7
		o.Registry = RegistryOptions{URL: fakeRegistryF(t, map[int]sr.Schema{7: s}), Subject: "bench-value"}
	}
	return enc, newDecoder(t, o)
}

// A version (revision, cancelled) of the contract reads back as the same
// version in every format and CloudEvents mode, through the contract's
// schema file of the format: an amendment with its content, a tombstone
// without, and a record without the fields as revision 0.
func TestVersionsInEveryFormat(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 11, 29, 13, 5, 0, 0, time.UTC)
	original := `{"event_id":"e-1","account_id":"acct-42","amount_minor":1250,"currency":"EUR","occurred_at":"2026-11-29T13:05:00Z"}`
	amended := `{"event_id":"e-1","revision":3,"account_id":"acct-43","amount_minor":-70,"currency":"JPY","occurred_at":"2026-11-29T13:05:00Z"}`
	tombstone := `{"event_id":"e-1","revision":4,"cancelled":true}`
	cases := []struct {
		name, value string
		want        event.Event
	}{
		{"original", original, event.Event{EventID: "e-1", AccountID: "acct-42", AmountMinor: 1250, Currency: "EUR", OccurredAt: at}},
		{"amended", amended, event.Event{EventID: "e-1", AccountID: "acct-43", AmountMinor: -70, Currency: "JPY", OccurredAt: at, Revision: 3}},
		{"tombstone", tombstone, event.Event{EventID: "e-1", Revision: 4, Cancelled: true}},
	}
	for _, f := range Formats() {
		for _, ce := range []string{"", "structured", "binary"} {
			if f == JSON && ce == "" {
				continue // the contract's own decoder: package event's tests
			}
			enc, dec := contractDecoder(t, f, ce)
			for _, c := range cases {
				v, h, err := enc.Record([]byte(c.value))
				if err != nil {
					t.Fatalf("%s %s %s: %v", f, ce, c.name, err)
				}
				w := c.want
				if ce != "" {
					w.EventID = EncoderCloudEventSource + " " + w.EventID
				}
				got, err := dec.Decode(ctx, v, h)
				if err != nil || got != w {
					t.Errorf("%s %q %s: got %+v %v, want %+v", f, ce, c.name, got, err, w)
				}
			}
		}
	}
}

// A revision that is negative, or a cancelled that is no boolean, is a
// dead letter naming the field, in a registry format as in JSON.
func TestVersionRejectsInRegistryFormats(t *testing.T) {
	ctx := context.Background()
	enc, dec := contractDecoder(t, Protobuf, "")
	m := dynamicpb.NewMessage(enc.proto)
	fs := enc.proto.Fields()
	m.Set(fs.ByName("event_id"), protoreflect.ValueOfString("e-2"))
	m.Set(fs.ByName("revision"), protoreflect.ValueOfInt64(-1))
	m.Set(fs.ByName("cancelled"), protoreflect.ValueOfBool(true))
	body, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	_, err = dec.Decode(ctx, append(wireHeader(7, 0), body...), nil)
	var de *event.DecodeError
	if !errors.As(err, &de) || de.Reason != event.ReasonInvalidField || de.Field != "revision" || de.EventID != "e-2" ||
		!strings.Contains(de.Detail, "negative") {
		t.Errorf("negative revision: %v (%+v)", err, de)
	}

	// JSON Schema: the contract's schema refuses it first (its minimum).
	enc, dec = contractDecoder(t, JSONSchema, "")
	v, _, _ := enc.Record([]byte(`{"event_id":"e-3","revision":1,"account_id":"a","amount_minor":1,"currency":"EUR","occurred_at":"2026-11-29T13:05:00Z"}`))
	v = []byte(strings.Replace(string(v), `"revision":1`, `"revision":-1`, 1))
	if _, err := dec.Decode(ctx, v, nil); reasonOf(err) != event.ReasonInvalidEncoding {
		t.Errorf("json-schema, negative revision: %v", err)
	}
	// Through a mapping of its own (no schema minimum): the mapping's reason.
	mp := mapping(t, "revision=meta.rev,cancelled=meta.void")
	jd := newDecoder(t, Options{Mapping: mp, CloudEvents: false})
	for _, c := range []struct{ in, field string }{
		{`"meta":{"rev":-2}`, "revision"},
		{`"meta":{"rev":"2"}`, "revision"},
		{`"meta":{"rev":1.5}`, "revision"},
		{`"meta":{"void":"yes"}`, "cancelled"},
	} {
		in := fmt.Sprintf(`{"event_id":"e-4",%s,"account_id":"a","amount_minor":1,"currency":"EUR","occurred_at":"2026-11-29T13:05:00Z"}`, c.in)
		_, err := jd.Decode(ctx, []byte(in), nil)
		if !errors.As(err, &de) || de.Reason != event.ReasonInvalidField || de.Field != c.field || de.EventID != "e-4" || !strings.Contains(de.Detail, "meta.") {
			t.Errorf("%s: %v", c.in, err)
		}
	}
}

// wireHeader is the Confluent header of schema id with message indexes.
func wireHeader(id int, index ...int) []byte {
	var h sr.ConfluentHeader
	b, _ := h.AppendEncode(nil, id, index)
	return b
}
