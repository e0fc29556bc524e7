package format

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/billing/ledger/internal/event"
)

// generalDecode decodes value as Decode did before the plans: Avro by
// hamba/avro's generic decoding, Protobuf with dynamicpb, JSON Schema by
// the validator alone.
func generalDecode(t *testing.T, d *Decoder, value []byte) (event.Event, error) {
	t.Helper()
	ctx := context.Background()
	if err := d.checkSize(value); err != nil {
		return event.Event{}, err
	}
	id, rest, err := wireID(value)
	if err != nil {
		return event.Event{}, err
	}
	body, err := d.reg.lookup(ctx, id)
	if err != nil {
		return event.Event{}, err
	}
	var tree any
	switch b := body.(type) {
	case *avroBody:
		tree, err = b.decode(rest)
	case *protoBody:
		tree, err = b.decodeKeys(rest, b.keys)
	case *jsonSchemaBody:
		slow := *b
		slow.quick = nil
		tree, err = slow.decode(rest)
	default:
		t.Fatalf("body %T", body)
	}
	if err != nil {
		return event.Event{}, err
	}
	return d.mapping.Event(tree, "")
}

// mutations returns value and what a broken or hostile producer makes of
// it: every truncation, every byte flipped (three ways), a byte appended,
// the body repeated (a Protobuf merge).
func mutations(value []byte) [][]byte {
	out := [][]byte{value}
	for n := range len(value) {
		out = append(out, value[:n])
	}
	for i := range value {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			v := append([]byte{}, value...)
			v[i] ^= x
			out = append(out, v)
		}
	}
	out = append(out, append(append([]byte{}, value...), 0))
	return out
}

// sameDecoding decodes each value with d, then as before the plans, and
// fails on the first difference (the event, or the dead letter to its
// detail). It decodes them in one decoder, in order: nothing of a record
// may remain for the next.
func sameDecoding(t *testing.T, d *Decoder, values [][]byte) (accepted int) {
	t.Helper()
	for _, v := range values {
		got, err := d.Decode(context.Background(), v, nil)
		want, werr := generalDecode(t, d, v)
		var de, wde *event.DecodeError
		errors.As(err, &de)
		errors.As(werr, &wde)
		if de != nil && wde != nil && strings.HasPrefix(de.Detail, jsonSchemaDetail) && strings.HasPrefix(wde.Detail, jsonSchemaDetail) {
			// The validator's, of the same tree: it lists a record's
			// failures in an order of its own, which varies.
			c, wc := *de, *wde
			c.Detail, wc.Detail = "", ""
			de, wde = &c, &wc
		}
		if got != want || (err == nil) != (werr == nil) || !reflect.DeepEqual(de, wde) {
			t.Fatalf("record %x:\n got %+v, %v\nwant %+v, %v", v, got, err, want, werr)
		}
		if err == nil {
			accepted++
		}
	}
	return accepted
}

const avroWide = `{"type":"record","name":"Wide","namespace":"t","fields":[
 {"name":"pad","type":"null"},
 {"name":"flag","type":"boolean"},
 {"name":"id","aliases":["event_id"],"type":"string"},
 {"name":"account_id","type":"int"},
 {"name":"amount_minor","type":"long"},
 {"name":"ratio","type":"float"},
 {"name":"score","type":"double"},
 {"name":"blob","type":"bytes"},
 {"name":"currency","type":"string"},
 {"name":"occurred_at","type":{"type":"long","logicalType":"timestamp-micros"}},
 {"name":"other","aliases":["currency","account_id"],"type":"string"}]}`

