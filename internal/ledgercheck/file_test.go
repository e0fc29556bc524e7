package ledgercheck

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFileRoundTrip(t *testing.T) {
	exp := sampleExpected(t)
	exp.Seed = math.MaxUint64
	exp.Topic = "billing"
	exp.Partitions = 6
	exp.Produced = Produced{Records: 10, Valid: 5, Duplicates: 2, CrossPartitionDuplicates: 1, Conflicts: 1, Malformed: 3}
	exp.Params = map[string]string{"events": "5"}
	// Extreme amounts must survive JSON exactly.
	exp.Balances[0].BalanceMinor = math.MinInt64
	exp.Windows[0].AmountMinor = math.MinInt64 + 20
	exp.Windows[1].AmountMinor = -20

	path := filepath.Join(t.TempDir(), "expected.json")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, exp); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := Marshal(exp)
	b, _ := Marshal(got)
	if !bytes.Equal(a, b) {
		t.Errorf("round trip differs:\n%s\n---\n%s", a, b)
	}
	if got.Seed != math.MaxUint64 || got.Balances[0].BalanceMinor != math.MinInt64 || got.Window != "1h0m0s" {
		t.Errorf("values lost: %+v", got)
	}
	if !got.Windows[0].WindowStart.Equal(exp.Windows[0].WindowStart) {
		t.Errorf("window start %v", got.Windows[0].WindowStart)
	}
	// The document is valid JSON with one row per line.
	var anyDoc map[string]any
	if err := json.Unmarshal(a, &anyDoc); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, a)
	}
	if !strings.Contains(string(a), "\n    {\"account_id\":\"acct-1\",\"currency\":\"EUR\",\"balance_minor\":-9223372036854775808,\"event_count\":3},\n") {
		t.Errorf("unexpected layout:\n%s", a)
	}
	if !strings.Contains(string(a), `"window": "1h0m0s"`) {
		t.Errorf("window not a duration string:\n%s", a)
	}
}

func TestMarshalEmpty(t *testing.T) {
	l, _ := NewModel(time.Hour)
	data, err := Marshal(l.Expected())
	if err != nil {
		t.Fatal(err)
	}
	e, err := Unmarshal(data)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	if len(e.Balances) != 0 || e.DeadLetters == nil {
		t.Errorf("%+v", e)
	}
	if !strings.Contains(string(data), `"balances": []`) {
		t.Errorf("layout:\n%s", data)
	}
}

func TestUnmarshalRejects(t *testing.T) {
	good, err := Marshal(sampleExpected(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Unmarshal(good); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, old, new string
	}{
		{"version", `"version": 2`, `"version": 3`},
		{"window", `"window": "1h0m0s"`, `"window": "0s"`},
		{"window unit", `"window": "1h0m0s"`, `"window": "1500ns"`},
		{"trailing data", "\n}\n", "\n}\n{}"},
		{"unsorted balances", `"acct-2","currency":"USD","balance_minor":15`, `"acct-0","currency":"USD","balance_minor":15`},
		{"balance not sum of windows", `"balance_minor":130`, `"balance_minor":131`},
		{"events_valid", `"events_valid": 5`, `"events_valid": 6`},
		{"unaligned window", `"window_start":"2026-11-29T13:00:00Z"`, `"window_start":"2026-11-29T13:00:01Z"`},
		{"negative dead letters", `"invalid_json": 2`, `"invalid_json": -2`},
		{"not JSON", "{", "["},
	}
	for _, tc := range tests {
		bad := strings.Replace(string(good), tc.old, tc.new, 1)
		if bad == string(good) {
			t.Fatalf("%s: %q not found in\n%s", tc.name, tc.old, good)
		}
		if _, err := Unmarshal([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", tc.name)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
}

func TestWriteFileFailsCleanly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing")
	if err := WriteFile(filepath.Join(dir, "e.json"), sampleExpected(t)); err == nil {
		t.Fatal("wrote into a missing directory")
	}
}
