package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/waits"
)

// CloudEvents in both modes and a mapping count exactly against Kafka and
// MySQL: the same event in structured and binary mode is one event (its id
// is source and id, its fingerprint the decoded values'), a type the
// filter does not select is skipped (counted, no dead letter, the position
// moves past it), and a record that does not fit is a dead letter naming
// the cause.
func TestCloudEventsAndMappingCountExactly(t *testing.T) {
	e := newEnv(t, 2)
	m, err := event.ParseMapping("account_id=data.customer.id,amount_minor=data.total,occurred_at=time")
	if err != nil {
		t.Fatal(err)
	}
	dec, err := format.New(format.Options{Mapping: &m, CloudEvents: true, CloudEventTypes: []string{"com.example.charge"}, MaxPayload: 4096})
	if err != nil {
		t.Fatal(err)
	}
	data := func(account, total string) string {
		return fmt.Sprintf(`{"customer":{"id":%q},"total":%s,"currency":"EUR"}`, account, total)
	}
	structured := func(id, typ, account, total string) *kgo.Record {
		v := fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"/shop","type":%q,"time":%q,"data":%s}`, id, typ, t0, data(account, total))
		return &kgo.Record{Key: []byte(account), Value: []byte(v),
			Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json")}}}
	}
	binary := func(id, typ, account, total string) *kgo.Record {
		return &kgo.Record{Key: []byte(account), Value: []byte(data(account, total)), Headers: []kgo.RecordHeader{
			{Key: "ce_specversion", Value: []byte("1.0")}, {Key: "ce_id", Value: []byte(id)}, {Key: "ce_source", Value: []byte("/shop")},
			{Key: "ce_type", Value: []byte(typ)}, {Key: "ce_time", Value: []byte(t0)}, {Key: "content-type", Value: []byte("application/json")}}}
	}
	var recs []*kgo.Record
	for i := range 50 {
		recs = append(recs, structured(fmt.Sprintf("s-%d", i), "com.example.charge", "acct-a", `"1.25"`))
		recs = append(recs, binary(fmt.Sprintf("b-%d", i), "com.example.charge", "acct-b", "200"))
	}
	// Repeats across modes and encodings: the same event again.
	recs = append(recs, binary("s-0", "com.example.charge", "acct-a", "125"))
	recs = append(recs, structured("b-0", "com.example.charge", "acct-b", `"2.00"`))
	// Other types on the shared topic: skipped.
	for i := range 7 {
		recs = append(recs, binary(fmt.Sprintf("r-%d", i), "com.example.refund", "acct-a", "999"))
	}
	// Does not fit: an amount finer than the currency, a missing path.
	recs = append(recs, structured("x-1", "com.example.charge", "acct-a", `"1.255"`))
	recs = append(recs, &kgo.Record{Key: []byte("acct-b"), Value: []byte(`{"total":1,"currency":"EUR"}`), Headers: binary("x-2", "com.example.charge", "", "").Headers})
	produce(t, e, recs...)

	in := start(t, e, func(c *Config, _ *sinkConfig) { c.Decoder = dec })
	waitCounted(t, e.db, 100, 2)
	b := balances(t, e.db)
	if a := b["acct-a/EUR"]; a.Amount != 50*125 || a.Count != 50 {
		t.Errorf("acct-a: %+v", a)
	}
	if a := b["acct-b/EUR"]; a.Amount != 50*200 || a.Count != 50 {
		t.Errorf("acct-b: %+v", a)
	}
	if r := deadReasons(t, e.db); r["amount_inexact"] != 1 || r["missing_field"] != 1 {
		t.Errorf("dead letters %v", r)
	}
	var ids []string
	if err := e.db.Select(&ids, `SELECT event_id FROM dead_letters ORDER BY event_id`); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids[0] != "/shop x-1" || ids[1] != "/shop x-2" {
		t.Errorf("dead letters' event ids %q", ids)
	}
	deadline := time.Now().Add(10 * time.Second)
	for in.p.Stats().Skipped.Load() < 7 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := in.p.Stats().Skipped.Load(); n != 7 {
		t.Errorf("skipped %d, want 7", n)
	}
	if n := in.p.Stats().Duplicates.Load(); n != 2 {
		t.Errorf("duplicates %d, want the 2 repeats across modes", n)
	}
}

// proxy forwards TCP connections to target until stopped; started again
// on the same address it forwards again: a registry "stopped and
// restarted" as the service sees it.
type proxy struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	p := &proxy{t: t, target: target}
	p.start()
	p.addr = p.ln.Addr().String()
	t.Cleanup(p.stop)
	return p
}

func (p *proxy) start() {
	addr := p.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
}

func (p *proxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

const chargeV1 = `{"type":"record","name":"Charge","namespace":"billing","fields":[
 {"name":"event_id","type":"string"},{"name":"account_id","type":"string"},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":18,"scale":2}},
 {"name":"currency","type":"string"},
 {"name":"occurred_at","type":{"type":"long","logicalType":"timestamp-millis"}}]}`

const chargeV2 = `{"type":"record","name":"Charge","namespace":"billing","fields":[
 {"name":"event_id","type":"string"},{"name":"account_id","type":"string"},
 {"name":"amount_minor","aliases":["amount"],"type":"long"},
 {"name":"currency","type":"string"},
 {"name":"occurred_at","type":{"type":"long","logicalType":"timestamp-micros"}},
 {"name":"channel","type":"string","default":"web"}]}`

// Avro through the real registry counts exactly against Kafka and MySQL,
// across a schema change mid-stream and a registry that stops and comes
// back while the service runs: the records wait for it (the metric says
// so), none becomes a dead letter for it, and a repeat re-encoded under
// the newer schema id is a repeat, not a conflicting duplicate.
func TestAvroCountsExactlyAcrossSchemaChangeAndRegistryOutage(t *testing.T) {
	regURL := testenv.SchemaRegistry(t)
	e := newEnv(t, 2)
	u, err := url.Parse(regURL)
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, u.Host)
	proxied := *u
	proxied.Host = px.addr

	rec, dec := avroCharges(t, regURL, proxied.String(), e.topic+"-value")
	var first []*kgo.Record
	for i := range 100 {
		first = append(first, rec("v1", fmt.Sprintf("a-%d", i), "acct-a", 150))
	}
	produce(t, e, first...)
	ws := waits.New(testenv.Logger())
	in := start(t, e, func(c *Config, _ *sinkConfig) { c.Decoder, c.Waits = dec, ws })
	waitCounted(t, e.db, 100, 0)

	// The registry goes away; the producer moves to v2, which this
	// instance has not fetched yet.
	px.stop()
	var second []*kgo.Record
	for i := range 100 {
		second = append(second, rec("v2", fmt.Sprintf("b-%d", i), "acct-b", 275))
	}
	for i := range 10 { // repeats of v1 events, re-encoded under v2
		second = append(second, rec("v2", fmt.Sprintf("a-%d", i), "acct-a", 150))
	}
	produce(t, e, second...)
	testenv.Eventually(t, 30*time.Second, "the outage noticed", func() (bool, string) {
		n := in.p.Stats().RegistryRetries.Load()
		return n >= 2 && in.p.Stats().RegistryDown.Load() == 1, fmt.Sprintf("%d retries", n)
	})
	// The held records are a wait /waits and billing status list.
	if cur := ws.Current(); len(cur) != 1 || !strings.Contains(cur[0].What, "schema registry") {
		t.Errorf("waits during the outage: %+v, want the schema registry's", cur)
	}
	var dead int
	if err := e.db.Get(&dead, `SELECT COUNT(*) FROM dead_letters`); err != nil || dead != 0 {
		t.Fatalf("%d dead letters during the outage (%v)", dead, err)
	}
	px.start()
	// One record the registry does not know, after it is back.
	unknown := rec("v1", "c-0", "acct-a", 1)
	unknown.Value[1], unknown.Value[2] = 0x7f, 0x7f
	produce(t, e, unknown)
	waitCounted(t, e.db, 200, 1)
	if in.p.Stats().RegistryDown.Load() != 0 {
		t.Error("the registry is still reported unavailable")
	}
	if cur := ws.Current(); len(cur) != 0 {
		t.Errorf("still waiting after the outage: %+v", cur)
	}
	b := balances(t, e.db)
	if a := b["acct-a/EUR"]; a.Amount != 100*150 || a.Count != 100 {
		t.Errorf("acct-a: %+v", a)
	}
	if a := b["acct-b/EUR"]; a.Amount != 100*275 || a.Count != 100 {
		t.Errorf("acct-b: %+v", a)
	}
	if r := deadReasons(t, e.db); r["unknown_schema"] != 1 {
		t.Errorf("dead letters %v, want one unknown_schema", r)
	}
	if n := in.p.Stats().Duplicates.Load(); n != 10 {
		t.Errorf("%d duplicates, want the 10 re-encoded repeats", n)
	}
}

// avroCharges registers chargeV1 and chargeV2 under subject and returns a
// producer of records in either version (the Confluent wire format) and a
// decoder reading them through registryURL (amount_minor=amount).
func avroCharges(t *testing.T, regURL, registryURL, subject string) (func(version, id, account string, minor int64) *kgo.Record, *format.Decoder) {
	cl, err := sr.NewClient(sr.URLs(regURL))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ids := map[string]int{}
	schemas := map[string]avro.Schema{}
	for name, text := range map[string]string{"v1": chargeV1, "v2": chargeV2} {
		ss, err := cl.CreateSchema(ctx, subject, sr.Schema{Schema: text, Type: sr.TypeAvro})
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = ss.ID
		schemas[name] = avro.MustParse(text)
	}
	at, _ := time.Parse(time.RFC3339, t0)
	rec := func(version, id, account string, minor int64) *kgo.Record {
		v := map[string]any{"event_id": id, "account_id": account, "currency": "EUR", "occurred_at": at}
		if version == "v1" {
			v["amount"] = big.NewRat(minor, 100)
		} else {
			v["amount_minor"] = minor
		}
		body, err := avro.Marshal(schemas[version], v)
		if err != nil {
			t.Fatal(err)
		}
		var h sr.ConfluentHeader
		b, _ := h.AppendEncode(nil, ids[version], nil)
		return &kgo.Record{Key: []byte(account), Value: append(b, body...)}
	}
	m, err := event.ParseMapping("amount_minor=amount")
	if err != nil {
		t.Fatal(err)
	}
	dec, err := format.New(format.Options{Format: format.Avro, Mapping: &m, MaxPayload: 4096,
		Registry: format.RegistryOptions{URL: registryURL, Subject: subject, Timeout: time.Second}})
	if err != nil {
		t.Fatal(err)
	}

	return rec, dec
}

const flatEventProto = `syntax = "proto3";
package billing.test;
import "google/protobuf/timestamp.proto";
message Other { string x = 1; }
message Event {
  string event_id = 1;
  string account_id = 2;
  int64 amount_minor = 3;
  string currency = 4;
  google.protobuf.Timestamp occurred_at = 5;
}
`

const flatEventJSONSchema = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
 "required":["event_id","account_id","amount_minor","currency","occurred_at"],
 "properties":{"event_id":{"type":"string"},"account_id":{"type":"string"},"amount_minor":{"type":"integer"},
 "currency":{"type":"string"},"occurred_at":{"type":"string"}}}`

// Protobuf and JSON Schema count exactly against Kafka, MySQL and the real
// registry, and hostile records of each (truncated, a wrong magic byte, an
// unknown schema id, the id of another subject, message indexes out of
// range, nesting past the bound) are dead letters that stall nothing.
func TestRegistryFormatsCountExactlyWithHostileInput(t *testing.T) {
	regURL := testenv.SchemaRegistry(t)
	cl, err := sr.NewClient(sr.URLs(regURL))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	otherSubject := testenv.RandomName("other_") + "-value"
	// Its own content: registries give equal schemas one id, whatever
	// the subject.
	other, err := cl.CreateSchema(ctx, otherSubject, sr.Schema{Schema: strings.Replace(flatEventJSONSchema, `"type":"object",`, `"type":"object","title":"other",`, 1), Type: sr.TypeJSON})
	if err != nil {
		t.Fatal(err)
	}
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{"event.proto": flatEventProto})})}
	files, err := c.Compile(ctx, "event.proto")
	if err != nil {
		t.Fatal(err)
	}
	md := files[0].Messages().ByName("Event")
	at, _ := time.Parse(time.RFC3339, t0)
	for _, f := range []string{format.Protobuf, format.JSONSchema} {
		t.Run(f, func(t *testing.T) {
			e := newEnv(t, 2)
			s := sr.Schema{Schema: flatEventProto, Type: sr.TypeProtobuf}
			if f == format.JSONSchema {
				s = sr.Schema{Schema: flatEventJSONSchema, Type: sr.TypeJSON}
			}
			ss, err := cl.CreateSchema(ctx, e.topic+"-value", s)
			if err != nil {
				t.Fatal(err)
			}
			header := wireHeader
			body := func(id string) []byte { return flatEvent(f, md, id, at) }
			index := []int(nil)
			if f == format.Protobuf {
				index = []int{1}
			}
			valid := func(id string) []byte { return append(header(ss.ID, index...), body(id)...) }
			var recs []*kgo.Record
			for i := range 60 {
				recs = append(recs, &kgo.Record{Key: []byte("acct-a"), Value: valid(fmt.Sprintf("v-%d", i))})
			}
			good := valid("h-0")
			hostile := [][]byte{
				good[:len(good)-3],             // truncated
				append([]byte{7}, good[1:]...), // wrong magic byte
				{0, 0, 0},                      // shorter than the header
				append(header(1<<30, index...), body("h-1")...),    // unknown schema id
				append(header(other.ID, index...), body("h-2")...), // another subject's id
			}
			if f == format.Protobuf {
				hostile = append(hostile, append(header(ss.ID, 9), body("h-3")...), append(header(ss.ID, 1, 4), body("h-4")...))
			} else {
				deep := `{"x":` + strings.Repeat("[", 2000) + strings.Repeat("]", 2000) + `,` + string(body("h-5"))[1:]
				hostile = append(hostile, append(header(ss.ID), deep...))
			}
			for _, h := range hostile {
				recs = append(recs, &kgo.Record{Key: []byte("acct-a"), Value: h})
			}
			produce(t, e, recs...)
			dec, err := format.New(format.Options{Format: f, MaxPayload: 16384,
				Registry: format.RegistryOptions{URL: regURL, Subject: e.topic + "-value"}})
			if err != nil {
				t.Fatal(err)
			}
			in := start(t, e, func(c *Config, _ *sinkConfig) {
				c.Decoder = dec
				c.MaxPayloadBytes, c.DeadLetterPayloadBytes = 16384, 16384
			})
			waitCounted(t, e.db, 60, len(hostile))
			if b := balances(t, e.db)["acct-a/EUR"]; b.Amount != 60*7 {
				t.Errorf("balance %+v", b)
			}
			var payloads [][]byte
			if err := e.db.Select(&payloads, `SELECT payload FROM dead_letters ORDER BY kafka_offset`); err != nil {
				t.Fatal(err)
			}
			for i, p := range payloads {
				if !bytes.Equal(p, hostile[i]) {
					t.Errorf("dead letter %d does not keep the record's bytes: %d bytes, want %d", i, len(p), len(hostile[i]))
				}
			}
			want := map[string]int{"invalid_encoding": 5, "unknown_schema": 2}
			if f == format.JSONSchema { // truncated JSON and nesting past the bound
				want = map[string]int{"invalid_encoding": 2, "invalid_json": 2, "unknown_schema": 2}
			}
			if got := deadReasons(t, e.db); !maps.Equal(got, want) {
				t.Errorf("dead letters %v, want %v", got, want)
			}
			if n := in.p.Stats().Aborts.Load(); n != 0 {
				t.Errorf("%d aborted checkpoints", n)
			}
		})
	}
}

