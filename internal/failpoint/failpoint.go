package failpoint

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrInjected is wrapped by every error an armed failpoint returns.
var ErrInjected = errors.New("failpoint: injected failure")

type action struct {
	kind  string
	sleep time.Duration
	nth   int // 0 = every time
}

// Set is a group of armed failpoints. It is safe for concurrent use.
type Set struct {
	mu      sync.Mutex
	actions map[string]action
	hits    map[string]int
}

// Parse arms the failpoints named in spec. An empty spec returns nil.
func Parse(spec string) (*Set, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, nil
	}
	s := &Set{actions: map[string]action{}, hits: map[string]int{}}
	for _, item := range strings.Split(spec, ",") {
		name, act, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("failpoint %q: want name=action", item)
		}
		var a action
		if body, n, ok := strings.Cut(act, "@"); ok {
			nth, err := strconv.Atoi(n)
			if err != nil || nth < 1 {
				return nil, fmt.Errorf("failpoint %q: @%s is not a positive count", item, n)
			}
			a.nth, act = nth, body
		}
		switch {
		case act == "kill" || act == "stop" || act == "exit" || act == "error":
			a.kind = act
		case strings.HasPrefix(act, "sleep:"):
			d, err := time.ParseDuration(strings.TrimPrefix(act, "sleep:"))
			if err != nil {
				return nil, fmt.Errorf("failpoint %q: %w", item, err)
			}
			a.kind, a.sleep = "sleep", d
		default:
			return nil, fmt.Errorf("failpoint %q: unknown action %q", item, act)
		}
		s.actions[name] = a
	}
	return s, nil
}

// Inject runs the action armed for name, if any. It returns an error
// wrapping ErrInjected for the error action and nil otherwise; kill and exit
// do not return.
func (s *Set) Inject(name string) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	a, ok := s.actions[name]
	s.hits[name]++
	hit := s.hits[name]
	s.mu.Unlock()
	if !ok || (a.nth != 0 && a.nth != hit) {
		return nil
	}
	switch a.kind {
	case "kill":
		fmt.Fprintf(os.Stderr, "failpoint %s: SIGKILL\n", name)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	case "stop":
		fmt.Fprintf(os.Stderr, "failpoint %s: SIGSTOP\n", name)
		stopSelf() // resumes here on SIGCONT
	case "exit":
		fmt.Fprintf(os.Stderr, "failpoint %s: exit 3\n", name)
		os.Exit(3)
	case "sleep":
		fmt.Fprintf(os.Stderr, "failpoint %s: sleeping %s\n", name, a.sleep)
		time.Sleep(a.sleep)
	case "error":
		return fmt.Errorf("%w at %s", ErrInjected, name)
	}
	return nil
}
