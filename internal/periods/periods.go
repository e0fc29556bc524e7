package periods

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Settings are the period settings of an instance, or of a ledger.
type Settings struct {
	Period event.Period
	// Close: windows close (WINDOW_CLOSE_AFTER set).
	Close bool
}

// Equal reports whether s and o are the same settings.
func (s Settings) Equal(o Settings) bool { return s.Period.Equal(o.Period) && s.Close == o.Close }

// ParsePeriod reads BILLING_WINDOW and BILLING_TIMEZONE as the service
// accepts them: a duration of whole seconds, at least 1s, or day or month.
func ParsePeriod(window, zone string) (event.Period, error) {
	p, err := event.ParsePeriod(window, zone)
	if err != nil {
		return event.Period{}, err
	}
	if !p.Calendar() && (p.Size() < time.Second || p.Size()%time.Second != 0) {
		return event.Period{}, fmt.Errorf("window %s: want a whole number of seconds, at least 1s, day or month", window)
	}
	return p, nil
}

// Definition is one row of ledger_periods: settings in force from From on.
type Definition struct {
	Seq int
	// From is the first instant of occurred_at the definition applies to;
	// zero: from the beginning, replacing every earlier definition (the
	// first, or one made before anything was counted).
	From time.Time
	Settings
	RecordedAt time.Time
	RecordedBy string
}

// Stored are a ledger's definitions, in order; empty for a ledger on which
// no instance of this version has started.
type Stored []Definition

// Current are the settings in force for new events: the last definition's.
func (s Stored) Current() Settings { return s[len(s)-1].Settings }

// Schedule is the ledger's windows over time. A definition that keeps its
// predecessor's period (a change of closing only) adds no step; one from
// the same instant as its predecessor replaces it (nothing was counted
// under that one).
func (s Stored) Schedule() (event.Schedule, error) {
	if len(s) == 0 {
		return event.Schedule{}, errors.New("no period settings stored")
	}
	var first event.Period
	var later []event.Step
	for i, d := range s {
		switch {
		case i == 0 || d.From.IsZero():
			first, later = d.Period, nil
		case d.Period.Equal(current(first, later)):
		case len(later) > 0 && d.From.Equal(later[len(later)-1].From):
			later[len(later)-1].Period = d.Period
		default:
			later = append(later, event.Step{From: d.From, Period: d.Period})
		}
	}
	return event.NewSchedule(first, later...)
}

func current(first event.Period, later []event.Step) event.Period {
	if len(later) == 0 {
		return first
	}
	return later[len(later)-1].Period
}

// Describe is the schedule in words: "month in Europe/Berlin", or "1h0m0s,
// then day in UTC from 2026-12-01T00:00:00Z".
func (s Stored) Describe() string {
	sched, err := s.Schedule()
	if err != nil {
		return "invalid: " + err.Error()
	}
	return sched.String()
}

// Difference is one setting on which an instance and its ledger differ.
type Difference struct {
	Setting  string // BILLING_WINDOW, BILLING_TIMEZONE or WINDOW_CLOSE_AFTER
	Ledger   string // the ledger's value
	Instance string // the instance's
}

// Diff lists the settings on which instance differs from ledger;
// closeAfter is the instance's WINDOW_CLOSE_AFTER, named in the message.
// BILLING_TIMEZONE matters only to calendar periods (fixed windows are in
// UTC whatever it says), so it differs only where both are calendar.
func Diff(ledger, instance Settings, closeAfter time.Duration) []Difference {
	var d []Difference
	lp, ip := ledger.Period, instance.Period
	if lp.Unit() != ip.Unit() {
		d = append(d, Difference{"BILLING_WINDOW", lp.Unit(), ip.Unit()})
	}
	if lp.Calendar() && ip.Calendar() && lp.Zone() != ip.Zone() {
		d = append(d, Difference{"BILLING_TIMEZONE", lp.Zone(), ip.Zone()})
	}
	if ledger.Close != instance.Close {
		d = append(d, Difference{"WINDOW_CLOSE_AFTER", closing(ledger.Close, 0), closing(instance.Close, closeAfter)})
	}
	return d
}

// closing names whether windows close, with the delay when known.
func closing(close bool, after time.Duration) string {
	switch {
	case !close:
		return "empty (windows never close)"
	case after > 0:
		return after.String() + " (windows close)"
	}
	return "set (windows close)"
}

// MismatchError refuses what is not the ledger's: an instance (or an
// expected file, Of) whose period settings differ from the stored ones
// (Differences), or, on a ledger with none stored yet, whose settings its
// rows contradict, or a ledger whose settings changed under a running
// instance (Problems, each a sentence). The service exits with status 4
// on it.
type MismatchError struct {
	Differences []Difference
	Problems    []string
	// Of names what differs from the ledger; empty: this instance, which
	// is then told what to do.
	Of string
}

