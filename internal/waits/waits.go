package waits

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Path is the instance's HTTP endpoint listing its waits (Current, as
// JSON: {"waits": [Info…]}).
const Path = "/waits"

// Defaults of a Set's logging.
const (
	DefaultFirst = 5 * time.Second  // a wait shorter than this is not logged
	DefaultEvery = 30 * time.Second // then at most one line per wait this often
)

// Set is one instance's waits in progress. A nil *Set is valid: its waits
// log through slog.Default() and are listed nowhere.
type Set struct {
	log          *slog.Logger
	first, every time.Duration
	now          func() time.Time

	mu    sync.Mutex
	waits map[*Wait]struct{}
}

// New returns a Set logging to log with the default intervals.
func New(log *slog.Logger) *Set {
	return NewWith(log, DefaultFirst, DefaultEvery, time.Now)
}

// NewWith returns a Set logging a wait once it lasted first, then at most
// every every, on the clock now (tests).
func NewWith(log *slog.Logger, first, every time.Duration, now func() time.Time) *Set {
	if log == nil {
		log = slog.Default()
	}
	return &Set{log: log, first: first, every: every, now: now, waits: map[*Wait]struct{}{}}
}

// Wait is one wait in progress.
type Wait struct {
	set    *Set
	what   string
	since  time.Time
	logged time.Time // zero: not logged yet

	mu     sync.Mutex
	detail string
}

// Info is a wait in progress as Current lists it.
type Info struct {
	What    string    `json:"what"`
	Detail  string    `json:"detail,omitempty"`
	Since   time.Time `json:"since"`
	Seconds float64   `json:"seconds"`
}

// Begin starts a wait for what (a short sentence: "the commit log's
// visible position to reach 42"); End it when it is over.
func (s *Set) Begin(what string) *Wait {
	if s == nil {
		s = New(nil)
		s.waits = nil
	}
	w := &Wait{set: s, what: what, since: s.now()}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waits != nil {
		s.waits[w] = struct{}{}
	}
	return w
}

// Still says the wait goes on, detail being what it last saw ("visible
// 40, decided 42"): it logs once the wait has lasted the Set's first
// interval, then at most every its every interval.
func (w *Wait) Still(detail string) {
	w.mu.Lock()
	w.detail = detail
	now := w.set.now()
	due := now.Sub(w.since) >= w.set.first && (w.logged.IsZero() || now.Sub(w.logged) >= w.set.every)
	if due {
		w.logged = now
	}
	w.mu.Unlock()
	if due {
		w.set.log.Warn("still waiting", "for", w.what, "since", w.since.UTC().Format(time.RFC3339), "waited", now.Sub(w.since).Round(time.Second), "detail", detail)
	}
}

// End ends the wait (and logs its end when it was logged).
func (w *Wait) End() {
	w.set.mu.Lock()
	delete(w.set.waits, w)
	w.set.mu.Unlock()
	w.mu.Lock()
	logged := !w.logged.IsZero()
	w.mu.Unlock()
	if logged {
		w.set.log.Info("wait over", "for", w.what, "waited", w.set.now().Sub(w.since).Round(time.Second))
	}
}

// Current lists the waits in progress, the oldest first.
func (s *Set) Current() []Info {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	ws := make([]*Wait, 0, len(s.waits))
	for w := range s.waits {
		ws = append(ws, w)
	}
	s.mu.Unlock()
	now := s.now()
	out := make([]Info, 0, len(ws))
	for _, w := range ws {
		w.mu.Lock()
		out = append(out, Info{What: w.what, Detail: w.detail, Since: w.since, Seconds: now.Sub(w.since).Seconds()})
		w.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b Info) int {
		if c := a.Since.Compare(b.Since); c != 0 {
			return c
		}
		return strings.Compare(a.What, b.What)
	})
	return out
}

// List is the body of the Path endpoint.
type List struct {
	Waits []Info `json:"waits"`
}

// Handler serves Current as a List.
func (s *Set) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(List{Waits: append([]Info{}, s.Current()...)})
	})
}
