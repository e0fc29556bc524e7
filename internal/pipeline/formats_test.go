package pipeline

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/event/format"
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
