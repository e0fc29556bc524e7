package event

import (
	"math/bits"
	"time"
)

// Window returns the start of the tumbling window of length size that
// contains t. Windows are aligned to the Unix epoch (1970-01-01T00:00:00Z):
// they are the half-open intervals [k*size, (k+1)*size) since the epoch for
// every integer k, so t lies in [Window(t, size), Window(t, size)+size).
// Alignment is by floor, also for instants before 1970 (with size = 1h,
// 1969-12-31T23:30:00Z maps to 1969-12-31T23:00:00Z, not to the epoch).
//
// The result depends only on the instant t, not on its Location; it is in
// UTC and carries no monotonic clock reading. Unlike time.Time.Truncate,
// which aligns to January 1 of year 1, the alignment here is to the Unix
// epoch; the two differ for sizes such as 7*24h (epoch-aligned weeks start
// on Thursdays). Days are 86400 s: time.Time has no leap seconds.
//
// Window panics if size is not positive: a non-positive window is a
// configuration error to be rejected at startup.
func Window(t time.Time, size time.Duration) time.Time {
	if size <= 0 {
		panic("event.Window: non-positive window size " + size.String())
	}
	d := uint64(size)
	sec := t.Unix()
	nsec := uint64(t.Nanosecond())
	// rem = (sec*1e9 + nsec) mod d, computed in 128 bits with floor
	// semantics for negative instants.
	var rem uint64
	if sec >= 0 {
		hi, lo := bits.Mul64(uint64(sec), 1e9)
		lo, carry := bits.Add64(lo, nsec, 0)
		hi += carry
		rem = bits.Rem64(hi, lo, d)
	} else {
		// |t| = -sec*1e9 - nsec > 0; floor mod = (d - |t| mod d) mod d.
		// uint64(-sec) is the magnitude even for math.MinInt64.
		hi, lo := bits.Mul64(uint64(-sec), 1e9)
		lo, borrow := bits.Sub64(lo, nsec, 0)
		hi -= borrow
		if r := bits.Rem64(hi, lo, d); r != 0 {
			rem = d - r
		}
	}
	return t.Add(-time.Duration(rem)).UTC()
}
