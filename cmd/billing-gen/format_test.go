package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/testenv"
)

// Every -format writes what the service's decoder of that EVENT_FORMAT
// reads back as the same event (versions too: -version-ratio), and each malformed kind becomes the dead
// letter the expected file says (malformedReason).
func TestFormatsRoundTripThroughTheServicesDecoder(t *testing.T) {
	url := testenv.SchemaRegistry(t)
	ctx := context.Background()
	e := ledgercheck.Event{EventID: "e-1", AccountID: "acct-9", AmountMinor: -1234, Currency: "JPY",
		OccurredAt: time.Date(2026, 11, 28, 23, 59, 59, 123e6, time.UTC)}
	want := event.Event{EventID: e.EventID, AccountID: e.AccountID, AmountMinor: e.AmountMinor, Currency: e.Currency, OccurredAt: e.OccurredAt}
	const maxPayload = 4096
	for _, f := range format.Formats() {
		subject := testenv.RandomName("gen_") + "-value"
		for _, ce := range []string{"", "structured", "binary"} {
			enc, err := format.NewEncoder(ctx, f, ce, url, subject, maxPayload)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			dec, err := format.New(format.Options{Format: f, CloudEvents: ce != "", MaxPayload: maxPayload, Registry: format.RegistryOptions{URL: url, Subject: subject}})
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			w := want
			if ce != "" {
				w.EventID = format.EncoderCloudEventSource + " " + e.EventID
			}
			for _, style := range []timeStyle{{}, {offset: 3600, millis: true, unknown: true}} {
				v, h, err := enc.Record(validPayload(e, style))
				if err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				got, err := dec.Decode(ctx, v, h)
				if err != nil || got != w {
					t.Errorf("%s %s %+v: %+v %v", f, ce, style, got, err)
				}
			}
			// Versions (-version-ratio): an amendment and a tombstone.
			amended, tomb := w, event.Event{EventID: w.EventID, Revision: 4, Cancelled: true}
			amended.Revision, amended.AmountMinor = 3, 99
			ae := e
			ae.AmountMinor = 99
			for _, c := range []struct {
				v    ledgercheck.Version
				want event.Event
			}{{ledgercheck.Version{Event: ae, Revision: 3}, amended}, {ledgercheck.Version{Event: ledgercheck.Event{EventID: e.EventID}, Revision: 4, Cancelled: true}, tomb}} {
				v, h, err := enc.Record(versionPayload(c.v))
				if err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				if got, err := dec.Decode(ctx, v, h); err != nil || got != c.want {
					t.Errorf("%s %s version %+v: %+v %v", f, ce, c.v, got, err)
				}
			}
			for _, k := range ledgercheck.MalformedKinds() {
				v, h, err := enc.Record(malformedPayload(k, e, 1, maxPayload))
				if err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				_, err = dec.Decode(ctx, v, h)
				var de *event.DecodeError
				if !errors.As(err, &de) || string(de.Reason) != malformedReason(f, ce, k) {
					t.Errorf("%s %s, malformed %s: %v, want %s", f, ce, k, err, malformedReason(f, ce, k))
				}
			}
		}
	}
}