// flatEvent is the event id of account acct-a, 7 EUR at at, in format f
// (a Protobuf Event of md, or a JSON document), without the wire header.
func flatEvent(f string, md protoreflect.MessageDescriptor, id string, at time.Time) []byte {
	if f == format.JSONSchema {
		return []byte(fmt.Sprintf(`{"event_id":%q,"account_id":"acct-a","amount_minor":7,"currency":"EUR","occurred_at":%q}`, id, at.Format(time.RFC3339)))
	}
	m := dynamicpb.NewMessage(md)
	fs := md.Fields()
	m.Set(fs.ByName("event_id"), protoreflect.ValueOfString(id))
	m.Set(fs.ByName("account_id"), protoreflect.ValueOfString("acct-a"))
	m.Set(fs.ByName("amount_minor"), protoreflect.ValueOfInt64(7))
	m.Set(fs.ByName("currency"), protoreflect.ValueOfString("EUR"))
	ts := m.Mutable(fs.ByName("occurred_at")).Message()
	ts.Set(ts.Descriptor().Fields().ByName("seconds"), protoreflect.ValueOfInt64(at.Unix()))
	b, _ := proto.Marshal(m)
	return b
}

// wireHeader is the Confluent wire format's header.
func wireHeader(id int, index ...int) []byte {
	var h sr.ConfluentHeader
	b, _ := h.AppendEncode(nil, id, index)
	return b
}

