package ledgercheck

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// The versions' model counts each event's highest revision, whatever
// order its versions come in: fed the same versions in any order, it
// holds the same tables, those of the highest revisions alone.
func TestVersionsCountTheHighestRevision(t *testing.T) {
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(3, 4))
	var all []Version
	highest := map[string]Version{}
	for i := range 200 {
		id := fmt.Sprintf("e-%d", i)
		for rev := range int64(1 + rng.IntN(4)) {
			v := Version{Event: Event{EventID: id, AccountID: fmt.Sprintf("acct-%d", rng.IntN(5)), AmountMinor: int64(rng.IntN(1000) - 200),
				Currency: []string{"EUR", "USD"}[rng.IntN(2)], OccurredAt: at.Add(time.Duration(rng.IntN(3*3600)) * time.Second)}, Revision: rev}
			if rev > 0 && rng.IntN(4) == 0 {
				v = Version{Event: Event{EventID: id}, Revision: rev, Cancelled: true}
			}
			all = append(all, v)
			if rng.IntN(5) == 0 {
				all = append(all, v) // a repeat
			}
			highest[id] = v
		}
	}
	want, err := NewModel(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range highest {
		if v.Cancelled {
			continue
		}
		if got := want.Add(v.Event); got != Counted {
			t.Fatalf("%v", got)
		}
	}
	for range 5 {
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		m, _ := NewModel(time.Hour)
		for _, v := range all {
			if got := m.AddVersion(v); got == Conflict || got == Overflow {
				t.Fatalf("%+v: %v", v, got)
			}
		}
		got, exp := m.Expected(), want.Expected()
		got.Windows, exp.Windows = nonEmpty(got.Windows), nonEmpty(exp.Windows)
		got.Balances, exp.Balances = nonEmptyBalances(got.Balances), nonEmptyBalances(exp.Balances)
		if !reflect.DeepEqual(got, exp) {
			t.Fatalf("in one order:\n%+v\nthe highest revisions:\n%+v", got, exp)
		}
	}
}

func nonEmpty(rows []WindowRow) []WindowRow {
	var out []WindowRow
	for _, r := range rows {
		if r.EventCount != 0 || r.AmountMinor != 0 {
			out = append(out, r)
		}
	}
	return out
}

func nonEmptyBalances(rows []BalanceRow) []BalanceRow {
	var out []BalanceRow
	for _, r := range rows {
		if r.EventCount != 0 || r.BalanceMinor != 0 {
			out = append(out, r)
		}
	}
	return out
}

// A row that holds nothing equals no row, on either side.
func TestCompareZeroRowIsNoRow(t *testing.T) {
	exp := &Expected{Balances: []BalanceRow{{AccountID: "a", Currency: "EUR"}, {AccountID: "b", Currency: "EUR", BalanceMinor: 5, EventCount: 1}}}
	act := &Actual{Balances: []ActualBalance{{BalanceRow: BalanceRow{AccountID: "b", Currency: "EUR", BalanceMinor: 5, EventCount: 1}},
		{BalanceRow: BalanceRow{AccountID: "c", Currency: "USD"}}}}
	if r := Compare(exp, act); !r.Exact() {
		t.Fatalf("diffs %v", r.Diffs)
	}
	act.Balances[1].EventCount = 1
	if r := Compare(exp, act); r.Exact() {
		t.Fatal("a row that counts an event is extra")
	}
}
