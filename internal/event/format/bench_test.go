package format

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/billing/ledger/internal/event"
)

// fakeRegistry serves schemas by id (GET /schemas/ids/N and its subjects)
// in-process, for the benchmarks: a decode after the first never asks it.
func fakeRegistry(b *testing.B, schemas map[int]sr.Schema) string { return fakeRegistryF(b, schemas) }

func fakeRegistryF(b testing.TB, schemas map[int]sr.Schema) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var id int
		subjects := strings.HasSuffix(r.URL.Path, "/subjects")
		if _, err := fmt.Sscanf(strings.TrimSuffix(r.URL.Path, "/subjects"), "/schemas/ids/%d", &id); err != nil {
			http.NotFound(w, r)
			return
		}
		s, ok := schemas[id]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if subjects {
			json.NewEncoder(w).Encode([]string{"bench-value"})
			return
		}
		json.NewEncoder(w).Encode(s)
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

var (
	sinkEvent event.Event
	sinkErr   error
)

// BenchmarkDecodeFormats: decode time and allocations per event of each
// format, the schema compiled and cached (the steady state).
func BenchmarkDecodeFormats(b *testing.B) {
	md := flatDescriptor(b)
	reg := fakeRegistry(b, map[int]sr.Schema{
		1: {Schema: avroV1},
		2: {Schema: protoChargeFlat, Type: sr.TypeProtobuf},
		3: {Schema: jsonSchemaFlat, Type: sr.TypeJSON},
	})
	avroValue := wire(1, avroRecord(b, avroV1, map[string]any{"event_id": "e-7f3a", "account_id": "acct-42",
		"amount": big.NewRat(1250, 100), "currency": "EUR", "occurred_at": want.OccurredAt}))
	amountMapping, _ := event.ParseMapping("amount_minor=amount")
	ceHeaders := []kgo.RecordHeader{{Key: "ce_specversion", Value: []byte("1.0")}, {Key: "ce_id", Value: []byte("e-7f3a")},
		{Key: "ce_source", Value: []byte("/shop")}, {Key: "ce_type", Value: []byte("charge")}}
	cases := []struct {
		name    string
		opts    Options
		value   []byte
		headers []kgo.RecordHeader
	}{
		{"json", Options{}, []byte(base), nil},
		{"json_mapped", Options{Mapping: &amountMapping}, []byte(strings.Replace(base, "amount_minor", "amount", 1)), nil},
		{"cloudevents_binary_json", Options{CloudEvents: true}, []byte(ceData), ceHeaders},
		{"avro", Options{Format: Avro, Mapping: &amountMapping}, avroValue, nil},
		{"protobuf", Options{Format: Protobuf}, wireIndex(2, []int{0}, flatProto(b, md)), nil},
		{"json_schema", Options{Format: JSONSchema}, wire(3, []byte(base)), nil},
	}
	ctx := context.Background()
	for _, c := range cases {
		c.opts.Registry = RegistryOptions{URL: reg, Subject: "bench-value"}
		if c.opts.Format == "" {
			c.opts.Registry = RegistryOptions{}
		}
		d, err := New(c.opts)
		if err != nil {
			b.Fatal(err)
		}
		if got, err := d.Decode(ctx, c.value, c.headers); err != nil || got.AmountMinor != 1250 {
			b.Fatalf("%s: %+v %v", c.name, got, err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.value)))
			for b.Loop() {
				sinkEvent, sinkErr = d.Decode(ctx, c.value, c.headers)
			}
		})
	}
}

const protoChargeFlat = `syntax = "proto3";
package billing.bench;
import "google/protobuf/timestamp.proto";
message Event {
  string event_id = 1;
  string account_id = 2;
  int64 amount_minor = 3;
  string currency = 4;
  google.protobuf.Timestamp occurred_at = 5;
}
`

