package format

import (
	"math"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// protoPlan reads the records of one message type straight from the wire
// into the tree of the mapping's keys, without dynamicpb, whose reflection
// and allocations cost most of a record's decoding. It exists for a proto3
// message whose fields are all singular scalars (no enum) or
// google.protobuf.Timestamp, the shape of an event; other types have no
// plan.
//
// It reads what proto.Unmarshal reads (a field's last occurrence counts,
// the occurrences of a message merge, a field of the wrong wire type or
// an unknown number is skipped as an unknown field, strings are valid
// UTF-8) and builds what protoTree builds from that message. It returns
// ok == false for a record it does not read to the end cleanly (any
// error, a Timestamp out of range): that record is decoded with dynamicpb,
// whose error names the cause, so a dead letter is the same either way.
type protoPlan struct {
	fields []planField
	byNum  []int8 // field number -> index in fields + 1 (0: unknown)
	size   int    // members of the tree
}

type planField struct {
	kind     protoreflect.Kind
	wire     protowire.Type
	ts       bool // a google.protobuf.Timestamp
	presence bool // in the tree only when on the wire (a message, proto3 optional)
	keys     []string
}

// maxPlanFields bounds the fields (and numbers) of a type with a plan:
// the state of a record's fields lives on the stack.
const maxPlanFields = 32

// planState is what a record holds of one field: its last scalar (raw
// varint or fixed bits, or its bytes), or a Timestamp's seconds and nanos.
type planState struct {
	seen  bool
	u     uint64
	b     []byte
	secs  int64
	nanos int32
}

// newProtoPlan returns the plan of md for the tree of keys, or nil.
func newProtoPlan(md protoreflect.MessageDescriptor, keys map[string]bool) *protoPlan {
	if md.ParentFile().Syntax() != protoreflect.Proto3 || md.ExtensionRanges().Len() > 0 {
		return nil
	}
	fs := md.Fields()
	if fs.Len() > maxPlanFields {
		return nil
	}
	pl := &protoPlan{byNum: make([]int8, maxPlanFields+1)}
	taken := map[string]bool{}
	for i := range fs.Len() {
		fd := fs.Get(i)
		if fd.IsList() || fd.IsMap() || fd.IsExtension() || fd.Number() > maxPlanFields ||
			fd.ContainingOneof() != nil && !fd.ContainingOneof().IsSynthetic() {
			return nil
		}
		f := planField{kind: fd.Kind(), presence: fd.HasPresence()}
		switch fd.Kind() {
		case protoreflect.BoolKind, protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Uint32Kind,
			protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Uint64Kind:
			f.wire = protowire.VarintType
		case protoreflect.Sfixed32Kind, protoreflect.Fixed32Kind, protoreflect.FloatKind:
			f.wire = protowire.Fixed32Type
		case protoreflect.Sfixed64Kind, protoreflect.Fixed64Kind, protoreflect.DoubleKind:
			f.wire = protowire.Fixed64Type
		case protoreflect.StringKind, protoreflect.BytesKind:
			f.wire = protowire.BytesType
		case protoreflect.MessageKind:
			if !isTimestamp(fd.Message()) {
				return nil
			}
			f.wire, f.ts = protowire.BytesType, true
		default: // enums, groups
			return nil
		}
		name, json := string(fd.Name()), fd.JSONName()
		for _, k := range []string{name, json} {
			if taken[k] {
				if k == json && json == name {
					continue
				}
				return nil // two fields' names meet: protoTree's order would decide
			}
			taken[k] = true
			if keys[k] {
				f.keys = append(f.keys, k)
			}
		}
		pl.byNum[fd.Number()] = int8(len(pl.fields) + 1)
		pl.fields = append(pl.fields, f)
		pl.size += len(f.keys)
	}
	return pl
}

// isTimestamp reports whether md is google.protobuf.Timestamp as the
// well-known type defines it.
func isTimestamp(md protoreflect.MessageDescriptor) bool {
	if md.FullName() != "google.protobuf.Timestamp" {
		return false
	}
	fs := md.Fields()
	s, n := fs.ByNumber(1), fs.ByNumber(2)
	return fs.Len() == 2 && s != nil && s.Name() == "seconds" && s.Kind() == protoreflect.Int64Kind && !s.IsList() &&
		n != nil && n.Name() == "nanos" && n.Kind() == protoreflect.Int32Kind && !n.IsList()
}

// tree reads a record's body (after the message indexes) into into (nil:
// a new map).
func (pl *protoPlan) tree(b []byte, into map[string]any) (map[string]any, bool) {
	var st [maxPlanFields]planState
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber {
			return nil, false
		}
		b = b[n:]
		i := -1
		if num <= maxPlanFields {
			i = int(pl.byNum[num]) - 1
		}
		if i < 0 || typ != pl.fields[i].wire {
			// Unknown to the type, or of another wire type: an unknown
			// field, which proto.Unmarshal keeps aside and the tree ignores.
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return nil, false
			}
			b = b[n:]
			continue
		}
		f, s := &pl.fields[i], &st[i]
		switch typ {
		case protowire.VarintType:
			s.u, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var v uint32
			v, n = protowire.ConsumeFixed32(b)
			s.u = uint64(v)
		case protowire.Fixed64Type:
			s.u, n = protowire.ConsumeFixed64(b)
		default:
			s.b, n = protowire.ConsumeBytes(b)
			if n >= 0 && f.kind == protoreflect.StringKind && !utf8.Valid(s.b) {
				return nil, false
			}
			if n >= 0 && f.ts && !mergeTimestamp(s, s.b) {
				return nil, false
			}
		}
		if n < 0 {
			return nil, false
		}
		s.seen = true
		b = b[n:]
	}
	// The strings of the tree share one allocation (they are the
	// decoder's own, never the record's bytes).
	var buf [256]byte
	text := buf[:0]
	for i := range pl.fields {
		f, s := &pl.fields[i], &st[i]
		if f.ts && s.seen && (s.nanos < 0 || s.nanos > 999999999) {
			return nil, false // protoTree's check, for every Timestamp
		}
		if f.kind == protoreflect.StringKind && len(f.keys) > 0 {
			text = append(text, s.b...)
		}
	}
	strs := string(text)
	tree := into
	if tree == nil {
		tree = make(map[string]any, pl.size)
	}
	for i := range pl.fields {
		f, s := &pl.fields[i], &st[i]
		var v any
		switch {
		case len(f.keys) == 0, f.presence && !s.seen: // (an absent string's s.b is empty)
			continue
		case f.kind == protoreflect.StringKind:
			v, strs = strs[:len(s.b)], strs[len(s.b):]
		default:
			v = f.value(s)
		}
		for _, k := range f.keys {
			tree[k] = v
		}
	}
	return tree, true
}

