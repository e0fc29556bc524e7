package format

import (
	"context"
	"sync"
	"testing"

	"github.com/bufbuild/protocompile"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/testenv"
)

const protoCommon = `syntax = "proto3";
package billing;
message Customer { string id = 1; }
`

const protoCharge = `syntax = "proto3";
package billing;
import "google/protobuf/timestamp.proto";
import "billing/common.proto";
message Other { string x = 1; }
message Charge {
  string event_id = 1;
  Customer customer = 2;
  int64 amount_minor = 3;
  string currency = 4;
  google.protobuf.Timestamp occurred_at = 5;
  message Nested { Nested child = 1; string pad = 2; }
  Nested nested = 6;
}
`

// chargeDescriptor compiles the test's schema locally, to encode records.
func chargeDescriptor(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"billing/common.proto": protoCommon, "charge.proto": protoCharge})})}
	files, err := c.Compile(context.Background(), "charge.proto")
	if err != nil {
		t.Fatal(err)
	}
	return files[0].Messages().ByName("Charge")
}

func chargeProto(t *testing.T, md protoreflect.MessageDescriptor, depth int) []byte {
	t.Helper()
	m := dynamicpb.NewMessage(md)
	f := md.Fields()
	m.Set(f.ByName("event_id"), protoreflect.ValueOfString("e-7f3a"))
	cust := m.Mutable(f.ByName("customer")).Message()
	cust.Set(cust.Descriptor().Fields().ByName("id"), protoreflect.ValueOfString("acct-42"))
	m.Set(f.ByName("amount_minor"), protoreflect.ValueOfInt64(1250))
	m.Set(f.ByName("currency"), protoreflect.ValueOfString("EUR"))
	ts := m.Mutable(f.ByName("occurred_at")).Message()
	ts.Set(ts.Descriptor().Fields().ByName("seconds"), protoreflect.ValueOfInt64(want.OccurredAt.Unix()))
	n := m.Mutable(f.ByName("nested")).Message()
	for range depth {
		n = n.Mutable(n.Descriptor().Fields().ByName("child")).Message()
	}
	n.Set(n.Descriptor().Fields().ByName("pad"), protoreflect.ValueOfString("x"))
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func wireIndex(id int, index []int, body []byte) []byte {
	var h sr.ConfluentHeader
	b, _ := h.AppendEncode(nil, id, index)
	return append(b, body...)
}

// Protobuf through the real registry: descriptors compiled from the
// registry's text and its references, the message picked by the message
// indexes, google.protobuf.Timestamp read as a time; hostile headers and
// bodies are dead letters.
func TestProtobufThroughTheRegistry(t *testing.T) {
	url := testenv.SchemaRegistry(t)
	commonSubject := testenv.RandomName("common_")
	register(t, url, commonSubject, protoCommon, sr.TypeProtobuf)
	subject := testenv.RandomName("proto_") + "-value"
	id := register(t, url, subject, protoCharge, sr.TypeProtobuf, sr.SchemaReference{Name: "billing/common.proto", Subject: commonSubject, Version: 1})
	m, err := event.ParseMapping("account_id=customer.id")
	if err != nil {
		t.Fatal(err)
	}
	d := newDecoder(t, Options{Format: Protobuf, Mapping: &m, Registry: RegistryOptions{URL: url, Subject: subject}})
	md := chargeDescriptor(t)
	ctx := context.Background()
	good := wireIndex(id, []int{1}, chargeProto(t, md, 3))
	got, err := d.Decode(ctx, good, nil)
	if err != nil || got != want || got.Fingerprint() != want.Fingerprint() {
		t.Fatalf("decode: %+v %v", got, err)
	}
	body := chargeProto(t, md, 0)
	for _, c := range []struct {
		name  string
		value []byte
		want  event.Reason
	}{
		{"index out of range", wireIndex(id, []int{7}, body), event.ReasonInvalidEncoding},
		{"nested index out of range", wireIndex(id, []int{1, 3}, body), event.ReasonInvalidEncoding},
		{"negative index", wireIndex(id, []int{-1}, body), event.ReasonInvalidEncoding},
		{"too many indexes", wireIndex(id, make([]int, 40), body), event.ReasonInvalidEncoding},
		{"the other message", wireIndex(id, []int{0}, body), event.ReasonMissingField},
		{"truncated", good[:len(good)-4], event.ReasonInvalidEncoding},
		{"no index", wireIndex(id, nil, nil), event.ReasonInvalidEncoding},
		{"wrong magic", append([]byte{9}, good[1:]...), event.ReasonInvalidEncoding},
		{"unknown id", wireIndex(1<<29, []int{1}, body), event.ReasonUnknownSchema},
		{"nested too deep", wireIndex(id, []int{1}, chargeProto(t, md, 200)), event.ReasonInvalidEncoding},
	} {
		_, err := d.Decode(ctx, c.value, nil)
		if reasonOf(err) != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
	// An Avro schema id under EVENT_FORMAT=protobuf (no subject checked).
	avroID := register(t, url, testenv.RandomName("avro_"), avroV1, sr.TypeAvro)
	any := newDecoder(t, Options{Format: Protobuf, Mapping: &m, Registry: RegistryOptions{URL: url}})
	if _, err := any.Decode(ctx, wireIndex(avroID, []int{1}, body), nil); reasonOf(err) != event.ReasonUnknownSchema {
		t.Errorf("avro schema under protobuf: %v", err)
	}
}

const protoRequiredInner = `syntax = "proto2";
package billing.req;
message Inner { required string v = 1; }
message Event {
  optional string event_id = 1;
  optional string account_id = 2;
  optional int64 amount_minor = 3;
  optional string currency = 4;
  optional int64 occurred_at = 5;
  optional Inner inner = 6;
}
`

// A proto2 required field, even in the message type of a field, is still
// required: a record without it is invalid_encoding (proto3 schemas have
// none, and their records skip the check).
func TestProtobufRequiredField(t *testing.T) {
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"req.proto": protoRequiredInner})})}
	files, err := c.Compile(context.Background(), "req.proto")
	if err != nil {
		t.Fatal(err)
	}
	md := files[0].Messages().ByName("Event")
	record := func(inner bool) []byte {
		m := dynamicpb.NewMessage(md)
		f := md.Fields()
		m.Set(f.ByName("event_id"), protoreflect.ValueOfString(want.EventID))
		m.Set(f.ByName("account_id"), protoreflect.ValueOfString(want.AccountID))
		m.Set(f.ByName("amount_minor"), protoreflect.ValueOfInt64(want.AmountMinor))
		m.Set(f.ByName("currency"), protoreflect.ValueOfString(want.Currency))
		m.Set(f.ByName("occurred_at"), protoreflect.ValueOfInt64(want.OccurredAt.UnixMilli()))
		if inner {
			m.Mutable(f.ByName("inner")) // set, without its required v
		}
		b, err := proto.MarshalOptions{AllowPartial: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return wireIndex(7, []int{1}, b)
	}
	d := newDecoder(t, Options{Format: Protobuf, Registry: RegistryOptions{
		URL: fakeRegistryF(t, map[int]sr.Schema{7: {Schema: protoRequiredInner, Type: sr.TypeProtobuf}}), Subject: "bench-value"}})
	ctx := context.Background()
	if got, err := d.Decode(ctx, record(false), nil); err != nil || got != want {
		t.Fatalf("without inner: %+v %v", got, err)
	}
	if _, err := d.Decode(ctx, record(true), nil); reasonOf(err) != event.ReasonInvalidEncoding {
		t.Fatalf("inner without its required field: %v, want %s", err, event.ReasonInvalidEncoding)
	}
}