const jsonSchemaFlat = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
 "required":["event_id","account_id","amount_minor","currency","occurred_at"],
 "properties":{"event_id":{"type":"string"},"account_id":{"type":"string"},"amount_minor":{"type":"integer"},
 "currency":{"type":"string","pattern":"^[A-Z]{3}$"},"occurred_at":{"type":"string"}}}`

func flatDescriptor(tb testing.TB) protoreflect.MessageDescriptor {
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"event.proto": protoChargeFlat})})}
	files, err := c.Compile(context.Background(), "event.proto")
	if err != nil {
		tb.Fatal(err)
	}
	return files[0].Messages().Get(0)
}

func flatProto(tb testing.TB, md protoreflect.MessageDescriptor) []byte {
	m := dynamicpb.NewMessage(md)
	f := md.Fields()
	m.Set(f.ByName("event_id"), protoreflect.ValueOfString("e-7f3a"))
	m.Set(f.ByName("account_id"), protoreflect.ValueOfString("acct-42"))
	m.Set(f.ByName("amount_minor"), protoreflect.ValueOfInt64(1250))
	m.Set(f.ByName("currency"), protoreflect.ValueOfString("EUR"))
	ts := m.Mutable(f.ByName("occurred_at")).Message()
	ts.Set(ts.Descriptor().Fields().ByName("seconds"), protoreflect.ValueOfInt64(want.OccurredAt.Unix()))
	b, err := proto.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// BenchmarkDecodePoll drives a decoder as the pipeline does per poll:
// Prepare with the poll's records, then Decode of each; every record is
// another event (ids, accounts, amounts differ). ns/op is per event.
func BenchmarkDecodePoll(b *testing.B) {
	md := flatDescriptor(b)
	reg := fakeRegistry(b, map[int]sr.Schema{
		2: {Schema: protoChargeFlat, Type: sr.TypeProtobuf},
		3: {Schema: jsonSchemaFlat, Type: sr.TypeJSON},
	})
	const poll = 500
	ctx := context.Background()
	for _, c := range []struct {
		name string
		opts Options
		enc  func(doc string, i int) []byte
	}{
		{"json", Options{}, func(doc string, _ int) []byte { return []byte(doc) }},
		{"protobuf", Options{Format: Protobuf}, func(_ string, i int) []byte {
			m := dynamicpb.NewMessage(md)
			f := md.Fields()
			m.Set(f.ByName("event_id"), protoreflect.ValueOfString(fmt.Sprintf("e-bench-%d", i)))
			m.Set(f.ByName("account_id"), protoreflect.ValueOfString(fmt.Sprintf("acct-%06d", i%997)))
			m.Set(f.ByName("amount_minor"), protoreflect.ValueOfInt64(int64(100+i)))
			m.Set(f.ByName("currency"), protoreflect.ValueOfString("EUR"))
			ts := m.Mutable(f.ByName("occurred_at")).Message()
			ts.Set(ts.Descriptor().Fields().ByName("seconds"), protoreflect.ValueOfInt64(want.OccurredAt.Unix()+int64(i)))
			v, err := proto.Marshal(m)
			if err != nil {
				b.Fatal(err)
			}
			return wireIndex(2, []int{0}, v)
		}},
		{"json_schema", Options{Format: JSONSchema}, func(doc string, _ int) []byte { return wire(3, []byte(doc)) }},
	} {
		if c.opts.Format != "" {
			c.opts.Registry = RegistryOptions{URL: reg, Subject: "bench-value"}
		}
		d, err := New(c.opts)
		if err != nil {
			b.Fatal(err)
		}
		recs := make([]*kgo.Record, poll)
		for i := range recs {
			doc := fmt.Sprintf(`{"event_id":"e-bench-%d","account_id":"acct-%06d","amount_minor":%d,"currency":"EUR","occurred_at":"2026-11-29T13:%02d:%02dZ"}`,
				i, i%997, 100+i, i/60%60, i%60)
			recs[i] = &kgo.Record{Value: c.enc(doc, i)}
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				if n%poll == 0 {
					if err := d.Prepare(ctx, recs); err != nil {
						b.Fatal(err)
					}
				}
				r := recs[n%poll]
				sinkEvent, sinkErr = d.Decode(ctx, r.Value, r.Headers)
				if sinkErr != nil {
					b.Fatal(sinkErr)
				}
				n++
			}
		})
	}
}

// contractRecords returns poll records of distinct events of the default
// workload in format f as billing-gen -format writes them (the contract's
// schema of the format, registered as id).
func contractRecords(tb testing.TB, f string, id, n int) []*kgo.Record {
	text, file, err := ContractSchema(f)
	if err != nil && f != JSON {
		tb.Fatal(err)
	}
	var as avro.Schema
	var md protoreflect.MessageDescriptor
	switch f {
	case Avro:
		if as, err = avro.Parse(text); err != nil {
			tb.Fatal(err)
		}
	case Protobuf:
		c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{file: text})})}
		files, err := c.Compile(context.Background(), file)
		if err != nil {
			tb.Fatal(err)
		}
		md = files[0].Messages().Get(0)
	}
	recs := make([]*kgo.Record, n)
	for i := range recs {
		ev := event.Event{EventID: fmt.Sprintf("e-bench-%08d", i), AccountID: fmt.Sprintf("acct-%06d", i%997),
			AmountMinor: int64(100 + i), Currency: "EUR", OccurredAt: want.OccurredAt.Add(time.Duration(i) * time.Second)}
		doc, err := json.Marshal(ev)
		if err != nil {
			tb.Fatal(err)
		}
		var v []byte
		switch f {
		case JSON:
			v = doc
		case JSONSchema:
			v = wire(id, doc)
		case Avro:
			body, err := avro.Marshal(as, map[string]any{"event_id": ev.EventID, "account_id": ev.AccountID,
				"amount_minor": ev.AmountMinor, "currency": ev.Currency, "occurred_at": ev.OccurredAt})
			if err != nil {
				tb.Fatal(err)
			}
			v = wire(id, body)
		case Protobuf:
			m := dynamicpb.NewMessage(md)
			fs := md.Fields()
			m.Set(fs.ByName("event_id"), protoreflect.ValueOfString(ev.EventID))
			m.Set(fs.ByName("account_id"), protoreflect.ValueOfString(ev.AccountID))
			m.Set(fs.ByName("amount_minor"), protoreflect.ValueOfInt64(ev.AmountMinor))
			m.Set(fs.ByName("currency"), protoreflect.ValueOfString(ev.Currency))
			ts := m.Mutable(fs.ByName("occurred_at")).Message()
			ts.Set(ts.Descriptor().Fields().ByName("seconds"), protoreflect.ValueOfInt64(ev.OccurredAt.Unix()))
			body, err := proto.Marshal(m)
			if err != nil {
				tb.Fatal(err)
			}
			v = wireIndex(id, []int{0}, body)
		}
		recs[i] = &kgo.Record{Value: v}
	}
	return recs
}

// BenchmarkDecodeContract: what the service's decoding costs per event in
// the bench's format variants: the default workload (distinct events)
// written in each format with the contract's schema, read with the
// default mapping, driven as the pipeline drives it (Prepare per poll of
// 500, then Decode of each). ns/op is per event.
func BenchmarkDecodeContract(b *testing.B) {
	schemas := map[int]sr.Schema{}
	for i, f := range []string{Avro, Protobuf, JSONSchema} {
		text, _, err := ContractSchema(f)
		if err != nil {
			b.Fatal(err)
		}
		typ := map[string]sr.SchemaType{Avro: sr.TypeAvro, Protobuf: sr.TypeProtobuf, JSONSchema: sr.TypeJSON}[f]
		schemas[i+1] = sr.Schema{Schema: text, Type: typ}
	}
	reg := fakeRegistry(b, schemas)
	const poll = 500
	ctx := context.Background()
	for i, f := range []string{JSON, Avro, Protobuf, JSONSchema} {
		opts := Options{Format: f}
		if f != JSON {
			opts.Registry = RegistryOptions{URL: reg, Subject: "bench-value"}
		}
		d, err := New(opts)
		if err != nil {
			b.Fatal(err)
		}
		recs := contractRecords(b, f, i, poll)
		b.Run(f, func(b *testing.B) {
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				if n%poll == 0 {
					if err := d.Prepare(ctx, recs); err != nil {
						b.Fatal(err)
					}
				}
				r := recs[n%poll]
				sinkEvent, sinkErr = d.Decode(ctx, r.Value, r.Headers)
				if sinkErr != nil {
					b.Fatal(sinkErr)
				}
				n++
			}
		})
	}
}
