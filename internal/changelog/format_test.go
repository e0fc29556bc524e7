package changelog

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"
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