const protoMarks = `syntax = "proto3";
package billing.marks;
import "google/protobuf/timestamp.proto";
message Event {
  string event_id = 1;
  string account_ref = 2;
  int64 amount_minor = 3;
  string currency = 4;
  google.protobuf.Timestamp occurred_at = 5;
  google.protobuf.Timestamp seen_at = 6;
  repeated google.protobuf.Timestamp history = 7;
  map<string, google.protobuf.Timestamp> marks = 8;
}
`

// The decoder builds only the part of a record's tree that the mapping's
// paths reach; the fields it leaves out are still checked as before (a
// Timestamp out of range anywhere is invalid_encoding), and what it
// decodes is what the mapping reads from the whole tree (Render's).
func TestProtobufTreeOfTheMapping(t *testing.T) {
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"marks.proto": protoMarks})})}
	files, err := c.Compile(context.Background(), "marks.proto")
	if err != nil {
		t.Fatal(err)
	}
	md := files[0].Messages().ByName("Event")
	f := md.Fields()
	ts := func(m protoreflect.Message, nanos int32) {
		tf := m.Descriptor().Fields()
		m.Set(tf.ByName("seconds"), protoreflect.ValueOfInt64(want.OccurredAt.Unix()))
		m.Set(tf.ByName("nanos"), protoreflect.ValueOfInt32(nanos))
	}
	record := func(edit func(m *dynamicpb.Message)) []byte {
		m := dynamicpb.NewMessage(md)
		m.Set(f.ByName("event_id"), protoreflect.ValueOfString(want.EventID))
		m.Set(f.ByName("account_ref"), protoreflect.ValueOfString(want.AccountID))
		m.Set(f.ByName("amount_minor"), protoreflect.ValueOfInt64(want.AmountMinor))
		m.Set(f.ByName("currency"), protoreflect.ValueOfString(want.Currency))
		ts(m.Mutable(f.ByName("occurred_at")).Message(), 0)
		edit(m)
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return wireIndex(9, []int{0}, b)
	}
	badNanos := int32(-1)
	cases := []struct {
		name  string
		value []byte
		want  event.Reason
	}{
		{"good", record(func(m *dynamicpb.Message) {
			ts(m.Mutable(f.ByName("seen_at")).Message(), 5)
			l := m.Mutable(f.ByName("history")).List()
			e := l.NewElement()
			ts(e.Message(), 7)
			l.Append(e)
		}), ""},
		{"unmapped timestamp out of range", record(func(m *dynamicpb.Message) { ts(m.Mutable(f.ByName("seen_at")).Message(), badNanos) }), event.ReasonInvalidEncoding},
		{"timestamp in a list out of range", record(func(m *dynamicpb.Message) {
			l := m.Mutable(f.ByName("history")).List()
			e := l.NewElement()
			ts(e.Message(), badNanos)
			l.Append(e)
		}), event.ReasonInvalidEncoding},
		{"timestamp in a map out of range", record(func(m *dynamicpb.Message) {
			mm := m.Mutable(f.ByName("marks")).Map()
			e := mm.NewValue()
			ts(e.Message(), badNanos)
			mm.Set(protoreflect.ValueOfString("k").MapKey(), e)
		}), event.ReasonInvalidEncoding},
		{"mapped timestamp out of range", record(func(m *dynamicpb.Message) { ts(m.Mutable(f.ByName("occurred_at")).Message(), badNanos) }), event.ReasonInvalidEncoding},
	}
	reg := fakeRegistryF(t, map[int]sr.Schema{9: {Schema: protoMarks, Type: sr.TypeProtobuf}})
	for _, spec := range []string{"account_id=accountRef", "account_id=account_ref"} {
		m, err := event.ParseMapping(spec)
		if err != nil {
			t.Fatal(err)
		}
		d := newDecoder(t, Options{Format: Protobuf, Mapping: &m, Registry: RegistryOptions{URL: reg, Subject: "bench-value"}})
		ctx := context.Background()
		for _, c := range cases {
			got, err := d.Decode(ctx, c.value, nil)
			if reasonOf(err) != c.want || err == nil && got != want {
				t.Errorf("%s, %s: %+v %v, want %q", spec, c.name, got, err, c.want)
			}
			full, ferr := d.registryTree(ctx, c.value, false, nil)
			if ferr == nil {
				ev, merr := d.mapping.Event(full, "")
				if ev != got || (merr == nil) != (err == nil) {
					t.Errorf("%s, %s: %+v %v from the whole tree, %+v %v from the mapping's", spec, c.name, ev, merr, got, err)
				}
			} else if err == nil || ferr.Error() != err.Error() {
				t.Errorf("%s, %s: %v from the whole tree, %v from the mapping's", spec, c.name, ferr, err)
			}
		}
	}
}

