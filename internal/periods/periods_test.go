package periods

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink/driver"
)

func mustPeriod(t testing.TB, window, zone string) event.Period {
	t.Helper()
	p, err := ParsePeriod(window, zone)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ptr[T any](v T) *T { return &v }

func TestDiffNamesEachSetting(t *testing.T) {
	month, day := mustPeriod(t, "month", "Europe/Berlin"), mustPeriod(t, "day", "Europe/Berlin")
	monthUTC, hour := mustPeriod(t, "month", "UTC"), mustPeriod(t, "60m", "Europe/Berlin")
	for _, tc := range []struct {
		name             string
		ledger, instance Settings
		want             string
	}{
		{"same", Settings{month, true}, Settings{month, true}, ""},
		{"same hour, zone ignored", Settings{mustPeriod(t, "1h", "UTC"), false}, Settings{hour, false}, ""},
		{"window", Settings{month, true}, Settings{day, true}, "BILLING_WINDOW month day"},
		{"zone", Settings{month, true}, Settings{monthUTC, true}, "BILLING_TIMEZONE Europe/Berlin UTC"},
		{"closing off here", Settings{hour, true}, Settings{hour, false}, "WINDOW_CLOSE_AFTER set (windows close) empty (windows never close)"},
		{"closing on here", Settings{hour, false}, Settings{hour, true}, "WINDOW_CLOSE_AFTER empty (windows never close) 48h0m0s (windows close)"},
		{"all", Settings{month, false}, Settings{hour, true}, "BILLING_WINDOW month 1h0m0s WINDOW_CLOSE_AFTER empty (windows never close) 48h0m0s (windows close)"},
	} {
		var got []string
		for _, d := range Diff(tc.ledger, tc.instance, 48*time.Hour) {
			got = append(got, d.Setting, d.Ledger, d.Instance)
		}
		if g := strings.Join(got, " "); g != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, g, tc.want)
		}
	}
	err := &MismatchError{Differences: Diff(Settings{month, true}, Settings{day, false}, 0)}
	for _, want := range []string{"BILLING_WINDOW is month in the ledger, day here", "WINDOW_CLOSE_AFTER is set (windows close) in the ledger, empty (windows never close) here", "billing periods change"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
}

// A change takes effect at the first window start of the new period
// strictly after everything counted and closed, for the class of periods,
// counted instants and frontiers (generated): under the resulting schedule
// every counted instant keeps its window, start and all, and stays inside
// it; the new windows start at the change; a second change cannot go back
// before the first.
func TestPlanChangeKeepsEveryCountedEventsWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 3))
	var periods []event.Period
	for _, w := range []string{"1h", "15m", "24h", "168h", "90s"} {
		periods = append(periods, mustPeriod(t, w, "UTC"))
	}
	for _, zone := range []string{"UTC", "Europe/Berlin", "America/Havana", "Australia/Lord_Howe", "Asia/Kathmandu"} {
		periods = append(periods, mustPeriod(t, "day", zone), mustPeriod(t, "month", zone))
	}
	base := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	for round := range 500 {
		old := periods[rng.IntN(len(periods))]
		next := periods[rng.IntN(len(periods))]
		if next.Equal(old) {
			continue
		}
		counted := base.Add(-time.Duration(rng.Int64N(int64(400 * 24 * time.Hour))))
		var f driver.Frontier
		if rng.IntN(2) == 0 {
			f.Closed = old.Start(counted.Add(-time.Duration(rng.Int64N(int64(60 * 24 * time.Hour)))))
			f.Sealed = f.Closed
		}
		stored := Stored{{Seq: 1, Settings: Settings{old, f.Closed.IsZero() && rng.IntN(2) == 0}}}
		plan, err := PlanChange(stored, Change{Window: ptr(next.Unit()), Timezone: ptr(next.Zone())}, counted, f)
		if err != nil {
			t.Fatalf("round %d: %v -> %v: %v", round, old, next, err)
		}
		if !plan.From.After(counted) || !plan.From.After(f.Closed) || !next.Start(plan.From).Equal(plan.From) {
			t.Fatalf("round %d: %v -> %v after %v (frontier %v): from %v", round, old, next, counted, f.Closed, plan.From)
		}
		if prev := event.FirstStartAfter(next, counted); plan.From.After(prev) && prev.After(f.Closed) {
			t.Fatalf("round %d: from %v, but %v is an earlier window start after everything", round, plan.From, prev)
		}
		def := plan.Definition(stored, base, "test")
		sched, err := append(stored, def).Schedule()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for range 50 {
			x := counted.Add(-time.Duration(rng.Int64N(int64(500 * 24 * time.Hour))))
			if s := sched.Start(x); !s.Equal(old.Start(x)) || !sched.End(s).After(x) {
				t.Fatalf("round %d (%v): a counted event at %v moved from %v to %v..%v", round, sched, x, old.Start(x), s, sched.End(s))
			}
			y := plan.From.Add(time.Duration(rng.Int64N(int64(500 * 24 * time.Hour))))
			if s := sched.Start(y); !s.Equal(next.Start(y)) {
				t.Fatalf("round %d (%v): an event at %v after the change is in %v, want %v", round, sched, y, s, next.Start(y))
			}
		}
		// A second change right away, nothing counted since: not before
		// the first.
		then := periods[rng.IntN(len(periods))]
		if then.Equal(next) {
			continue
		}
		stored2 := append(stored, def)
		plan2, err := PlanChange(stored2, Change{Window: ptr(then.Unit()), Timezone: ptr(then.Zone())}, counted, f)
		if err != nil {
			t.Fatalf("round %d, second change: %v", round, err)
		}
		if plan2.From.Before(plan.From) {
			t.Fatalf("round %d: the second change takes effect at %v, before the first's %v", round, plan2.From, plan.From)
		}
		if _, err := append(stored2, plan2.Definition(stored2, base, "test")).Schedule(); err != nil {
			t.Fatalf("round %d, second change: %v", round, err)
		}
	}
}

