package main

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the reporter goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestProgressModes(t *testing.T) {
	var bar syncBuffer
	p := newProgress("bar", &bar, 100)
	p.valid.Store(40)
	time.Sleep(3 * barEvery)
	p.valid.Store(100)
	p.finish()
	p.finish() // idempotent
	if !strings.Contains(bar.String(), "producing") || !strings.Contains(bar.String(), "100/100") {
		t.Errorf("bar output %q", bar.String())
	}

	var none syncBuffer
	p = newProgress("none", &none, 10)
	p.finish()
	if none.String() != "" {
		t.Errorf("none wrote %q", none.String())
	}

	// auto on a non-terminal is log mode: nothing before logEvery.
	var auto syncBuffer
	p = newProgress("auto", &auto, 10)
	if p.bar != nil {
		t.Error("auto chose the bar for a buffer")
	}
	p.render()
	p.finish()
	if !strings.Contains(auto.String(), "0/10 valid events") {
		t.Errorf("log output %q", auto.String())
	}
}
