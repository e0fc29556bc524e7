package ledgercompare

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/periods"
)

// ledger is a ledger read from memory.
type ledger struct {
	act    *ledgercheck.Actual
	stored periods.Stored
	err    error // of Rows
	topics []string
}

func (l *ledger) Rows(_ context.Context, topic string, rows func(int64)) (*ledgercheck.Actual, error) {
	l.topics = append(l.topics, topic)
	n := int64(len(l.act.Balances) + len(l.act.Windows) + len(l.act.Adjustments) + len(l.act.DeadLetters))
	rows(n)
	return l.act, l.err
}

func (l *ledger) Periods(context.Context) (periods.Stored, error) { return l.stored, nil }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func stored(p event.Period, close bool) periods.Stored {
	return periods.Stored{{Seq: 1, Settings: periods.Settings{Period: p, Close: close}}}
}

func window(account string, start time.Time, amount, count int64, shard int) ledgercheck.ActualWindow {
	return ledgercheck.ActualWindow{WindowRow: ledgercheck.WindowRow{AccountID: account, Currency: "EUR", WindowStart: start, AmountMinor: amount, EventCount: count}, Shard: shard}
}

func balance(account string, amount, count int64, shard int) ledgercheck.ActualBalance {
	return ledgercheck.ActualBalance{BalanceRow: ledgercheck.BalanceRow{AccountID: account, Currency: "EUR", BalanceMinor: amount, EventCount: count}, Shard: shard}
}

// TestCompareTellsARebuiltLedgerCaughtUp: a ledger rebuilt with windows
// that closed at other moments (its split between windows and
// adjustments differs) on other servers compares EXACT, window by window
// as row plus adjustment; a lost event, one counted twice and a missing
// dead letter are MISMATCH, each named.
func TestCompareTellsARebuiltLedgerCaughtUp(t *testing.T) {
	month, _ := periods.ParsePeriod("month", "Europe/Berlin")
	nov := time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC)
	dec := time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC)
	blue := &ledger{stored: stored(month, true), act: &ledgercheck.Actual{
		Balances: []ledgercheck.ActualBalance{balance("acct-1", 300, 3, 0), balance("acct-2", 50, 1, 1)},
		Windows:  []ledgercheck.ActualWindow{window("acct-1", nov, 200, 2, 0), window("acct-2", dec, 50, 1, 1)},
		Adjustments: []ledgercheck.ActualWindow{
			window("acct-1", nov, 100, 1, 0), // late in the old ledger
		},
		DeadLetters: []ledgercheck.DeadLetterRow{{Shard: 0, Topic: "events", Partition: 0, Offset: 9, Reason: "invalid_json"}},
	}}
	green := &ledger{stored: stored(month, true), act: &ledgercheck.Actual{
		// One server, not two; the late event counted in its window.
		Balances:    []ledgercheck.ActualBalance{balance("acct-1", 300, 3, 0), balance("acct-2", 50, 1, 0)},
		Windows:     []ledgercheck.ActualWindow{window("acct-1", nov, 300, 3, 0), window("acct-2", dec, 50, 1, 0)},
		DeadLetters: []ledgercheck.DeadLetterRow{{Shard: 0, Topic: "events", Partition: 0, Offset: 9, Reason: "invalid_json"}},
	}}
	var seen []string
	o := Options{Topic: "events", Log: quiet, Progress: func(what string, rows int64) { seen = append(seen, what) }}
	r, err := Compare(t.Context(), blue, green, o)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Exact() {
		var b strings.Builder
		_ = r.WriteDiffs(&b, 20)
		t.Fatalf("a caught-up rebuild: %s\n%s", r.Verdict(), b.String())
	}
	if blue.topics[0] != "events" || green.topics[0] != "events" {
		t.Errorf("dead letters read of %v and %v, want of the topic", blue.topics, green.topics)
	}
	if len(seen) < 2 || seen[0] != "reading this ledger" || seen[len(seen)-1] != "reading the other ledger" {
		t.Errorf("progress %q", seen)
	}

	green.act.Balances[0].BalanceMinor, green.act.Balances[0].EventCount = 200, 2 // acct-1 lost an event
	green.act.Windows[0].AmountMinor, green.act.Windows[0].EventCount = 200, 2
	green.act.Balances[1].BalanceMinor, green.act.Balances[1].EventCount = 100, 2 // acct-2 counted one twice
	green.act.Windows[1].AmountMinor, green.act.Windows[1].EventCount = 100, 2
	green.act.DeadLetters = nil
	r, err = Compare(t.Context(), blue, green, o)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := r.WriteDiffs(&b, 20); err != nil {
		t.Fatal(err)
	}
	if r.Exact() || r.Lost != 1 || r.CountedTwice != 1 {
		t.Fatalf("verdict %s (lost %d, twice %d):\n%s", r.Verdict(), r.Lost, r.CountedTwice, b.String())
	}
	for _, want := range []string{"acct-1", "acct-2", "invalid_json"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("differences do not name %s:\n%s", want, b.String())
		}
	}
}

