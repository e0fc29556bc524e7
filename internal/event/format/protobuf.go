package format

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/billing/ledger/internal/event"
)

// maxMessageIndexes bounds the message indexes of a Protobuf record's
// header (the nesting of the message type in its file).
const maxMessageIndexes = 16

// protoBody decodes Protobuf records of one schema: the message indexes
// after the schema id pick the message type in the schema's file (the
// Confluent wire format), the body is decoded with dynamicpb under
// descriptors compiled from the registry's schema text and its
// references. The tree has each field by its name (and by its JSON name
// where that differs), a message google.protobuf.Timestamp as a
// time.Time, wrapper types as their value, enums by their value names.
type protoBody struct {
	file protoreflect.FileDescriptor
	// unmarshal: AllowPartial when no message the file can hold has a
	// required field (proto3's never do): the check then finds nothing
	// and only costs allocations.
	unmarshal proto.UnmarshalOptions
	// msgs keeps emptied messages of each type (MessageDescriptor ->
	// *sync.Pool of *dynamicpb.Message) for the next records: a new one
	// costs its allocations per record.
	msgs sync.Map
	// keys are the member names of the mapping's paths (decodeKeyed).
	keys map[string]bool
	// plans holds, per message type (MessageDescriptor), its *protoPlan:
	// how to read its records without dynamicpb (nil: not possible).
	plans sync.Map
}

const protoMainFile = "registry-schema.proto"

// compileProto compiles schemas whose records the tree of keys is read
// from (decodeKeyed).
func compileProto(keys map[string]bool) func(context.Context, *sr.Client, sr.Schema) (bodyDecoder, error) {
	return func(ctx context.Context, cl *sr.Client, s sr.Schema) (bodyDecoder, error) {
		body, err := compileProtoBody(ctx, cl, s)
		if err != nil {
			return nil, err
		}
		body.keys = keys
		return body, nil
	}
}

func compileProtoBody(ctx context.Context, cl *sr.Client, s sr.Schema) (*protoBody, error) {
	if s.Type != sr.TypeProtobuf {
		return nil, &event.DecodeError{Reason: event.ReasonUnknownSchema, Detail: fmt.Sprintf("the schema is %s, not PROTOBUF (EVENT_FORMAT=protobuf)", s.Type)}
	}
	srcs := map[string]string{}
	err := refs(ctx, cl, s, map[string]bool{}, 0, func(ref sr.SchemaReference, rs sr.Schema) error {
		srcs[ref.Name] = rs.Schema
		return nil
	})
	if err != nil {
		return nil, err
	}
	if _, taken := srcs[protoMainFile]; taken {
		return nil, fmt.Errorf("a reference is named %s", protoMainFile)
	}
	srcs[protoMainFile] = s.Schema
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(srcs)})}
	files, err := c.Compile(ctx, protoMainFile)
	if err != nil {
		return nil, err
	}
	// Merge: decoded into an emptied message (newMessage), which a reset
	// would only allocate again.
	opts := proto.UnmarshalOptions{RecursionLimit: event.MaxTreeDepth, Merge: true}
	opts.AllowPartial = !protoRequired(files[0].Messages(), map[protoreflect.FullName]bool{})
	return &protoBody{file: files[0], unmarshal: opts}, nil
}

// protoRequired reports whether a message of msgs, a message nested in
// one, or a message type of one's fields has a required field (each
// message visited once: a recursive type ends).
func protoRequired(msgs protoreflect.MessageDescriptors, seen map[protoreflect.FullName]bool) bool {
	for i := range msgs.Len() {
		if messageRequired(msgs.Get(i), seen) {
			return true
		}
	}
	return false
}

func messageRequired(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) bool {
	if seen[md.FullName()] {
		return false
	}
	seen[md.FullName()] = true
	if md.RequiredNumbers().Len() > 0 || protoRequired(md.Messages(), seen) {
		return true
	}
	fields := md.Fields()
	for j := range fields.Len() {
		fd := fields.Get(j)
		if fd.Cardinality() == protoreflect.Required {
			return true
		}
		if sub := fd.Message(); sub != nil && messageRequired(sub, seen) {
			return true
		}
	}
	return false
}

func (p *protoBody) decode(b []byte) (any, error) { return p.decodeKeys(b, nil) }

// decodeKeyed is decodeKeys with the mapping's keys: straight from the
// wire when the message type has a plan and the record is plain (see
// protoPlan), with dynamicpb otherwise.
func (p *protoBody) decodeKeyed(b []byte, into map[string]any) (any, error) {
	md, rest, err := p.header(b)
	if err != nil {
		return nil, err
	}
	if pl := p.plan(md); pl != nil {
		if tree, ok := pl.tree(rest, into); ok {
			return tree, nil
		}
	}
	return p.decodeKeys(b, p.keys)
}

