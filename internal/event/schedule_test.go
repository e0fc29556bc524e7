package event

import (
	"math/rand/v2"
	"testing"
	"time"
)

// A schedule of periods, for the class of changes between fixed windows
// and calendar days and months in zones with every kind of change: windows
// tile time across each change (the last old window ends where the first
// new one starts), each definition rules its instants, and Start never
// decreases (a frontier computed with it only grows).
func TestScheduleTilesTimeAcrossChanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 3))
	periods := []Period{MustFixed(time.Hour), MustFixed(15 * time.Minute), MustFixed(7 * 24 * time.Hour), MustFixed(90 * time.Second)}
	for _, zone := range []string{"UTC", "Europe/Berlin", "America/Havana", "Asia/Kolkata", "Australia/Lord_Howe", "Pacific/Apia"} {
		for _, unit := range []string{"day", "month"} {
			p, err := Calendar(unit, zone)
			if err != nil {
				t.Fatal(err)
			}
			periods = append(periods, p)
		}
	}
	lo := time.Date(2011, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	for round := range 300 {
		first := periods[rng.IntN(len(periods))]
		var steps []Step
		at := time.Unix(lo+rng.Int64N(10*365*86400), rng.Int64N(1e9)).UTC()
		for range 1 + rng.IntN(3) {
			next := periods[rng.IntN(len(periods))]
			from := FirstStartAfter(next, at)
			if !from.After(at) || !next.Start(from).Equal(from) {
				t.Fatalf("FirstStartAfter(%v, %v) = %v: not a later window start", next, at, from)
			}
			steps = append(steps, Step{From: from, Period: next})
			at = from.Add(time.Duration(rng.Int64N(int64(90 * 24 * time.Hour))))
		}
		s, err := NewSchedule(first, steps...)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		// Walk window by window across every change.
		w := s.Start(steps[0].From.Add(-40 * 24 * time.Hour))
		end := steps[len(steps)-1].From.Add(40 * 24 * time.Hour)
		for n := 0; w.Before(end) && n < 200000; n++ {
			e := s.End(w)
			if !e.After(w) {
				t.Fatalf("round %d (%v): window %v ends at %v", round, s, w, e)
			}
			if got := s.Start(e); !got.Equal(e) {
				t.Fatalf("round %d (%v): the window after %v..%v starts at %v", round, s, w, e, got)
			}
			mid := w.Add(e.Sub(w) / 2)
			if got := s.Start(mid); !got.Equal(w) {
				t.Fatalf("round %d (%v): Start(%v) = %v, want %v", round, s, mid, got, w)
			}
			if got := s.Start(e.Add(-time.Nanosecond)); !got.Equal(w) {
				t.Fatalf("round %d (%v): the last instant of %v..%v is in %v", round, s, w, e, got)
			}
			w = e
		}
		// Each definition rules its instants; Start never decreases.
		prev := time.Time{}
		for i := range 200 {
			tt := steps[0].From.Add(time.Duration(int64(i-100) * int64(time.Hour) * 7))
			def := first
			for _, st := range steps {
				if !tt.Before(st.From) {
					def = st.Period
				}
			}
			if got, want := s.Start(tt), def.Start(tt); !got.Equal(want) {
				t.Fatalf("round %d (%v): Start(%v) = %v, want %v's %v", round, s, tt, got, def, want)
			}
			if got := s.Start(tt); got.Before(prev) {
				t.Fatalf("round %d (%v): Start went back from %v to %v at %v", round, s, prev, got, tt)
			}
			prev = s.Start(tt)
		}
	}
}

func TestScheduleRefusesWhatCannotTile(t *testing.T) {
	hour, day := MustFixed(time.Hour), MustFixed(24*time.Hour)
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for name, steps := range map[string][]Step{
		"not a window start": {{From: at.Add(time.Hour), Period: day}},
		"from the beginning": {{Period: day}},
		"not increasing":     {{From: at, Period: day}, {From: at, Period: hour}},
		"zero period":        {{From: at}},
	} {
		if _, err := NewSchedule(hour, steps...); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := NewSchedule(Period{}); err == nil {
		t.Error("zero first period accepted")
	}
	s, err := NewSchedule(hour, Step{From: at, Period: day})
	if err != nil {
		t.Fatal(err)
	}
	if s.String() != "1h0m0s, 24h0m0s from 2026-12-01T00:00:00Z" || s.Latest() != day || len(s.Steps()) != 2 {
		t.Errorf("%v, latest %v", s, s.Latest())
	}
}
