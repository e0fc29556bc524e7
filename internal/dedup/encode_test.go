package dedup

import (
	"testing"
	"time"
)

func TestVersionEncoding(t *testing.T) {
	at := time.Date(2026, 11, 29, 13, 5, 0, 123456789, time.UTC)
	long := "acct-" + string(make([]byte, 59))
	for _, v := range []Version{
		{Revision: 0, Account: "acct-42", Currency: "EUR", Amount: 1250, OccurredAt: at},
		{Revision: 1<<63 - 1, Account: long, Currency: "USD", Amount: -1 << 63, OccurredAt: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)},
		{Revision: 7, Account: "a", Currency: "JPY", Amount: 1<<63 - 1, OccurredAt: time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Revision: 3, Cancelled: true},
	} {
		s := EncodeVersion(v)
		if len(s) > MaxVersionBytes {
			t.Fatalf("%+v: %d bytes, more than %d", v, len(s), MaxVersionBytes)
		}
		got, ok := DecodeVersion(s)
		if !ok || got != v {
			t.Fatalf("round trip of %+v: %+v, %v", v, got, ok)
		}
	}
	// What a key costs: a typical original, and a tombstone.
	if n := len(EncodeVersion(Version{Account: "acct-000042", Currency: "EUR", Amount: 1250, OccurredAt: at})); n > 30 {
		t.Fatalf("a typical version is %d bytes", n)
	}
	for _, bad := range []string{"", "\x03\x00", "\x02\x01x", "\x01\x01\x02"} {
		if _, ok := DecodeVersion(bad); ok {
			t.Fatalf("%q decoded", bad)
		}
	}
}
