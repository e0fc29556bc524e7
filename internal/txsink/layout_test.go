package txsink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/placement"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// layoutCheck refuses exactly the checkpoints that placed a key of a
// moving slot the cursor has passed or frozen since their Begin, or that
// wrote every server's rows while the cursor went on, or began under
// another version.
func TestLayoutCheck(t *testing.T) {
	moving := func(moved, frozen string) driver.MoveCursor {
		return driver.MoveCursor{Version: 2, Moving: true, MovedBelow: moved, FrozenBelow: frozen}
	}
	done := driver.MoveCursor{Version: 2, MovedBelow: driver.KeysEnd}
	for _, tc := range []struct {
		name    string
		built   driver.MoveCursor
		version int // the layout version placed by
		touched []string
		all     bool
		cur     driver.MoveCursor
		refused bool
	}{
		{"no move", driver.MoveCursor{}, 0, []string{"a"}, true, driver.MoveCursor{}, false},
		{"a move began", driver.MoveCursor{}, 0, nil, false, moving("", ""), true},
		{"another version", moving("", ""), 2, nil, false, driver.MoveCursor{Version: 3, Moving: true}, true},
		{"cursor unchanged", moving("c", ""), 2, []string{"a", "c", "z"}, true, moving("c", ""), false},
		{"frozen above every key", moving("c", ""), 2, []string{"a", "b", "q"}, false, moving("c", "k"), false},
		{"frozen over a key", moving("c", ""), 2, []string{"a", "d", "q"}, false, moving("c", "k"), true},
		{"frozen from the key", moving("c", ""), 2, []string{"c"}, false, moving("c", "k"), true},
		{"frozen up to the key", moving("c", ""), 2, []string{"k"}, false, moving("c", "k"), false},
		{"moved past a key", moving("c", ""), 2, []string{"e"}, false, moving("k", ""), true},
		{"moved, the key above", moving("c", ""), 2, []string{"m"}, false, moving("k", ""), false},
		{"moved below the cursor built on", moving("c", ""), 2, []string{"b"}, false, moving("k", "m"), false},
		{"sealing while moved", moving("c", ""), 2, nil, true, moving("k", ""), true},
		{"sealing while frozen", moving("c", ""), 2, nil, true, moving("c", "d"), true},
		{"built frozen, still frozen", moving("c", "k"), 2, []string{"d"}, false, moving("c", "k"), true},
		{"done since", moving("c", ""), 2, []string{"zz"}, false, done, true},
		{"done since, keys below", moving("c", ""), 2, []string{"a"}, false, done, false},
		{"done before", done, 2, []string{"a"}, true, done, false},
		// A move's begin does not fence the instances that follow it:
		// their checkpoint in flight commits while no key moved.
		{"a move began from the version placed by", driver.MoveCursor{}, 1, []string{"a"}, true, moving("", ""), false},
		{"a move began from the version done", driver.MoveCursor{Version: 1, MovedBelow: driver.KeysEnd}, 1, nil, false, moving("", ""), false},
		{"a move began and froze a step", driver.MoveCursor{}, 1, nil, false, moving("", "k"), true},
		{"a move began and moved a step", driver.MoveCursor{}, 1, nil, false, moving("k", ""), true},
		{"a move from another version began", driver.MoveCursor{}, 2, nil, false, moving("", ""), true},
		// An announced step refuses nothing: checkpoints in flight then
		// decide before it freezes.
		{"announced over a key", moving("c", ""), 2, []string{"d"}, false, driver.MoveCursor{Version: 2, Moving: true, MovedBelow: "c", AnnouncedBelow: "k"}, false},
		{"announced, sealing", moving("c", ""), 2, nil, true, driver.MoveCursor{Version: 2, Moving: true, MovedBelow: "c", AnnouncedBelow: "k"}, false},
		{"two moves began since", driver.MoveCursor{Version: 1, MovedBelow: driver.KeysEnd}, 1, nil, false, driver.MoveCursor{Version: 3, Moving: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := layoutCheck(tc.built, tc.version, tc.touched, tc.all, tc.cur)
			if got := errors.Is(err, ErrLayoutMoved); got != tc.refused || (err != nil && !got) {
				t.Fatalf("layoutCheck(%+v, %d, %q, %v, %+v) = %v, want refused %v", tc.built, tc.version, tc.touched, tc.all, tc.cur, err, tc.refused)
			}
		})
	}
}

