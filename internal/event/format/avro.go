package format

import (
	"context"
	"fmt"
	"sync"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/billing/ledger/internal/event"
)

// avroBody decodes Avro binary under the writer's schema (the one the
// record's id names) into a tree: records as map[string]any, decimal as
// *big.Rat, timestamp-millis/-micros as time.Time (hamba/avro's mapping).
// A field is also reachable by each of its aliases, so that a mapping
// written against a field's old name reads a producer that renamed it
// with an alias (Avro's schema evolution).
type avroBody struct {
	schema  avro.Schema
	api     avro.API
	aliases bool // some field of the schema has an alias
	readers sync.Pool
	// plan reads the records straight into the tree of the mapping's keys
	// (decodeKeyed; nil: the schema has no plan).
	plan *avroPlan
}

// compileAvro compiles schemas whose records the tree of keys is read
// from (decodeKeyed).
func compileAvro(limit int, keys map[string]bool) func(context.Context, *sr.Client, sr.Schema) (bodyDecoder, error) {
	// Allocations a record can ask for are bounded by its size: a hostile
	// length prefix cannot allocate more than the record could hold.
	api := avro.Config{MaxByteSliceSize: limit, MaxSliceAllocSize: limit}.Freeze()
	return func(ctx context.Context, cl *sr.Client, s sr.Schema) (bodyDecoder, error) {
		if s.Type != sr.TypeAvro {
			return nil, &event.DecodeError{Reason: event.ReasonUnknownSchema, Detail: fmt.Sprintf("the schema is %s, not AVRO (EVENT_FORMAT=avro)", s.Type)}
		}
		cache := &avro.SchemaCache{}
		err := refs(ctx, cl, s, map[string]bool{}, 0, func(_ sr.SchemaReference, rs sr.Schema) error {
			_, err := avro.ParseWithCache(rs.Schema, "", cache)
			return err
		})
		if err != nil {
			return nil, err
		}
		schema, err := avro.ParseWithCache(s.Schema, "", cache)
		if err != nil {
			return nil, err
		}
		return &avroBody{schema: schema, api: api, aliases: hasAliases(schema, map[string]bool{}), plan: newAvroPlan(schema, keys)}, nil
	}
}

// reader returns a reader of b (done gives it back).
func (a *avroBody) reader(b []byte) *avro.Reader {
	r, _ := a.readers.Get().(*avro.Reader)
	if r == nil {
		r = avro.NewReader(nil, 0, avro.WithReaderConfig(a.api))
	}
	r.Reset(b)
	return r
}

// done keeps r for the next record.
func (a *avroBody) done(r *avro.Reader) {
	r.Reset(nil)
	r.Error = nil
	a.readers.Put(r)
}

// decodeKeyed reads a record with the schema's plan, or decodes it whole.
func (a *avroBody) decodeKeyed(b []byte, into map[string]any) (any, error) {
	if a.plan != nil {
		r := a.reader(b)
		tree, ok := a.plan.tree(r, into)
		a.done(r)
		if ok {
			return tree, nil
		}
	}
	return a.decode(b)
}

func (a *avroBody) decode(b []byte) (any, error) {
	// Not api.Unmarshal: it takes running out of bytes (a truncated
	// record) for success.
	var v any
	r := a.reader(b)
	defer a.done(r)
	r.ReadVal(a.schema, &v)
	if r.Error != nil {
		return nil, &event.DecodeError{Reason: event.ReasonInvalidEncoding, Detail: "avro: " + trim(r.Error.Error())}
	}
	if r.Peek(); r.Error == nil {
		return nil, &event.DecodeError{Reason: event.ReasonInvalidEncoding, Detail: "avro: bytes left after the record"}
	}
	if a.aliases {
		if err := addAliases(a.schema, v, 0); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// hasAliases reports whether a field of s, or of a schema it contains,
// has an alias (named schemas visited once: a recursive schema ends).
func hasAliases(s avro.Schema, seen map[string]bool) bool {
	if n, ok := s.(avro.NamedSchema); ok {
		if seen[n.FullName()] {
			return false
		}
		seen[n.FullName()] = true
	}
	switch s := s.(type) {
	case *avro.RefSchema:
		return hasAliases(s.Schema(), seen)
	case *avro.RecordSchema:
		for _, f := range s.Fields() {
			if len(f.Aliases()) > 0 || hasAliases(f.Type(), seen) {
				return true
			}
		}
	case *avro.UnionSchema:
		for _, t := range s.Types() {
			if hasAliases(t, seen) {
				return true
			}
		}
	case *avro.ArraySchema:
		return hasAliases(s.Items(), seen)
	case *avro.MapSchema:
		return hasAliases(s.Values(), seen)
	}
	return false
}

// addAliases makes every record field reachable by its aliases too.
func addAliases(s avro.Schema, v any, depth int) error {
	if depth > event.MaxTreeDepth {
		return &event.DecodeError{Reason: event.ReasonInvalidEncoding, Detail: fmt.Sprintf("avro: nesting deeper than %d levels", event.MaxTreeDepth)}
	}
	switch s := s.(type) {
	case *avro.RefSchema:
		return addAliases(s.Schema(), v, depth)
	case *avro.RecordSchema:
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		for _, f := range s.Fields() {
			fv, ok := m[f.Name()]
			if !ok {
				continue
			}
			if err := addAliases(f.Type(), fv, depth+1); err != nil {
				return err
			}
			for _, alias := range f.Aliases() {
				if _, taken := m[alias]; !taken {
					m[alias] = fv
				}
			}
		}
	case *avro.UnionSchema:
		if v == nil {
			return nil
		}
		if nullable, typ := nullableUnion(s); nullable {
			return addAliases(typ, v, depth+1)
		}
		if m, ok := v.(map[string]any); ok && len(m) == 1 {
			for name, inner := range m {
				for _, t := range s.Types() {
					if n, ok := t.(avro.NamedSchema); ok && n.FullName() == name {
						return addAliases(t, inner, depth+1)
					}
				}
			}
		}
	case *avro.ArraySchema:
		if items, ok := v.([]any); ok {
			for _, it := range items {
				if err := addAliases(s.Items(), it, depth+1); err != nil {
					return err
				}
			}
		}
	case *avro.MapSchema:
		if m, ok := v.(map[string]any); ok {
			for _, it := range m {
				if err := addAliases(s.Values(), it, depth+1); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func nullableUnion(s *avro.UnionSchema) (bool, avro.Schema) {
	ts := s.Types()
	if len(ts) != 2 {
		return false, nil
	}
	switch {
	case ts[0].Type() == avro.Null:
		return true, ts[1]
	case ts[1].Type() == avro.Null:
		return true, ts[0]
	}
	return false, nil
}

// trim bounds a library's error text in a detail.
func trim(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}
