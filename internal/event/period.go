package event

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	// The zone database is compiled in: the container image has none, and
	// a calendar period must not depend on the host's files.
	_ "time/tzdata"
)

// Period is the billing window: either tumbling windows of a fixed length
// aligned to the Unix epoch in UTC (see Window), or calendar days or months
// in a time zone, aligned to local midnight and to the first of the month.
// Calendar periods follow daylight saving time: a local day lasts 23, 24 or
// 25 hours. The zero Period is not usable.
//
// A window is named by its start, an instant (returned in UTC, as stored in
// window_start); it covers [Start(t), End(Start(t))).
type Period struct {
	unit string         // "" (fixed), "day" or "month"
	size time.Duration  // fixed windows
	loc  *time.Location // calendar periods
}

// Fixed returns epoch-aligned windows of the given size, a positive whole
// number of microseconds (window_start is a DATETIME(6)).
func Fixed(size time.Duration) (Period, error) {
	if size <= 0 || size%time.Microsecond != 0 {
		return Period{}, fmt.Errorf("window %v must be a positive whole number of microseconds", size)
	}
	return Period{size: size}, nil
}

// MustFixed is Fixed for sizes known to be valid (tests, constants); it
// panics on an invalid one.
func MustFixed(size time.Duration) Period {
	p, err := Fixed(size)
	if err != nil {
		panic("event: " + err.Error())
	}
	return p
}

// Calendar returns calendar days ("day") or months ("month") in the IANA
// zone named zone ("UTC" for UTC).
func Calendar(unit, zone string) (Period, error) {
	if unit != "day" && unit != "month" {
		return Period{}, fmt.Errorf("calendar period %q: want day or month", unit)
	}
	loc, err := LoadZone(zone)
	if err != nil {
		return Period{}, err
	}
	return Period{unit: unit, loc: loc}, nil
}

// ParsePeriod reads a BILLING_WINDOW setting: a Go duration ("1h") or day
// or month; zone (BILLING_TIMEZONE) applies to calendar periods only, but
// must name a zone in any case, so that a typo is reported whatever the
// window.
func ParsePeriod(window, zone string) (Period, error) {
	loc, zerr := LoadZone(zone)
	w := strings.TrimSpace(window)
	switch w {
	case "day", "month":
		if zerr != nil {
			return Period{}, zerr
		}
		return Period{unit: w, loc: loc}, nil
	}
	d, err := time.ParseDuration(w)
	if err != nil {
		return Period{}, errors.Join(fmt.Errorf("window %q: want a duration (1h), day or month", window), zerr)
	}
	p, err := Fixed(d)
	return p, errors.Join(err, zerr)
}

// LoadZone loads an IANA zone by name from the embedded database; it
// refuses "Local" and the empty name, which would depend on the host.
func LoadZone(name string) (*time.Location, error) {
	if name == "" || name == "Local" {
		return nil, fmt.Errorf("time zone %q: want an IANA zone name such as UTC or Europe/Berlin", name)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("time zone %q: %w", name, err)
	}
	return loc, nil
}

// Equal reports whether p and q define the same windows (== compares the
// zones' pointers, which two loads of one zone do not share).
func (p Period) Equal(q Period) bool {
	return p.unit == q.unit && p.size == q.size && p.Zone() == q.Zone()
}

// IsZero reports whether p is the zero Period.
func (p Period) IsZero() bool { return p.unit == "" && p.size == 0 }

// Calendar reports whether p is a calendar period (day or month).
func (p Period) Calendar() bool { return p.unit != "" }

// Unit is "day" or "month" for calendar periods, and the duration's text
// ("1h0m0s") for fixed windows.
func (p Period) Unit() string {
	if p.unit != "" {
		return p.unit
	}
	return p.size.String()
}

// Zone is the time zone of a calendar period ("UTC" for fixed windows).
func (p Period) Zone() string {
	if p.loc == nil {
		return "UTC"
	}
	return p.loc.String()
}

// Size is the length of fixed windows (0 for calendar periods).
func (p Period) Size() time.Duration { return p.size }

// String describes p: "1h0m0s", "day in Europe/Berlin", "month in UTC".
func (p Period) String() string {
	if p.unit == "" {
		return p.size.String()
	}
	return p.unit + " in " + p.loc.String()
}

// Start returns the start of the window containing t, in UTC, without a
// monotonic clock reading.
func (p Period) Start(t time.Time) time.Time {
	if p.unit == "" {
		return Window(t, p.size)
	}
	y, m, d := t.In(p.loc).Date()
	if p.unit == "month" {
		d = 1
	}
	s := firstInstant(y, m, d, p.loc)
	if s.After(t) {
		// Only if the zone's dates went backwards; the previous period
		// then holds t.
		s = p.prev(s)
	}
	return s.UTC()
}

// End returns the end of the window that starts at start (the start of the
// next one), in UTC. start must be a window start of p.
func (p Period) End(start time.Time) time.Time {
	if p.unit == "" {
		return start.Add(p.size).UTC()
	}
	y, m, d := start.In(p.loc).Date()
	if p.unit == "month" {
		return firstInstant(y, m+1, 1, p.loc).UTC()
	}
	return firstInstant(y, m, d+1, p.loc).UTC()
}

