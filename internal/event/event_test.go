package event

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"testing"
	"time"
)

// TestFingerprintGolden pins the persisted layout. The expected values were
// computed independently (Python hashlib) from the layout documented on
// Fingerprint; if this test fails, stored fingerprints no longer match.
func TestFingerprintGolden(t *testing.T) {
	cases := []struct {
		e    Event
		want string
	}{
		{baseEvent, "08f7f5c9fb68e4c80e9ebe21a4598272"},
		{Event{
			EventID:     "ignored",
			AccountID:   "acct-é",
			AmountMinor: -1 << 63,
			Currency:    "JPY",
			OccurredAt:  time.Date(1969, 12, 31, 23, 59, 59, 999999999, time.UTC),
		}, "d24ab30f184e7843a9125140395214ea"},
	}
	for _, tc := range cases {
		fp := tc.e.Fingerprint()
		if got := hex.EncodeToString(fp[:]); got != tc.want {
			t.Errorf("Fingerprint(%+v) = %s, want %s", tc.e, got, tc.want)
		}
		if fp != referenceFingerprint(tc.e) {
			t.Errorf("Fingerprint(%+v) differs from the documented layout", tc.e)
		}
	}
}

// referenceFingerprint is a direct transcription of the documented layout.
func referenceFingerprint(e Event) [16]byte {
	h := sha256.New()
	h.Write([]byte("ledger.event.fingerprint.v1"))
	_ = binary.Write(h, binary.BigEndian, uint32(len(e.AccountID)))
	h.Write([]byte(e.AccountID))
	_ = binary.Write(h, binary.BigEndian, e.AmountMinor)
	_ = binary.Write(h, binary.BigEndian, uint32(len(e.Currency)))
	h.Write([]byte(e.Currency))
	_ = binary.Write(h, binary.BigEndian, e.OccurredAt.Unix())
	_ = binary.Write(h, binary.BigEndian, uint32(e.OccurredAt.Nanosecond()))
	var fp [16]byte
	copy(fp[:], h.Sum(nil))
	return fp
}

func TestFingerprintEqualContent(t *testing.T) {
	a := baseEvent
	b := baseEvent
	b.EventID = "a-completely-different-id"
	if a.Fingerprint() != b.Fingerprint() {
		t.Error("fingerprint depends on EventID")
	}
	// Same instant, different Location, with a monotonic reading.
	c := baseEvent
	c.OccurredAt = baseEvent.OccurredAt.In(time.FixedZone("X", 5*3600+30*60))
	if a.Fingerprint() != c.Fingerprint() {
		t.Error("fingerprint depends on the Location of OccurredAt")
	}
	now := time.Now()
	d := baseEvent
	d.OccurredAt = now
	e := baseEvent
	e.OccurredAt = now.Round(0).UTC()
	if d.Fingerprint() != e.Fingerprint() {
		t.Error("fingerprint depends on the monotonic reading")
	}
}

func TestFingerprintSameInstantDifferentOffsets(t *testing.T) {
	var dec Decoder
	var fps [][16]byte
	for _, ts := range []string{
		"2026-11-29T13:05:00Z",
		"2026-11-29T14:05:00+01:00",
		"2026-11-29T07:35:00-05:30",
		"2026-11-30T02:05:00+13:00",
		"2026-11-29T13:05:00-00:00",
		"2026-11-29t13:05:00.000z",
	} {
		e, err := dec.Decode([]byte(with("occurred_at", `"`+ts+`"`)))
		if err != nil {
			t.Fatal(err)
		}
		fps = append(fps, e.Fingerprint())
	}
	for i := range fps {
		if fps[i] != fps[0] {
			t.Errorf("offset variant %d has a different fingerprint", i)
		}
	}
}

func TestFingerprintDiffersPerBillableField(t *testing.T) {
	base := baseEvent.Fingerprint()
	mods := map[string]func(*Event){
		"account":       func(e *Event) { e.AccountID = "acct-43" },
		"account case":  func(e *Event) { e.AccountID = "ACCT-42" },
		"amount":        func(e *Event) { e.AmountMinor = 1251 },
		"amount sign":   func(e *Event) { e.AmountMinor = -1250 },
		"currency":      func(e *Event) { e.Currency = "USD" },
		"time 1ns":      func(e *Event) { e.OccurredAt = e.OccurredAt.Add(1) },
		"time 1s":       func(e *Event) { e.OccurredAt = e.OccurredAt.Add(time.Second) },
		"time -1ns":     func(e *Event) { e.OccurredAt = e.OccurredAt.Add(-1) },
		"empty account": func(e *Event) { e.AccountID = "" },
	}
	seen := map[[16]byte]string{base: "base"}
	for name, mod := range mods {
		e := ev(mod)
		fp := e.Fingerprint()
		if other, dup := seen[fp]; dup {
			t.Errorf("%s: same fingerprint as %s", name, other)
		}
		seen[fp] = name
	}
	// Length prefixes keep field boundaries unambiguous.
	x := Event{AccountID: "ab", Currency: "CDE"}
	y := Event{AccountID: "abC", Currency: "DE"}
	if x.Fingerprint() == y.Fingerprint() {
		t.Error("field boundary ambiguity")
	}
}

func TestFingerprintAllocs(t *testing.T) {
	e := baseEvent
	if n := testing.AllocsPerRun(100, func() { _ = e.Fingerprint() }); n != 0 {
		t.Errorf("Fingerprint: %v allocs, want 0", n)
	}
}
