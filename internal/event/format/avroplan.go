package format

import (
	"time"

	"github.com/hamba/avro/v2"
)

// avroPlan reads the records of one schema field by field with the
// reader's own primitives into the tree of the mapping's keys, instead of
// hamba/avro's generic decoding (reflection, a map of every field, a value
// allocated per field). It exists for a record schema whose fields are
// all primitive (null, boolean, int, long, float, double, string, bytes;
// no logical type but timestamp-millis and timestamp-micros), the shape
// of an event; other schemas have no plan.
//
// It reads what generic decoding reads, in the same order with the same
// reads, and builds the members of the generic tree (after addAliases)
// that the keys name. A record it does not read to its last byte cleanly
// gives ok == false: the record is then decoded the generic way, whose
// error names the cause, so a dead letter is the same either way.
type avroPlan struct {
	fields []avroPlanField
	size   int // members of the tree
}

type avroPlanField struct {
	typ     avro.Type
	logical avro.LogicalType // "", timestamp-millis or timestamp-micros
	keys    []string         // the tree's members it is (its name, its aliases)
}

// newAvroPlan returns the plan of s for the tree of keys, or nil.
func newAvroPlan(s avro.Schema, keys map[string]bool) *avroPlan {
	if ref, ok := s.(*avro.RefSchema); ok {
		s = ref.Schema()
	}
	rec, ok := s.(*avro.RecordSchema)
	if !ok {
		return nil
	}
	pl := &avroPlan{}
	for _, f := range rec.Fields() {
		if _, ok := f.Type().(*avro.NullSchema); ok {
			pl.fields = append(pl.fields, avroPlanField{typ: avro.Null})
			continue
		}
		p, ok := f.Type().(*avro.PrimitiveSchema)
		if !ok {
			return nil
		}
		pf := avroPlanField{typ: p.Type()}
		if l := p.Logical(); l != nil {
			pf.logical = l.Type()
			if p.Type() != avro.Long || pf.logical != avro.TimestampMillis && pf.logical != avro.TimestampMicros {
				return nil
			}
		}
		pl.fields = append(pl.fields, pf)
	}
	// Each key names the field of that name, or else the first field
	// with that alias (addAliases's order).
	for k := range keys {
		i := fieldNamed(rec.Fields(), k)
		if i < 0 {
			continue
		}
		pl.fields[i].keys = append(pl.fields[i].keys, k)
		pl.size++
	}
	return pl
}

func fieldNamed(fs []*avro.Field, k string) int {
	for i, f := range fs {
		if f.Name() == k {
			return i
		}
	}
	for i, f := range fs {
		for _, a := range f.Aliases() {
			if a == k {
				return i
			}
		}
	}
	return -1
}

// tree reads a record from r into into (nil: a new map).
func (pl *avroPlan) tree(r *avro.Reader, into map[string]any) (map[string]any, bool) {
	tree := into
	if tree == nil {
		tree = make(map[string]any, pl.size)
	}
	for i := range pl.fields {
		f := &pl.fields[i]
		keep := len(f.keys) > 0
		var v any // boxed only when kept: a value costs an allocation
		switch f.typ {
		case avro.Null:
		case avro.Boolean:
			if b := r.ReadBool(); keep {
				v = b
			}
		case avro.Int:
			if n := r.ReadInt(); keep {
				v = int(n)
			}
		case avro.Long:
			n := r.ReadLong()
			switch {
			case !keep:
			case f.logical == avro.TimestampMillis:
				sec := n / 1e3
				v = time.Unix(sec, (n-sec*1e3)*1e6).UTC()
			case f.logical == avro.TimestampMicros:
				sec := n / 1e6
				v = time.Unix(sec, (n-sec*1e6)*1e3).UTC()
			default:
				v = n
			}
		case avro.Float:
			if x := r.ReadFloat(); keep {
				v = x
			}
		case avro.Double:
			if x := r.ReadDouble(); keep {
				v = x
			}
		case avro.String:
			if s := r.ReadString(); keep {
				v = s
			}
		case avro.Bytes:
			if b := r.ReadBytes(); keep {
				v = b
			}
		default:
			return nil, false
		}
		if r.Error != nil {
			return nil, false
		}
		for _, k := range f.keys {
			tree[k] = v
		}
	}
	if r.Peek(); r.Error == nil {
		return nil, false // bytes left after the record
	}
	return tree, true
}