// mergeTimestamp reads a Timestamp's occurrence into s (a later
// occurrence's fields replace the earlier ones', as a merge does).
func mergeTimestamp(s *planState, b []byte) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber {
			return false
		}
		b = b[n:]
		if (num == 1 || num == 2) && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return false
			}
			if num == 1 {
				s.secs = int64(v)
			} else {
				s.nanos = int32(v)
			}
			b = b[n:]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return false
		}
		b = b[n:]
	}
	return true
}

// value is the field's member of the tree (protoValue's types; an absent
// proto3 scalar is its zero value), but for a string (tree's).
func (f *planField) value(s *planState) any {
	switch f.kind {
	case protoreflect.BoolKind:
		return protowire.DecodeBool(s.u)
	case protoreflect.Int32Kind, protoreflect.Sfixed32Kind:
		return int32(s.u)
	case protoreflect.Sint32Kind:
		return int32(protowire.DecodeZigZag(s.u & math.MaxUint32))
	case protoreflect.Int64Kind, protoreflect.Sfixed64Kind:
		return int64(s.u)
	case protoreflect.Sint64Kind:
		return protowire.DecodeZigZag(s.u)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return uint32(s.u)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return s.u
	case protoreflect.FloatKind:
		return float64(math.Float32frombits(uint32(s.u)))
	case protoreflect.DoubleKind:
		return math.Float64frombits(s.u)
	case protoreflect.BytesKind:
		if !s.seen {
			return []byte(nil)
		}
		return append([]byte{}, s.b...)
	}
	// A Timestamp (seen: the caller leaves out one that is not).
	return time.Unix(s.secs, int64(s.nanos)).UTC()
}