func TestPlanChangeRefusals(t *testing.T) {
	hour, day := mustPeriod(t, "1h", "UTC"), mustPeriod(t, "day", "UTC")
	stored := Stored{{Seq: 1, Settings: Settings{hour, true}}}
	closed := driver.Frontier{Closed: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)}
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	if _, err := PlanChange(nil, Change{Window: ptr("day")}, now, closed); err == nil || !strings.Contains(err.Error(), "no period settings stored") {
		t.Errorf("nothing stored: %v", err)
	}
	if _, err := PlanChange(stored, Change{Window: ptr("60m")}, now, closed); !errors.Is(err, ErrNoChange) {
		t.Errorf("the same window: %v", err)
	}
	if _, err := PlanChange(stored, Change{Close: ptr(false)}, now, closed); err == nil || !strings.Contains(err.Error(), "stays on") {
		t.Errorf("closing off after windows closed: %v", err)
	}
	if _, err := PlanChange(stored, Change{Window: ptr("1500ms")}, now, closed); err == nil {
		t.Error("a window of 1.5 s accepted")
	}
	if p, err := PlanChange(stored, Change{Close: ptr(false)}, now, driver.Frontier{}); err != nil || p.Next.Close || p.PeriodChanged() {
		t.Errorf("closing off before anything closed: %+v, %v", p, err)
	}
	p, err := PlanChange(Stored{{Seq: 1, Settings: Settings{hour, false}}}, Change{Window: ptr("day")}, time.Time{}, driver.Frontier{})
	if err != nil || !p.From.IsZero() || !p.Next.Period.Equal(day) {
		t.Fatalf("nothing counted: %+v, %v; want day from the beginning", p, err)
	}
	s, err := Stored{{Seq: 1, Settings: Settings{hour, false}}, p.Definition(stored, now, "t")}.Schedule()
	if err != nil || len(s.Steps()) != 1 || !s.Latest().Equal(day) {
		t.Fatalf("nothing counted: schedule %v (%v), want day alone", s, err)
	}
	// Closing only: the windows stay as they are.
	p, err = PlanChange(Stored{{Seq: 1, Settings: Settings{hour, false}}}, Change{Close: ptr(true)}, now, driver.Frontier{})
	if err != nil || p.PeriodChanged() || !p.Next.Close {
		t.Fatalf("closing on: %+v, %v", p, err)
	}
	s, err = Stored{{Seq: 1, Settings: Settings{hour, false}}, p.Definition(stored, now, "t")}.Schedule()
	if err != nil || len(s.Steps()) != 1 || !s.Latest().Equal(hour) {
		t.Fatalf("closing on: schedule %v (%v), want the hour alone", s, err)
	}
}