// The Avro plan reads every record as the generic decoding did: the same
// events, the same dead letters, for the contract's schema and one of
// every primitive type, with aliases, under mappings that read each type.
func TestAvroPlanDecodesAsBefore(t *testing.T) {
	contract, _, _ := ContractSchema(Avro)
	reg := fakeRegistryF(t, map[int]sr.Schema{1: {Schema: contract}, 2: {Schema: avroWide}})
	contractRec := wire(1, avroRecord(t, contract, map[string]any{"event_id": "e-7f3a", "account_id": "acct-42",
		"amount_minor": int64(1250), "currency": "EUR", "occurred_at": want.OccurredAt}))
	wide := map[string]any{"pad": nil, "flag": true, "id": "e-7f3a", "account_id": 42, "amount_minor": int64(-1250),
		"ratio": float32(0.5), "score": 2.5, "blob": []byte("xy"), "currency": "EUR",
		"occurred_at": want.OccurredAt.Add(1500 * time.Microsecond), "other": "USD"}
	wideRec := wire(2, avroRecord(t, avroWide, wide))
	for _, spec := range []string{"", "amount_minor=ratio", "amount_minor=score,account_id=flag", "event_id=blob",
		"currency=other,occurred_at=amount_minor", "account_id=pad", "event_id=blob.x"} {
		d := newDecoder(t, Options{Format: Avro, Mapping: mapping(t, spec), Registry: RegistryOptions{URL: reg, Subject: "bench-value"}})
		for _, id := range []int{1, 2} {
			if b, err := d.reg.lookup(context.Background(), id); err != nil || b.(*avroBody).plan == nil {
				t.Fatalf("%q: schema %d has no plan (%v)", spec, id, err)
			}
		}
		values := append(mutations(contractRec), mutations(wideRec)...)
		if n := sameDecoding(t, d, values); spec == "" && n < 2 {
			t.Errorf("%q: %d records accepted", spec, n)
		}
	}
	// Negative timestamps (before 1970) convert as the codec converts.
	d := newDecoder(t, Options{Format: Avro, Mapping: mapping(t, ""), Registry: RegistryOptions{URL: reg, Subject: "bench-value"}})
	var values [][]byte
	for _, at := range []time.Time{time.Date(1969, 12, 31, 23, 59, 59, 999000000, time.UTC), time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)} {
		values = append(values, wire(1, avroRecord(t, contract, map[string]any{"event_id": "e", "account_id": "a",
			"amount_minor": int64(1), "currency": "EUR", "occurred_at": at})))
	}
	sameDecoding(t, d, values)
}

// A schema the plan does not read (a union, a decimal, a record inside)
// has none: its records are decoded the generic way.
func TestAvroPlanOnlyForFlatRecords(t *testing.T) {
	for _, text := range []string{
		avroV1, // a decimal
		`{"type":"record","name":"U","fields":[{"name":"event_id","type":["null","string"]}]}`,
		`{"type":"record","name":"N","fields":[{"name":"data","type":{"type":"record","name":"D","fields":[{"name":"x","type":"string"}]}}]}`,
		`{"type":"record","name":"L","fields":[{"name":"at","type":{"type":"long","logicalType":"local-timestamp-millis"}}]}`,
		`{"type":"record","name":"S","fields":[{"name":"id","type":{"type":"string","logicalType":"uuid"}}]}`,
		`"string"`,
	} {
		s, err := avro.Parse(text)
		if err != nil {
			t.Fatal(err)
		}
		if newAvroPlan(s, map[string]bool{"event_id": true}) != nil {
			t.Errorf("a plan for %s", text)
		}
	}
}

const protoWide = `syntax = "proto3";
package t;
import "google/protobuf/timestamp.proto";
message Wide {
  string event_id = 1;
  sint64 account_number = 2;
  sfixed64 amount_minor = 3;
  optional string currency = 4;
  google.protobuf.Timestamp occurred_at = 5;
  google.protobuf.Timestamp seen_at = 6;
  bool flag = 7;
  int32 i32 = 8;
  sint32 s32 = 9;
  uint32 u32 = 10;
  fixed32 f32 = 11;
  sfixed32 sf32 = 12;
  uint64 u64 = 13;
  fixed64 f64 = 14;
  float fl = 15;
  double db = 16;
  bytes blob = 17;
  int64 i64 = 18;
  string note = 19;
}
`

