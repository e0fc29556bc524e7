package format

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/billing/ledger/internal/event"
)

// Formats are the values of EVENT_FORMAT.
const (
	JSON       = "json"
	Avro       = "avro"        // Confluent wire format, the schema from the registry
	Protobuf   = "protobuf"    // Confluent wire format with message indexes
	JSONSchema = "json-schema" // Confluent wire format, a JSON document
)

// Formats returns the supported record formats.
func Formats() []string { return []string{JSON, Avro, Protobuf, JSONSchema} }

// NeedsRegistry reports whether records of format f name their schema in
// the schema registry (the Confluent wire format).
func NeedsRegistry(f string) bool { return f == Avro || f == Protobuf || f == JSONSchema }

// ErrSkipped is returned for a CloudEvent whose type the filter excludes:
// the record is passed over (counted as skipped), neither an event nor a
// dead letter.
var ErrSkipped = errors.New("format: CloudEvent of a type not selected")

// Options configure a Decoder.
type Options struct {
	// Format is the format of record values (of a CloudEvent's data in
	// binary mode): one of Formats; empty means JSON.
	Format string
	// Mapping says where the five values are in the decoded record; with
	// CloudEvents the record is the event's envelope (its attributes and
	// data), and fields the mapping does not name are read from below
	// data. The zero value means event.DefaultMapping.
	Mapping *event.Mapping
	// MaxPayload bounds a record value (event.DefaultMaxPayload if not
	// positive).
	MaxPayload int
	// CloudEvents: records are CloudEvents (Kafka protocol binding); the
	// event id is the event's source and id joined by a space.
	CloudEvents bool
	// CloudEventTypes, if not empty, are the CloudEvent types counted;
	// others are skipped (ErrSkipped).
	CloudEventTypes []string
	// Registry is the schema registry of the formats that need one
	// (NeedsRegistry).
	Registry RegistryOptions
}

// Decoder decodes records. It is safe for concurrent use.
type Decoder struct {
	fast    *event.Decoder // today's JSON contract: no mapping, no envelope
	mapping event.Mapping
	limit   int
	// body decodes a record value (of a CloudEvent's data) into its
	// tree; a keyedDecoder may build it in into (empty, nil for none),
	// which the caller empties and reuses once the mapping has read it.
	body  func(ctx context.Context, value []byte, into map[string]any) (any, error)
	trees sync.Pool // maps for into, with a registry format
	ce    bool
	types map[string]struct{}
	reg   *registry // nil: the format needs none
	// keys are the member names the mapping's paths use: a decoder that
	// can (keyedDecoder) builds only the part of the tree they reach.
	keys map[string]bool
}

// keyedDecoder decodes the bytes after the wire-format header into the
// tree, or only the part of it that the member names its schema was
// compiled for (the Decoder's keys) reach at every level, with the errors
// of the whole tree's decoding: a mapping whose paths only use those names
// reads the same values from it as from the whole tree. It may build the
// tree's root in into (empty; nil: none), saving a map per record.
type keyedDecoder interface {
	decodeKeyed(b []byte, into map[string]any) (any, error)
}

// tree returns an empty map for a body to build a tree in (nil without a
// registry format, whose bodies build none in it).
func (d *Decoder) tree() map[string]any {
	if d.reg == nil {
		return nil
	}
	if m, ok := d.trees.Get().(map[string]any); ok {
		return m
	}
	return make(map[string]any, len(d.keys))
}

// release empties a map of tree for the next record: the mapping has
// read the tree, and neither the event nor an error refers to the map.
func (d *Decoder) release(m map[string]any) {
	if m != nil {
		clear(m)
		d.trees.Put(m)
	}
}

