package ledgercheck

import (
	"strconv"
	"time"
)

// Dead-letter reasons, as stored in dead_letters.reason. The decoder reasons
// are referenced only through [MalformedKind.Reason], which is the one place
// to adjust if the decoder's names change.
const (
	ReasonInvalidJSON          = "invalid_json"
	ReasonMissingField         = "missing_field"
	ReasonInvalidField         = "invalid_field"
	ReasonAmountNotInteger     = "amount_not_integer"
	ReasonAmountOutOfRange     = "amount_out_of_range"
	ReasonInvalidCurrency      = "invalid_currency"
	ReasonIDTooLong            = "id_too_long"
	ReasonInvalidTime          = "invalid_time"
	ReasonPayloadTooLarge      = "payload_too_large"
	ReasonEmptyPayload         = "empty_payload"
	ReasonConflictingDuplicate = "conflicting_duplicate"
	ReasonAmountOverflow       = "amount_overflow"
	ReasonEventTimeInFuture    = "event_time_in_future"
)

// InFuture is the contract's bound on event time: an event whose
// occurred_at is later than the processing time of the checkpoint that
// judges it plus the service's MAX_EVENT_TIME_SKEW is dead-lettered as
// event_time_in_future before anything else is decided about it. It
// counts nowhere, does not move the watermark (it is never given to
// [Model.Add]), and its id is not remembered. The processing time is the
// service's, later than any the generator knows: a caller can only be sure
// of the outcome for events far from the bound.
func InFuture(occurredAt, processing time.Time, skew time.Duration) bool {
	return occurredAt.After(processing.Add(skew))
}

// MalformedKind is one way of producing a record the decoder must reject.
// Each kind is built so that exactly one rule of the contract is broken, so
// it maps to exactly one reason whatever order the decoder checks in.
type MalformedKind int

// The malformed kinds the generator produces. The zero value is not a kind.
const (
	// MalformedInvalidJSON: bytes that are not JSON at all.
	MalformedInvalidJSON MalformedKind = iota + 1
	// MalformedMissingField: a well-formed event without "currency".
	MalformedMissingField
	// MalformedInvalidField: "amount_minor" is a JSON string ("12").
	MalformedInvalidField
	// MalformedAmountNotInteger: "amount_minor" is 12.5.
	MalformedAmountNotInteger
	// MalformedAmountOutOfRange: "amount_minor" is 9223372036854775808.
	MalformedAmountOutOfRange
	// MalformedInvalidCurrency: "currency" is "eur".
	MalformedInvalidCurrency
	// MalformedIDTooLong: "event_id" is 129 bytes.
	MalformedIDTooLong
	// MalformedInvalidTime: "occurred_at" is "2026-11-29 13:05".
	MalformedInvalidTime
	// MalformedPayloadTooLarge: an otherwise valid event padded past the
	// service's maximum payload size.
	MalformedPayloadTooLarge
	// MalformedEmptyPayload: a zero-length (non-null) value.
	MalformedEmptyPayload
)

// MalformedKinds returns every malformed kind, in declaration order. The
// caller owns the returned slice.
func MalformedKinds() []MalformedKind {
	return []MalformedKind{
		MalformedInvalidJSON,
		MalformedMissingField,
		MalformedInvalidField,
		MalformedAmountNotInteger,
		MalformedAmountOutOfRange,
		MalformedInvalidCurrency,
		MalformedIDTooLong,
		MalformedInvalidTime,
		MalformedPayloadTooLarge,
		MalformedEmptyPayload,
	}
}

// Reason returns the dead-letter reason the decoder stores for a record of
// kind k, or "" if k is not a kind. This switch is the table to edit if the
// decoder's final reason names differ.
func (k MalformedKind) Reason() string {
	switch k {
	case MalformedInvalidJSON:
		return ReasonInvalidJSON
	case MalformedMissingField:
		return ReasonMissingField
	case MalformedInvalidField:
		return ReasonInvalidField
	case MalformedAmountNotInteger:
		return ReasonAmountNotInteger
	case MalformedAmountOutOfRange:
		return ReasonAmountOutOfRange
	case MalformedInvalidCurrency:
		return ReasonInvalidCurrency
	case MalformedIDTooLong:
		return ReasonIDTooLong
	case MalformedInvalidTime:
		return ReasonInvalidTime
	case MalformedPayloadTooLarge:
		return ReasonPayloadTooLarge
	case MalformedEmptyPayload:
		return ReasonEmptyPayload
	}
	return ""
}

// String returns the kind's reason, or "malformed(N)" for an invalid kind.
func (k MalformedKind) String() string {
	if r := k.Reason(); r != "" {
		return r
	}
	return "malformed(" + strconv.Itoa(int(k)) + ")"
}
