package txsink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/billing/ledger/internal/placement"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Where the sink places keys while the ledger grows. A move to a new
// layout version runs while the instances count (package shards, billing
// shards add; driver.MoveCursor says how it goes): the rows of the slots
// that change server move step by step, in key order. So a key is placed
// by the layout the sink last read: on its slot's new server when the
// slot moves and the key is below the cursor, on its old server
// otherwise. A checkpoint places every key it writes by the layout of its
// Begin (Txn.Route) and remembers the keys of moving slots; its decision
// reads the cursor under a shared lock, which each step of the mover
// changes under an exclusive one, and refuses (ErrLayoutMoved) a
// checkpoint that placed a key the cursor has since passed or frozen
// (layoutCheck): such a checkpoint's rows of that key would be on the old
// server after the move read it. So no checkpoint's row is left behind,
// and none goes where no reader looks. The mover, for its part, moves a
// step's keys only once every decision before its freeze is applied.

// ErrLayoutMoved refuses the decision of a checkpoint that placed a key
// the live move has moved, or is moving, since the checkpoint began (or
// that began under another layout version): nothing of it commits; it is
// built again on the layout the sink reads then (Sink.Refresh).
var ErrLayoutMoved = errors.New("txsink: the ledger's layout moved since the checkpoint placed its keys")

// ErrNotPlaceable stops an instance that cannot place keys by the
// ledger's layout: it has servers this instance was not given
// (Config.Layouts says which).
var ErrNotPlaceable = errors.New("txsink: the ledger's layout has servers this instance was not configured with")

// Layouts returns the placement of a layout version over the sink's
// servers and, when the version was moved to from another, the placement
// before it (zero: none). An error wrapping ErrNotPlaceable says the
// version has servers beyond the sink's.
type Layouts func(ctx context.Context, version int) (place, before placement.Placement, err error)

// layout is where the sink places keys: a placement and, during a move
// to it, the placement before and the move's cursor. Immutable once
// made.
type layout struct {
	cursor driver.MoveCursor
	place  placement.Placement
	before placement.Placement // during a move; zero otherwise
	// version is the layout version place is: the cursor's, or while
	// the cursor has none (no move since migration 00013) the one the
	// sink started with (Config.LayoutVersion; 0: not known).
	version int
}

// server is the server of a key of hash h, and whether its slot moves.
func (l *layout) server(key string, h uint64) (sv int, moving bool) {
	to := l.place.Server(h)
	if !l.cursor.Moving || l.before.Servers() == 0 {
		return to, false
	}
	from := l.before.Server(h)
	if from == to {
		return to, false
	}
	if key < l.cursor.MovedBelow {
		return to, true
	}
	return from, true
}

// participant places a key on a participant of branches per server.
func (l *layout) participant(key string, branches int) (int, bool) {
	h := placement.Hash(key)
	sv, moving := l.server(key, h)
	return sv*branches + l.place.Branch(h, branches), moving
}

// layoutCheck is the decision's guard against the move (see the top of
// this file): a checkpoint begun under cursor built, placing keys by
// layout version version (0: not known), which placed the
// keys of moving slots touched (sorted; all: it wrote rows it did not
// place by key, the sealing of closed windows on every server), may
// commit under the current cursor cur only if the cursor's version is
// the same and no key it placed by the cursor lies where the cursor has
// moved or frozen since. One begun before a move, at the version the
// move goes from, may commit while the move has neither moved nor frozen
// a key: it placed every key on the server the move reads it from (the
// begin does not fence the instances that follow the cursor; the
// checkpoint each has in flight then is not lost).
func layoutCheck(built driver.MoveCursor, version int, touched []string, all bool, cur driver.MoveCursor) error {
	if !built.Moving && version > 0 && cur.Moving && cur.Version == version+1 && cur.Settled() == "" {
		return nil
	}
	if cur.Version != built.Version {
		return fmt.Errorf("%w: the layout's move went from version %d to %d", ErrLayoutMoved, built.Version, cur.Version)
	}
	if !built.Moving {
		return nil
	}
	lo, hi := built.MovedBelow, cur.Settled()
	if hi <= lo {
		return nil
	}
	if all {
		return fmt.Errorf("%w: it wrote every server's rows while keys from %q moved", ErrLayoutMoved, lo)
	}
	i := sort.SearchStrings(touched, lo)
	if i < len(touched) && touched[i] < hi {
		return fmt.Errorf("%w: key %q moved to its new server", ErrLayoutMoved, touched[i])
	}
	return nil
}