// moveFixture is a sink on the first of two in-memory servers, with a
// layout of version 2 that grows onto the second: moves is a key of a slot
// that moves there, stays one that does not.
type moveFixture struct {
	s             *Sink
	control       *memdriver.Server
	before, grown placement.Placement
	layouts       Layouts
	moves, stays  string
}

func newMoveFixture(t *testing.T) *moveFixture {
	t.Helper()
	ctx := context.Background()
	c0 := memdriver.New(memdriver.Options{})
	c1 := memdriver.New(memdriver.Options{})
	f := &moveFixture{control: c0.As("billing")}
	var err error
	if f.before, err = placement.Modulo(1); err != nil {
		t.Fatal(err)
	}
	if f.grown, _, err = f.before.Grow(1); err != nil {
		t.Fatal(err)
	}
	f.layouts = func(_ context.Context, version int) (placement.Placement, placement.Placement, error) {
		if version != 2 {
			return placement.Placement{}, placement.Placement{}, fmt.Errorf("no version %d", version)
		}
		return f.grown, f.before, nil
	}
	f.s, err = New(ctx, Config{Branches: 2, Group: "g", Topic: "t", StepTimeout: time.Second, Logger: testenv.Logger(), Placement: f.before, Layouts: f.layouts},
		f.control, []driver.Server{f.control, c1.As("billing")})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; f.moves == "" || f.stays == ""; i++ {
		k := fmt.Sprintf("acct-%d", i)
		if f.grown.Server(placement.Hash(k)) == 1 {
			f.moves = k
		} else {
			f.stays = k
		}
	}
	return f
}

// begin begins the move to version 2 and has the sink read it.
func (f *moveFixture) begin(t *testing.T) driver.MoveCursor {
	t.Helper()
	start := driver.MoveCursor{Version: 2, Moving: true, Mover: "test"}
	f.change(t, driver.MoveCursor{}, start)
	return start
}

// change changes the cursor from was to next, and has the sink read it.
func (f *moveFixture) change(t *testing.T, was, next driver.MoveCursor) {
	t.Helper()
	ctx := context.Background()
	if _, err := f.control.ChangeMoveCursor(ctx, was, next); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
}

// A sink follows a live move: keys of moving slots go to their old server
// until the cursor passes them, then to the new one; a checkpoint that
// placed one the cursor froze or passed since its Begin is refused at its
// decision, one that placed only keys that do not move is not; a sink
// given too few servers for the new layout stops (ErrNotPlaceable).
func TestSinkFollowsALiveMove(t *testing.T) {
	ctx := context.Background()
	f := newMoveFixture(t)
	s, control, moves, stays := f.s, f.control, f.moves, f.stays
	if s.ServerOf(s.Route(moves)) != 0 {
		t.Fatal("a key placed on the server to add before the move")
	}
	start := f.begin(t)
	if s.ServerOf(s.Route(moves)) != 0 || s.ServerOf(s.Route(stays)) != 0 {
		t.Fatal("keys placed on the new server before the cursor passed them")
	}
	decide := func(keys ...string) error {
		tx := s.Begin(1)
		for _, k := range keys {
			tx.Route(k)
		}
		frozen := start
		frozen.FrozenBelow = moves + "\x00"
		if _, err := control.ChangeMoveCursor(ctx, start, frozen); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if _, err := control.ChangeMoveCursor(ctx, frozen, start); err != nil {
				t.Fatal(err)
			}
		}()
		return tx.Decide(ctx, nil, nil, nil)
	}
	if err := decide(moves, stays); !errors.Is(err, ErrLayoutMoved) {
		t.Fatalf("the decision of a checkpoint that placed a frozen key: %v, want ErrLayoutMoved", err)
	}
	if err := decide(stays); err != nil {
		t.Fatalf("the decision of a checkpoint whose keys do not move: %v", err)
	}
	passed := start
	passed.MovedBelow = moves + "\x00"
	f.change(t, start, passed)
	if s.ServerOf(s.Route(moves)) != 1 || s.ServerOf(s.Route(stays)) != 0 {
		t.Fatal("after the cursor passed the moving key, it is not on the new server (or the other moved)")
	}

	// An instance given only the first server cannot follow.
	one, err := New(ctx, Config{Branches: 1, Group: "g", Topic: "t", StepTimeout: time.Second, Logger: testenv.Logger(), Placement: f.before, Layouts: f.layouts},
		control, []driver.Server{control})
	if !errors.Is(err, ErrNotPlaceable) {
		t.Fatalf("a sink without the new server on a moving ledger: %v, %v; want ErrNotPlaceable", one, err)
	}
}

