package event

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

func TestWindow(t *testing.T) {
	cases := []struct {
		t    string
		size time.Duration
		want string
	}{
		{"2026-11-29T13:05:00Z", time.Hour, "2026-11-29T13:00:00Z"},
		{"2026-11-29T13:00:00Z", time.Hour, "2026-11-29T13:00:00Z"},           // start is inclusive
		{"2026-11-29T13:59:59.999999999Z", time.Hour, "2026-11-29T13:00:00Z"}, // end is exclusive
		{"2026-11-29T14:05:00+01:00", time.Hour, "2026-11-29T13:00:00Z"},      // location irrelevant
		{"2026-11-29T13:05:00+05:30", 24 * time.Hour, "2026-11-29T00:00:00Z"}, // UTC days, not local
		{"2026-11-29T13:05:00Z", 15 * time.Minute, "2026-11-29T13:00:00Z"},
		{"2026-11-29T13:05:00.7Z", 1500 * time.Millisecond, "2026-11-29T13:05:00Z"}, // 1795957500 s = 1197305000 * 1.5 s
		{"2026-11-29T13:05:01.6Z", 1500 * time.Millisecond, "2026-11-29T13:05:01.5Z"},
		{"2026-11-29T13:05:00.123456789Z", time.Nanosecond, "2026-11-29T13:05:00.123456789Z"},
		{"2026-11-29T13:05:00Z", 7 * 24 * time.Hour, "2026-11-26T00:00:00Z"}, // epoch weeks start on Thursday
		{"1970-01-01T00:00:00Z", time.Hour, "1970-01-01T00:00:00Z"},
		{"1969-12-31T23:30:00Z", time.Hour, "1969-12-31T23:00:00Z"}, // floor, not toward zero
		{"1969-12-31T23:59:59.999999999Z", time.Second, "1969-12-31T23:59:59Z"},
		{"1969-12-31T23:00:00Z", time.Hour, "1969-12-31T23:00:00Z"},
		{"1969-12-31T22:59:59.999999999Z", time.Hour, "1969-12-31T22:00:00Z"},
		{"1900-03-01T12:34:56.5Z", 24 * time.Hour, "1900-03-01T00:00:00Z"},
		{"0001-01-01T00:00:00.5Z", time.Second, "0001-01-01T00:00:00Z"},
		{"9999-12-31T23:59:59.999999999Z", time.Hour, "9999-12-31T23:00:00Z"},
		{"2300-01-01T00:30:00Z", time.Hour, "2300-01-01T00:00:00Z"}, // beyond UnixNano range
	}
	for _, tc := range cases {
		got := Window(utc(tc.t), tc.size)
		if want := utc(tc.want); !got.Equal(want) || got.Location() != time.UTC {
			t.Errorf("Window(%s, %v) = %s, want %s", tc.t, tc.size, got.Format(time.RFC3339Nano), tc.want)
		}
	}
}

func TestWindowLocationAndMonotonic(t *testing.T) {
	now := time.Now() // has a monotonic reading and the Local location
	w := Window(now, time.Minute)
	if w.Location() != time.UTC {
		t.Errorf("location %v", w.Location())
	}
	if w != w.Round(0) {
		t.Error("result carries a monotonic reading")
	}
	in := now.In(time.FixedZone("odd", -(3*3600 + 17*60)))
	if !Window(in, time.Minute).Equal(w) {
		t.Error("result depends on the location of t")
	}
}

// TestWindowMatchesReference compares with exact big-integer floor division
// over a wide range of instants and sizes.
func TestWindowMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []time.Duration{1, 3, time.Microsecond, 999 * time.Millisecond, time.Second, time.Minute,
		time.Hour, 24 * time.Hour, 7 * 24 * time.Hour, 1<<63 - 1}
	for range 20000 {
		sec := rng.Int64N(2*300_000_000_000) - 300_000_000_000 // about ±9500 years
		t0 := time.Unix(sec, rng.Int64N(1e9))
		size := sizes[rng.IntN(len(sizes))]
		if rng.IntN(3) == 0 {
			size = time.Duration(rng.Int64N(1<<62) + 1)
		}
		got := Window(t0, size)
		want := referenceWindow(t0, size)
		if !got.Equal(want) {
			t.Fatalf("Window(%s, %d) = %s, want %s", t0.UTC().Format(time.RFC3339Nano), size,
				got.Format(time.RFC3339Nano), want.Format(time.RFC3339Nano))
		}
		if got.After(t0) || !t0.Before(got.Add(size)) {
			t.Fatalf("Window(%v, %d) = %v does not contain t", t0, size, got)
		}
	}
}

func referenceWindow(t time.Time, size time.Duration) time.Time {
	n := new(big.Int).Mul(big.NewInt(t.Unix()), big.NewInt(1e9))
	n.Add(n, big.NewInt(int64(t.Nanosecond())))
	d := big.NewInt(int64(size))
	q := new(big.Int)
	m := new(big.Int)
	q.DivMod(n, d, m) // Euclidean: m >= 0, i.e. floor for positive d
	return t.Add(-time.Duration(m.Int64())).UTC()
}

func TestWindowPanicsOnNonPositiveSize(t *testing.T) {
	for _, size := range []time.Duration{0, -time.Hour} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Window(_, %v) did not panic", size)
				}
			}()
			Window(time.Now(), size)
		}()
	}
}
