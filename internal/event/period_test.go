package event

import (
	"math/rand/v2"
	"testing"
	"time"
)

func mustPeriod(t *testing.T, window, zone string) Period {
	t.Helper()
	p, err := ParsePeriod(window, zone)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Calendar periods in Europe/Berlin across both daylight-saving changes of
// 2026 (29 March: 02:00 CET → 03:00 CEST; 25 October: 03:00 CEST → 02:00
// CET): days of 23 and 25 hours, months that start at 23:00 or 22:00 UTC.
func TestCalendarPeriodsBerlin(t *testing.T) {
	day := mustPeriod(t, "day", "Europe/Berlin")
	month := mustPeriod(t, "month", "Europe/Berlin")
	cases := []struct {
		p          Period
		at         string
		start, end string
	}{
		// The spring change: 29 March lasts 23 hours.
		{day, "2026-03-29T00:30:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z"},
		{day, "2026-03-29T21:59:59.999999999Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z"},
		{day, "2026-03-29T22:00:00Z", "2026-03-29T22:00:00Z", "2026-03-30T22:00:00Z"},
		{day, "2026-03-28T22:59:59Z", "2026-03-27T23:00:00Z", "2026-03-28T23:00:00Z"},
		// The autumn change: 25 October lasts 25 hours.
		{day, "2026-10-24T22:00:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"},
		{day, "2026-10-25T22:30:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"},
		{day, "2026-10-25T23:00:00Z", "2026-10-25T23:00:00Z", "2026-10-26T23:00:00Z"},
		// An instant written with another offset is the same instant.
		{day, "2026-10-26T00:30:00+01:00", "2026-10-25T23:00:00Z", "2026-10-26T23:00:00Z"},
		// Months: March starts in winter time and ends in summer time.
		{month, "2026-03-15T12:00:00Z", "2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z"},
		{month, "2026-02-28T23:00:00Z", "2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z"},
		{month, "2026-02-28T22:59:59.999Z", "2026-01-31T23:00:00Z", "2026-02-28T23:00:00Z"}, // still February in Berlin
		{month, "2026-03-31T22:00:00Z", "2026-03-31T22:00:00Z", "2026-04-30T22:00:00Z"},     // 1 April, 00:00 CEST
		{month, "2026-10-31T22:59:59Z", "2026-09-30T22:00:00Z", "2026-10-31T23:00:00Z"},
		{month, "2026-10-31T23:00:00Z", "2026-10-31T23:00:00Z", "2026-11-30T23:00:00Z"},
		{month, "2026-12-31T23:30:00Z", "2026-12-31T23:00:00Z", "2027-01-31T23:00:00Z"}, // new year in Berlin
	}
	for _, c := range cases {
		at := utc(c.at)
		got := c.p.Start(at)
		if want := utc(c.start); !got.Equal(want) || got.Location() != time.UTC {
			t.Errorf("%v: Start(%s) = %s, want %s", c.p, c.at, got.Format(time.RFC3339Nano), c.start)
		}
		if end, want := c.p.End(got), utc(c.end); !end.Equal(want) {
			t.Errorf("%v: End(%s) = %s, want %s", c.p, got.Format(time.RFC3339), end.Format(time.RFC3339), c.end)
		}
	}
	// The day lengths themselves.
	for _, c := range []struct {
		start string
		hours float64
	}{{"2026-03-28T23:00:00Z", 23}, {"2026-10-24T22:00:00Z", 25}, {"2026-06-30T22:00:00Z", 24}} {
		s := utc(c.start)
		if h := day.End(s).Sub(s).Hours(); h != c.hours {
			t.Errorf("day starting %s lasts %vh, want %vh", c.start, h, c.hours)
		}
	}
}

// Every instant lies in the window Start gives it, windows tile time
// without gaps or overlaps, and a start is its own window's start; in
// zones whose daylight-saving changes skip or repeat midnight, too.
func TestPeriodsTileTime(t *testing.T) {
	zones := []string{"UTC", "Europe/Berlin", "America/Havana", "America/Santiago", "America/Sao_Paulo", "Asia/Beirut",
		"America/Asuncion", "Pacific/Apia", "Australia/Lord_Howe", "Asia/Kolkata", "America/St_Johns"}
	rng := rand.New(rand.NewPCG(1, 2))
	lo, hi := utc("1990-01-01T00:00:00Z").Unix(), utc("2040-01-01T00:00:00Z").Unix()
	for _, zone := range zones {
		for _, unit := range []string{"day", "month"} {
			p := mustPeriod(t, unit, zone)
			for range 3000 {
				at := time.Unix(lo+rng.Int64N(hi-lo), rng.Int64N(1e9)).UTC()
				s := p.Start(at)
				e := p.End(s)
				if s.After(at) || !e.After(at) {
					t.Fatalf("%v: %s not in [%s, %s)", p, at, s, e)
				}
				if got := p.Start(e); !got.Equal(e) {
					t.Fatalf("%v: the window after [%s, %s) starts at %s", p, s, e, got)
				}
				if got := p.Start(e.Add(-time.Nanosecond)); !got.Equal(s) {
					t.Fatalf("%v: the last instant before %s is in the window of %s, not %s", p, e, got, s)
				}
				// Local midnight (or the change that skipped it) of the
				// first of the month, or of the day.
				ls := s.In(p.loc)
				if unit == "month" && ls.Day() != 1 {
					t.Fatalf("%v: month starts %s", p, ls)
				}
				if ly, lm, ld := at.In(p.loc).Date(); unit == "day" && (ls.Year() != ly || ls.Month() != lm || ls.Day() != ld) {
					t.Fatalf("%v: %s (local %s) is in the day starting %s", p, at, at.In(p.loc), ls)
				}
			}
		}
	}
}

// Where a daylight-saving change skips midnight (Havana, 8 March 2026:
// 00:00 CST → 01:00 CDT), the day starts at the change.
func TestDayStartsAtTheChangeThatSkipsMidnight(t *testing.T) {
	p := mustPeriod(t, "day", "America/Havana")
	at := utc("2026-03-08T12:00:00Z")
	s := p.Start(at)
	if want := utc("2026-03-08T05:00:00Z"); !s.Equal(want) {
		t.Fatalf("Havana's 8 March 2026 starts at %s, want %s (01:00 CDT)", s, want)
	}
	prev := p.Start(s.Add(-time.Second))
	if end := p.End(prev); !end.Equal(s) || s.Sub(prev) != 24*time.Hour {
		t.Fatalf("7 March: [%s, %s), want 24 hours ending at %s", prev, end, s)
	}
}

func TestFixedPeriodIsWindow(t *testing.T) {
	p := mustPeriod(t, "1h", "Europe/Berlin") // the zone does not apply
	at := utc("2026-03-29T01:30:00Z")
	if got := p.Start(at); !got.Equal(Window(at, time.Hour)) {
		t.Fatalf("Start = %s", got)
	}
	if got := p.End(utc("2026-03-29T01:00:00Z")); !got.Equal(utc("2026-03-29T02:00:00Z")) {
		t.Fatalf("End = %s", got)
	}
	if p.Calendar() || p.Unit() != "1h0m0s" || p.Zone() != "UTC" {
		t.Fatalf("%v: calendar %v unit %q zone %q", p, p.Calendar(), p.Unit(), p.Zone())
	}
}

func TestParsePeriod(t *testing.T) {
	for _, c := range []struct {
		window, zone, want string
	}{
		{"1h", "UTC", "1h0m0s"},
		{"15m", "Europe/Berlin", "15m0s"},
		{"month", "Europe/Berlin", "month in Europe/Berlin"},
		{"day", "UTC", "day in UTC"},
	} {
		p, err := ParsePeriod(c.window, c.zone)
		if err != nil || p.String() != c.want {
			t.Errorf("ParsePeriod(%q, %q) = %v, %v; want %s", c.window, c.zone, p, err, c.want)
		}
	}
	for _, c := range []struct{ window, zone string }{
		{"week", "UTC"}, {"0s", "UTC"}, {"-1h", "UTC"}, {"1ns", "UTC"}, {"month", "Mars/Olympus"}, {"day", ""}, {"day", "Local"},
		{"1h", "Europe/Berln"}, // ignored for durations, but still a typo
	} {
		if p, err := ParsePeriod(c.window, c.zone); err == nil {
			t.Errorf("ParsePeriod(%q, %q) = %v, want an error", c.window, c.zone, p)
		}
	}
}
