package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/billing/ledger/internal/ledgercheck"
)

// field is one member of a JSON object: its key and its value already
// encoded as JSON.
type field struct {
	key string
	raw string
}

// object encodes fields as a JSON object, in order.
func object(fields ...field) []byte {
	var b strings.Builder
	b.WriteByte('{')
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(jsonString(f.key))
		b.WriteByte(':')
		b.WriteString(f.raw)
	}
	b.WriteByte('}')
	return []byte(b.String())
}

// jsonString encodes s as a JSON string.
func jsonString(s string) string {
	b, err := json.Marshal(s)
	if err != nil { // impossible for a string
		panic(err)
	}
	return string(b)
}

// timeStyle selects how occurred_at is written; every style is RFC 3339 with
// an offset, and the model only looks at the UTC instant.
type timeStyle struct {
	offset  int  // zone offset in seconds east of UTC; 0 writes "Z"
	millis  bool // write three fractional digits
	unknown bool // add an unknown field, which the decoder ignores
}

// formatTime writes t, which must be a whole number of milliseconds, in
// style s; a time with a fractional second always gets its milliseconds, so
// the written instant is exactly t.
func formatTime(t time.Time, s timeStyle) string {
	layout := "2006-01-02T15:04:05Z07:00"
	if s.millis || t.Nanosecond() != 0 {
		layout = "2006-01-02T15:04:05.000Z07:00"
	}
	if s.offset != 0 {
		t = t.In(time.FixedZone("", s.offset))
	} else {
		t = t.UTC()
	}
	return t.Format(layout)
}

// eventFields returns the JSON fields of a valid event.
func eventFields(e ledgercheck.Event, s timeStyle) []field {
	f := []field{
		{"event_id", jsonString(e.EventID)},
		{"account_id", jsonString(e.AccountID)},
		{"amount_minor", strconv.FormatInt(e.AmountMinor, 10)},
		{"currency", jsonString(e.Currency)},
		{"occurred_at", jsonString(formatTime(e.OccurredAt, s))},
	}
	if s.unknown {
		f = append(f, field{"source", `{"system":"billing-gen","tags":["a",1,null,true]}`})
	}
	return f
}

// validPayload encodes a valid event.
func validPayload(e ledgercheck.Event, s timeStyle) []byte { return object(eventFields(e, s)...) }

// versionPayload is the record of a version: its content and revision, or
// a tombstone (event_id, revision, cancelled).
func versionPayload(v ledgercheck.Version) []byte {
	rev := field{"revision", strconv.FormatInt(v.Revision, 10)}
	if v.Cancelled {
		return object(field{"event_id", jsonString(v.EventID)}, rev, field{"cancelled", "true"})
	}
	return object(append(eventFields(v.Event, timeStyle{}), rev)...)
}

// malformedPayload builds a record value of kind k from the otherwise valid
// event e (whose EventID is fresh). Each kind breaks exactly one rule, so the
// decoder's reason is [ledgercheck.MalformedKind.Reason] whatever order it
// checks in. n varies the payload between records of the same kind.
func malformedPayload(k ledgercheck.MalformedKind, e ledgercheck.Event, n int64, maxPayload int) []byte {
	f := eventFields(e, timeStyle{})
	set := func(key, raw string) {
		for i := range f {
			if f[i].key == key {
				f[i].raw = raw
			}
		}
	}
	switch k {
	case ledgercheck.MalformedInvalidJSON:
		// Not JSON from the first byte on.
		return []byte("not json: " + e.EventID + " amount=12")
	case ledgercheck.MalformedMissingField:
		f = append(f[:3], f[4:]...) // drop currency
	case ledgercheck.MalformedInvalidField:
		set("amount_minor", `"12"`)
	case ledgercheck.MalformedAmountNotInteger:
		if n%2 == 0 {
			set("amount_minor", "12.5")
		} else {
			set("amount_minor", "1e3")
		}
	case ledgercheck.MalformedAmountOutOfRange:
		if n%2 == 0 {
			set("amount_minor", "9223372036854775808")
		} else {
			set("amount_minor", "-9223372036854775809")
		}
	case ledgercheck.MalformedInvalidCurrency:
		set("currency", `"eur"`)
	case ledgercheck.MalformedIDTooLong:
		id := e.EventID + "-"
		id += strings.Repeat("x", 129-len(id))
		set("event_id", jsonString(id))
	case ledgercheck.MalformedInvalidTime:
		set("occurred_at", `"2026-11-29 13:05"`)
	case ledgercheck.MalformedPayloadTooLarge:
		// A valid event padded with an unknown field to 6 KiB over the
		// limit (70 KiB for the default 64 KiB).
		base := len(object(f...)) + len(`,"padding":""`)
		f = append(f, field{"padding", jsonString(strings.Repeat("p", maxPayload+6*1024-base))})
	case ledgercheck.MalformedEmptyPayload:
		return []byte{} // zero length, not null (not a tombstone)
	default:
		panic("billing-gen: unknown malformed kind " + k.String())
	}
	return object(f...)
}
