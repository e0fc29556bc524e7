package ledgercheck

import (
	"math"
	"reflect"
	"testing"
	"time"
)

func TestWindowStart(t *testing.T) {
	utc := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		in   string
		size time.Duration
		want string
	}{
		{"2026-11-29T13:05:00Z", time.Hour, "2026-11-29T13:00:00Z"},
		{"2026-11-29T13:00:00Z", time.Hour, "2026-11-29T13:00:00Z"},
		{"2026-11-29T13:59:59.999999999Z", time.Hour, "2026-11-29T13:00:00Z"},
		{"2026-11-29T14:05:00+01:00", time.Hour, "2026-11-29T13:00:00Z"},            // normalised to UTC
		{"2026-11-29T13:05:00+05:30", time.Hour, "2026-11-29T07:00:00Z"},            // half-hour offset
		{"2026-11-29T13:05:00Z", 24 * time.Hour, "2026-11-29T00:00:00Z"},            // epoch-aligned days
		{"2026-11-29T13:05:00Z", 7 * time.Minute, "2026-11-29T13:03:00Z"},           // 7 min does not divide an hour
		{"1970-01-01T00:00:00Z", time.Hour, "1970-01-01T00:00:00Z"},                 // epoch
		{"1969-12-31T23:59:59Z", time.Hour, "1969-12-31T23:00:00Z"},                 // floor, not truncation
		{"1969-12-31T23:59:59.5Z", time.Second, "1969-12-31T23:59:59Z"},             // pre-1970 with fraction
		{"1969-12-31T23:30:00Z", time.Hour, "1969-12-31T23:00:00Z"},                 // pre-1970 exact half
		{"1900-06-15T10:20:30Z", time.Hour, "1900-06-15T10:00:00Z"},                 // far before 1970
		{"0001-01-01T00:30:00Z", time.Hour, "0001-01-01T00:00:00Z"},                 // year 1
		{"1969-12-31T23:59:59.9995Z", time.Millisecond, "1969-12-31T23:59:59.999Z"}, // sub-second, pre-1970
		{"2026-11-29T13:05:00.0016Z", 1500 * time.Microsecond, "2026-11-29T13:05:00.0015Z"},
		{"9999-12-31T23:59:59Z", time.Hour, "9999-12-31T23:00:00Z"},
	}
	for _, tc := range tests {
		got := WindowStart(utc(tc.in), tc.size)
		if want := utc(tc.want); !got.Equal(want) || got.Location() != time.UTC {
			t.Errorf("WindowStart(%s, %v) = %s (%v), want %s UTC", tc.in, tc.size, got.Format(time.RFC3339Nano), got.Location(), tc.want)
		}
	}
}

// TestWindowStartProperties checks floor semantics on many instants around
// the epoch: start <= t < start+size and start is a multiple of size.
func TestWindowStartProperties(t *testing.T) {
	for _, size := range []time.Duration{time.Second, time.Hour, 1500 * time.Microsecond, 7 * time.Minute} {
		for ns := int64(-3 * time.Hour); ns <= int64(3*time.Hour); ns += int64(977 * time.Millisecond / 3) {
			tm := time.Unix(0, ns)
			s := WindowStart(tm, size)
			if s.After(tm) || !tm.Before(s.Add(size)) {
				t.Fatalf("size %v, t %v: start %v does not contain t", size, tm, s)
			}
			if s.UnixNano()%int64(size) != 0 {
				t.Fatalf("size %v, t %v: start %v not aligned", size, tm, s)
			}
		}
	}
}