// The Protobuf plan reads every record as dynamicpb did: the same events,
// the same dead letters, for the contract's schema and one of every
// scalar type, under mappings that read each type (by name and by JSON
// name), whatever the bytes (repeated fields, merged Timestamps, unknown
// fields, wrong wire types, groups, invalid UTF-8, nanos out of range).
func TestProtobufPlanDecodesAsBefore(t *testing.T) {
	contract, _, _ := ContractSchema(Protobuf)
	reg := fakeRegistryF(t, map[int]sr.Schema{1: {Schema: contract, Type: sr.TypeProtobuf}, 2: {Schema: protoWide, Type: sr.TypeProtobuf}})
	contractRec := contractRecords(t, Protobuf, 1, 1)[0].Value

	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"wide.proto": protoWide})})}
	files, err := c.Compile(context.Background(), "wide.proto")
	if err != nil {
		t.Fatal(err)
	}
	md := files[0].Messages().Get(0)
	fs := md.Fields()
	m := dynamicpb.NewMessage(md)
	set := func(name string, v protoreflect.Value) { m.Set(fs.ByName(protoreflect.Name(name)), v) }
	set("event_id", protoreflect.ValueOfString("e-7f3a"))
	set("account_number", protoreflect.ValueOfInt64(-42))
	set("amount_minor", protoreflect.ValueOfInt64(1250))
	set("currency", protoreflect.ValueOfString("EUR"))
	for _, name := range []string{"occurred_at", "seen_at"} {
		ts := m.Mutable(fs.ByName(protoreflect.Name(name))).Message()
		ts.Set(ts.Descriptor().Fields().ByName("seconds"), protoreflect.ValueOfInt64(want.OccurredAt.Unix()))
		ts.Set(ts.Descriptor().Fields().ByName("nanos"), protoreflect.ValueOfInt32(5))
	}
	set("flag", protoreflect.ValueOfBool(true))
	set("i32", protoreflect.ValueOfInt32(-7))
	set("s32", protoreflect.ValueOfInt32(-8))
	set("u32", protoreflect.ValueOfUint32(9))
	set("f32", protoreflect.ValueOfUint32(10))
	set("sf32", protoreflect.ValueOfInt32(-11))
	set("u64", protoreflect.ValueOfUint64(1<<63+5))
	set("f64", protoreflect.ValueOfUint64(13))
	set("fl", protoreflect.ValueOfFloat32(0.5))
	set("db", protoreflect.ValueOfFloat64(2.5))
	set("blob", protoreflect.ValueOfBytes([]byte("xy")))
	set("i64", protoreflect.ValueOfInt64(want.OccurredAt.UnixMilli()))
	set("note", protoreflect.ValueOfString("n"))
	body, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	// Hand-made bodies: what no encoder writes, every reader must take.
	tag := func(b []byte, num protowire.Number, typ protowire.Type) []byte {
		return protowire.AppendTag(b, num, typ)
	}
	str := func(b []byte, num protowire.Number, s string) []byte {
		return protowire.AppendString(tag(b, num, protowire.BytesType), s)
	}
	ts := func(secs, nanos uint64) []byte {
		b := protowire.AppendVarint(tag(nil, 1, protowire.VarintType), secs)
		return protowire.AppendVarint(tag(b, 2, protowire.VarintType), nanos)
	}
	hand := [][]byte{
		append(append([]byte{}, body...), body...),                                                        // merged with itself
		str(append([]byte{}, body...), 1, "e-later"),                                                      // the last occurrence counts
		str(append([]byte{}, body...), 19, "\xff"),                                                        // invalid UTF-8, unmapped
		str(append([]byte{}, body...), 1, "\xc3"),                                                         // invalid UTF-8, mapped
		protowire.AppendBytes(tag(append([]byte{}, body...), 6, protowire.BytesType), ts(1, 1<<31)),       // nanos out of range, unmapped
		protowire.AppendBytes(tag(append([]byte{}, body...), 5, protowire.BytesType), ts(1, 1<<32-1)),     // -1 nanos, mapped
		protowire.AppendBytes(tag(append([]byte{}, body...), 5, protowire.BytesType), []byte{0x08, 0x07}), // seconds only: merged
		protowire.AppendBytes(tag(append([]byte{}, body...), 5, protowire.BytesType), nil),                // an empty Timestamp merged
		protowire.AppendVarint(tag(append([]byte{}, body...), 4, protowire.VarintType), 3),                // wrong wire type: unknown
		protowire.AppendFixed32(tag(append([]byte{}, body...), 99, protowire.Fixed32Type), 3),             // unknown number
		tag(tag(append([]byte{}, body...), 50, protowire.StartGroupType), 50, protowire.EndGroupType),     // an unknown group
		tag(append([]byte{}, body...), 50, protowire.EndGroupType),                                        // a stray end of group
		tag(append([]byte{}, body...), protowire.MaxValidNumber+1, protowire.VarintType),                  // number out of range
		protowire.AppendVarint(tag(nil, 3, protowire.Fixed64Type), 1),                                     // wrong wire type, truncated
		{},
	}
	values := append(mutations(contractRec), mutations(wireIndex(2, []int{0}, body))...)
	for _, h := range hand {
		values = append(values, wireIndex(2, []int{0}, h))
	}
	for _, spec := range []string{"", "account_id=accountNumber", "account_id=account_number", "amount_minor=u64,account_id=i32",
		"amount_minor=s32,account_id=sf32,occurred_at=i64", "amount_minor=u32,account_id=f32", "amount_minor=f64,event_id=note",
		"amount_minor=fl,account_id=db", "account_id=blob,amount_minor=flag", "occurred_at=seen_at,account_id=seenAt",
		"account_id=occurred_at.seconds"} {
		d := newDecoder(t, Options{Format: Protobuf, Mapping: mapping(t, spec), Registry: RegistryOptions{URL: reg, Subject: "bench-value"}})
		if n := sameDecoding(t, d, values); n < 2 && (spec == "" || spec == "account_id=accountNumber") {
			t.Errorf("%q: %d records accepted", spec, n)
		}
		for _, id := range []int{1, 2} {
			b, _ := d.reg.lookup(context.Background(), id)
			p := b.(*protoBody)
			if p.plan(p.file.Messages().Get(0)) == nil {
				t.Fatalf("%q: schema %d has no plan", spec, id)
			}
		}
	}
}