// prev is the start of the period before the one starting at s.
func (p Period) prev(s time.Time) time.Time {
	y, m, d := s.In(p.loc).Date()
	if p.unit == "month" {
		return firstInstant(y, m-1, 1, p.loc)
	}
	return firstInstant(y, m, d-1, p.loc)
}

// firstInstant is the first instant of the local date y-m-d (normalised as
// by time.Date) in loc: its midnight, or, where a daylight-saving change
// skips midnight, the instant of the change. time.Date leaves the choice
// of offset open for a local time that does not exist; it may return an
// instant of the day before, which is corrected here with the zone's
// bounds.
func firstInstant(y int, m time.Month, d int, loc *time.Location) time.Time {
	s := time.Date(y, m, d, 0, 0, 0, 0, loc)
	want := time.Date(y, m, d, 12, 0, 0, 0, time.UTC) // normalised date
	if sy, sm, sd := s.Date(); time.Date(sy, sm, sd, 12, 0, 0, 0, time.UTC).Before(want) {
		if _, end := s.ZoneBounds(); !end.IsZero() {
			s = end
		}
	}
	return s
}

// Windows names the billing window of every instant: a Period, or a
// Schedule of periods. Start returns the start of the window holding t (in
// UTC); End the end of the window that starts at start.
type Windows interface {
	Start(t time.Time) time.Time
	End(start time.Time) time.Time
	String() string
}

// Schedule is a ledger's billing periods over time: each definition
// applies to the instants from its From on, until the next one's From;
// the first from the beginning of time. A ledger's period settings change
// only this way (package periods): each later From is a window start of
// its own period, so its windows tile time from there, and the last
// window of the definition before it is cut at that instant (it ends
// there, earlier than it would have). Start never decreases with t, so a
// frontier computed with it only grows across a change.
type Schedule struct {
	steps []Step
}

// Step is one definition of a Schedule: Period from From on (zero: from
// the beginning; only the first).
type Step struct {
	From   time.Time
	Period Period
}

// NewSchedule returns the schedule of first, replaced by each of later
// from its From on. The instants must grow, and each must be a window
// start of its own period.
func NewSchedule(first Period, later ...Step) (Schedule, error) {
	if first.IsZero() {
		return Schedule{}, errors.New("schedule: the first period is the zero Period")
	}
	s := Schedule{steps: []Step{{Period: first}}}
	for _, st := range later {
		prev := s.steps[len(s.steps)-1]
		switch {
		case st.Period.IsZero():
			return Schedule{}, fmt.Errorf("schedule: the period from %s is the zero Period", st.From.Format(time.RFC3339Nano))
		case st.From.IsZero() || (!prev.From.IsZero() && !st.From.After(prev.From)):
			return Schedule{}, fmt.Errorf("schedule: %v from %s does not follow %v from %s", st.Period, st.From.Format(time.RFC3339Nano), prev.Period, prev.From.Format(time.RFC3339Nano))
		case !st.Period.Start(st.From).Equal(st.From):
			return Schedule{}, fmt.Errorf("schedule: %s is not a window start of %v", st.From.Format(time.RFC3339Nano), st.Period)
		}
		s.steps = append(s.steps, Step{From: st.From.UTC(), Period: st.Period})
	}
	return s, nil
}

// Steps are the schedule's definitions, in order. The caller owns the
// returned slice.
func (s Schedule) Steps() []Step { return slices.Clone(s.steps) }

// Latest is the period of the last definition: the one new events get.
func (s Schedule) Latest() Period { return s.steps[len(s.steps)-1].Period }

// at is the index of the definition that applies to t.
func (s Schedule) at(t time.Time) int {
	i := len(s.steps) - 1
	for i > 0 && t.Before(s.steps[i].From) {
		i--
	}
	return i
}

// Start returns the start of the window containing t, by the definition
// that applies to t.
func (s Schedule) Start(t time.Time) time.Time {
	return s.steps[s.at(t)].Period.Start(t)
}

// End returns the end of the window that starts at start: its period's,
// or the next definition's From if that comes first.
func (s Schedule) End(start time.Time) time.Time {
	i := s.at(start)
	end := s.steps[i].Period.End(start)
	if i+1 < len(s.steps) && s.steps[i+1].From.Before(end) {
		return s.steps[i+1].From
	}
	return end
}

// String describes s: "1h0m0s", or "1h0m0s, day in Europe/Berlin from
// 2026-12-01T23:00:00Z".
func (s Schedule) String() string {
	var b strings.Builder
	for i, st := range s.steps {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(st.Period.String())
		if i > 0 {
			b.WriteString(" from " + st.From.Format(time.RFC3339Nano))
		}
	}
	return b.String()
}

// FirstStartAfter is the first window start of p strictly after t: where a
// change of a ledger's period to p takes effect when t is the latest
// instant already judged by the old one.
func FirstStartAfter(p Period, t time.Time) time.Time {
	return p.End(p.Start(t))
}
