package event

import (
	"crypto/sha256"
	"encoding/binary"
	"time"
)

// Field length limits of the contract, in bytes of UTF-8 after JSON
// unescaping.
const (
	MaxEventIDLen   = 128
	MaxAccountIDLen = 64
)

// Event is a decoded, validated billing event.
//
// Every Event returned by [Decoder.Decode] satisfies the contract: EventID
// is 1-128 bytes and AccountID 1-64 bytes of valid UTF-8 without control
// characters, Currency is three ASCII letters A-Z, OccurredAt is in UTC
// (Location() == time.UTC, no monotonic reading) with a year in 0000-9999.
// The string fields of one decoded Event may share a single backing
// allocation; they never alias the decoded input.
//
// The json tags make encoding/json produce the wire format the decoder
// accepts, so a decoded Event re-encodes to an equivalent record.
type Event struct {
	EventID     string    `json:"event_id"`
	AccountID   string    `json:"account_id"`
	AmountMinor int64     `json:"amount_minor"` // minor units; negative = refund/credit
	Currency    string    `json:"currency"`     // ISO-4217-style code, e.g. "EUR"
	OccurredAt  time.Time `json:"occurred_at"`  // UTC
	// Revision and Cancelled make the record a version of the event
	// EventID (docs/corrections.md): the ledger counts its highest
	// revision, and a cancelled version (a tombstone, whose other fields
	// are zero) counts nothing. A record without them is revision 0, the
	// original.
	Revision  int64 `json:"revision,omitempty"`
	Cancelled bool  `json:"cancelled,omitempty"`
}

// fingerprintDomain is the fixed prefix of the fingerprint input. Changing it,
// or anything else in the layout documented on Fingerprint, changes every
// fingerprint and therefore breaks duplicate detection against stored rows.
const fingerprintDomain = "ledger.event.fingerprint.v1"

// Fingerprint identifies the billable content of e: account, amount,
// currency and the instant it occurred. EventID is deliberately excluded, so
// two records with the same EventID are true duplicates when their
// fingerprints are equal and conflicting duplicates when they differ.
//
// The value is stable across processes, platforms and versions of this
// package (it is persisted). It is the first 16 bytes of the SHA-256 digest
// of this byte string (all integers big-endian):
//
//	"ledger.event.fingerprint.v1"  27 ASCII bytes, no terminator
//	uint32 len(AccountID)          byte length
//	AccountID                      raw bytes
//	int64  AmountMinor             two's complement
//	uint32 len(Currency)           byte length
//	Currency                       raw bytes
//	int64  OccurredAt.Unix()       seconds since 1970-01-01T00:00:00Z
//	uint32 OccurredAt.Nanosecond() 0..999999999
//
// The time enters as an instant (Unix seconds plus nanoseconds, which is
// exact for every time.Time, unlike UnixNano), so the same instant written
// with different zone offsets, or held in a different time.Location, yields
// the same fingerprint. Strings are hashed byte-for-byte without Unicode
// normalisation. Fingerprint is defined for any Event, validated or not.
func (e Event) Fingerprint() [16]byte {
	var buf [len(fingerprintDomain) + 4 + MaxAccountIDLen + 8 + 4 + 3 + 8 + 4]byte
	b := append(buf[:0], fingerprintDomain...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(e.AccountID)))
	b = append(b, e.AccountID...)
	b = binary.BigEndian.AppendUint64(b, uint64(e.AmountMinor))
	b = binary.BigEndian.AppendUint32(b, uint32(len(e.Currency)))
	b = append(b, e.Currency...)
	b = binary.BigEndian.AppendUint64(b, uint64(e.OccurredAt.Unix()))
	b = binary.BigEndian.AppendUint32(b, uint32(e.OccurredAt.Nanosecond()))
	sum := sha256.Sum256(b)
	var fp [16]byte
	copy(fp[:], sum[:16])
	return fp
}