// A step announced: the sink says it is stepping (its checkpoints wait),
// records once per announcement that it waits for it (AwaitStep, which the
// mover reads), and the decision of a checkpoint that placed one of its
// keys is not refused: only a freeze refuses.
func TestSinkWaitsForAnAnnouncedStep(t *testing.T) {
	ctx := context.Background()
	f := newMoveFixture(t)
	s := f.s
	start := f.begin(t)
	if s.Stepping() {
		t.Fatal("stepping before any step was announced")
	}
	if err := s.AwaitStep(ctx); err != nil {
		t.Fatal(err)
	}
	tx := s.Begin(1)
	tx.Route(f.moves)
	announced := start
	announced.AnnouncedBelow = f.moves + "\x00"
	f.change(t, start, announced)
	if !s.Stepping() {
		t.Fatal("not stepping while a step is announced")
	}
	for range 2 {
		if err := s.AwaitStep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.control.StepWaiters(announced); !slices.Equal(got, []string{s.Instance()}) {
		t.Fatalf("instances waiting for the announced step: %q, want this one", got)
	}
	if got := f.control.StepWaiters(start); len(got) != 0 {
		t.Fatalf("instances waiting while no step was announced: %q", got)
	}
	if err := tx.Decide(ctx, nil, nil, nil); err != nil {
		t.Fatalf("the decision of a checkpoint that placed a key of the announced step: %v", err)
	}
	frozen := announced
	frozen.FrozenBelow, frozen.AnnouncedBelow = announced.AnnouncedBelow, ""
	f.change(t, announced, frozen)
	if !s.Stepping() {
		t.Fatal("not stepping while a step is frozen")
	}

	// An instance that stops during the move waits for every step; one
	// that stops while no move is under way records nothing.
	next := driver.MoveCursor{Version: 2, Moving: true, MovedBelow: frozen.FrozenBelow, AnnouncedBelow: driver.KeysEnd, Mover: "test"}
	if got := f.control.StepWaiters(next); len(got) != 0 {
		t.Fatalf("instances waiting for a step not announced yet: %q", got)
	}
	if err := s.LeaveMove(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.control.StepWaiters(next); !slices.Equal(got, []string{s.Instance()}) {
		t.Fatalf("instances waiting for the next step after this one stopped: %q, want this one", got)
	}
	idle := newMoveFixture(t)
	if err := idle.s.LeaveMove(ctx); err != nil {
		t.Fatal(err)
	}
	if got := idle.control.StepWaiters(next); len(got) != 0 {
		t.Fatalf("an instance stopped with no move under way recorded a wait: %q", got)
	}
	// The move began after the instance's last read of the cursor.
	if _, err := idle.control.ChangeMoveCursor(ctx, driver.MoveCursor{}, start); err != nil {
		t.Fatal(err)
	}
	if err := idle.s.LeaveMove(ctx); err != nil {
		t.Fatal(err)
	}
	if got := idle.control.StepWaiters(next); !slices.Equal(got, []string{idle.s.Instance()}) {
		t.Fatalf("an instance stopped after a move began unseen: waiting %q, want it", got)
	}
}