// Refresh reads the move's cursor and, when it changed, places keys by
// it from then on (a new layout version is read through Config.Layouts).
// The checkpointer calls it before each attempt; a checkpoint begun
// before keeps the layout of its Begin.
func (s *Sink) Refresh(ctx context.Context) error {
	cur, err := s.control.MoveCursor(ctx)
	if err != nil {
		return fmt.Errorf("read the move's cursor: %w", err)
	}
	old := s.layout.Load()
	if cur == old.cursor {
		return nil
	}
	next := &layout{cursor: cur, place: old.place, before: old.before, version: old.version}
	if cur.Version != old.cursor.Version {
		if next, err = s.loadLayout(ctx, cur); err != nil {
			return err
		}
	}
	s.layout.Store(next)
	if cur.Version != old.cursor.Version || cur.Moving != old.cursor.Moving {
		s.log.Info("placing keys by the ledger's layout", "version", cur.Version, "moving", cur.Moving, "servers", next.place.Servers())
	}
	return nil
}

// loadLayout is the layout of cursor cur.
func (s *Sink) loadLayout(ctx context.Context, cur driver.MoveCursor) (*layout, error) {
	if s.cfg.Layouts == nil {
		return nil, fmt.Errorf("%w: the move to layout version %d, and no Layouts configured", ErrNotPlaceable, cur.Version)
	}
	place, before, err := s.cfg.Layouts(ctx, cur.Version)
	if err != nil {
		return nil, err
	}
	check := []placement.Placement{place}
	if cur.Moving {
		// Keys not yet moved are on their servers before the move.
		check = append(check, before)
	}
	for _, p := range check {
		if p.Servers() > len(s.servers) {
			return nil, fmt.Errorf("%w: layout version %d places keys on %d servers, this instance has %d", ErrNotPlaceable, cur.Version, p.Servers(), len(s.servers))
		}
	}
	if place.Servers() == 0 {
		return nil, fmt.Errorf("txsink: layout version %d has no placement", cur.Version)
	}
	return &layout{cursor: cur, place: place, before: before, version: cur.Version}, nil
}

// Stepping says whether a step of a move is announced or under way by
// the cursor the sink last read: a checkpoint that writes one of its keys
// would be refused once it is frozen, so the checkpointer waits for the
// step (and says so: AwaitStep).
func (s *Sink) Stepping() bool {
	c := s.layout.Load().cursor
	return c.Frozen() || c.Announced()
}

// LeaveMove records on the control server, while a move is under way,
// that this instance stopped (it waits for every step: AwaitStep), so
// that the mover does not wait for it after its last checkpoint. The
// cursor is read again: the move may have begun after the instance's
// last checkpoint, which the mover counts it by.
func (s *Sink) LeaveMove(ctx context.Context) error {
	cur, err := s.control.MoveCursor(ctx)
	if err != nil || !cur.Moving {
		return err
	}
	return s.control.AwaitStep(ctx, s.instance, driver.MoveCursor{})
}

// AwaitStep records on the control server, once per announcement, that
// this instance waits for the announced step with no checkpoint in flight
// (driver.Control.AwaitStep): the mover freezes the step once every
// counting instance has said so, and the checkpoints in flight
// at the announcement have decided. The caller must have none in flight.
func (s *Sink) AwaitStep(ctx context.Context) error {
	cur := s.layout.Load().cursor
	if !cur.Announced() {
		return nil
	}
	if last := s.awaited.Load(); last != nil && *last == cur {
		return nil
	}
	if err := s.control.AwaitStep(ctx, s.instance, cur); err != nil {
		return err
	}
	s.awaited.Store(&cur)
	return nil
}

// Cursor is the move's cursor as the sink last read it.
func (s *Sink) Cursor() driver.MoveCursor { return s.layout.Load().cursor }

// Route places a key by the checkpoint's layout (the sink's at Begin),
// remembering it for the decision's guard when its slot moves.
func (t *Txn) Route(key string) int {
	p, moving := t.layout.participant(key, t.s.cfg.Branches)
	if moving {
		t.mu.Lock()
		t.touched = append(t.touched, key)
		t.mu.Unlock()
	}
	return p
}

// TouchAll records that the checkpoint writes rows it does not place by
// key (the sealing of closed windows on every server): its decision is
// refused if any step of a move went on since its Begin.
func (t *Txn) TouchAll() { t.all = true }

// Participants is the number of XA branches a checkpoint may use.
func (t *Txn) Participants() int { return t.s.Participants() }

// ServerOf is the server a participant's branches run on.
func (t *Txn) ServerOf(participant int) int { return t.s.ServerOf(participant) }

// layoutGuard is the decision's check of the move's cursor.
func (t *Txn) layoutGuard() func(driver.MoveCursor) error {
	t.mu.Lock()
	touched := slices.Clone(t.touched)
	t.mu.Unlock()
	slices.Sort(touched)
	built, version, all := t.layout.cursor, t.layout.version, t.all
	return func(cur driver.MoveCursor) error { return layoutCheck(built, version, touched, all, cur) }
}