// New returns a Decoder for opts.
func New(opts Options) (*Decoder, error) {
	d := &Decoder{limit: opts.MaxPayload, ce: opts.CloudEvents}
	if d.limit <= 0 {
		d.limit = event.DefaultMaxPayload
	}
	d.mapping = event.DefaultMapping()
	if opts.Mapping != nil {
		d.mapping = *opts.Mapping
	}
	if d.ce {
		if d.mapping.Named("event_id") {
			return nil, errors.New("format: with CloudEvents the event id is the event's source and id; the mapping cannot name event_id")
		}
		d.mapping = d.mapping.Under("data")
		if len(opts.CloudEventTypes) > 0 {
			d.types = map[string]struct{}{}
			for _, t := range opts.CloudEventTypes {
				d.types[t] = struct{}{}
			}
		}
	} else if len(opts.CloudEventTypes) > 0 {
		return nil, errors.New("format: a CloudEvent type filter needs CloudEvents")
	}
	d.keys = map[string]bool{}
	for _, f := range event.FieldNames() {
		for _, seg := range strings.Split(d.mapping.Path(f), ".") {
			d.keys[seg] = true
		}
	}
	switch opts.Format {
	case "", JSON:
		d.body = jsonTree
	case Avro, Protobuf, JSONSchema:
		var compile func(context.Context, *sr.Client, sr.Schema) (bodyDecoder, error)
		switch opts.Format {
		case Avro:
			compile = compileAvro(d.limit, d.keys)
		case Protobuf:
			compile = compileProto(d.keys)
		default:
			compile = compileJSONSchema(d.keys)
		}
		reg, err := newRegistry(opts.Registry, compile)
		if err != nil {
			return nil, err
		}
		d.reg, d.body = reg, d.registryBody
	default:
		return nil, fmt.Errorf("format: unknown format %q (one of %s)", opts.Format, strings.Join(Formats(), ", "))
	}
	if (opts.Format == "" || opts.Format == JSON) && !d.ce && d.mapping.IsDefault() {
		d.fast = event.NewDecoder(d.limit)
	}
	return d, nil
}

// Fast reports whether d is the JSON contract's own decoder
// (event.Decoder): JSON, the default mapping, no envelope.
func (d *Decoder) Fast() bool { return d.fast != nil }

// registryBody decodes a value in the Confluent wire format: magic byte 0,
// the schema id (4 bytes, big-endian), the body in the schema's format.
func (d *Decoder) registryBody(ctx context.Context, value []byte, into map[string]any) (any, error) {
	return d.registryTree(ctx, value, true, into)
}

// registryTree is registryBody's tree, restricted to the mapping's keys
// where the schema's decoder can (keyed), or the whole tree.
func (d *Decoder) registryTree(ctx context.Context, value []byte, keyed bool, into map[string]any) (any, error) {
	id, rest, err := wireID(value)
	if err != nil {
		return nil, err
	}
	body, err := d.reg.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	if k, ok := body.(keyedDecoder); ok && keyed {
		return k.decodeKeyed(rest, into)
	}
	return body.decode(rest)
}

func wireID(value []byte) (int, []byte, error) {
	var h sr.ConfluentHeader
	id, rest, err := h.DecodeID(value)
	if err != nil {
		detail := "not in the Confluent wire format: "
		if len(value) < 5 {
			detail += fmt.Sprintf("%d bytes, shorter than the 5-byte header", len(value))
		} else {
			detail += fmt.Sprintf("first byte 0x%02x is not the magic byte 0x00", value[0])
		}
		return 0, nil, &event.DecodeError{Reason: event.ReasonInvalidEncoding, Detail: detail}
	}
	return id, rest, nil
}

// Prepare makes sure that the schemas the records name are compiled, so
// that decoding them needs no I/O; it fetches the missing ones from the
// registry. It returns an *UnavailableError while the registry does not
// answer: the caller waits and calls it again, and decodes the records
// only once it returns nil (a schema id the registry does not hold is no
// error here: its record becomes a dead letter when decoded). Without a
// registry it does nothing.
func (d *Decoder) Prepare(ctx context.Context, recs []*kgo.Record) error {
	if d.reg == nil {
		return nil
	}
	d.reg.begin()
	last := -1 // the id of the record before, resolved: a poll's records mostly share one
	for _, r := range recs {
		if len(r.Value) == 0 || len(r.Value) > d.limit || r.Attrs.IsControl() {
			continue
		}
		id, _, err := wireID(r.Value)
		if err != nil || id == last {
			continue // in structured CloudEvents, or junk: decoded (or refused) later
		}
		if _, err := d.reg.lookup(ctx, id); err != nil && IsUnavailable(err) {
			return err
		}
		last = id
	}
	return nil
}

