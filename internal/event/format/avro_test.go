package format

import (
	"context"
	"encoding/json"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/testenv"
)

const avroV1 = `{"type":"record","name":"Charge","namespace":"billing","fields":[
 {"name":"event_id","type":"string"},
 {"name":"account_id","type":"string"},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":18,"scale":2}},
 {"name":"currency","type":"string"},
 {"name":"occurred_at","type":{"type":"long","logicalType":"timestamp-millis"}}]}`

// v2: a field added with a default, amount renamed to total with the old
// name as an alias, occurred_at in microseconds.
const avroV2 = `{"type":"record","name":"Charge","namespace":"billing","fields":[
 {"name":"event_id","type":"string"},
 {"name":"account_id","type":"string"},
 {"name":"total","aliases":["amount"],"type":{"type":"bytes","logicalType":"decimal","precision":18,"scale":4}},
 {"name":"currency","type":"string"},
 {"name":"occurred_at","type":{"type":"long","logicalType":"timestamp-micros"}},
 {"name":"channel","type":"string","default":"web"}]}`

// register registers a schema under subject and returns its id.
func register(t testing.TB, url, subject, text string, typ sr.SchemaType, refs ...sr.SchemaReference) int {
	t.Helper()
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	ss, err := cl.CreateSchema(context.Background(), subject, sr.Schema{Schema: text, Type: typ, References: refs})
	if err != nil {
		t.Fatalf("register %s: %v", subject, err)
	}
	return ss.ID
}

func wire(id int, body []byte) []byte {
	var h sr.ConfluentHeader
	b, _ := h.AppendEncode(nil, id, nil)
	return append(b, body...)
}

func avroRecord(t testing.TB, text string, v map[string]any) []byte {
	t.Helper()
	s, err := avro.Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	b, err := avro.Marshal(s, v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Avro through the real registry: decimals and timestamps convert exactly,
// a producer moving to a newer compatible schema mid-stream (a field added
// with a default, a field renamed with an alias) decodes to the same event
// and fingerprint, and hostile input is a dead letter naming its cause.
func TestAvroThroughTheRegistry(t *testing.T) {
	url := testenv.SchemaRegistry(t)
	subject := testenv.RandomName("avro_") + "-value"
	id1 := register(t, url, subject, avroV1, sr.TypeAvro)
	id2 := register(t, url, subject, avroV2, sr.TypeAvro)
	otherID := register(t, url, testenv.RandomName("other_")+"-value", `{"type":"record","name":"X","fields":[{"name":"x","type":"string"}]}`, sr.TypeAvro)
	m, err := event.ParseMapping("amount_minor=amount")
	if err != nil {
		t.Fatal(err)
	}
	d := newDecoder(t, Options{Format: Avro, Mapping: &m, Registry: RegistryOptions{URL: url, Subject: subject}})
	ctx := context.Background()

	v1 := wire(id1, avroRecord(t, avroV1, map[string]any{"event_id": "e-7f3a", "account_id": "acct-42",
		"amount": big.NewRat(1250, 100), "currency": "EUR", "occurred_at": want.OccurredAt}))
	v2 := wire(id2, avroRecord(t, avroV2, map[string]any{"event_id": "e-7f3a", "account_id": "acct-42",
		"total": big.NewRat(125000, 10000), "currency": "EUR", "occurred_at": want.OccurredAt, "channel": "app"}))
	if err := d.Prepare(ctx, []*kgo.Record{{Value: v1}, {Value: v2}}); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string][]byte{"v1": v1, "v2": v2} {
		got, err := d.Decode(ctx, v, nil)
		if err != nil || got != want || got.Fingerprint() != want.Fingerprint() {
			t.Errorf("%s: %+v %v", name, got, err)
		}
	}

	// 0.001 EUR: v2's scale 4 carries it, EUR's minor unit does not.
	fine := wire(id2, avroRecord(t, avroV2, map[string]any{"event_id": "e-1", "account_id": "a",
		"total": big.NewRat(1, 1000), "currency": "EUR", "occurred_at": want.OccurredAt}))
	for _, c := range []struct {
		name  string
		value []byte
		want  event.Reason
	}{
		{"inexact decimal", fine, event.ReasonAmountInexact},
		{"truncated", v1[:len(v1)-3], event.ReasonInvalidEncoding},
		{"header only", v1[:5], event.ReasonInvalidEncoding},
		{"trailing bytes", append(append([]byte{}, v1...), 0), event.ReasonInvalidEncoding},
		{"short", []byte{0, 0, 1}, event.ReasonInvalidEncoding},
		{"wrong magic byte", append([]byte{1}, v1[1:]...), event.ReasonInvalidEncoding},
		{"json", []byte(base), event.ReasonInvalidEncoding},
		{"unknown schema id", wire(1<<30, v1[5:]), event.ReasonUnknownSchema},
		{"schema id of another subject", wire(otherID, v1[5:]), event.ReasonUnknownSchema},
		{"huge length prefix", wire(id1, []byte{0xfe, 0xff, 0xff, 0xff, 0x0f}), event.ReasonInvalidEncoding},
	} {
		_, err := d.Decode(ctx, c.value, nil)
		if reasonOf(err) != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
}

// A registry that does not answer, or answers 5xx, is not the record's
// fault: an UnavailableError, never a DecodeError; the next call asks again
// (nothing cached), and a 404 is a permanent unknown_schema.
func TestRegistryOutageIsNotADeadLetter(t *testing.T) {
	var status = http.StatusInternalServerError
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
		switch status {
		case http.StatusOK:
			json.NewEncoder(w).Encode(map[string]any{"schema": avroV1})
		default:
			w.WriteHeader(status)
			json.NewEncoder(w).Encode(map[string]any{"error_code": status * 100, "message": "no"})
		}
	}))
	defer srv.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := "http://" + ln.Addr().String()
	ln.Close()

	ctx := context.Background()
	value := wire(7, avroRecord(t, avroV1, map[string]any{"event_id": "e-7f3a", "account_id": "acct-42",
		"amount": big.NewRat(1250, 100), "currency": "EUR", "occurred_at": want.OccurredAt}))
	m, _ := event.ParseMapping("amount_minor=amount")
	down := newDecoder(t, Options{Format: Avro, Mapping: &m, Registry: RegistryOptions{URL: closed, Timeout: time.Second}})
	if _, err := down.Decode(ctx, value, nil); !IsUnavailable(err) || reasonOf(err) != "" {
		t.Errorf("registry down: %v", err)
	}
	if err := down.Prepare(ctx, []*kgo.Record{{Value: value}}); !IsUnavailable(err) {
		t.Errorf("Prepare with the registry down: %v", err)
	}
	d := newDecoder(t, Options{Format: Avro, Mapping: &m, Registry: RegistryOptions{URL: srv.URL}})
	for _, s := range []int{http.StatusInternalServerError, http.StatusServiceUnavailable, http.StatusUnauthorized} {
		status = s
		if _, err := d.Decode(ctx, value, nil); !IsUnavailable(err) {
			t.Errorf("status %d: %v", s, err)
		}
	}
	status = http.StatusOK
	if got, err := d.Decode(ctx, value, nil); err != nil || got != want {
		t.Errorf("registry back: %+v %v", got, err)
	}
	status = http.StatusNotFound
	var de *event.DecodeError
	if _, err := d.Decode(ctx, wire(8, value[5:]), nil); !errors.As(err, &de) || de.Reason != event.ReasonUnknownSchema {
		t.Errorf("404: %v", err)
	}
	// Once compiled, a schema is not fetched again.
	status = http.StatusInternalServerError
	if _, err := d.Decode(ctx, value, nil); err != nil {
		t.Errorf("cached schema: %v", err)
	}
	// A 404 is believed for missingTTL (a replica may lag behind a new
	// id), then asked again.
	status = http.StatusOK
	if _, err := d.Decode(ctx, wire(8, value[5:]), nil); reasonOf(err) != event.ReasonUnknownSchema {
		t.Errorf("404 within its TTL: %v", err)
	}
	d.reg.missingTTL = 0
	if got, err := d.Decode(ctx, wire(8, value[5:]), nil); err != nil || got != want {
		t.Errorf("404 after its TTL, the registry holding it now: %+v %v", got, err)
	}
}

