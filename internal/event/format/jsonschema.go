package format

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/billing/ledger/internal/event"
)

// jsonSchemaBody decodes JSON records of one JSON Schema (the Confluent
// wire format: magic byte and schema id, then the JSON document): the
// document is parsed as strictly as the contract's JSON, then validated
// against the schema (a record that fails it is invalid_encoding, naming
// where), and read by the mapping.
type jsonSchemaBody struct {
	schema *jsonschema.Schema
	quick  *quickSchema // nil: the validator checks every record
	names  []string     // member names expected: the mapping's keys, the schema's properties
}

// jsonSchemaMainURL is where the record's schema is placed; a reference's
// name is resolved against it, so a "$ref" by that name finds it (what the
// registries do). Nothing is ever fetched from it.
const jsonSchemaMainURL = "https://schema-registry.invalid/schemas/record.json"

// noLoader refuses every $ref the registry did not supply: compiling a
// schema fetches nothing from anywhere else.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s is not among the schema's registry references", url)
}

// compileJSONSchema compiles schemas whose records are read by a mapping
// of keys.
func compileJSONSchema(keys map[string]bool) func(context.Context, *sr.Client, sr.Schema) (bodyDecoder, error) {
	return func(ctx context.Context, cl *sr.Client, s sr.Schema) (bodyDecoder, error) {
		body, err := compileJSONSchemaBody(ctx, cl, s)
		if err != nil {
			return nil, err
		}
		names := map[string]bool{}
		for k := range keys {
			names[k] = true
		}
		if body.quick != nil {
			for k := range body.quick.props {
				names[k] = true
			}
		}
		for k := range names {
			body.names = append(body.names, k)
		}
		return body, nil
	}
}

func compileJSONSchemaBody(ctx context.Context, cl *sr.Client, s sr.Schema) (*jsonSchemaBody, error) {
	if s.Type != sr.TypeJSON {
		return nil, &event.DecodeError{Reason: event.ReasonUnknownSchema, Detail: fmt.Sprintf("the schema is %s, not JSON (EVENT_FORMAT=json-schema)", s.Type)}
	}
	base, _ := url.Parse(jsonSchemaMainURL)
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7) // the registries' default
	c.UseLoader(noLoader{})
	add := func(url, text string) error {
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
		if err != nil {
			return err
		}
		return c.AddResource(url, doc)
	}
	err := refs(ctx, cl, s, map[string]bool{}, 0, func(ref sr.SchemaReference, rs sr.Schema) error {
		u, err := url.Parse(ref.Name)
		if err != nil {
			return fmt.Errorf("reference %q: %w", ref.Name, err)
		}
		return add(base.ResolveReference(u).String(), rs.Schema)
	})
	if err != nil {
		return nil, err
	}
	if err := add(jsonSchemaMainURL, s.Schema); err != nil {
		return nil, err
	}
	sch, err := c.Compile(jsonSchemaMainURL)
	if err != nil {
		return nil, err
	}
	body := &jsonSchemaBody{schema: sch}
	if len(s.References) == 0 {
		body.quick = newQuickSchema(s.Schema)
	}
	return body, nil
}

// jsonSchemaDetail begins the detail of a record the validator fails.
const jsonSchemaDetail = "json schema: "

func (j *jsonSchemaBody) decode(b []byte) (any, error) { return j.decodeKeyed(b, nil) }

// decodeKeyed decodes the whole tree, its root built in into.
func (j *jsonSchemaBody) decodeKeyed(b []byte, into map[string]any) (any, error) {
	tree, derr := event.ParseJSONInto(b, into, j.names)
	if derr != nil {
		return nil, derr
	}
	// The validator reads the tree the mapping reads: parsing the document
	// again would double the cost of a record. Only a tree holding a value
	// the validator does not know (the mark ParseJSON leaves for a key
	// repeated in a nested object) is validated in the validator's own
	// parse, where the last of the repeated values counts.
	plain := plainJSON(tree, 0)
	if plain && j.quick != nil && j.quick.valid(tree) {
		return tree, nil
	}
	inst := tree
	if !plain {
		var err error
		if inst, err = jsonschema.UnmarshalJSON(bytes.NewReader(b)); err != nil {
			return nil, &event.DecodeError{Reason: event.ReasonInvalidJSON, Detail: "json: " + trim(err.Error())}
		}
	}
	if err := j.schema.Validate(inst); err != nil {
		return nil, &event.DecodeError{Reason: event.ReasonInvalidEncoding, Detail: jsonSchemaDetail + trim(strings.Join(strings.Fields(err.Error()), " "))}
	}
	return tree, nil
}

// plainJSON reports whether v holds only the values encoding/json decodes
// a document into (with UseNumber), what the validator reads.
func plainJSON(v any, depth int) bool {
	if depth > event.MaxTreeDepth {
		return false
	}
	switch x := v.(type) {
	case nil, bool, string, json.Number:
		return true
	case map[string]any:
		for _, e := range x {
			if !plainJSON(e, depth+1) {
				return false
			}
		}
		return true
	case []any:
		for _, e := range x {
			if !plainJSON(e, depth+1) {
				return false
			}
		}
		return true
	}
	return false
}
