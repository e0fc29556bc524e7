package dedup

import (
	"encoding/binary"
	"time"
)

// The version a key's row keeps (the key tables' version column, migration
// 00009), in a compact binary form: a key costs its version's bytes on top
// of its id, fingerprint and expiry, so every field is as short as it can
// be. Layout:
//
//	byte    format: 1, or 2 for a tombstone (nothing follows but the revision)
//	uvarint revision
//	varint  amount (zigzag)
//	varint  occurred_at, Unix seconds
//	uvarint occurred_at, nanoseconds
//	3 bytes currency
//	rest    account
//
// An empty version is a key stored before versions were kept: what it
// counted is not known, so no later version can retract it.
const (
	versionContent   = 1
	versionTombstone = 2
)

// MaxVersionBytes is the longest encoded version (the column's width).
const MaxVersionBytes = 1 + binary.MaxVarintLen64*3 + binary.MaxVarintLen32 + 3 + 64

// EncodeVersion is v as a key's row keeps it.
func EncodeVersion(v Version) string {
	var buf [MaxVersionBytes]byte
	return string(AppendVersion(buf[:0], v))
}

// AppendVersion appends v, encoded, to b: many versions can share one
// allocation.
func AppendVersion(b []byte, v Version) []byte {
	if v.Cancelled {
		b = append(b, versionTombstone)
		return binary.AppendUvarint(b, uint64(v.Revision))
	}
	b = append(b, versionContent)
	b = binary.AppendUvarint(b, uint64(v.Revision))
	b = binary.AppendVarint(b, v.Amount)
	b = binary.AppendVarint(b, v.OccurredAt.Unix())
	b = binary.AppendUvarint(b, uint64(v.OccurredAt.Nanosecond()))
	b = append(b, v.Currency...)
	return append(b, v.Account...)
}

// DecodeVersion reads what EncodeVersion wrote; ok is false for an empty
// or malformed version (a key stored before versions).
func DecodeVersion(s string) (v Version, ok bool) {
	b := []byte(s)
	if len(b) == 0 {
		return Version{}, false
	}
	format := b[0]
	b = b[1:]
	rev, n := binary.Uvarint(b)
	if n <= 0 || rev > 1<<63-1 {
		return Version{}, false
	}
	b = b[n:]
	v.Revision = int64(rev)
	switch format {
	case versionTombstone:
		v.Cancelled = true
		return v, len(b) == 0
	case versionContent:
	default:
		return Version{}, false
	}
	amount, n := binary.Varint(b)
	if n <= 0 {
		return Version{}, false
	}
	b = b[n:]
	sec, n := binary.Varint(b)
	if n <= 0 {
		return Version{}, false
	}
	b = b[n:]
	nsec, n := binary.Uvarint(b)
	if n <= 0 || nsec > 999999999 || len(b)-n < 3 {
		return Version{}, false
	}
	b = b[n:]
	v.Amount = amount
	v.OccurredAt = time.Unix(sec, int64(nsec)).UTC()
	v.Currency, v.Account = string(b[:3]), string(b[3:])
	return v, true
}
