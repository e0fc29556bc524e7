package ledgercheck

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// sampleExpected builds a small consistent expectation through the model.
func sampleExpected(t *testing.T) *Expected {
	t.Helper()
	l, err := NewModel(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []Event{
		{"e1", "acct-1", 100, "EUR", at("2026-11-29T13:05:00Z")},
		{"e2", "acct-1", 50, "EUR", at("2026-11-29T13:10:00Z")},
		{"e3", "acct-1", -20, "EUR", at("2026-11-29T14:00:00Z")},
		{"e4", "acct-2", 7, "USD", at("2026-11-29T12:59:59Z")},
		{"e5", "acct-2", 8, "USD", at("2026-11-29T11:00:00Z")},
		{"e1", "acct-1", 999, "EUR", at("2026-11-29T13:05:00Z")}, // conflict
	} {
		l.Add(e)
	}
	l.DeadLetter(ReasonInvalidJSON)
	l.DeadLetter(ReasonInvalidJSON)
	l.DeadLetter(ReasonEmptyPayload)
	e := l.Expected()
	if err := e.Validate(); err != nil {
		t.Fatal(err)
	}
	return e
}

// actualFrom returns tables equal to exp, split over two servers.
func actualFrom(exp *Expected) *Actual {
	a := &Actual{}
	for i, b := range exp.Balances {
		a.Balances = append(a.Balances, ActualBalance{b, i % 2})
	}
	for i, w := range exp.Windows {
		a.Windows = append(a.Windows, ActualWindow{WindowRow: w, Shard: i % 2})
	}
	var off int64
	for reason, n := range exp.DeadLetters {
		for range n {
			a.DeadLetters = append(a.DeadLetters, DeadLetterRow{int(off % 2), "billing", 0, off, reason})
			off++
		}
	}
	return a
}

func TestCompareExact(t *testing.T) {
	exp := sampleExpected(t)
	r := Compare(exp, actualFrom(exp))
	if !r.Exact() {
		var b bytes.Buffer
		_ = r.WriteDiffs(&b, 0)
		t.Fatalf("not exact: %s\n%s", r.Verdict(), b.String())
	}
	want := "EXACT: 2 balances, 4 windows, 4 dead letters, 5 events"
	if got := r.Verdict(); got != want {
		t.Errorf("verdict %q, want %q", got, want)
	}
}

func TestCompareDifferences(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(a *Actual)
		// expected classification
		lost, twice, wlost, wtwice int64
		amountDiffs, dups          int
		dlMissing, dlExtra         int64
		kinds                      []DiffKind // kinds of the diffs, in order
		verdict                    []string   // substrings of the verdict
	}{
		{
			name: "missing balance and its windows",
			mutate: func(a *Actual) {
				a.Balances = a.Balances[1:] // acct-1/EUR, 3 events
				a.Windows = a.Windows[2:]
			},
			lost: 3, wlost: 3,
			kinds:   []DiffKind{Missing, Missing, Missing},
			verdict: []string{"MISMATCH: 3 differences", "lost 3 events"},
		},
		{
			name: "extra balance row",
			mutate: func(a *Actual) {
				a.Balances = append(a.Balances, ActualBalance{BalanceRow{"acct-9", "GBP", 5, 1}, 0})
			},
			twice:   1,
			kinds:   []DiffKind{Extra},
			verdict: []string{"MISMATCH: 1 difference (", "counted twice 1 event"},
		},
		{
			name: "extra window row only",
			mutate: func(a *Actual) {
				a.Windows = append(a.Windows, ActualWindow{WindowRow: WindowRow{"acct-2", "USD", at("2026-11-29T15:00:00Z"), 1, 1}, Shard: 1})
			},
			wtwice:  1,
			kinds:   []DiffKind{Extra},
			verdict: []string{"windows: lost 0, counted twice 1 event"},
		},
		{
			name: "event counted twice",
			mutate: func(a *Actual) {
				a.Balances[0].BalanceMinor += 50
				a.Balances[0].EventCount++
				a.Windows[0].AmountMinor += 50
				a.Windows[0].EventCount++
			},
			twice: 1, wtwice: 1,
			kinds:   []DiffKind{Different, Different},
			verdict: []string{"counted twice 1 event", "2 differences"},
		},
		{
			name: "event lost",
			mutate: func(a *Actual) {
				a.Balances[1].BalanceMinor -= 7
				a.Balances[1].EventCount--
				a.Windows[3].AmountMinor -= 7
				a.Windows[3].EventCount--
			},
			lost: 1, wlost: 1,
			kinds:   []DiffKind{Different, Different},
			verdict: []string{"lost 1 event"},
		},
		{
			name: "event in the wrong window",
			mutate: func(a *Actual) {
				// e2 (50, 13:10) booked in the 14:00 window.
				a.Windows[0].AmountMinor -= 50
				a.Windows[0].EventCount--
				a.Windows[1].AmountMinor += 50
				a.Windows[1].EventCount++
			},
			wlost: 1, wtwice: 1,
			kinds:   []DiffKind{Different, Different},
			verdict: []string{"windows: lost 1, counted twice 1 event"},
		},
		{
			name:        "wrong amount, right count",
			mutate:      func(a *Actual) { a.Balances[0].BalanceMinor++ },
			amountDiffs: 1,
			kinds:       []DiffKind{Different},
			verdict:     []string{"1 balance with a wrong amount"},
		},
		{
			name: "dead letters: one missing, one extra reason, one changed count",
			mutate: func(a *Actual) {
				for i, d := range a.DeadLetters {
					if d.Reason == ReasonEmptyPayload {
						a.DeadLetters[i].Reason = ReasonAmountOverflow
						break
					}
				}
				a.DeadLetters = append(a.DeadLetters, DeadLetterRow{0, "billing", 1, 0, ReasonInvalidJSON})
			},
			dlMissing: 1, dlExtra: 2,
			// Sorted by reason: amount_overflow, empty_payload, invalid_json.
			kinds:   []DiffKind{Extra, Missing, Different},
			verdict: []string{"1 dead letter missing", "2 extra dead letters"},
		},
		{
			name: "row on two servers",
			mutate: func(a *Actual) {
				dup := a.Balances[1]
				dup.Shard = 1 - dup.Shard
				a.Balances = append(a.Balances, dup)
			},
			twice: 2, dups: 1,
			kinds:   []DiffKind{Different, DuplicateRow},
			verdict: []string{"1 row on more than one server", "counted twice 2 events"},
		},
		{
			name: "dead letter on two servers",
			mutate: func(a *Actual) {
				d := a.DeadLetters[0]
				d.Shard = 1 - d.Shard
				a.DeadLetters = append(a.DeadLetters, d)
			},
			dlExtra: 1, dups: 1,
			kinds:   []DiffKind{Different, DuplicateRow},
			verdict: []string{"1 extra dead letter", "1 row on more than one server"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			exp := sampleExpected(t)
			act := actualFrom(exp)
			tc.mutate(act)
			r := Compare(exp, act)
			var out bytes.Buffer
			_ = r.WriteDiffs(&out, 0)
			t.Logf("%s\n%s", r.Verdict(), out.String())
			if r.Exact() {
				t.Fatal("reported exact")
			}
			if r.Lost != tc.lost || r.CountedTwice != tc.twice {
				t.Errorf("lost %d, counted twice %d; want %d, %d", r.Lost, r.CountedTwice, tc.lost, tc.twice)
			}
			if r.WindowLost != tc.wlost || r.WindowCountedTwice != tc.wtwice {
				t.Errorf("window lost %d, counted twice %d; want %d, %d", r.WindowLost, r.WindowCountedTwice, tc.wlost, tc.wtwice)
			}
			if r.BalanceAmountDiffs+r.WindowAmountDiffs != tc.amountDiffs {
				t.Errorf("amount diffs %d+%d, want %d", r.BalanceAmountDiffs, r.WindowAmountDiffs, tc.amountDiffs)
			}
			if r.Duplicates != tc.dups {
				t.Errorf("duplicates %d, want %d", r.Duplicates, tc.dups)
			}
			if r.DeadLettersMissing != tc.dlMissing || r.DeadLettersExtra != tc.dlExtra {
				t.Errorf("dead letters missing %d, extra %d; want %d, %d", r.DeadLettersMissing, r.DeadLettersExtra, tc.dlMissing, tc.dlExtra)
			}
			if len(r.Diffs) != len(tc.kinds) {
				t.Fatalf("%d diffs, want kinds %v", len(r.Diffs), tc.kinds)
			}
			for i, k := range tc.kinds {
				if r.Diffs[i].Kind != k {
					t.Errorf("diff %d is %v, want %v", i, r.Diffs[i].Kind, k)
				}
			}
			v := r.Verdict()
			if !strings.HasPrefix(v, "MISMATCH: ") {
				t.Errorf("verdict %q", v)
			}
			for _, s := range tc.verdict {
				if !strings.Contains(v, s) {
					t.Errorf("verdict %q lacks %q", v, s)
				}
			}
		})
	}
}

