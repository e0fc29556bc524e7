package changelogtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

func balanceRow(id string, balance int64, at time.Time) Row {
	return Row{"account_id": id, "currency": "EUR", "balance_minor": balance, "event_count": int64(1), "updated_at": at}
}

// The spec's example event, byte for byte (the spec's text, compacted).
func TestEncodeSpecExample(t *testing.T) {
	spec := `{"before": null,
 "after": {"account_id": "acct-42", "currency": "EUR", "balance_minor": 1250, "event_count": 1,
           "updated_at": "2026-11-29T13:05:01.123456Z"},
 "op": "c",
 "ts_ms": 1796115681526,
 "source": {"connector": "billing-ledger", "version": "<build version>", "name": "<p>",
            "ledger": "<ledger id>", "table": "account_balances",
            "checkpoint": "<gtrid>", "commit_seq": 17, "ts_ms": 1796115681526,
            "snapshot": "false"}}`
	var want bytes.Buffer
	if err := json.Compact(&want, []byte(spec)); err != nil {
		t.Fatal(err)
	}
	key, value, err := Encode(Event{Table: AccountBalances, Op: OpCreate,
		After: balanceRow("acct-42", 1250, time.Date(2026, 11, 29, 13, 5, 1, 123456000, time.UTC)),
		TsMs:  1796115681526,
		Source: Source{Version: "<build version>", Name: "<p>", Ledger: "<ledger id>", Checkpoint: "<gtrid>",
			CommitSeq: 17, TsMs: 1796115681526}})
	if err != nil {
		t.Fatal(err)
	}
	if string(value) != want.String() {
		t.Errorf("value\n got %s\nwant %s", value, want.String())
	}
	if string(key) != `{"account_id":"acct-42","currency":"EUR"}` {
		t.Errorf("key %s", key)
	}
}

// Values a JSON encoder can get wrong come out as JSON that decodes back to
// them: int64 limits as numbers (no float), strings with quotes,
// backslashes, control and non-ASCII characters, times in other zones.
func TestEncodeValuesRoundTrip(t *testing.T) {
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	for _, tc := range []struct {
		id      string
		balance int64
		at      time.Time
		wantAt  string
	}{
		{`quote"back\slash`, math.MaxInt64, time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC), "9999-12-31T23:59:59.999999Z"},
		{"tab\tnl\n账户💶</script>&", math.MinInt64, time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC), "1000-01-01T00:00:00.000000Z"},
		{"Müller", 0, time.Date(2026, 1, 1, 5, 30, 0, 1000, zone), "2026-01-01T00:00:00.000001Z"},
	} {
		_, value, err := Encode(Event{Table: AccountBalances, Op: OpCreate, After: balanceRow(tc.id, tc.balance, tc.at)})
		if err != nil {
			t.Fatal(err)
		}
		var env struct {
			After struct {
				AccountID string      `json:"account_id"`
				Balance   json.Number `json:"balance_minor"`
				UpdatedAt string      `json:"updated_at"`
			}
		}
		dec := json.NewDecoder(bytes.NewReader(value))
		dec.UseNumber()
		if err := dec.Decode(&env); err != nil {
			t.Fatalf("%s: %v", value, err)
		}
		if env.After.AccountID != tc.id || env.After.Balance.String() != strconv.FormatInt(tc.balance, 10) ||
			env.After.UpdatedAt != tc.wantAt {
			t.Errorf("%s: decoded %+v", value, env.After)
		}
	}
}

