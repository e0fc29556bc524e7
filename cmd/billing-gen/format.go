package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
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
	ce     string // -cloudevents: "", structured or binary
	id     int
	dec    *event.Decoder
	avro   avro.Schema
	proto  protoreflect.MessageDescriptor
}

// newEncoder registers the format's schema under subject (the registry
// returns the existing id for a schema it holds).
// maxPayload is the service's: a larger value is sent as it is.
func newEncoder(ctx context.Context, f, ce, registryURL, subject string, maxPayload int) (*encoder, error) {
	e := &encoder{format: f, ce: ce, dec: event.NewDecoder(maxPayload)}
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

// CloudEvents of -cloudevents: the source and type of every event (its id
// is the event id, so the ledger's event id is "billing-gen <id>").
const (
	ceSource = "billing-gen"
	ceType   = "billing.event"
)

// record returns the Kafka value and headers of value: encoded in the
// format, then, with -cloudevents, made a CloudEvent in its mode. A
// malformed value is sent as it is, without headers.
func (e *encoder) record(value []byte) ([]byte, []kgo.RecordHeader, error) {
	body, err := e.encode(value)
	if err != nil || e.ce == "" {
		return body, nil, err
	}
	ev, derr := e.dec.Decode(value)
	if derr != nil {
		return value, nil, nil
	}
	if e.ce == "binary" {
		return body, []kgo.RecordHeader{
			{Key: "ce_specversion", Value: []byte("1.0")}, {Key: "ce_id", Value: []byte(ev.EventID)},
			{Key: "ce_source", Value: []byte(ceSource)}, {Key: "ce_type", Value: []byte(ceType)},
		}, nil
	}
	env := map[string]any{"specversion": "1.0", "id": ev.EventID, "source": ceSource, "type": ceType}
	if e.format == format.JSON {
		env["data"] = json.RawMessage(body)
	} else {
		env["data_base64"] = base64.StdEncoding.EncodeToString(body)
	}
	b, err := json.Marshal(env)
	return b, []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json")}}, err
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
// in format f (with -cloudevents ce): the empty and the too-large record
// are refused for their size first; with CloudEvents every other kind has
// no CloudEvent's headers, and in the registry formats no magic byte.
func malformedReason(f, ce string, k ledgercheck.MalformedKind) string {
	switch {
	case k == ledgercheck.MalformedEmptyPayload || k == ledgercheck.MalformedPayloadTooLarge:
		return k.Reason()
	case ce != "":
		return string(event.ReasonInvalidCloudEvent)
	case format.NeedsRegistry(f):
		return string(event.ReasonInvalidEncoding)
	}
	return k.Reason()
}
