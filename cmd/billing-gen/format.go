package main

import (
	"context"
	"fmt"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/ledgercheck"
)

// encoder turns the generator's JSON record values into -format: a value
// that is a valid event of the JSON contract is written in the format (the
// Confluent wire format with the registered schema's id); any other value
// (the malformed kinds) is sent as it is, which the service dead-letters
// as invalid_encoding (no magic byte), or as before when it is empty or
// too large (malformedReason).
type encoder struct {
	format string
	id     int
	dec    *event.Decoder
	avro   avro.Schema
	proto  protoreflect.MessageDescriptor
}

// newEncoder registers the format's schema under subject (the registry
// returns the existing id for a schema it holds).
// maxPayload is the service's: a larger value is sent as it is.
func newEncoder(ctx context.Context, f, registryURL, subject string, maxPayload int) (*encoder, error) {
	e := &encoder{format: f, dec: event.NewDecoder(maxPayload)}
	if !format.NeedsRegistry(f) {
		if f != format.JSON {
			return nil, fmt.Errorf("-format: unknown format %q", f)
		}
		return e, nil
	}
	if registryURL == "" {
		return nil, fmt.Errorf("-format %s needs -schema-registry", f)
	}
	cl, err := sr.NewClient(sr.URLs(registryURL))
	if err != nil {
		return nil, err
	}
	// The contract's schema of the format, the one the docs show.
	text, file, err := format.ContractSchema(f)
	if err != nil {
		return nil, err
	}
	s := sr.Schema{Schema: text, Type: sr.TypeAvro}
	switch f {
	case format.Avro:
		if e.avro, err = avro.Parse(text); err != nil {
			return nil, err
		}
	case format.Protobuf:
		s.Type = sr.TypeProtobuf
		c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{file: text})})}
		files, err := c.Compile(ctx, file)
		if err != nil {
			return nil, err
		}
		e.proto = files[0].Messages().ByName("Event")
	case format.JSONSchema:
		s.Type = sr.TypeJSON
	}
	ss, err := cl.CreateSchema(ctx, subject, s)
	if err != nil {
		return nil, fmt.Errorf("registering the %s schema under %s: %w", f, subject, err)
	}
	e.id = ss.ID
	return e, nil
}

// encode returns value in the encoder's format.
func (e *encoder) encode(value []byte) ([]byte, error) {
	if e.format == format.JSON {
		return value, nil
	}
	ev, err := e.dec.Decode(value)
	if err != nil {
		return value, nil // malformed: sent as it is
	}
	var h sr.ConfluentHeader
	var index []int
	if e.format == format.Protobuf {
		index = []int{0}
	}
	b, _ := h.AppendEncode(nil, e.id, index)
	switch e.format {
	case format.Avro:
		body, err := avro.Marshal(e.avro, map[string]any{"event_id": ev.EventID, "account_id": ev.AccountID,
			"amount_minor": ev.AmountMinor, "currency": ev.Currency, "occurred_at": ev.OccurredAt})
		if err != nil {
			return nil, err
		}
		return append(b, body...), nil
	case format.Protobuf:
		m := dynamicpb.NewMessage(e.proto)
		f := e.proto.Fields()
		m.Set(f.ByName("event_id"), protoreflect.ValueOfString(ev.EventID))
		m.Set(f.ByName("account_id"), protoreflect.ValueOfString(ev.AccountID))
		m.Set(f.ByName("amount_minor"), protoreflect.ValueOfInt64(ev.AmountMinor))
		m.Set(f.ByName("currency"), protoreflect.ValueOfString(ev.Currency))
		ts := m.Mutable(f.ByName("occurred_at")).Message()
		tf := ts.Descriptor().Fields()
		ts.Set(tf.ByName("seconds"), protoreflect.ValueOfInt64(ev.OccurredAt.Unix()))
		ts.Set(tf.ByName("nanos"), protoreflect.ValueOfInt32(int32(ev.OccurredAt.Nanosecond())))
		return proto.MarshalOptions{}.MarshalAppend(b, m)
	default: // json-schema: the JSON document itself
		return append(b, value...), nil
	}
}

// malformedReason is the dead letter a malformed record of kind k becomes
// in format f: in the registry formats every kind but the empty and the
// too-large record lacks the wire format's magic byte.
func malformedReason(f string, k ledgercheck.MalformedKind) string {
	if !format.NeedsRegistry(f) || k == ledgercheck.MalformedEmptyPayload || k == ledgercheck.MalformedPayloadTooLarge {
		return k.Reason()
	}
	return string(event.ReasonInvalidEncoding)
}
