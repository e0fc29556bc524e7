package failpoint

import (
	"errors"
	"testing"
	"time"
)

func TestNilSetNeverFires(t *testing.T) {
	var s *Set
	if err := s.Inject("anything"); err != nil {
		t.Fatal(err)
	}
	s, err := Parse("  ")
	if err != nil || s != nil {
		t.Fatalf("empty spec: %v %v", s, err)
	}
}

func TestErrorAndNth(t *testing.T) {
	s, err := Parse("a=error,b=error@2,c=sleep:10ms")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Inject("a"); !errors.Is(err, ErrInjected) {
		t.Fatalf("a: %v", err)
	}
	if err := s.Inject("b"); err != nil {
		t.Fatalf("b first hit fired: %v", err)
	}
	if err := s.Inject("b"); !errors.Is(err, ErrInjected) {
		t.Fatalf("b second hit: %v", err)
	}
	if err := s.Inject("b"); err != nil {
		t.Fatalf("b third hit fired: %v", err)
	}
	start := time.Now()
	if err := s.Inject("c"); err != nil || time.Since(start) < 10*time.Millisecond {
		t.Fatalf("c: %v after %s", err, time.Since(start))
	}
	if err := s.Inject("unarmed"); err != nil {
		t.Fatal(err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, spec := range []string{"a", "=kill", "a=boom", "a=kill@0", "a=sleep:x"} {
		if _, err := Parse(spec); err == nil {
			t.Errorf("Parse(%q) accepted", spec)
		}
	}
}
