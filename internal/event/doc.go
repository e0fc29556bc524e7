// Package event defines the billing event of the Kafka→MySQL ledger
// pipeline and decodes it from Kafka record values. Decoding is on the
// per-record hot path: a typical valid record costs one allocation and no
// floating point is involved anywhere.
//
// # Wire contract
//
// A record value is a single JSON object (RFC 8259, UTF-8), for example
//
//	{"event_id":"e-7f3a","account_id":"acct-42","amount_minor":1250,"currency":"EUR","occurred_at":"2026-11-29T13:05:00Z"}
//
// with these required members:
//
//   - event_id: JSON string, 1 to 128 bytes (UTF-8, after unescaping),
//     no control characters (Unicode category Cc: U+0000-U+001F,
//     U+007F-U+009F), unique per billable event.
//   - account_id: JSON string, 1 to 64 bytes, same character rules.
//   - amount_minor: JSON integer in minor currency units, within the
//     signed 64-bit range; negative means refund/credit. Only the
//     integer grammar -?(0|[1-9][0-9]*) is accepted: no fraction, no
//     exponent, no quotes (12.0, 1e3 and "12" are rejected). -0 is 0.
//     Money never passes through floating point.
//   - currency: JSON string of exactly three upper-case ASCII letters A-Z.
//     Membership in ISO 4217 is not checked.
//   - occurred_at: JSON string holding an RFC 3339 date-time with a zone
//     offset (Z or ±hh:mm; "T" and "Z" may be lower case as RFC 3339
//     allows), at most 9 fractional second digits, no leap second, and a
//     UTC value in years 0000-9999. It is normalised to UTC.
//
// and these optional ones, which make the record a version of the event
// (docs/corrections.md):
//
//   - revision: a non-negative JSON integer within the signed 64-bit
//     range; absent, 0 (the original). The ledger counts the highest
//     revision of each event_id.
//   - cancelled: a JSON boolean; true makes the version a tombstone, which
//     requires no other member (its content members are ignored) and
//     counts nothing.
//
// Further rules:
//
//   - Unknown members are ignored, but must still be valid JSON.
//   - Keys are matched exactly and case-sensitively after unescaping
//     ("Event_ID" is an unknown member; "event\u005fid" is event_id).
//   - A key occurring twice in the top-level object, known or not, is
//     rejected as ambiguous. Nested objects of ignored members are not
//     checked for duplicate keys.
//   - null is not a value for a required or optional member (it is a
//     type error, invalid_field).
//   - Anything but white space after the object is rejected.
//   - Every string in the document, including keys and ignored members,
//     must be valid UTF-8; \u escapes of unpaired UTF-16 surrogates are
//     rejected as well (encoding/json would silently substitute U+FFFD).
//   - Ids are taken byte-for-byte: no trimming, case folding or Unicode
//     normalisation.
//   - An empty (or nil) value is rejected, and so is a value larger than
//     the decoder's MaxPayload (default 64 KiB), before any parsing.
//
// Rejections are reported as *[DecodeError] with a stable [Reason].
//
// # Other guarantees
//
// [Event.Fingerprint] is a persisted, versioned hash of the billable
// content (not the event id) used to tell true duplicates from conflicting
// ones; [Window] assigns events to epoch-aligned tumbling windows, and
// [Period] to those or to calendar days and months in a time zone (the zone
// database is compiled in).
package event
