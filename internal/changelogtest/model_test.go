package changelogtest

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/changelog"
)

func balanceRow(id string, balance int64, at time.Time) changelog.Row {
	return changelog.Row{"account_id": id, "currency": "EUR", "balance_minor": balance, "event_count": int64(1), "updated_at": at}
}

func TestModelChain(t *testing.T) {
	at := time.Date(2026, 11, 29, 13, 5, 1, 0, time.UTC)
	r1, r2, r3 := balanceRow("a", 1, at), balanceRow("a", 2, at), balanceRow("a", 3, at)
	m := NewModel()
	steps := []struct {
		ev    changelog.Event
		chain bool // want a *ChainError
	}{
		{changelog.Event{Table: changelog.AccountBalances, Op: changelog.OpUpdate, Before: r1, After: r2}, true}, // no row yet
		{changelog.Event{Table: changelog.AccountBalances, Op: changelog.OpCreate, After: r1}, false},
		{changelog.Event{Table: changelog.AccountBalances, Op: changelog.OpCreate, After: r2}, true},             // key holds a row
		{changelog.Event{Table: changelog.AccountBalances, Op: changelog.OpUpdate, Before: r2, After: r3}, true}, // before is not r1
		{changelog.Event{Table: changelog.AccountBalances, Op: changelog.OpUpdate, Before: r1, After: r2}, false},
		{changelog.Event{Table: changelog.AccountBalances, Op: changelog.OpDelete, Before: r2}, false},
		{changelog.Event{Table: changelog.AccountBalances, Op: changelog.OpRead, After: r3, Source: changelog.Source{Snapshot: "last"}}, false},
	}
	for i, s := range steps {
		err := m.Apply(s.ev)
		var ce *ChainError
		if s.chain != errors.As(err, &ce) {
			t.Fatalf("step %d (%s): got %v, want chain error %v", i, s.ev.Op, err, s.chain)
		}
	}
	want, _ := changelog.Canonical(mustTable(t, changelog.AccountBalances), r3)
	if got := m.Canonical(changelog.AccountBalances); len(got) != 1 || got[0] != want {
		t.Errorf("final rows %v, want [%s]", got, want)
	}
}

func mustTable(t *testing.T, name string) changelog.Table {
	t.Helper()
	tb, ok := changelog.Lookup(name)
	if !ok {
		t.Fatalf("no table %s", name)
	}
	return tb
}

func TestDiff(t *testing.T) {
	if d := Diff([]string{"a", "b", "b"}, []string{"b", "a", "b"}, 5); d != nil {
		t.Errorf("equal multisets: %v", d)
	}
	d := Diff([]string{"a", "b"}, []string{"b", "b", "c"}, 5)
	want := []string{"missing: a", "unexpected: b", "unexpected: c"}
	if strings.Join(d, "|") != strings.Join(want, "|") {
		t.Errorf("got %v, want %v", d, want)
	}
}

// ParseReadings reads flink-read's lines back into the Canonical form and
// refuses a line that is not exactly a table's row.
func TestParseReadings(t *testing.T) {
	out := `{"reading":"debezium-json","table":"account_balances","account_id":"q\"\\ü","currency":"EUR","balance_minor":-9223372036854775808,"event_count":9223372036854775807,"updated_at":"1000-01-01T00:00:00.000000Z"}
{"reading":"upsert-kafka","table":"account_balances","violation":"broken"}
`
	r, err := ParseReadings([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := changelog.Canonical(mustTable(t, changelog.AccountBalances), balanceRow(`q"\ü`, math.MinInt64, time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)))
	want = strings.Replace(want, `"event_count":1`, `"event_count":9223372036854775807`, 1)
	if got := r.Rows[ReadingDebeziumJSON][changelog.AccountBalances]; len(got) != 1 || got[0] != want {
		t.Errorf("rows %v, want [%s]", got, want)
	}
	if len(r.Violations) != 1 || !strings.Contains(r.Violations[0], "broken") {
		t.Errorf("violations %v", r.Violations)
	}
	for name, line := range map[string]string{
		"float":          `{"reading":"r","table":"account_balances","account_id":"a","currency":"EUR","balance_minor":1.5,"event_count":1,"updated_at":"2026-01-01T00:00:00.000000Z"}`,
		"beyond int64":   `{"reading":"r","table":"account_balances","account_id":"a","currency":"EUR","balance_minor":9223372036854775808,"event_count":1,"updated_at":"2026-01-01T00:00:00.000000Z"}`,
		"millis":         `{"reading":"r","table":"account_balances","account_id":"a","currency":"EUR","balance_minor":1,"event_count":1,"updated_at":"2026-01-01T00:00:00.000Z"}`,
		"missing column": `{"reading":"r","table":"account_balances","account_id":"a","currency":"EUR","balance_minor":1,"updated_at":"2026-01-01T00:00:00.000000Z"}`,
		"extra field":    `{"reading":"r","table":"account_balances","account_id":"a","currency":"EUR","balance_minor":1,"event_count":1,"updated_at":"2026-01-01T00:00:00.000000Z","x":1}`,
		"unknown table":  `{"reading":"r","table":"nope"}`,
		"not JSON":       `flink says hello`,
	} {
		if _, err := ParseReadings([]byte(line + "\n")); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}
