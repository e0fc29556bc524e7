package format

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/billing/ledger/internal/event"
)

// Encoder writes what a producer of a format writes: it turns record
// values of the JSON contract into the format (billing-gen's -format, the
// chaos suite's own records). A value that is a valid event of the JSON
// contract, or a version of one (revision, cancelled), is written in the format (the
// Confluent wire format with the registered schema's id); any other value
// (the malformed kinds) is sent as it is, which the service dead-letters
// as invalid_encoding (no magic byte), or as before when it is empty or
// too large (malformedReason).
type Encoder struct {
	format string
	ce     string // -cloudevents: "", structured or binary
	id     int
	dec    *event.Decoder
	avro   avro.Schema
	proto  protoreflect.MessageDescriptor
}

// NewEncoder registers format f's contract schema under subject (the
// registry returns the existing id for a schema it holds); ce is "",
// "structured" or "binary" (CloudEvents). maxPayload is the service's: a
// larger value is sent as it is.
func NewEncoder(ctx context.Context, f, ce, registryURL, subject string, maxPayload int) (*Encoder, error) {
	e, s, err := newEncoder(ctx, f, ce, maxPayload)
	if err != nil || !NeedsRegistry(f) {
		return e, err
	}
	if registryURL == "" {
		return nil, fmt.Errorf("format %s needs a schema registry", f)
	}
	cl, err := sr.NewClient(sr.URLs(registryURL))
	if err != nil {
		return nil, err
	}
	ss, err := cl.CreateSchema(ctx, subject, s)
	if err != nil {
		return nil, fmt.Errorf("registering the %s schema under %s: %w", f, subject, err)
	}
	e.id = ss.ID
	return e, nil
}

// newEncoder returns an Encoder of format f's contract schema and the
// schema to register (NeedsRegistry), whose id it still needs.
func newEncoder(ctx context.Context, f, ce string, maxPayload int) (*Encoder, sr.Schema, error) {
	e := &Encoder{format: f, ce: ce, dec: event.NewDecoder(maxPayload)}
	if !NeedsRegistry(f) {
		if f != JSON {
			return nil, sr.Schema{}, fmt.Errorf("unknown format %q", f)
		}
		return e, sr.Schema{}, nil
	}
	// The contract's schema of the format, the one the docs show.
	text, file, err := ContractSchema(f)
	if err != nil {
		return nil, sr.Schema{}, err
	}
	s := sr.Schema{Schema: text, Type: sr.TypeAvro}
	switch f {
	case Avro:
		if e.avro, err = avro.Parse(text); err != nil {
			return nil, sr.Schema{}, err
		}
	case Protobuf:
		s.Type = sr.TypeProtobuf
		c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{file: text})})}
		files, err := c.Compile(ctx, file)
		if err != nil {
			return nil, sr.Schema{}, err
		}
		e.proto = files[0].Messages().ByName("Event")
	case JSONSchema:
		s.Type = sr.TypeJSON
	}
	return e, s, nil
}

// The source and type of every CloudEvent an Encoder writes (its id is the
// event id, so the ledger's event id is "billing-gen <id>").
const (
	EncoderCloudEventSource = "billing-gen"
	EncoderCloudEventType   = "billing.event"
)

// Record returns the Kafka value and headers of value: encoded in the
// format, then, with -cloudevents, made a CloudEvent in its mode. A
// malformed value is sent as it is, without headers.
func (e *Encoder) Record(value []byte) ([]byte, []kgo.RecordHeader, error) {
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
			{Key: "ce_source", Value: []byte(EncoderCloudEventSource)}, {Key: "ce_type", Value: []byte(EncoderCloudEventType)},
		}, nil
	}
	env := map[string]any{"specversion": "1.0", "id": ev.EventID, "source": EncoderCloudEventSource, "type": EncoderCloudEventType}
	if e.format == JSON {
		env["data"] = json.RawMessage(body)
	} else {
		env["data_base64"] = base64.StdEncoding.EncodeToString(body)
	}
	b, err := json.Marshal(env)
	return b, []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json")}}, err
}

// encode returns value in the encoder's format.
func (e *Encoder) encode(value []byte) ([]byte, error) {
	if e.format == JSON {
		return value, nil
	}
	ev, err := e.dec.Decode(value)
	if err != nil {
		return value, nil // malformed: sent as it is
	}
	var h sr.ConfluentHeader
	var index []int
	if e.format == Protobuf {
		index = []int{0}
	}
	b, _ := h.AppendEncode(nil, e.id, index)
	switch e.format {
	case Avro:
		at := ev.OccurredAt
		if ev.Cancelled {
			at = time.Unix(0, 0) // a tombstone's content is not read; the schema wants a value
		}
		body, err := avro.Marshal(e.avro, map[string]any{"event_id": ev.EventID, "account_id": ev.AccountID,
			"amount_minor": ev.AmountMinor, "currency": ev.Currency, "occurred_at": at,
			"revision": ev.Revision, "cancelled": ev.Cancelled})
		if err != nil {
			return nil, err
		}
		return append(b, body...), nil
	case Protobuf:
		m := dynamicpb.NewMessage(e.proto)
		f := e.proto.Fields()
		m.Set(f.ByName("event_id"), protoreflect.ValueOfString(ev.EventID))
		m.Set(f.ByName("revision"), protoreflect.ValueOfInt64(ev.Revision))
		if ev.Cancelled { // a tombstone: no content
			m.Set(f.ByName("cancelled"), protoreflect.ValueOfBool(true))
			return proto.MarshalOptions{}.MarshalAppend(b, m)
		}
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