func TestWindowStartPanicsOnBadSize(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for size 0")
		}
	}()
	WindowStart(time.Now(), 0)
}

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestLedgerAdd(t *testing.T) {
	const w1, w2 = "2026-11-29T13:05:00Z", "2026-11-29T14:10:00Z"
	ev := func(id, acct string, amount int64, cur, when string) Event {
		return Event{id, acct, amount, cur, at(when)}
	}
	type step struct {
		e    Event
		want Outcome
	}
	tests := []struct {
		name     string
		steps    []step
		balances []BalanceRow
		windows  []WindowRow
		dead     map[string]int64
	}{
		{
			name: "counted, same window and different windows",
			steps: []step{
				{ev("e1", "a", 100, "EUR", w1), Counted},
				{ev("e2", "a", -30, "EUR", w1), Counted},
				{ev("e3", "a", 5, "EUR", w2), Counted},
				{ev("e4", "a", 7, "USD", w1), Counted},
			},
			balances: []BalanceRow{{"a", "EUR", 75, 3}, {"a", "USD", 7, 1}},
			windows: []WindowRow{
				{"a", "EUR", at("2026-11-29T13:00:00Z"), 70, 2},
				{"a", "EUR", at("2026-11-29T14:00:00Z"), 5, 1},
				{"a", "USD", at("2026-11-29T13:00:00Z"), 7, 1},
			},
		},
		{
			name: "exact duplicate dropped, also with another offset for the same instant",
			steps: []step{
				{ev("e1", "a", 100, "EUR", w1), Counted},
				{ev("e1", "a", 100, "EUR", w1), Duplicate},
				{ev("e1", "a", 100, "EUR", "2026-11-29T15:05:00+02:00"), Duplicate},
			},
			balances: []BalanceRow{{"a", "EUR", 100, 1}},
			windows:  []WindowRow{{"a", "EUR", at("2026-11-29T13:00:00Z"), 100, 1}},
		},
		{
			name: "conflicting duplicates: amount, currency, time, account",
			steps: []step{
				{ev("e1", "a", 100, "EUR", w1), Counted},
				{ev("e1", "a", 101, "EUR", w1), Conflict},
				{ev("e1", "a", 100, "USD", w1), Conflict},
				{ev("e1", "a", 100, "EUR", "2026-11-29T13:05:01Z"), Conflict},
				{ev("e1", "b", 100, "EUR", w1), Conflict},
				{ev("e1", "a", 100, "EUR", w1), Duplicate}, // the original still wins
			},
			balances: []BalanceRow{{"a", "EUR", 100, 1}},
			windows:  []WindowRow{{"a", "EUR", at("2026-11-29T13:00:00Z"), 100, 1}},
			dead:     map[string]int64{ReasonConflictingDuplicate: 4},
		},
		{
			name: "balance overflow upwards, account keeps working",
			steps: []step{
				{ev("o1", "x", math.MaxInt64, "EUR", w1), Counted},
				{ev("o2", "x", 1, "EUR", w1), Overflow},
				{ev("o3", "x", -1, "EUR", w1), Counted},
			},
			balances: []BalanceRow{{"x", "EUR", math.MaxInt64 - 1, 2}},
			windows:  []WindowRow{{"x", "EUR", at("2026-11-29T13:00:00Z"), math.MaxInt64 - 1, 2}},
			dead:     map[string]int64{ReasonAmountOverflow: 1},
		},
		{
			name: "balance overflow downwards",
			steps: []step{
				{ev("o1", "x", math.MinInt64, "EUR", w1), Counted},
				{ev("o2", "x", -1, "EUR", w1), Overflow},
				{ev("o3", "x", 1, "EUR", w1), Counted},
			},
			balances: []BalanceRow{{"x", "EUR", math.MinInt64 + 1, 2}},
			windows:  []WindowRow{{"x", "EUR", at("2026-11-29T13:00:00Z"), math.MinInt64 + 1, 2}},
			dead:     map[string]int64{ReasonAmountOverflow: 1},
		},
		{
			name: "window-only overflow counts nowhere",
			steps: []step{
				{ev("o1", "x", math.MaxInt64, "EUR", w1), Counted},
				{ev("o2", "x", -math.MaxInt64, "EUR", w2), Counted}, // balance back to 0
				{ev("o3", "x", 1, "EUR", w1), Overflow},             // balance 1 fine, window w1 overflows
				{ev("o4", "x", -1, "EUR", w1), Counted},
			},
			balances: []BalanceRow{{"x", "EUR", -1, 3}},
			windows: []WindowRow{
				{"x", "EUR", at("2026-11-29T13:00:00Z"), math.MaxInt64 - 1, 2},
				{"x", "EUR", at("2026-11-29T14:00:00Z"), -math.MaxInt64, 1},
			},
			dead: map[string]int64{ReasonAmountOverflow: 1},
		},
		{
			name: "an overflowed event's id is not remembered",
			steps: []step{
				{ev("o1", "x", math.MaxInt64, "EUR", w1), Counted},
				{ev("o2", "x", 1, "EUR", w1), Overflow},
				{ev("o2", "x", -5, "EUR", w1), Counted}, // same id, new content: judged afresh
			},
			balances: []BalanceRow{{"x", "EUR", math.MaxInt64 - 5, 2}},
			windows:  []WindowRow{{"x", "EUR", at("2026-11-29T13:00:00Z"), math.MaxInt64 - 5, 2}},
			dead:     map[string]int64{ReasonAmountOverflow: 1},
		},
		{
			name: "a duplicate is dropped even where counting it would overflow",
			steps: []step{
				{ev("o1", "x", math.MaxInt64, "EUR", w1), Counted},
				{ev("o1", "x", math.MaxInt64, "EUR", w1), Duplicate},
			},
			balances: []BalanceRow{{"x", "EUR", math.MaxInt64, 1}},
			windows:  []WindowRow{{"x", "EUR", at("2026-11-29T13:00:00Z"), math.MaxInt64, 1}},
		},
		{
			name: "pre-1970 events",
			steps: []step{
				{ev("p1", "a", 3, "GBP", "1969-12-31T23:59:59Z"), Counted},
				{ev("p2", "a", 4, "GBP", "1970-01-01T00:00:00Z"), Counted},
			},
			balances: []BalanceRow{{"a", "GBP", 7, 2}},
			windows: []WindowRow{
				{"a", "GBP", at("1969-12-31T23:00:00Z"), 3, 1},
				{"a", "GBP", at("1970-01-01T00:00:00Z"), 4, 1},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := NewModel(time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			var counted int64
			for i, s := range tc.steps {
				if got := l.Add(s.e); got != s.want {
					t.Fatalf("step %d (%+v): got %v, want %v", i, s.e, got, s.want)
				}
				if s.want == Counted {
					counted++
				}
			}
			e := l.Expected()
			if e.EventsValid != counted || l.Counted() != counted {
				t.Errorf("events_valid %d, Counted %d, want %d", e.EventsValid, l.Counted(), counted)
			}
			if err := e.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			if len(e.Balances) != len(tc.balances) {
				t.Fatalf("balances %+v, want %+v", e.Balances, tc.balances)
			}
			for i := range tc.balances {
				if e.Balances[i] != tc.balances[i] {
					t.Errorf("balance %d: %+v, want %+v", i, e.Balances[i], tc.balances[i])
				}
			}
			if len(e.Windows) != len(tc.windows) {
				t.Fatalf("windows %+v, want %+v", e.Windows, tc.windows)
			}
			for i, w := range tc.windows {
				g := e.Windows[i]
				if g.Key() != w.Key() || g.AmountMinor != w.AmountMinor || g.EventCount != w.EventCount || g.WindowStart.Location() != time.UTC {
					t.Errorf("window %d: %+v, want %+v", i, g, w)
				}
			}
			if len(e.DeadLetters) != len(tc.dead) {
				t.Errorf("dead letters %v, want %v", e.DeadLetters, tc.dead)
			}
			for r, n := range tc.dead {
				if e.DeadLetters[r] != n {
					t.Errorf("dead letters %v, want %v", e.DeadLetters, tc.dead)
				}
			}
		})
	}
}

func TestLedgerDeadLetter(t *testing.T) {
	l, err := NewModel(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range MalformedKinds() {
		l.DeadLetter(k.Reason())
	}
	l.DeadLetter(ReasonInvalidJSON)
	e := l.Expected()
	if e.DeadLetterTotal() != int64(len(MalformedKinds()))+1 || e.DeadLetters[ReasonInvalidJSON] != 2 {
		t.Errorf("dead letters %v", e.DeadLetters)
	}
	if e.EventsValid != 0 || len(e.Balances) != 0 {
		t.Errorf("malformed records counted: %+v", e)
	}
}

func TestMalformedKindReasonsDistinct(t *testing.T) {
	seen := map[string]MalformedKind{}
	for _, k := range MalformedKinds() {
		r := k.Reason()
		if r == "" {
			t.Errorf("kind %d has no reason", k)
		}
		if prev, ok := seen[r]; ok {
			t.Errorf("kinds %d and %d share reason %q", prev, k, r)
		}
		seen[r] = k
	}
	if MalformedKind(0).Reason() != "" || MalformedKind(0).String() != "malformed(0)" {
		t.Error("zero kind has a reason")
	}
}

func TestNewModelRejectsBadWindow(t *testing.T) {
	for _, w := range []time.Duration{0, -time.Hour, time.Nanosecond, 1500 * time.Nanosecond} {
		if _, err := NewModel(w); err == nil {
			t.Errorf("NewModel(%v) accepted", w)
		}
	}
}

func TestAddInt64(t *testing.T) {
	tests := []struct {
		a, b int64
		sum  int64
		ok   bool
	}{
		{1, 2, 3, true},
		{math.MaxInt64, 0, math.MaxInt64, true},
		{math.MaxInt64, 1, 0, false},
		{math.MaxInt64 - 1, 1, math.MaxInt64, true},
		{math.MinInt64, -1, 0, false},
		{math.MinInt64, 1, math.MinInt64 + 1, true},
		{math.MinInt64, math.MaxInt64, -1, true},
		{-1, math.MinInt64, 0, false},
		{math.MaxInt64, math.MaxInt64, 0, false},
		{math.MinInt64, math.MinInt64, 0, false},
	}
	for _, tc := range tests {
		sum, ok := addInt64(tc.a, tc.b)
		if sum != tc.sum || ok != tc.ok {
			t.Errorf("addInt64(%d, %d) = %d, %v; want %d, %v", tc.a, tc.b, sum, ok, tc.sum, tc.ok)
		}
	}
}

// Merging two ledgers gives the ledger of all their events.
func TestExpectedMerge(t *testing.T) {
	at := time.Date(2026, 11, 29, 13, 5, 0, 0, time.UTC)
	a, _ := NewModel(time.Hour)
	b, _ := NewModel(time.Hour)
	all, _ := NewModel(time.Hour)
	for i, e := range []Event{
		{"e1", "acct-1", 5, "EUR", at}, {"e2", "acct-2", 7, "EUR", at},
		{"h1", "acct-1", 3, "EUR", at.Add(2 * time.Hour)}, {"h2", "acct-9", 1, "USD", at},
	} {
		if i < 2 {
			a.Add(e)
		} else {
			b.Add(e)
		}
		all.Add(e)
	}
	a.DeadLetter("invalid_json")
	b.DeadLetter("invalid_json")
	b.DeadLetter("payload_too_large")
	all.DeadLetter("invalid_json")
	all.DeadLetter("invalid_json")
	all.DeadLetter("payload_too_large")
	got := a.Expected()
	if err := got.Merge(b.Expected()); err != nil {
		t.Fatal(err)
	}
	want := all.Expected()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("merged %+v\nwant %+v", got, want)
	}
	other, _ := NewModel(time.Minute)
	if err := got.Merge(other.Expected()); err == nil {
		t.Fatal("merged ledgers of different windows")
	}
}