// plan returns the plan of message type md for the body's keys (nil:
// records of md are decoded with dynamicpb).
func (p *protoBody) plan(md protoreflect.MessageDescriptor) *protoPlan {
	if v, ok := p.plans.Load(md); ok {
		return v.(*protoPlan)
	}
	v, _ := p.plans.LoadOrStore(md, newProtoPlan(md, p.keys))
	return v.(*protoPlan)
}

// decodeKeys decodes a record into the tree restricted to the member
// names in keys (nil: every member), at every level: a mapping whose
// paths only use those names reads the same values from it as from the
// whole tree, and the fields it leaves out are not converted, only checked
// as the whole tree's building checks them (the same errors, in the same
// order).
func (p *protoBody) decodeKeys(b []byte, keys map[string]bool) (any, error) {
	md, rest, err := p.header(b)
	if err != nil {
		return nil, err
	}
	pool := p.pool(md)
	msg, _ := pool.Get().(*dynamicpb.Message)
	if msg == nil {
		msg = dynamicpb.NewMessage(md)
	}
	// The tree shares nothing with msg (strings and bytes are the
	// decoder's own copies), so msg is emptied and kept for the next.
	defer func() {
		msg.Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
			msg.Clear(fd)
			return true
		})
		msg.SetUnknown(nil)
		pool.Put(msg)
	}()
	if err := p.unmarshal.Unmarshal(rest, msg); err != nil {
		return nil, &event.DecodeError{Reason: event.ReasonInvalidEncoding, Detail: "protobuf: " + trim(err.Error())}
	}
	return protoTree(msg, 0, keys)
}

// pool returns the pool of emptied messages of type md.
func (p *protoBody) pool(md protoreflect.MessageDescriptor) *sync.Pool {
	if v, ok := p.msgs.Load(md); ok {
		return v.(*sync.Pool)
	}
	v, _ := p.msgs.LoadOrStore(md, &sync.Pool{})
	return v.(*sync.Pool)
}

// header reads the message indexes and returns the message type they
// pick and the body after them.
func (p *protoBody) header(b []byte) (protoreflect.MessageDescriptor, []byte, error) {
	if len(b) > 0 && b[0] == 0 && p.file.Messages().Len() > 0 {
		// The shortcut for the indexes [0], what most producers write:
		// read without allocating them.
		return p.file.Messages().Get(0), b[1:], nil
	}
	var h sr.ConfluentHeader
	index, rest, err := h.DecodeIndex(b, maxMessageIndexes)
	if err != nil {
		return nil, nil, &event.DecodeError{Reason: event.ReasonInvalidEncoding, Detail: "protobuf: message indexes: " + err.Error()}
	}
	md, err := p.message(index)
	return md, rest, err
}

// message resolves the message indexes: the first picks a top-level
// message of the file, each next one a message nested in the previous.
func (p *protoBody) message(index []int) (protoreflect.MessageDescriptor, error) {
	msgs := p.file.Messages()
	var md protoreflect.MessageDescriptor
	for _, i := range index {
		if i < 0 || i >= msgs.Len() {
			return nil, &event.DecodeError{Reason: event.ReasonInvalidEncoding,
				Detail: fmt.Sprintf("protobuf: message indexes %v out of range of the schema's messages", index)}
		}
		md = msgs.Get(i)
		msgs = md.Messages()
	}
	if md == nil {
		return nil, &event.DecodeError{Reason: event.ReasonInvalidEncoding, Detail: "protobuf: no message index"}
	}
	return md, nil
}

