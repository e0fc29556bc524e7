package waits

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A wait is listed from its start to its end; it is logged once it has
// lasted the first interval, then at most once every interval, saying
// what it waits for, since when and what it last saw; its end is logged
// when it was.
func TestWaitListedAndLoggedAtMostEveryInterval(t *testing.T) {
	var log bytes.Buffer
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := t0
	s := NewWith(slog.New(slog.NewTextHandler(&log, nil)), 5*time.Second, 30*time.Second, func() time.Time { return now })
	w := s.Begin("the thing")
	lines := func() int { return strings.Count(log.String(), "still waiting") }
	for _, step := range []struct {
		at    time.Duration
		lines int
	}{{0, 0}, {time.Second, 0}, {5 * time.Second, 1}, {6 * time.Second, 1}, {34 * time.Second, 1}, {35 * time.Second, 2}, {40 * time.Second, 2}, {66 * time.Second, 3}} {
		now = t0.Add(step.at)
		w.Still("seen " + step.at.String())
		if got := lines(); got != step.lines {
			t.Fatalf("after %s: %d lines logged, want %d:\n%s", step.at, got, step.lines, log.String())
		}
	}
	for _, want := range []string{"for=\"the thing\"", "since=2026-01-02T03:04:05Z", "waited=1m6s", "detail=\"seen 1m6s\""} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, log.String())
		}
	}
	cur := s.Current()
	if len(cur) != 1 || cur[0].What != "the thing" || cur[0].Detail != "seen 1m6s" || !cur[0].Since.Equal(t0) || cur[0].Seconds != 66 {
		t.Errorf("current %+v", cur)
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", Path, nil))
	var l List
	if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil || len(l.Waits) != 1 || l.Waits[0].What != "the thing" {
		t.Errorf("%s served %q (%v)", Path, rec.Body.String(), err)
	}
	w.End()
	if cur := s.Current(); len(cur) != 0 {
		t.Errorf("current after the end %+v", cur)
	}
	if !strings.Contains(log.String(), "wait over") {
		t.Errorf("the end not logged:\n%s", log.String())
	}

	// A short wait is neither logged nor, once over, listed.
	log.Reset()
	w = s.Begin("short")
	now = now.Add(time.Second)
	w.Still("")
	w.End()
	if log.Len() != 0 || len(s.Current()) != 0 {
		t.Errorf("a short wait: log %q, current %+v", log.String(), s.Current())
	}
	// A nil Set's waits work and are listed nowhere.
	var none *Set
	none.Begin("x").End()
	if none.Current() != nil {
		t.Error("a nil Set lists waits")
	}
}
