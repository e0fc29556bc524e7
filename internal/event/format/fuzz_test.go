package format

import (
	"context"
	"errors"
	"math/big"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/billing/ledger/internal/event"
)

// FuzzFormats: whatever the bytes, every decoder returns an event that
// satisfies the contract or a *event.DecodeError (a dead letter) — never a
// panic, never another error (the in-process registry always answers), and
// a decode never stalls.
func FuzzFormats(f *testing.F) {
	reg := fakeRegistryF(f, map[int]sr.Schema{
		1: {Schema: avroV1},
		2: {Schema: protoChargeFlat, Type: sr.TypeProtobuf},
		3: {Schema: jsonSchemaFlat, Type: sr.TypeJSON},
	})
	amount, _ := event.ParseMapping("amount_minor=amount")
	var decs []*Decoder
	for _, o := range []Options{
		{Mapping: &amount},
		{CloudEvents: true},
		{Format: Avro, Mapping: &amount},
		{Format: Protobuf},
		{Format: JSONSchema},
	} {
		if o.Format != "" {
			o.Registry = RegistryOptions{URL: reg, Subject: "bench-value"}
		}
		o.MaxPayload = 4096
		d, err := New(o)
		if err != nil {
			f.Fatal(err)
		}
		decs = append(decs, d)
	}
	f.Add(uint8(0), []byte(base))
	f.Add(uint8(1), []byte(`{"specversion":"1.0","id":"1","source":"/s","type":"t","data":`+ceData+`}`))
	f.Add(uint8(2), wire(1, avroRecord(f, avroV1, map[string]any{"event_id": "e", "account_id": "a",
		"amount": big.NewRat(1, 100), "currency": "EUR", "occurred_at": want.OccurredAt})))
	f.Add(uint8(3), wireIndex(2, []int{0}, flatProto(f, flatDescriptor(f))))
	f.Add(uint8(4), wire(3, []byte(base)))
	ct := []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json")}}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, which uint8, value []byte) {
		d := decs[int(which)%len(decs)]
		ev, err := d.Decode(ctx, value, ct)
		var de *event.DecodeError
		switch {
		case err == nil:
			if y := ev.OccurredAt.Year(); ev.EventID == "" || ev.AccountID == "" || len(ev.Currency) != 3 ||
				ev.OccurredAt.Location() != time.UTC || y < event.MinYear || y > event.MaxYear {
				t.Fatalf("accepted an event outside the contract: %+v", ev)
			}
		case errors.As(err, &de):
			if de.Reason == "" {
				t.Fatalf("dead letter without a reason: %v", err)
			}
		default:
			t.Fatalf("neither an event nor a dead letter: %v", err)
		}
	})
}
