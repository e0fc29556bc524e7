package reinject

import (
	"context"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/deadletters"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/event/format"
)

type fakeDecoder struct{ err error }

func (f fakeDecoder) Decode(context.Context, []byte, []kgo.RecordHeader) (event.Event, error) {
	if f.err != nil {
		return event.Event{}, f.err
	}
	return event.Event{EventID: "e-1"}, nil
}

// A payload is checked by the pipeline's decoder of EVENT_FORMAT: one it
// refuses is refused, and a registry that does not answer is an error to
// retry, not a verdict on the payload.
func TestPayloadCheckedByTheFormatsDecoder(t *testing.T) {
	row := &deadletters.Row{Topic: "t", Payload: []byte{0, 0, 0, 0, 1, 2}, PayloadSize: 6}
	r := &Reinjector{Topic: "t", Decoder: fakeDecoder{}}
	if _, ev, err := r.payload(Request{}, row); err != nil || ev.EventID != "e-1" {
		t.Fatalf("decodable payload: %+v %v", ev, err)
	}
	r.Decoder = fakeDecoder{err: &event.DecodeError{Reason: event.ReasonUnknownSchema, Detail: "x"}}
	if _, _, err := r.payload(Request{}, row); !errors.Is(err, ErrRefused) {
		t.Errorf("undecodable payload: %v", err)
	}
	r.Decoder = fakeDecoder{err: &format.UnavailableError{Err: errors.New("connection refused")}}
	if _, _, err := r.payload(Request{}, row); err == nil || errors.Is(err, ErrRefused) || !format.IsUnavailable(err) {
		t.Errorf("registry down: %v", err)
	}
	// Without a decoder the JSON contract's decides: these bytes are no JSON.
	r.Decoder = nil
	if _, _, err := r.payload(Request{}, row); !errors.Is(err, ErrRefused) {
		t.Errorf("JSON contract: %v", err)
	}
}