// TestCompareRefusesWhatItCannotCompare: ledgers with different period
// settings, or one that cannot be read, are "could not compare" (an
// error), never a verdict.
func TestCompareRefusesWhatItCannotCompare(t *testing.T) {
	hour, _ := periods.ParsePeriod("1h", "UTC")
	month, _ := periods.ParsePeriod("month", "Europe/Berlin")
	a := &ledger{stored: stored(month, true), act: &ledgercheck.Actual{}}
	b := &ledger{stored: stored(hour, true), act: &ledgercheck.Actual{}}
	if _, err := Compare(t.Context(), a, b, Options{Log: quiet}); err == nil || !strings.Contains(err.Error(), "different period settings") {
		t.Fatalf("different settings: %v", err)
	}
	broken := &ledger{stored: stored(month, true), act: &ledgercheck.Actual{}, err: errors.New("server 1: connection refused")}
	if _, err := Compare(t.Context(), a, broken, Options{Log: quiet}); err == nil || !strings.Contains(err.Error(), "the other ledger: server 1: connection refused") {
		t.Fatalf("unreadable: %v", err)
	}
}

// TestComparedPeriodsAreTheLedgers: the windows are compared under the
// ledgers' own settings, which must agree; the environment's serve only
// ledgers that have none stored.
func TestComparedPeriodsAreTheLedgers(t *testing.T) {
	hour, _ := periods.ParsePeriod("1h", "UTC")
	month, _ := periods.ParsePeriod("month", "Europe/Berlin")
	day, _ := periods.ParsePeriod("day", "UTC")
	env := periods.Settings{Period: day} // never closes
	got, err := comparedPeriods(env, quiet, stored(month, true), stored(month, true))
	if err != nil || !got.Period.Equal(month) || !got.Close {
		t.Fatalf("the same stored settings: %+v, %v", got, err)
	}
	if exp := asExpected(&ledgercheck.Actual{}, "t", got); !exp.Closes() || exp.Window != "month" || exp.Timezone != "Europe/Berlin" {
		t.Fatalf("the expectation: %+v", exp)
	}
	if _, err := comparedPeriods(env, quiet, stored(month, true), stored(hour, true)); err == nil || !strings.Contains(err.Error(), "different period settings") {
		t.Fatalf("different stored settings: %v", err)
	}
	if _, err := comparedPeriods(env, quiet, stored(hour, true), stored(hour, false)); err == nil {
		t.Fatal("closing and not closing compared")
	}
	if got, err := comparedPeriods(env, quiet, nil, stored(hour, true)); err != nil || !got.Period.Equal(hour) || !got.Close {
		t.Fatalf("only the other stored: %+v, %v", got, err)
	}
	if got, err := comparedPeriods(env, quiet, stored(hour, false), nil); err != nil || !got.Period.Equal(hour) {
		t.Fatalf("only this one stored: %+v, %v", got, err)
	}
	got, err = comparedPeriods(env, quiet, nil, nil)
	if err != nil || got.Period.Unit() != "day" || got.Close {
		t.Fatalf("none stored, the environment's: %+v, %v", got, err)
	}
}
