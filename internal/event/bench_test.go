package event

import (
	"testing"
	"time"
)

var (
	sinkEvent Event
	sinkErr   error
	sinkFP    [16]byte
	sinkTime  time.Time
)

func BenchmarkDecode(b *testing.B) {
	var d Decoder
	in := []byte(baseRecord)
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		sinkEvent, sinkErr = d.Decode(in)
	}
	if sinkErr != nil {
		b.Fatal(sinkErr)
	}
}

func BenchmarkDecodeVariants(b *testing.B) {
	cases := []struct{ name, in string }{
		{"offset_fraction", with("occurred_at", `"2026-11-29T14:05:00.123456+01:00"`)},
		{"escaped_ids", with("event_id", `"e-\u00e9\"7f3a\/x"`)},
		{"unknown_fields", plus(`"source":"checkout","schema":3,"meta":{"ip":"10.0.0.1","tags":["a","b"],"ratio":0.25}`)},
		{"max_ids", with("event_id", `"`+string(make128('a'))+`"`)},
		{"reject_currency", with("currency", `"eur"`)},
		{"reject_syntax", baseRecord + "x"},
	}
	var d Decoder
	for _, c := range cases {
		in := []byte(c.in)
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				sinkEvent, sinkErr = d.Decode(in)
			}
		})
	}
}

func make128(c byte) []byte {
	s := make([]byte, MaxEventIDLen)
	for i := range s {
		s[i] = c
	}
	return s
}

// BenchmarkDecodeReference measures the encoding/json-based oracle of
// fuzz_test.go, for comparison only.
func BenchmarkDecodeReference(b *testing.B) {
	in := []byte(baseRecord)
	b.ReportAllocs()
	for b.Loop() {
		sinkEvent, _ = referenceDecode(in, DefaultMaxPayload)
	}
}

func BenchmarkFingerprint(b *testing.B) {
	e := baseEvent
	b.ReportAllocs()
	for b.Loop() {
		sinkFP = e.Fingerprint()
	}
}

func BenchmarkWindow(b *testing.B) {
	t := baseEvent.OccurredAt
	b.ReportAllocs()
	for b.Loop() {
		sinkTime = Window(t, 5*time.Minute)
	}
}