// A message the plan does not read (a list, a map, a oneof, an enum, a
// message other than Timestamp, proto2) has none.
func TestProtobufPlanOnlyForFlatMessages(t *testing.T) {
	for _, text := range []string{
		`syntax = "proto3"; message M { repeated string a = 1; }`,
		`syntax = "proto3"; message M { map<string, string> a = 1; }`,
		`syntax = "proto3"; message M { oneof o { string a = 1; string b = 2; } }`,
		`syntax = "proto3"; message M { enum E { X = 0; } E e = 1; }`,
		`syntax = "proto3"; message M { message N { string x = 1; } N n = 1; }`,
		`syntax = "proto3"; import "google/protobuf/wrappers.proto"; message M { google.protobuf.StringValue s = 1; }`,
		`syntax = "proto2"; message M { optional string a = 1; }`,
		`syntax = "proto3"; message M { string a = 33; }`,
	} {
		c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{"m.proto": text})})}
		files, err := c.Compile(context.Background(), "m.proto")
		if err != nil {
			t.Fatal(err)
		}
		if newProtoPlan(files[0].Messages().Get(0), map[string]bool{"a": true}) != nil {
			t.Errorf("a plan for %s", text)
		}
	}
}

const jsonSchemaClosed = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","additionalProperties":false,
 "required":["event_id","account_id","amount_minor","currency","occurred_at","channel"],
 "properties":{"event_id":{"type":"string","minLength":1,"maxLength":8},"account_id":{"type":["string","integer"]},
 "amount_minor":{"type":"integer","description":"minor units"},"currency":{"type":"string","pattern":"^[A-Z]{3}$"},
 "occurred_at":{"type":"string"},"channel":{"type":["string","null"],"pattern":"^(web|app)$"},"note":true,
 "ratio":{"type":"number"},"meta":{"type":"object"},"tags":{"type":"array"},"ok":{"type":"boolean"}}}`

// The quick check of a JSON Schema passes no record that the validator
// fails: the same events, the same dead letters, for the contract's
// schema and a closed one of every keyword it reads.
func TestJSONSchemaQuickCheckDecodesAsBefore(t *testing.T) {
	contract, _, _ := ContractSchema(JSONSchema)
	reg := fakeRegistryF(t, map[int]sr.Schema{1: {Schema: contract, Type: sr.TypeJSON}, 2: {Schema: jsonSchemaClosed, Type: sr.TypeJSON}})
	member := func(doc, k, v string) string {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatal(err)
		}
		if v == "" {
			delete(m, k)
		} else {
			m[k] = json.RawMessage(v)
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	closed := member(base, "channel", `"web"`)
	var docs []string
	for _, doc := range []string{base, closed} {
		docs = append(docs, doc)
		for _, kv := range [][2]string{
			{"event_id", ""}, {"event_id", `""`}, {"event_id", `"12345678"`}, {"event_id", `"123456789"`},
			{"event_id", `"ééééééé\u00e9"`}, {"event_id", `"éééééééé\u00e9"`}, {"event_id", `7`}, {"event_id", `null`},
			{"account_id", `42`}, {"account_id", `42.0`}, {"account_id", `4.2e1`}, {"account_id", `true`},
			{"amount_minor", `1250.0`}, {"amount_minor", `1.25e3`}, {"amount_minor", `12.5`}, {"account_id", `4.5`}, {"amount_minor", `"1250"`}, {"amount_minor", `-0`},
			{"currency", `"eur"`}, {"currency", `"EURO"`}, {"currency", `["EUR"]`},
			{"channel", `null`}, {"channel", `"shop"`}, {"channel", ""}, {"note", `{"a":1,"a":2}`}, {"note", `[1,"x"]`},
			{"ratio", `0.5`}, {"ratio", `"0.5"`}, {"meta", `{"k":{"k":1,"k":2}}`}, {"meta", `[]`}, {"tags", `[]`}, {"tags", `{}`},
			{"ok", `false`}, {"ok", `0`}, {"extra", `1`},
			// Versions: the contract's if/else (a tombstone needs only
			// event_id) and the revision's minimum.
			{"revision", `0`}, {"revision", `3`}, {"revision", `-1`}, {"revision", `1.5`}, {"revision", `2.0`}, {"revision", `1e2`},
			{"revision", `"1"`}, {"revision", `9223372036854775808`}, {"revision", `null`},
			{"cancelled", `true`}, {"cancelled", `false`}, {"cancelled", `"true"`}, {"cancelled", `1`}, {"cancelled", `null`},
		} {
			docs = append(docs, member(doc, kv[0], kv[1]))
		}
	}
	var values [][]byte
	for _, doc := range docs {
		for _, id := range []int{1, 2} {
			values = append(values, wire(id, []byte(doc)))
		}
	}
	values = append(values, mutations(wire(1, []byte(base)))...)
	values = append(values, wire(1, []byte(`[1]`)), wire(1, []byte(`"x"`)), wire(2, []byte(`{}`)))
	// Tombstones, whole and not.
	for _, doc := range []string{`{"event_id":"e-1","cancelled":true}`, `{"event_id":"e-1","cancelled":false}`, `{"event_id":"e-1","cancelled":true,"revision":2}`,
		`{"event_id":"e-1","cancelled":true,"revision":-2}`, `{"event_id":"e-1","cancelled":"yes"}`, `{"event_id":"e-1"}`, `{"cancelled":true}`} {
		values = append(values, wire(1, []byte(doc)))
	}
	for _, spec := range []string{"", "account_id=channel", "amount_minor=ratio"} {
		d := newDecoder(t, Options{Format: JSONSchema, Mapping: mapping(t, spec), Registry: RegistryOptions{URL: reg, Subject: "bench-value"}})
		if n := sameDecoding(t, d, values); spec == "" && n < 4 {
			t.Errorf("%q: %d records accepted", spec, n)
		}
		for _, id := range []int{1, 2} {
			if b, _ := d.reg.lookup(context.Background(), id); b.(*jsonSchemaBody).quick == nil {
				t.Fatalf("schema %d has no quick check", id)
			}
		}
	}
}

// A schema with a keyword the quick check does not read has none: the
// validator checks its records.
func TestJSONSchemaQuickCheckOnlyForItsKeywords(t *testing.T) {
	for _, text := range []string{
		`{"type":"object","properties":{"a":{"type":"integer","maximum":1}}}`,
		`{"type":"object","properties":{"a":{"type":"integer","minimum":1.5}}}`,
		`{"type":"object","properties":{"a":{"const":1}}}`,
		`{"type":"object","if":{"type":"object"},"else":{"required":["a"]}}`,
		`{"type":"object","then":{"required":["a"]}}`,
		`{"type":"object","if":{"properties":{"a":{"const":true,"type":"boolean"}}}}`,
		`{"type":"object","properties":{"a":{"type":"string","format":"date-time"}}}`,
		`{"type":"object","properties":{"a":{"$ref":"#/definitions/x"}},"definitions":{"x":{}}}`,
		`{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"string"}}}}}`,
		`{"type":"object","additionalProperties":{"type":"string"}}`,
		`{"type":"object","patternProperties":{"^a":{"type":"string"}}}`,
		`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}`,
		`{"properties":{"a":{"type":"string"}}}`,
		`{"type":["object","null"]}`,
		`{"type":"object","properties":{"a":false}}`,
		`{"type":"object","properties":{"a":{"enum":["x"]}}}`,
	} {
		if newQuickSchema(text) != nil {
			t.Errorf("a quick check of %s", text)
		}
	}
	if newQuickSchema(jsonSchemaClosed) == nil {
		t.Error("no quick check of the closed schema")
	}
}

// Decoding with the plans allocates a fraction of what it did: the
// pooled tree, one allocation for a record's strings.
func TestPlansAllocations(t *testing.T) {
	schemas := map[int]sr.Schema{}
	for i, f := range []string{Avro, Protobuf, JSONSchema} {
		text, _, _ := ContractSchema(f)
		schemas[i+1] = sr.Schema{Schema: text, Type: map[string]sr.SchemaType{Avro: sr.TypeAvro, Protobuf: sr.TypeProtobuf, JSONSchema: sr.TypeJSON}[f]}
	}
	reg := fakeRegistryF(t, schemas)
	for i, c := range []struct {
		format string
		max    float64
	}{{Avro, 4}, {Protobuf, 5}, {JSONSchema, 10}} {
		d := newDecoder(t, Options{Format: c.format, Registry: RegistryOptions{URL: reg, Subject: "bench-value"}})
		v := contractRecords(t, c.format, i+1, 1)[0].Value
		if _, err := d.Decode(context.Background(), v, nil); err != nil {
			t.Fatal(err)
		}
		n := testing.AllocsPerRun(200, func() { sinkEvent, sinkErr = d.Decode(context.Background(), v, nil) })
		if n > c.max {
			t.Errorf("%s: %.0f allocations per record, want at most %.0f", c.format, n, c.max)
		}
	}
}

// FuzzPlans: whatever the bytes after the header, the plans decode a
// record as the general decoding does (the event, or the dead letter to
// its detail).
func FuzzPlans(f *testing.F) {
	schemas := map[int]sr.Schema{}
	for i, text := range []string{avroWide, protoWide, jsonSchemaClosed} {
		schemas[i+1] = sr.Schema{Schema: text, Type: []sr.SchemaType{sr.TypeAvro, sr.TypeProtobuf, sr.TypeJSON}[i]}
	}
	for i, fm := range []string{Avro, Protobuf, JSONSchema} {
		text, _, _ := ContractSchema(fm)
		schemas[i+4] = sr.Schema{Schema: text, Type: []sr.SchemaType{sr.TypeAvro, sr.TypeProtobuf, sr.TypeJSON}[i]}
	}
	reg := fakeRegistryF(f, schemas)
	var decs []*Decoder
	for _, fm := range []string{Avro, Protobuf, JSONSchema} {
		decs = append(decs, newDecoderTB(f, Options{Format: fm, Registry: RegistryOptions{URL: reg, Subject: "bench-value"}}))
	}
	for i, fm := range []string{Avro, Protobuf, JSONSchema} {
		v := contractRecords(f, fm, i+4, 1)[0].Value
		f.Add(uint8(i), true, v[5:])
		f.Add(uint8(i), false, v[5:])
	}
	f.Add(uint8(2), false, []byte(`{"event_id":"e","account_id":4.5,"amount_minor":1.0,"currency":"EUR","occurred_at":"x","channel":null}`))
	f.Fuzz(func(t *testing.T, which uint8, wide bool, body []byte) {
		i := int(which) % len(decs)
		id := i + 4
		if wide {
			id = i + 1
		}
		sameDecoding(t, decs[i], [][]byte{wire(id, body)})
	})
}

func newDecoderTB(tb testing.TB, o Options) *Decoder {
	tb.Helper()
	d, err := New(o)
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

// Decoders are used concurrently: the trees they build in their pooled
// maps are a record's own (run with -race too).
func TestPlansConcurrentDecode(t *testing.T) {
	schemas := map[int]sr.Schema{}
	for i, f := range []string{Avro, Protobuf, JSONSchema} {
		text, _, _ := ContractSchema(f)
		schemas[i+1] = sr.Schema{Schema: text, Type: []sr.SchemaType{sr.TypeAvro, sr.TypeProtobuf, sr.TypeJSON}[i]}
	}
	reg := fakeRegistryF(t, schemas)
	for i, f := range []string{Avro, Protobuf, JSONSchema} {
		d := newDecoder(t, Options{Format: f, Registry: RegistryOptions{URL: reg, Subject: "bench-value"}})
		recs := contractRecords(t, f, i+1, 64)
		want := make([]event.Event, len(recs))
		for j, r := range recs {
			var err error
			if want[j], err = generalDecode(t, d, r.Value); err != nil {
				t.Fatal(err)
			}
		}
		errs := make(chan error, 4)
		for g := range 4 {
			go func() {
				for n := range 2000 {
					j := (n*7 + g) % len(recs)
					got, err := d.Decode(context.Background(), recs[j].Value, nil)
					if err != nil || got != want[j] {
						errs <- fmt.Errorf("%s record %d: %+v %v, want %+v", f, j, got, err, want[j])
						return
					}
				}
				errs <- nil
			}()
		}
		for range 4 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
}
