package format

import (
	"context"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/testenv"
)

const jsonSchemaAmount = `{"$schema":"http://json-schema.org/draft-07/schema#","$id":"amount.json","type":"string","pattern":"^-?[0-9]+(\\.[0-9]+)?$"}`

const jsonSchemaCharge = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","required":["event_id","account_id","amount","currency","occurred_at"],
 "properties":{"event_id":{"type":"string"},"account_id":{"type":"string"},"amount":{"$ref":"amount.json"},
 "currency":{"type":"string","minLength":3,"maxLength":3},"occurred_at":{"type":"string"}}}`

// JSON Schema through the real registry: the document is validated against
// the registry's schema (with a reference) before the mapping reads it.
func TestJSONSchemaThroughTheRegistry(t *testing.T) {
	url := testenv.SchemaRegistry(t)
	amountSubject := testenv.RandomName("amount_")
	register(t, url, amountSubject, jsonSchemaAmount, sr.TypeJSON)
	subject := testenv.RandomName("js_") + "-value"
	id := register(t, url, subject, jsonSchemaCharge, sr.TypeJSON, sr.SchemaReference{Name: "amount.json", Subject: amountSubject, Version: 1})
	m, err := event.ParseMapping("amount_minor=amount")
	if err != nil {
		t.Fatal(err)
	}
	d := newDecoder(t, Options{Format: JSONSchema, Mapping: &m, Registry: RegistryOptions{URL: url, Subject: subject}})
	ctx := context.Background()
	doc := `{"event_id":"e-7f3a","account_id":"acct-42","amount":"12.50","currency":"EUR","occurred_at":"2026-11-29T13:05:00Z"}`
	got, err := d.Decode(ctx, wire(id, []byte(doc)), nil)
	if err != nil || got != want {
		t.Fatalf("decode: %+v %v", got, err)
	}
	for _, c := range []struct {
		name  string
		value []byte
		want  event.Reason
	}{
		{"fails the schema", wire(id, []byte(strings.Replace(doc, `"12.50"`, `12.5`, 1))), event.ReasonInvalidEncoding},
		{"fails the referenced schema", wire(id, []byte(strings.Replace(doc, `"12.50"`, `"12,50"`, 1))), event.ReasonInvalidEncoding},
		{"not json", wire(id, []byte(`{"event_id":`)), event.ReasonInvalidJSON},
		{"truncated header", []byte{0, 0}, event.ReasonInvalidEncoding},
		{"no header", []byte(doc), event.ReasonInvalidEncoding},
		{"unknown id", wire(1<<28, []byte(doc)), event.ReasonUnknownSchema},
		{"deeply nested", wire(id, []byte(strings.Replace(doc, `{`, `{"x":`+strings.Repeat("[", 5000)+strings.Repeat("]", 5000)+`,`, 1))), event.ReasonInvalidJSON},
	} {
		_, err := d.Decode(ctx, c.value, nil)
		if reasonOf(err) != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
}

// The validator reads the tree the mapping reads, except where a nested
// object repeats a key: there, as before, the last value is the one
// validated (encoding/json's rule), and the record decodes when it holds.
func TestJSONSchemaRepeatedNestedKey(t *testing.T) {
	schema := `{"type":"object","required":["event_id"],"properties":{"event_id":{"type":"string"},
 "meta":{"type":"object","properties":{"x":{"type":"string"}}}}}`
	d := newDecoder(t, Options{Format: JSONSchema, Registry: RegistryOptions{URL: fakeRegistryF(t, map[int]sr.Schema{5: {Schema: schema, Type: sr.TypeJSON}}), Subject: "bench-value"}})
	ctx := context.Background()
	doc := strings.TrimSuffix(base, "}")
	if got, err := d.Decode(ctx, wire(5, []byte(doc+`,"meta":{"x":1,"x":"s"}}`)), nil); err != nil || got != want {
		t.Fatalf("last value valid: %+v %v", got, err)
	}
	if _, err := d.Decode(ctx, wire(5, []byte(doc+`,"meta":{"x":"s","x":1}}`)), nil); reasonOf(err) != event.ReasonInvalidEncoding {
		t.Fatalf("last value invalid: %v, want %s", err, event.ReasonInvalidEncoding)
	}
	if _, err := d.Decode(ctx, wire(5, []byte(doc+`,"meta":{"x":1}}`)), nil); reasonOf(err) != event.ReasonInvalidEncoding {
		t.Fatalf("invalid: %v, want %s", err, event.ReasonInvalidEncoding)
	}
}
