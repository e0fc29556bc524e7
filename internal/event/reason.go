package event

// Reason classifies why a record was rejected or flagged. Values are stable,
// snake_case identifiers: they are persisted in the dead_letters.reason column
// and used as metric label values, so an existing value must never be renamed
// or reused for a different meaning. New reasons may be added.
type Reason string

// Reasons produced by [Decoder.Decode]. Where more than one applies to a
// record, the decoder reports the first one in this precedence order:
// [ReasonEmptyPayload], [ReasonPayloadTooLarge], then the first lexical or
// syntax problem in document order ([ReasonInvalidJSON], [ReasonInvalidUTF8]),
// then [ReasonDuplicateKey], then field problems in the field order event_id,
// account_id, amount_minor, currency, occurred_at.
const (
	// ReasonEmptyPayload: the record value is nil or zero-length (for example
	// a Kafka tombstone).
	ReasonEmptyPayload Reason = "empty_payload"
	// ReasonPayloadTooLarge: the record value exceeds the decoder's
	// MaxPayload; it was rejected without being parsed.
	ReasonPayloadTooLarge Reason = "payload_too_large"
	// ReasonInvalidJSON: the value is not a single RFC 8259 JSON object
	// (syntax error, trailing data after the object, a top-level value
	// that is not an object, whitespace only).
	ReasonInvalidJSON Reason = "invalid_json"
	// ReasonInvalidUTF8: a string (anywhere in the document, including
	// ignored fields and keys) contains bytes that are not valid UTF-8, or a
	// \u escape denoting an unpaired UTF-16 surrogate.
	ReasonInvalidUTF8 Reason = "invalid_utf8"
	// ReasonDuplicateKey: a key occurs more than once in the top-level
	// object (compared after unescaping, case-sensitively).
	ReasonDuplicateKey Reason = "duplicate_key"
	// ReasonMissingField: a required field is absent.
	ReasonMissingField Reason = "missing_field"
	// ReasonInvalidField: a required field has the wrong JSON type
	// (including null), or an id is empty or contains a control character.
	ReasonInvalidField Reason = "invalid_field"
	// ReasonIDTooLong: event_id exceeds 128 bytes or account_id exceeds 64
	// bytes (UTF-8 bytes after unescaping).
	ReasonIDTooLong Reason = "id_too_long"
	// ReasonAmountNotInteger: amount_minor is a JSON number with a fraction
	// or exponent part (12.0, 1e3, -0.5), even if its value is integral.
	ReasonAmountNotInteger Reason = "amount_not_integer"
	// ReasonAmountOutOfRange: amount_minor is a JSON integer outside the
	// signed 64-bit range.
	ReasonAmountOutOfRange Reason = "amount_out_of_range"
	// ReasonInvalidCurrency: currency is a string but not exactly three
	// upper-case ASCII letters A-Z.
	ReasonInvalidCurrency Reason = "invalid_currency"
	// ReasonInvalidTime: occurred_at is a string but not an RFC 3339
	// date-time with zone offset as accepted by the decoder, or its UTC
	// value falls outside years 0000-9999.
	ReasonInvalidTime Reason = "invalid_time"
	// ReasonAmountInexact: a decimal amount (major units) has more
	// non-zero decimals than its currency's minor unit: converting it would
	// round.
	ReasonAmountInexact Reason = "amount_inexact"
	// ReasonUnknownSchema: the record names a schema id the registry does
	// not hold (or one of another subject).
	ReasonUnknownSchema Reason = "unknown_schema"
	// ReasonInvalidEncoding: the record's bytes do not decode in its
	// format (wire-format header, Avro, Protobuf, a JSON Schema it fails).
	ReasonInvalidEncoding Reason = "invalid_encoding"
	// ReasonInvalidCloudEvent: the record is not a CloudEvent of the Kafka
	// protocol binding (attributes missing or malformed, an unsupported
	// content type).
	ReasonInvalidCloudEvent Reason = "invalid_cloudevent"
)

// Reasons not produced by the decoder but reserved here so that every
// dead-letter reason lives in one place.
const (
	// ReasonConflictingDuplicate: an event id was seen again with a
	// different [Event.Fingerprint] than the one already recorded.
	ReasonConflictingDuplicate Reason = "conflicting_duplicate"
	// ReasonAmountOverflow: aggregating amounts would overflow int64.
	ReasonAmountOverflow Reason = "amount_overflow"
	// ReasonRejectedByDatabase: the database refused to store the event
	// (a constraint, trigger or setting of the server), every time it was
	// tried; the detail carries the server's message.
	ReasonRejectedByDatabase Reason = "rejected_by_database"
	// ReasonEventTimeInFuture: occurred_at is later than the processing
	// time of the checkpoint that judged it plus MAX_EVENT_TIME_SKEW; such
	// an event would move its partition's watermark, and so the closing
	// frontier, past what has happened.
	ReasonEventTimeInFuture Reason = "event_time_in_future"
	// ReasonVersionPastHorizon: a revision of an event other than the
	// one the ledger counts arrived later than the version horizon after
	// the event's first version (or the event's key keeps no version to
	// retract); it is neither applied nor dropped.
	ReasonVersionPastHorizon Reason = "version_past_horizon"
)

// AllReasons returns every Reason declared by this package, decoder
// reasons first in precedence order. The caller owns the returned slice.
func AllReasons() []Reason {
	return []Reason{
		ReasonEmptyPayload,
		ReasonPayloadTooLarge,
		ReasonInvalidJSON,
		ReasonInvalidUTF8,
		ReasonDuplicateKey,
		ReasonMissingField,
		ReasonInvalidField,
		ReasonIDTooLong,
		ReasonAmountNotInteger,
		ReasonAmountOutOfRange,
		ReasonInvalidCurrency,
		ReasonInvalidTime,
		ReasonAmountInexact,
		ReasonUnknownSchema,
		ReasonInvalidEncoding,
		ReasonInvalidCloudEvent,
		ReasonConflictingDuplicate,
		ReasonAmountOverflow,
		ReasonRejectedByDatabase,
		ReasonEventTimeInFuture,
		ReasonVersionPastHorizon,
	}
}