func protoTree(m protoreflect.Message, depth int, keys map[string]bool) (any, error) {
	if depth > event.MaxTreeDepth {
		return nil, &event.DecodeError{Reason: event.ReasonInvalidEncoding, Detail: fmt.Sprintf("protobuf: nesting deeper than %d levels", event.MaxTreeDepth)}
	}
	md := m.Descriptor()
	switch md.FullName() {
	case "google.protobuf.Timestamp":
		fs := md.Fields()
		secs, nanos := m.Get(fs.ByName("seconds")).Int(), m.Get(fs.ByName("nanos")).Int()
		if nanos < 0 || nanos > 999999999 {
			return nil, &event.DecodeError{Reason: event.ReasonInvalidEncoding, Detail: fmt.Sprintf("protobuf: Timestamp nanos %d out of range", nanos)}
		}
		return time.Unix(secs, nanos).UTC(), nil
	case "google.protobuf.StringValue", "google.protobuf.Int64Value", "google.protobuf.Int32Value",
		"google.protobuf.UInt64Value", "google.protobuf.UInt32Value", "google.protobuf.BoolValue", "google.protobuf.BytesValue":
		fd := md.Fields().ByName("value")
		return protoValue(fd, m.Get(fd), depth, keys)
	}
	fields := md.Fields()
	size := 2 * fields.Len() // names and JSON names
	if keys != nil {
		size = min(size, len(keys))
	}
	out := make(map[string]any, size)
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.HasPresence() && !m.Has(fd) {
			continue
		}
		name, json := string(fd.Name()), fd.JSONName()
		if keys != nil && !keys[name] && !keys[json] {
			if err := protoCheck(fd, m.Get(fd), depth); err != nil {
				return nil, err
			}
			continue
		}
		var v any
		var err error
		switch {
		case fd.IsList():
			l := m.Get(fd).List()
			items := make([]any, l.Len())
			for j := range l.Len() {
				if items[j], err = protoValue(fd, l.Get(j), depth, keys); err != nil {
					return nil, err
				}
			}
			v = items
		case fd.IsMap():
			mm := map[string]any{}
			m.Get(fd).Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				var e error
				mm[k.String()], e = protoValue(fd.MapValue(), mv, depth, keys)
				err = errors.Join(err, e)
				return err == nil
			})
			v = mm
		default:
			v, err = protoValue(fd, m.Get(fd), depth, keys)
		}
		if err != nil {
			return nil, err
		}
		if keys == nil || keys[name] {
			out[name] = v
		}
		if json != name && (keys == nil || keys[json]) {
			if _, taken := out[json]; !taken {
				out[json] = v
			}
		}
	}
	return out, nil
}

// protoCheck returns the error that building the tree of field fd's value
// v would return, without building it.
func protoCheck(fd protoreflect.FieldDescriptor, v protoreflect.Value, depth int) error {
	switch {
	case fd.IsList():
		if k := fd.Kind(); k != protoreflect.MessageKind && k != protoreflect.GroupKind {
			return nil
		}
		l := v.List()
		for j := range l.Len() {
			if err := protoCheckMessage(l.Get(j).Message(), depth+1); err != nil {
				return err
			}
		}
	case fd.IsMap():
		if k := fd.MapValue().Kind(); k != protoreflect.MessageKind && k != protoreflect.GroupKind {
			return nil
		}
		var err error
		v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
			err = errors.Join(err, protoCheckMessage(mv.Message(), depth+1))
			return err == nil
		})
		return err
	default:
		if k := fd.Kind(); k == protoreflect.MessageKind || k == protoreflect.GroupKind {
			return protoCheckMessage(v.Message(), depth+1)
		}
	}
	return nil
}

// protoCheckMessage is protoCheck of a message value (protoTree's checks).
func protoCheckMessage(m protoreflect.Message, depth int) error {
	if depth > event.MaxTreeDepth {
		return &event.DecodeError{Reason: event.ReasonInvalidEncoding, Detail: fmt.Sprintf("protobuf: nesting deeper than %d levels", event.MaxTreeDepth)}
	}
	md := m.Descriptor()
	switch md.FullName() {
	case "google.protobuf.Timestamp":
		if nanos := m.Get(md.Fields().ByName("nanos")).Int(); nanos < 0 || nanos > 999999999 {
			return &event.DecodeError{Reason: event.ReasonInvalidEncoding, Detail: fmt.Sprintf("protobuf: Timestamp nanos %d out of range", nanos)}
		}
		return nil
	case "google.protobuf.StringValue", "google.protobuf.Int64Value", "google.protobuf.Int32Value",
		"google.protobuf.UInt64Value", "google.protobuf.UInt32Value", "google.protobuf.BoolValue", "google.protobuf.BytesValue":
		return nil // a scalar value
	}
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.HasPresence() && !m.Has(fd) {
			continue
		}
		if err := protoCheck(fd, m.Get(fd), depth); err != nil {
			return err
		}
	}
	return nil
}

func protoValue(fd protoreflect.FieldDescriptor, v protoreflect.Value, depth int, keys map[string]bool) (any, error) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return v.Bool(), nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return int32(v.Int()), nil
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return v.Int(), nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return uint32(v.Uint()), nil
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return v.Uint(), nil
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return v.Float(), nil
	case protoreflect.StringKind:
		return v.String(), nil
	case protoreflect.BytesKind:
		return v.Bytes(), nil
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return string(ev.Name()), nil
		}
		return int32(v.Enum()), nil
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return protoTree(v.Message(), depth+1, keys)
	}
	return nil, nil
}