// The decoder reuses its messages: nothing of a record is left for the
// next one (a field the next record lacks is missing there, an invalid
// value of one does not fail the next).
func TestProtobufRecordsShareNothing(t *testing.T) {
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"marks.proto": protoMarks})})}
	files, err := c.Compile(context.Background(), "marks.proto")
	if err != nil {
		t.Fatal(err)
	}
	md := files[0].Messages().ByName("Event")
	f := md.Fields()
	record := func(account string, nanos int32) []byte {
		m := dynamicpb.NewMessage(md)
		m.Set(f.ByName("event_id"), protoreflect.ValueOfString(want.EventID))
		if account != "" {
			m.Set(f.ByName("account_ref"), protoreflect.ValueOfString(account))
		}
		m.Set(f.ByName("amount_minor"), protoreflect.ValueOfInt64(want.AmountMinor))
		m.Set(f.ByName("currency"), protoreflect.ValueOfString(want.Currency))
		occ := m.Mutable(f.ByName("occurred_at")).Message()
		occ.Set(occ.Descriptor().Fields().ByName("seconds"), protoreflect.ValueOfInt64(want.OccurredAt.Unix()))
		if nanos != 0 {
			seen := m.Mutable(f.ByName("seen_at")).Message()
			seen.Set(seen.Descriptor().Fields().ByName("nanos"), protoreflect.ValueOfInt32(nanos))
		}
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return wireIndex(9, []int{0}, b)
	}
	m, err := event.ParseMapping("account_id=account_ref")
	if err != nil {
		t.Fatal(err)
	}
	d := newDecoder(t, Options{Format: Protobuf, Mapping: &m, Registry: RegistryOptions{
		URL: fakeRegistryF(t, map[int]sr.Schema{9: {Schema: protoMarks, Type: sr.TypeProtobuf}}), Subject: "bench-value"}})
	ctx := context.Background()
	for i := range 3 { // a pool may drop what it keeps: try more than once
		if got, err := d.Decode(ctx, record(want.AccountID, -1), nil); reasonOf(err) != event.ReasonInvalidEncoding {
			t.Fatalf("%d: bad nanos: %+v %v", i, got, err)
		}
		if got, err := d.Decode(ctx, record(want.AccountID, 0), nil); err != nil || got != want {
			t.Fatalf("%d: after a bad record: %+v %v", i, got, err)
		}
		if got, err := d.Decode(ctx, record("", 0), nil); reasonOf(err) != event.ReasonInvalidField {
			t.Fatalf("%d: without an account: %+v %v, want %s", i, got, err, event.ReasonInvalidField)
		}
	}
	// Nor between records decoded at once (the Decoder is safe for
	// concurrent use; -race sees any sharing).
	good, bad := record(want.AccountID, 0), record("", 0)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for range 200 {
				if got, err := d.Decode(ctx, good, nil); err != nil || got != want {
					t.Errorf("goroutine %d: %+v %v", g, got, err)
					return
				}
				if _, err := d.Decode(ctx, bad, nil); reasonOf(err) != event.ReasonInvalidField {
					t.Errorf("goroutine %d: without an account: %v", g, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
