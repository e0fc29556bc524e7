package ledgercheck

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/event"
)

// The model's calendar periods (found by bisection from the definition)
// agree with the service's (midnights from time.Date, corrected where a
// change skips midnight), in zones with and without daylight saving,
// changes at midnight included.
func TestPeriodAgreesWithTheService(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	lo, hi := time.Date(1995, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), time.Date(2035, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	for _, zone := range []string{"UTC", "Europe/Berlin", "America/Havana", "America/Santiago", "Asia/Beirut", "Pacific/Apia", "Australia/Lord_Howe", "Asia/Kathmandu"} {
		for _, unit := range []string{"day", "month"} {
			model, err := NewPeriod(unit, zone)
			if err != nil {
				t.Fatal(err)
			}
			svc, err := event.Calendar(unit, zone)
			if err != nil {
				t.Fatal(err)
			}
			for range 2000 {
				at := time.Unix(lo+rng.Int64N(hi-lo), rng.Int64N(1e9))
				if m, s := model.Start(at), svc.Start(at); !m.Equal(s) {
					t.Fatalf("%s in %s, %s: model %s, service %s", unit, zone, at.UTC(), m, s)
				}
			}
		}
	}
	fixed, _ := NewPeriod("15m", "Europe/Berlin")
	if got := fixed.Start(at("2026-03-29T01:59:00Z")); !got.Equal(at("2026-03-29T01:45:00Z")) || fixed.Zone() != "" {
		t.Fatalf("fixed windows: %s, zone %q", got, fixed.Zone())
	}
}

// With closing and one partition, the model knows the split: each event is
// judged against the frontier of the events before and including it, every
// event (repeats too) moving the watermark.
func TestLedgerClosesWindows(t *testing.T) {
	p, _ := NewPeriod("1h", "")
	l, err := NewModelWith(Options{Period: p, CloseAfter: 30 * time.Minute, SplitExact: true, Entries: true})
	if err != nil {
		t.Fatal(err)
	}
	ev := func(id string, amount int64, when string) Event {
		return Event{EventID: id, AccountID: "a", AmountMinor: amount, Currency: "EUR", OccurredAt: at(when)}
	}
	for _, e := range []Event{
		ev("1", 1, "2026-11-29T10:05:00Z"),
		ev("2", 2, "2026-11-29T11:29:00Z"), // 10:00 closes at 11:30
		ev("3", 4, "2026-11-29T10:10:00Z"), // open
		ev("2", 2, "2026-11-29T11:29:00Z"), // a repeat: dropped
		ev("4", 8, "2026-11-29T11:30:00Z"), // closes 10:00
		ev("5", 16, "2026-11-29T10:20:00Z"),
	} {
		l.Add(e)
	}
	// A repeat that moves the watermark closes 11:00 (a conflict: its time
	// differs), though it counts nowhere.
	if o := l.Add(ev("1", 1, "2026-11-29T12:45:00Z")); o != Conflict {
		t.Fatalf("outcome %v", o)
	}
	l.Add(ev("6", 32, "2026-11-29T11:40:00Z"))
	e := l.Expected()
	rows := func(rs []WindowRow) string {
		var s []string
		for _, r := range rs {
			s = append(s, fmt.Sprintf("%s=%d/%d", r.WindowStart.Format("15:04"), r.AmountMinor, r.EventCount))
		}
		return strings.Join(s, " ")
	}
	if got := rows(e.Windows); got != "10:00=5/2 11:00=10/2" {
		t.Errorf("windows %s", got)
	}
	if got := rows(e.Adjustments); got != "10:00=16/1 11:00=32/1" {
		t.Errorf("adjustments %s", got)
	}
	if !e.SplitExact || e.Watermark == nil || !e.Watermark.Equal(at("2026-11-29T12:45:00Z")) || !e.ClosedBefore.Equal(at("2026-11-29T12:00:00Z")) {
		t.Errorf("split %v, watermark %v, closed before %v", e.SplitExact, e.Watermark, e.ClosedBefore)
	}
	var digest uint64
	for _, x := range []Event{ev("1", 1, "2026-11-29T10:05:00Z"), ev("2", 2, "2026-11-29T11:29:00Z"), ev("3", 4, "2026-11-29T10:10:00Z"),
		ev("4", 8, "2026-11-29T11:30:00Z"), ev("5", 16, "2026-11-29T10:20:00Z"), ev("6", 32, "2026-11-29T11:40:00Z")} {
		digest += EntryDigest(x)
	}
	if e.EntriesDigest != digest {
		t.Errorf("digest %x, want %x", e.EntriesDigest, digest)
	}
	b, err := Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Unmarshal(b)
	if err != nil || len(back.Adjustments) != 2 || !back.ClosedBefore.Equal(*e.ClosedBefore) || back.EntriesDigest != digest {
		t.Fatalf("round trip: %v\n%s", err, b)
	}

	// Without the exact split (several partitions), each window holds the
	// sum of both.
	l2, _ := NewModelWith(Options{Period: p, CloseAfter: 30 * time.Minute})
	for _, x := range []Event{ev("1", 1, "2026-11-29T10:05:00Z"), ev("4", 8, "2026-11-29T11:30:00Z"), ev("5", 16, "2026-11-29T10:20:00Z")} {
		l2.Add(x)
	}
	if e2 := l2.Expected(); rows(e2.Windows) != "10:00=17/2 11:00=8/1" || len(e2.Adjustments) != 0 || e2.SplitExact {
		t.Errorf("combined: windows %s, adjustments %v", rows(e2.Windows), e2.Adjustments)
	}
}

// closingCase is an expected ledger with closing and its exact actual
// tables, for the comparison tests.
func closingCase(t *testing.T) (*Expected, *Actual) {
	t.Helper()
	p, _ := NewPeriod("1h", "")
	l, _ := NewModelWith(Options{Period: p, CloseAfter: 30 * time.Minute, Entries: true})
	evs := []Event{
		{"1", "a", 1, "EUR", at("2026-11-29T10:05:00Z")},
		{"2", "a", 2, "EUR", at("2026-11-29T11:40:00Z")},
		{"3", "a", 4, "EUR", at("2026-11-29T10:10:00Z")}, // late on the service, either way in the sum
	}
	for _, e := range evs {
		l.Add(e)
	}
	exp := l.Expected()
	sealed := at("2026-11-29T11:41:00Z")
	act := &Actual{
		Balances: []ActualBalance{{BalanceRow{"a", "EUR", 7, 3}, 0}},
		Windows: []ActualWindow{
			{WindowRow: WindowRow{"a", "EUR", at("2026-11-29T10:00:00Z"), 1, 1}, ClosedAt: &sealed, UpdatedAt: sealed},
			{WindowRow: WindowRow{"a", "EUR", at("2026-11-29T11:00:00Z"), 2, 1}, UpdatedAt: sealed},
		},
		Adjustments: []ActualWindow{{WindowRow: WindowRow{"a", "EUR", at("2026-11-29T10:00:00Z"), 4, 1}, UpdatedAt: sealed}},
		Entries: &Entries{Count: 3, DistinctIDs: 3, Digest: EntryDigest(evs[0]) + EntryDigest(evs[1]) + EntryDigest(evs[2]),
			Timely: map[WindowKey]Sum{{"a", "EUR", at("2026-11-29T10:00:00Z").UnixMicro()}: {1, 1}, {"a", "EUR", at("2026-11-29T11:00:00Z").UnixMicro()}: {2, 1}},
			Late:   map[WindowKey]Sum{{"a", "EUR", at("2026-11-29T10:00:00Z").UnixMicro()}: {4, 1}}},
	}
	return exp, act
}

func TestCompareClosing(t *testing.T) {
	exp, act := closingCase(t)
	if r := Compare(exp, act); !r.Exact() {
		var b strings.Builder
		_ = r.WriteDiffs(&b, 0)
		t.Fatalf("%s\n%s", r.Verdict(), b.String())
	} else if !strings.Contains(r.Verdict(), "1 sealed windows, 1 adjustments, 3 ledger entries") {
		t.Errorf("verdict %q", r.Verdict())
	}
	tests := []struct {
		name   string
		break_ func(*Actual)
		want   string
	}{
		{"the event counted in its window instead: the sums hold, the entries must agree", func(a *Actual) {
			a.Windows[0].AmountMinor, a.Windows[0].EventCount = 5, 2
			a.Adjustments = nil
		}, "window_adjustments"},
		{"an open window before the frontier", func(a *Actual) { a.Windows[0].ClosedAt = nil }, "open, but every window before"},
		{"a sealed window after it", func(a *Actual) {
			c := at("2026-11-29T12:00:00Z")
			a.Windows[1].ClosedAt, a.Windows[1].UpdatedAt = &c, c
		},
			"sealed, but windows from"},
		{"a sealed row changed", func(a *Actual) { a.Windows[0].UpdatedAt = a.Windows[0].UpdatedAt.Add(time.Second) }, "after it was sealed"},
		{"an adjustment of an open window", func(a *Actual) {
			a.Adjustments = append(a.Adjustments, ActualWindow{WindowRow: WindowRow{"a", "EUR", at("2026-11-29T11:00:00Z"), 0, 1}})
		}, "an adjustment of a window that is open"},
		{"an event lost from the sums", func(a *Actual) { a.Adjustments[0].EventCount = 0; a.Adjustments[0].AmountMinor = 0 }, "lost 1"},
		{"two entries for one event", func(a *Actual) { a.Entries.Count, a.Entries.DistinctIDs = 3, 2 }, "more than one entry"},
		{"an entry's content", func(a *Actual) { a.Entries.Digest++ }, "digest"},
		{"a missing entry", func(a *Actual) { a.Entries.Count = 2 }, "ledger_entries rows"},
		{"a late entry marked timely", func(a *Actual) {
			k := WindowKey{"a", "EUR", at("2026-11-29T10:00:00Z").UnixMicro()}
			a.Entries.Timely[k] = Sum{5, 2}
			delete(a.Entries.Late, k)
		}, "late entries"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exp, act := closingCase(t)
			tt.break_(act)
			r := Compare(exp, act)
			var b strings.Builder
			_ = r.WriteDiffs(&b, 0)
			if tt.name == "the event counted in its window instead: the sums hold, the entries must agree" {
				// The sums alone cannot tell; the entries (late) do.
				if r.Lost != 0 || r.WindowLost != 0 || r.Violations == 0 {
					t.Fatalf("%s\n%s", r.Verdict(), b.String())
				}
			}
			if r.Exact() || !strings.Contains(r.Verdict()+"\n"+b.String(), tt.want) {
				t.Fatalf("want %q in\n%s\n%s", tt.want, r.Verdict(), b.String())
			}
		})
	}
	// Without closing, any seal or adjustment is a violation.
	exp, act = closingCase(t)
	exp.CloseAfter, exp.ClosedBefore, exp.Watermark = 0, nil, nil
	if r := Compare(exp, act); r.Violations != 2 {
		t.Errorf("without closing: %d violations, want the sealed row and the adjustment", r.Violations)
	}
}
