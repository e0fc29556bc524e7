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
