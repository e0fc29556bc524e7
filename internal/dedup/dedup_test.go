package dedup

import (
	"slices"
	"testing"
	"time"
)

func fp(b byte) Fingerprint { return Fingerprint{b} }

func TestClassify(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ttl := time.Hour
	live, gone := now.Add(time.Minute), now
	tests := []struct {
		name     string
		keys     []Key
		known    map[string]Seen
		earlier  map[string]Seen
		want     []Verdict
		inserts  int
		replace  bool
		takeBack []string
	}{
		{"first arrival", []Key{{"a", fp(1)}}, nil, nil, []Verdict{New}, 1, false, nil},
		{"repeat in batch", []Key{{"a", fp(1)}, {"a", fp(1)}}, nil, nil, []Verdict{New, Duplicate}, 1, false, nil},
		{"conflict in batch", []Key{{"a", fp(1)}, {"a", fp(2)}}, nil, nil, []Verdict{New, Conflict}, 1, false, nil},
		{"repeat of stored", []Key{{"a", fp(1)}}, map[string]Seen{"a": {Fingerprint: fp(1), ExpiresAt: live}}, nil, []Verdict{Duplicate}, 0, false, nil},
		{"conflict with stored", []Key{{"a", fp(2)}}, map[string]Seen{"a": {Fingerprint: fp(1), ExpiresAt: live}}, nil, []Verdict{Conflict}, 0, false, nil},
		// The stored first arrival decides, not the first arrival in the batch.
		{"batch repeat of a conflict", []Key{{"a", fp(2)}, {"a", fp(2)}}, map[string]Seen{"a": {Fingerprint: fp(1), ExpiresAt: live}}, nil, []Verdict{Conflict, Conflict}, 0, false, nil},
		{"expired is forgotten", []Key{{"a", fp(2)}}, map[string]Seen{"a": {Fingerprint: fp(1), ExpiresAt: gone}}, nil, []Verdict{New}, 1, true, nil},
		// A live key of an earlier generation makes the arrival a repeat,
		// and the key the claim inserted into the current one is taken
		// back (once, however many arrivals).
		{"repeat of an earlier generation", []Key{{"a", fp(1)}, {"a", fp(1)}}, nil, map[string]Seen{"a": {Fingerprint: fp(1), ExpiresAt: live}}, []Verdict{Duplicate, Duplicate}, 0, false, []string{"a"}},
		{"conflict with an earlier generation", []Key{{"a", fp(2)}}, nil, map[string]Seen{"a": {Fingerprint: fp(1), ExpiresAt: live}}, []Verdict{Conflict}, 0, false, []string{"a"}},
		{"expired in an earlier generation", []Key{{"a", fp(2)}}, nil, map[string]Seen{"a": {Fingerprint: fp(1), ExpiresAt: gone}}, []Verdict{New}, 1, false, nil},
		// An expired row in the current table and a live one in an earlier
		// generation: the live one decides; the claim inserted nothing.
		{"live earlier, expired current", []Key{{"a", fp(2)}}, map[string]Seen{"a": {Fingerprint: fp(1), ExpiresAt: gone}}, map[string]Seen{"a": {Fingerprint: fp(3), ExpiresAt: live}}, []Verdict{Conflict}, 0, false, nil},
		// Two live rows: the one expiring first is the first arrival.
		{"two live, the earlier first", []Key{{"a", fp(3)}}, map[string]Seen{"a": {Fingerprint: fp(1), ExpiresAt: live.Add(time.Hour)}}, map[string]Seen{"a": {Fingerprint: fp(3), ExpiresAt: live}}, []Verdict{Duplicate}, 0, false, nil},
		{"two live, the current first", []Key{{"a", fp(1)}}, map[string]Seen{"a": {Fingerprint: fp(1), ExpiresAt: live}}, map[string]Seen{"a": {Fingerprint: fp(3), ExpiresAt: live.Add(time.Hour)}}, []Verdict{Duplicate}, 0, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ins, back := Classify(now, ttl, tt.keys, tt.known, tt.earlier)
			for i := range tt.want {
				if got[i] != tt.want[i] {
					t.Fatalf("verdict %d = %v, want %v", i, got[i], tt.want[i])
				}
			}
			if len(ins) != tt.inserts {
				t.Fatalf("inserts = %d, want %d", len(ins), tt.inserts)
			}
			if len(ins) > 0 && (ins[0].Replace != tt.replace || !ins[0].ExpiresAt.Equal(now.Add(ttl))) {
				t.Fatalf("insert = %+v", ins[0])
			}
			if !slices.Equal(back, tt.takeBack) {
				t.Fatalf("taken back %v, want %v", back, tt.takeBack)
			}
		})
	}
}

func TestCacheBudgetAndExpiry(t *testing.T) {
	now := time.Unix(1000, 0)
	c := NewCache(2)
	c.Add("a", Seen{Fingerprint: fp(1), ExpiresAt: now.Add(time.Hour)}, now)
	c.Add("b", Seen{Fingerprint: fp(2), ExpiresAt: now.Add(time.Hour)}, now)
	c.Add("c", Seen{Fingerprint: fp(3), ExpiresAt: now.Add(time.Hour)}, now)
	if c.Len() != 2 {
		t.Fatalf("len = %d, want budget 2", c.Len())
	}
	if _, ok := c.Get("a", now); ok {
		t.Fatal("oldest entry not evicted")
	}
	if s, ok := c.Get("c", now); !ok || s.Fingerprint != fp(3) {
		t.Fatal("newest entry missing")
	}
	c.Add("d", Seen{Fingerprint: fp(4), ExpiresAt: now.Add(time.Hour)}, now)
	if _, ok := c.Get("b", now); ok {
		t.Fatal("second oldest not evicted next")
	}
	if _, ok := c.Get("c", now.Add(time.Hour)); ok {
		t.Fatal("expired entry returned")
	}
	c.Add("e", Seen{Fingerprint: fp(5), ExpiresAt: now}, now)
	if _, ok := c.entries["e"]; ok {
		t.Fatal("already expired entry added")
	}
	off := NewCache(0)
	off.Add("a", Seen{Fingerprint: fp(1), ExpiresAt: now.Add(time.Hour)}, now)
	if off.Len() != 0 {
		t.Fatal("disabled cache holds entries")
	}
}