func TestDiffString(t *testing.T) {
	tests := []struct {
		d    Diff
		want string
	}{
		{Diff{Table: TableBalances, Kind: Missing, Key: `"a"/EUR`, ExpAmount: 10, ExpCount: 2},
			`missing   account_balances "a"/EUR: expected balance 10, 2 events, actual none`},
		{Diff{Table: TableWindows, Kind: Different, Key: "k", ExpAmount: 10, ExpCount: 2, ActAmount: 20, ActCount: 3},
			`different billing_windows k: expected amount 10, 2 events, actual amount 20, 3 events (counted twice 1)`},
		{Diff{Table: TableBalances, Kind: Different, Key: "k", ExpAmount: 10, ExpCount: 2, ActAmount: 5, ActCount: 1},
			`different account_balances k: expected balance 10, 2 events, actual balance 5, 1 event (lost 1)`},
		{Diff{Table: TableDeadLetters, Kind: Extra, Key: "invalid_json", ActCount: 3},
			`extra     dead_letters invalid_json: expected none, actual 3`},
	}
	for _, tc := range tests {
		if got := tc.d.String(); got != tc.want {
			t.Errorf("got  %s\nwant %s", got, tc.want)
		}
	}
}

func TestWriteDiffsLimit(t *testing.T) {
	r := &Report{Diffs: make([]Diff, 5)}
	var b bytes.Buffer
	if err := r.WriteDiffs(&b, 2); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(b.String(), "\n"); n != 3 || !strings.Contains(b.String(), "and 3 more") {
		t.Errorf("output %q", b.String())
	}
}