func TestEncodeRejects(t *testing.T) {
	at := time.Date(2026, 11, 29, 13, 5, 1, 0, time.UTC)
	ok := balanceRow("a", 1, at)
	with := func(k string, v any) Row {
		r := Row{}
		for kk, vv := range ok {
			r[kk] = vv
		}
		if v == nil && k == "" {
			return r
		}
		if v == "DELETE" {
			delete(r, k)
		} else {
			r[k] = v
		}
		return r
	}
	for name, ev := range map[string]Event{
		"invalid UTF-8":        {Table: AccountBalances, Op: OpCreate, After: with("account_id", "a\xff")},
		"nanoseconds":          {Table: AccountBalances, Op: OpCreate, After: with("updated_at", at.Add(1))},
		"before year 1000":     {Table: AccountBalances, Op: OpCreate, After: with("updated_at", time.Date(999, 12, 31, 0, 0, 0, 0, time.UTC))},
		"NULL in NOT NULL":     {Table: AccountBalances, Op: OpCreate, After: with("balance_minor", nil)},
		"int, not int64":       {Table: AccountBalances, Op: OpCreate, After: with("balance_minor", 1)},
		"missing column":       {Table: AccountBalances, Op: OpCreate, After: with("event_count", "DELETE")},
		"unknown column":       {Table: AccountBalances, Op: OpCreate, After: with("extra", int64(1))},
		"c with before":        {Table: AccountBalances, Op: OpCreate, Before: ok, After: ok},
		"u without before":     {Table: AccountBalances, Op: OpUpdate, After: ok},
		"u changing the key":   {Table: AccountBalances, Op: OpUpdate, Before: ok, After: with("account_id", "b")},
		"r without snapshot":   {Table: AccountBalances, Op: OpRead, After: ok},
		"c marked snapshot":    {Table: AccountBalances, Op: OpCreate, After: ok, Source: Source{Snapshot: "true"}},
		"u on append-only":     {Table: ClosedWindows, Op: OpUpdate, Before: ok, After: ok},
		"unknown op":           {Table: AccountBalances, Op: "x", After: ok},
		"unknown table":        {Table: "nope", Op: OpCreate, After: ok},
		"invalid UTF-8 ledger": {Table: AccountBalances, Op: OpCreate, After: ok, Source: Source{Ledger: "\xc3"}},
	} {
		_, _, err := Encode(ev)
		var fe *FormatError
		if !errors.As(err, &fe) {
			t.Errorf("%s: got %v, want a *FormatError", name, err)
		}
	}
	if _, _, err := Encode(Event{Table: AccountBalances, Op: OpCreate, After: ok}); err != nil {
		t.Fatalf("the valid row: %v", err)
	}
}

func TestModelChain(t *testing.T) {
	at := time.Date(2026, 11, 29, 13, 5, 1, 0, time.UTC)
	r1, r2, r3 := balanceRow("a", 1, at), balanceRow("a", 2, at), balanceRow("a", 3, at)
	m := NewModel()
	steps := []struct {
		ev    Event
		chain bool // want a *ChainError
	}{
		{Event{Table: AccountBalances, Op: OpUpdate, Before: r1, After: r2}, true}, // no row yet
		{Event{Table: AccountBalances, Op: OpCreate, After: r1}, false},
		{Event{Table: AccountBalances, Op: OpCreate, After: r2}, true},             // key holds a row
		{Event{Table: AccountBalances, Op: OpUpdate, Before: r2, After: r3}, true}, // before is not r1
		{Event{Table: AccountBalances, Op: OpUpdate, Before: r1, After: r2}, false},
		{Event{Table: AccountBalances, Op: OpDelete, Before: r2}, false},
		{Event{Table: AccountBalances, Op: OpRead, After: r3, Source: Source{Snapshot: "last"}}, false},
	}
	for i, s := range steps {
		err := m.Apply(s.ev)
		var ce *ChainError
		if s.chain != errors.As(err, &ce) {
			t.Fatalf("step %d (%s): got %v, want chain error %v", i, s.ev.Op, err, s.chain)
		}
	}
	want, _ := Canonical(mustTable(t, AccountBalances), r3)
	if got := m.Canonical(AccountBalances); len(got) != 1 || got[0] != want {
		t.Errorf("final rows %v, want [%s]", got, want)
	}
}

func mustTable(t *testing.T, name string) Table {
	t.Helper()
	tb, ok := Lookup(name)
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
	want, _ := Canonical(mustTable(t, AccountBalances), balanceRow(`q"\ü`, math.MinInt64, time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)))
	want = strings.Replace(want, `"event_count":1`, `"event_count":9223372036854775807`, 1)
	if got := r.Rows[ReadingDebeziumJSON][AccountBalances]; len(got) != 1 || got[0] != want {
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
