package event

import (
	"errors"
	"testing"
)

func TestDecodeVersions(t *testing.T) {
	amended := baseEvent
	amended.Revision = 3
	tombstone := Event{EventID: "e-7f3a", Revision: 2, Cancelled: true}
	maxRevision := baseEvent
	maxRevision.Revision = 1<<63 - 1
	tests := []struct {
		name  string
		value string
		want  Event
	}{
		{"no version fields: revision 0", baseRecord, baseEvent},
		{"revision", plus(`"revision":3`), amended},
		{"cancelled false is the content", plus(`"revision":3,"cancelled":false`), amended},
		{"largest revision", plus(`"revision":9223372036854775807`), maxRevision},
		{"tombstone without content", `{"event_id":"e-7f3a","revision":2,"cancelled":true}`, tombstone},
		// Content beside a tombstone is ignored, valid or not: every
		// tombstone of one revision is the same version.
		{"tombstone ignores content", `{"event_id":"e-7f3a","revision":2,"cancelled":true,"amount_minor":"x","currency":"eur"}`, tombstone},
		{"tombstone of revision 0", `{"event_id":"e-7f3a","cancelled":true}`, Event{EventID: "e-7f3a", Cancelled: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NewDecoder(0).Decode([]byte(tt.value))
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	if tombstone.Fingerprint() == baseEvent.Fingerprint() {
		t.Fatal("a tombstone has the fingerprint of content")
	}
}

func TestDecodeVersionRejects(t *testing.T) {
	tests := []struct {
		name, value, field string
	}{
		{"negative revision", plus(`"revision":-1`), "revision"},
		{"fractional revision", plus(`"revision":1.0`), "revision"},
		{"revision as a string", plus(`"revision":"1"`), "revision"},
		{"null revision", plus(`"revision":null`), "revision"},
		{"revision beyond 64 bits", plus(`"revision":9223372036854775808`), "revision"},
		{"cancelled as a string", plus(`"cancelled":"true"`), "cancelled"},
		{"null cancelled", plus(`"cancelled":null`), "cancelled"},
		// Not cancelled, a version needs its content.
		{"content missing", `{"event_id":"e-7f3a","revision":2,"cancelled":false}`, "account_id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewDecoder(0).Decode([]byte(tt.value))
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("err = %v, want a DecodeError", err)
			}
			want := ReasonInvalidField
			if tt.field == "account_id" {
				want = ReasonMissingField
			}
			if de.Reason != want || de.Field != tt.field || de.EventID != "e-7f3a" {
				t.Fatalf("got %+v, want %s on %s", de, want, tt.field)
			}
		})
	}
}