// Render shows a dead letter of a registry format readably: its schema id
// and the record as JSON, or why it does not decode.
func TestRenderWireFormat(t *testing.T) {
	url := testenv.SchemaRegistry(t)
	subject := testenv.RandomName("render_") + "-value"
	id := register(t, url, subject, avroV1, sr.TypeAvro)
	d := newDecoder(t, Options{Format: Avro, Registry: RegistryOptions{URL: url, Subject: subject}})
	ctx := context.Background()
	v := wire(id, avroRecord(t, avroV1, map[string]any{"event_id": "e-1", "account_id": "a",
		"amount": big.NewRat(1, 4), "currency": "EUR", "occurred_at": want.OccurredAt}))
	gotID, doc, ok, err := d.Render(ctx, v)
	if !ok || err != nil || gotID != id || !strings.Contains(string(doc), `"event_id": "e-1"`) || !strings.Contains(string(doc), `"occurred_at": "2026-11-29T13:05:00Z"`) ||
		!strings.Contains(string(doc), `"amount": "0.25"`) {
		t.Errorf("render: %d %s %v %v", gotID, doc, ok, err)
	}
	if _, _, ok, _ := d.Render(ctx, []byte(base)); ok {
		t.Error("JSON rendered as the wire format")
	}
	if _, _, ok, err := d.Render(ctx, v[:7]); !ok || err == nil {
		t.Errorf("truncated: %v %v", ok, err)
	}
}

func TestPingRegistry(t *testing.T) {
	url := testenv.SchemaRegistry(t)
	if err := PingRegistry(context.Background(), RegistryOptions{URL: url}); err != nil {
		t.Errorf("registry up: %v", err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := "http://" + ln.Addr().String()
	ln.Close()
	if err := PingRegistry(context.Background(), RegistryOptions{URL: closed, Timeout: time.Second}); !IsUnavailable(err) {
		t.Errorf("registry down: %v", err)
	}
}