// Render decodes a record value of a registry format (the Confluent wire
// format) into JSON for a person to read: its schema id and the decoded
// record, whatever the mapping makes of it. ok is false for a value not
// in the wire format, or without a registry format; err says why the
// record (known to be in the wire format) does not decode.
func (d *Decoder) Render(ctx context.Context, value []byte) (schemaID int, doc []byte, ok bool, err error) {
	if d.reg == nil {
		return 0, nil, false, nil
	}
	id, _, werr := wireID(value)
	if werr != nil {
		return 0, nil, false, nil
	}
	tree, err := d.registryTree(ctx, value, false, nil)
	if err != nil {
		return id, nil, true, err
	}
	doc, err = json.MarshalIndent(readable(tree), "", "  ")
	return id, doc, true, err
}

// readable replaces decimals (*big.Rat, which JSON would show as a
// fraction) by their exact decimal text, and bytes by their hex, in place.
func readable(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = readable(e)
		}
	case []any:
		for i, e := range x {
			x[i] = readable(e)
		}
	case *big.Rat:
		// A decimal's denominator divides a power of ten: find the
		// digits that show it exactly (a fraction otherwise).
		for digits := 0; digits <= 64; digits++ {
			if new(big.Rat).Mul(x, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(digits)), nil))).IsInt() {
				return x.FloatString(digits)
			}
		}
		return x.String()
	case []byte:
		return hex.EncodeToString(x)
	}
	return v
}

func jsonTree(_ context.Context, value []byte, _ map[string]any) (any, error) {
	tree, err := event.ParseJSON(value)
	if err != nil {
		return nil, err
	}
	return tree, nil
}

// Decode decodes one record: its value and, for CloudEvents, its headers.
// Errors: *event.DecodeError for a record that is no valid event (a dead
// letter), ErrSkipped for a CloudEvent the type filter passes over.
func (d *Decoder) Decode(ctx context.Context, value []byte, headers []kgo.RecordHeader) (event.Event, error) {
	if d.fast != nil {
		return d.fast.Decode(value)
	}
	if err := d.checkSize(value); err != nil {
		return event.Event{}, err
	}
	if d.ce {
		return d.cloudEvent(ctx, value, headers)
	}
	into := d.tree()
	defer d.release(into)
	tree, err := d.body(ctx, value, into)
	if err != nil {
		return event.Event{}, err
	}
	return d.mapping.Event(tree, "")
}

func (d *Decoder) checkSize(value []byte) error {
	if len(value) == 0 {
		return &event.DecodeError{Reason: event.ReasonEmptyPayload, Detail: "record value is empty"}
	}
	if len(value) > d.limit {
		return &event.DecodeError{Reason: event.ReasonPayloadTooLarge,
			Detail: fmt.Sprintf("record value is %d bytes, max %d", len(value), d.limit)}
	}
	return nil
}

func badCE(format string, args ...any) error {
	return &event.DecodeError{Reason: event.ReasonInvalidCloudEvent, Detail: "cloudevent: " + fmt.Sprintf(format, args...)}
}

// The CloudEvents Kafka protocol binding: a record with a content-type
// header of application/cloudevents(+format) is in structured mode, one
// with a ce_specversion header in binary mode.
const (
	headerContentType = "content-type"
	headerPrefix      = "ce_"
	structuredPrefix  = "application/cloudevents"
)

func (d *Decoder) cloudEvent(ctx context.Context, value []byte, headers []kgo.RecordHeader) (event.Event, error) {
	var contentType string
	binary := false
	for _, h := range headers {
		switch k := strings.ToLower(h.Key); {
		case k == headerContentType:
			contentType = string(h.Value)
		case k == headerPrefix+"specversion":
			binary = true
		}
	}
	if ct := strings.ToLower(strings.TrimSpace(contentType)); strings.HasPrefix(ct, structuredPrefix) {
		media, _, _ := strings.Cut(ct, ";")
		if strings.TrimSpace(media) != structuredPrefix+"+json" {
			return event.Event{}, badCE("structured mode in %q: only application/cloudevents+json is read", contentType)
		}
		return d.structured(ctx, value)
	}
	if binary {
		return d.binary(ctx, value, headers)
	}
	return event.Event{}, badCE("neither structured mode (content-type application/cloudevents+json) nor binary mode (a ce_specversion header)")
}