// flakyDecoder is the JSON contract's decoder whose Decode reports the
// registry unavailable for the first records it is given, as a schema lost
// from the cache between Prepare and Decode would.
type flakyDecoder struct {
	dec   *event.Decoder
	fails atomic.Int64
}

func (f *flakyDecoder) Prepare(context.Context, []*kgo.Record) error { return nil }

func (f *flakyDecoder) Decode(_ context.Context, value []byte, _ []kgo.RecordHeader) (event.Event, error) {
	if f.fails.Add(-1) >= 0 {
		return event.Event{}, &format.UnavailableError{Err: errors.New("lost from the cache")}
	}
	return f.dec.Decode(value)
}

// A decode that finds the registry unavailable after Prepare never makes a
// dead letter: the partition is read again from its committed position and
// every event counts once.
func TestUnavailableDecodeRereadsThePartition(t *testing.T) {
	e := newEnv(t, 1)
	var recs []*kgo.Record
	for i := range 50 {
		recs = append(recs, ev{fmt.Sprintf("u-%d", i), "acct-u", 3, "EUR", t0}.record(""))
	}
	produce(t, e, recs...)
	dec := &flakyDecoder{dec: event.NewDecoder(4096)}
	dec.fails.Store(3)
	start(t, e, func(c *Config, _ *sinkConfig) { c.Decoder = dec })
	waitCounted(t, e.db, 50, 0)
	if b := balances(t, e.db)["acct-u/EUR"]; b.Amount != 150 || b.Count != 50 {
		t.Errorf("balance %+v", b)
	}
}
