package dedup

import (
	"testing"
	"time"
)

func fp(b byte) Fingerprint { return Fingerprint{b} }

func TestClassify(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ttl := time.Hour
	tests := []struct {
		name    string
		keys    []Key
		known   map[string]Seen
		want    []Verdict
		inserts int
		replace bool
	}{
		{"first arrival", []Key{{"a", fp(1)}}, nil, []Verdict{New}, 1, false},
		{"repeat in batch", []Key{{"a", fp(1)}, {"a", fp(1)}}, nil, []Verdict{New, Duplicate}, 1, false},
		{"conflict in batch", []Key{{"a", fp(1)}, {"a", fp(2)}}, nil, []Verdict{New, Conflict}, 1, false},
		{"repeat of stored", []Key{{"a", fp(1)}}, map[string]Seen{"a": {fp(1), now.Add(time.Minute)}}, []Verdict{Duplicate}, 0, false},
		{"conflict with stored", []Key{{"a", fp(2)}}, map[string]Seen{"a": {fp(1), now.Add(time.Minute)}}, []Verdict{Conflict}, 0, false},
		// The stored first arrival decides, not the first arrival in the batch.
		{"batch repeat of a conflict", []Key{{"a", fp(2)}, {"a", fp(2)}}, map[string]Seen{"a": {fp(1), now.Add(time.Minute)}}, []Verdict{Conflict, Conflict}, 0, false},
		{"expired is forgotten", []Key{{"a", fp(2)}}, map[string]Seen{"a": {fp(1), now}}, []Verdict{New}, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ins := Classify(now, ttl, tt.keys, tt.known)
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
		})
	}
}

func TestCacheBudgetAndExpiry(t *testing.T) {
	now := time.Unix(1000, 0)
	c := NewCache(2)
	c.Add("a", Seen{fp(1), now.Add(time.Hour)}, now)
	c.Add("b", Seen{fp(2), now.Add(time.Hour)}, now)
	c.Add("c", Seen{fp(3), now.Add(time.Hour)}, now)
	if c.Len() != 2 {
		t.Fatalf("len = %d, want budget 2", c.Len())
	}
	if _, ok := c.Get("a", now); ok {
		t.Fatal("oldest entry not evicted")
	}
	if s, ok := c.Get("c", now); !ok || s.Fingerprint != fp(3) {
		t.Fatal("newest entry missing")
	}
	c.Add("d", Seen{fp(4), now.Add(time.Hour)}, now)
	if _, ok := c.Get("b", now); ok {
		t.Fatal("second oldest not evicted next")
	}
	if _, ok := c.Get("c", now.Add(time.Hour)); ok {
		t.Fatal("expired entry returned")
	}
	c.Add("e", Seen{fp(5), now}, now)
	if _, ok := c.entries["e"]; ok {
		t.Fatal("already expired entry added")
	}
	off := NewCache(0)
	off.Add("a", Seen{fp(1), now.Add(time.Hour)}, now)
	if off.Len() != 0 {
		t.Fatal("disabled cache holds entries")
	}
}