// envelope checks the required attributes and the type filter, and
// returns the event id the ledger deduplicates on.
func (d *Decoder) envelope(env map[string]any) (string, error) {
	attr := func(name string) (string, error) {
		v, ok := env[name]
		if !ok {
			return "", badCE("required attribute %s is missing", name)
		}
		s, ok := v.(string)
		if !ok || s == "" {
			return "", badCE("attribute %s must be a non-empty string", name)
		}
		return s, nil
	}
	spec, err := attr("specversion")
	if err != nil {
		return "", err
	}
	if spec != "1.0" {
		return "", badCE("specversion %q is not 1.0", spec)
	}
	var id, source, typ string
	if id, err = attr("id"); err != nil {
		return "", err
	}
	if source, err = attr("source"); err != nil {
		return "", err
	}
	if typ, err = attr("type"); err != nil {
		return "", err
	}
	if d.types != nil {
		if _, ok := d.types[typ]; !ok {
			return "", ErrSkipped
		}
	}
	// source is a URI-reference, which has no space: joined by one, the
	// pair (source, id) the spec makes unique is one unambiguous id.
	if strings.ContainsAny(source, " ") {
		return "", badCE("source %q contains a space, which no URI-reference has", source)
	}
	return source + " " + id, nil
}

func (d *Decoder) structured(ctx context.Context, value []byte) (event.Event, error) {
	tree, derr := event.ParseJSON(value)
	if derr != nil {
		return event.Event{}, derr
	}
	env, ok := tree.(map[string]any)
	if !ok {
		return event.Event{}, badCE("structured mode: the record value is not a JSON object")
	}
	id, err := d.envelope(env)
	if err != nil {
		return event.Event{}, err
	}
	if b64, ok := env["data_base64"]; ok {
		if _, both := env["data"]; both {
			return event.Event{}, badCE("both data and data_base64")
		}
		s, isStr := b64.(string)
		raw, berr := base64.StdEncoding.DecodeString(s)
		if !isStr || berr != nil {
			return event.Event{}, badCE("data_base64 is not base64")
		}
		if err := d.checkSize(raw); err != nil {
			return event.Event{}, err
		}
		into := d.tree()
		defer d.release(into)
		data, err := d.body(ctx, raw, into)
		if err != nil {
			return event.Event{}, withEventID(err, id)
		}
		env["data"] = data
		delete(env, "data_base64")
	}
	return d.mapping.Event(env, id)
}

func (d *Decoder) binary(ctx context.Context, value []byte, headers []kgo.RecordHeader) (event.Event, error) {
	env := map[string]any{}
	for _, h := range headers {
		k := strings.ToLower(h.Key)
		name, ok := strings.CutPrefix(k, headerPrefix)
		if !ok {
			continue
		}
		if !utf8.Valid(h.Value) {
			return event.Event{}, badCE("header %s is not valid UTF-8", h.Key)
		}
		if _, dup := env[name]; dup {
			return event.Event{}, badCE("header %s occurs more than once", h.Key)
		}
		env[name] = string(h.Value)
	}
	id, err := d.envelope(env)
	if err != nil {
		return event.Event{}, err
	}
	into := d.tree()
	defer d.release(into)
	data, err := d.body(ctx, value, into)
	if err != nil {
		return event.Event{}, withEventID(err, id)
	}
	env["data"] = data
	return d.mapping.Event(env, id)
}

// withEventID attributes a decode error of a CloudEvent's data to the
// event id the envelope names.
func withEventID(err error, id string) error {
	var de *event.DecodeError
	if errors.As(err, &de) && de.EventID == "" && len(id) <= event.MaxEventIDLen && utf8.ValidString(id) {
		c := *de
		c.EventID = id
		return &c
	}
	return err
}
