package ledgercheck

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // as the service: zones do not depend on the host
)

// Period is the billing window of the model: fixed windows aligned to the
// Unix epoch (WindowStart), or calendar days or months in a time zone. The
// calendar computation is the model's own, written from the definition
// rather than from the service's code: a calendar day (month) starts at the
// first instant whose local date is that day (in that month), found by
// bisection over the seconds before t. Zone changes happen on whole
// seconds, so the first such second is the start.
type Period struct {
	unit string // "" fixed, "day", "month"
	size time.Duration
	loc  *time.Location
}

// NewPeriod reads a BILLING_WINDOW setting (a Go duration, day or month)
// and a BILLING_TIMEZONE ("" means UTC; ignored for durations).
func NewPeriod(window, zone string) (Period, error) {
	if zone == "" {
		zone = "UTC"
	}
	switch window {
	case "day", "month":
		loc, err := time.LoadLocation(zone)
		if err != nil || zone == "Local" {
			return Period{}, fmt.Errorf("time zone %q: want an IANA name (%v)", zone, err)
		}
		return Period{unit: window, loc: loc}, nil
	}
	d, err := time.ParseDuration(window)
	if err != nil {
		return Period{}, fmt.Errorf("window %q: want a duration, day or month", window)
	}
	if err := checkWindow(d); err != nil {
		return Period{}, err
	}
	return Period{size: d}, nil
}

// Fixed is the period of fixed windows of size d.
func Fixed(d time.Duration) (Period, error) { return NewPeriod(d.String(), "") }

// Calendar reports whether p is a calendar period; Size is the length of
// fixed windows (0 for calendar periods).
func (p Period) Calendar() bool      { return p.unit != "" }
func (p Period) Size() time.Duration { return p.size }

// Next returns the start of the window after the one starting at start.
func (p Period) Next(start time.Time) time.Time {
	switch p.unit {
	case "":
		return start.Add(p.size).UTC()
	case "day": // a local day lasts 23 to 25 hours (24.5 at most elsewhere)
		return p.Start(start.Add(26 * time.Hour))
	}
	return p.Start(start.Add(32 * 24 * time.Hour)) // months last 28 to 31 days
}

// Window is the BILLING_WINDOW text of p: "1h0m0s", "day" or "month".
func (p Period) Window() string {
	if p.unit != "" {
		return p.unit
	}
	return p.size.String()
}

// Zone is the BILLING_TIMEZONE of a calendar period, "" for fixed windows.
func (p Period) Zone() string {
	if p.loc == nil {
		return ""
	}
	return p.loc.String()
}

func (p Period) String() string {
	if p.unit == "" {
		return p.size.String()
	}
	return p.unit + " in " + p.loc.String()
}

// Start returns the start of the window that contains t, in UTC.
func (p Period) Start(t time.Time) time.Time {
	if p.unit == "" {
		return WindowStart(t, p.size)
	}
	key := p.key(t)
	// A local day lasts at most 26 hours and a month at most 32 days:
	// lo is in an earlier period.
	lo := t.Unix() - 3*86400
	if p.unit == "month" {
		lo = t.Unix() - 33*86400
	}
	hi := t.Unix() // key(hi) == key; find the first second with it
	for lo+1 < hi {
		mid := lo + (hi-lo)/2
		if p.key(time.Unix(mid, 0)) < key {
			lo = mid
		} else {
			hi = mid
		}
	}
	return time.Unix(hi, 0).UTC()
}

// key orders the local periods: year, month and (for days) day.
func (p Period) key(t time.Time) int64 {
	y, m, d := t.In(p.loc).Date()
	if p.unit == "month" {
		d = 0
	}
	return int64(y)*10000 + int64(m)*100 + int64(d)
}

// aligned reports whether s is a window start of p.
func (p Period) aligned(s time.Time) bool { return p.Start(s).Equal(s) }

// EntryDigest is the contribution of one counted event to the digest of
// the ledger entries: the first 8 bytes of the SHA-256 of its id, account,
// amount, currency and time (UTC, microseconds, as ledger_entries stores
// it). The digest of a set of events is the sum of their contributions
// modulo 2^64, so it does not depend on the order of the entries.
func EntryDigest(e Event) uint64 {
	var b strings.Builder
	b.WriteString(e.EventID)
	b.WriteByte(0)
	b.WriteString(e.AccountID)
	b.WriteByte(0)
	b.WriteString(e.Currency)
	b.WriteByte(0)
	var n [16]byte
	binary.BigEndian.PutUint64(n[:8], uint64(e.AmountMinor))
	binary.BigEndian.PutUint64(n[8:], uint64(e.OccurredAt.Truncate(time.Microsecond).UnixMicro()))
	b.Write(n[:])
	sum := sha256.Sum256([]byte(b.String()))
	return binary.BigEndian.Uint64(sum[:8])
}