func (e *MismatchError) Error() string {
	if len(e.Differences) == 0 {
		return strings.Join(e.Problems, "; ")
	}
	of := e.Of
	if of == "" {
		of = "this instance"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s's period settings differ from the ledger's (stored in ledger_periods):", of)
	for i, d := range e.Differences {
		sep := ","
		if i == len(e.Differences)-1 {
			sep = ""
		}
		fmt.Fprintf(&b, " %s is %s in the ledger, %s here%s", d.Setting, d.Ledger, d.Instance, sep)
	}
	if e.Of == "" {
		b.WriteString("; start it with the ledger's settings, or change them with `billing periods change` while every instance is stopped (docs/operations.md)")
	}
	return b.String()
}

// Change is a requested change of the settings; a nil field keeps the
// ledger's value.
type Change struct {
	Window, Timezone *string
	Close            *bool
}

// Plan is a change decided on a ledger's state.
type Plan struct {
	Previous, Next Settings
	// From is where the new period takes effect: the first window start
	// of the new period strictly after Counted (zero: from the beginning,
	// nothing having been counted). Equal to Counted's if the period
	// does not change.
	From time.Time
	// Counted is the latest instant the old definitions keep: the latest
	// watermark, the frontier, the end of the latest window with a row,
	// the start of the current definition.
	Counted time.Time
}

// PeriodChanged reports whether the plan changes the windows (not only
// closing).
func (p Plan) PeriodChanged() bool { return !p.Previous.Period.Equal(p.Next.Period) }

// ErrNoChange: the change asks for the settings the ledger has.
var ErrNoChange = errors.New("the ledger already has these settings: nothing to change")

// PlanChange decides req on a ledger whose definitions are stored, whose
// latest counted instant is counted (see Plan.Counted; zero: nothing
// counted) and whose frontier is f. It refuses a ledger without stored
// settings, a change to what the ledger has, and turning closing off once
// windows have closed.
func PlanChange(stored Stored, req Change, counted time.Time, f driver.Frontier) (Plan, error) {
	if len(stored) == 0 {
		return Plan{}, errors.New("this ledger has no period settings stored: the first instance of this version to start stores its own; start one, then change them")
	}
	prev := stored.Current()
	window, zone := prev.Period.Unit(), prev.Period.Zone()
	if req.Window != nil {
		window = *req.Window
	}
	if req.Timezone != nil {
		zone = *req.Timezone
	}
	p, err := ParsePeriod(window, zone)
	if err != nil {
		return Plan{}, err
	}
	next := Settings{Period: p, Close: prev.Close}
	if req.Close != nil {
		next.Close = *req.Close
	}
	if next.Equal(prev) {
		return Plan{}, ErrNoChange
	}
	if prev.Close && !next.Close && !f.Closed.IsZero() {
		return Plan{}, fmt.Errorf("windows of this ledger have closed (window_frontier.closed_before %s): closing, once on, stays on; a larger WINDOW_CLOSE_AFTER delays it instead",
			f.Closed.UTC().Format(time.RFC3339))
	}
	after := laterOf(laterOf(counted, f.Closed), f.Sealed)
	if from := lastFrom(stored); !from.IsZero() {
		// Not before the current definition's own start: it keeps the
		// instants it was given (or, from that very instant, is replaced).
		after = laterOf(after, from.Add(-time.Nanosecond))
	}
	plan := Plan{Previous: prev, Next: next, Counted: after}
	switch {
	case !plan.PeriodChanged():
		plan.From = after
	case after.IsZero():
		// Nothing counted, nothing closed: the new period replaces the
		// old from the beginning.
	default:
		plan.From = event.FirstStartAfter(p, after)
	}
	return plan, nil
}

// Definition is the row the plan appends after stored.
func (p Plan) Definition(stored Stored, at time.Time, by string) Definition {
	from := p.From
	if !p.PeriodChanged() {
		from = stored[len(stored)-1].From // the windows stay as they are
	}
	return Definition{Seq: stored[len(stored)-1].Seq + 1, From: from, Settings: p.Next, RecordedAt: at, RecordedBy: by}
}

// lastFrom is where the current windows took effect (zero: from the
// beginning).
func lastFrom(stored Stored) time.Time {
	sched, err := stored.Schedule()
	if err != nil {
		return time.Time{}
	}
	steps := sched.Steps()
	return steps[len(steps)-1].From
}

func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
