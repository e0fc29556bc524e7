package shards

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/placement"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// AddOptions configure Add and Remove.
type AddOptions struct {
	// By names who adds (recorded with the move).
	By string
	// Recover resolves the branches a checkpoint left in doubt (a
	// txsink.Sink's recovery over the ledger's servers): a step waits
	// until every checkpoint decided before its freeze is applied, which
	// a coordinator killed leaves to recovery, and a branch of a
	// checkpoint refused by the freeze holds the locks of rows to move
	// until it is rolled back. Nil: the instances' own recovery does it.
	Recover func(ctx context.Context) error
	// StepRows bounds a step: the keys it moves are those of at most
	// StepRows rows of each table on each server (5000 when 0), of which
	// the moving slots' share moves.
	StepRows int
	// Rest is how long the mover rests after each step, as a multiple of
	// the step's own time (2 when 0; negative: no rest): checkpoints that
	// write a key of a step wait for it, so a step is a short pause of
	// counting, and with a rest of 2 the pauses take at most a third of
	// the move's time.
	Rest float64
	// RestCheckpoints is how many checkpoints each counting instance
	// commits, at least, between two steps (5 when 0; negative: none):
	// a step pauses every instance's checkpoints (nearly every one writes
	// some of its keys), so the steps must leave the instances
	// checkpoints that commit. The rest ends when the commit log has
	// grown by that many decisions per counting instance (one that
	// claimed a partition or committed a checkpoint within the last
	// 10 s: countingWithin), or when no decision came for idleRest (2 s),
	// and never before Rest's time; with no instance counting (an idle
	// ledger) there is no rest.
	RestCheckpoints int
	// Drain bounds the wait, after a step is announced, for the counting
	// instances to say they wait for it (2 s when 0; negative: no wait):
	// the mover freezes the step once the checkpoint each had in flight
	// decided, instead of having it refused. An instance that does not
	// say so in time (stopped, slow) may have its checkpoint refused, as
	// without the wait.
	Drain time.Duration
	// Batch is how many rows of a table are read at once (1000 when 0).
	Batch int
	// Attempts bounds the starts of one table's step on transient errors
	// (120 when 0, about two minutes).
	Attempts int
	// Log receives progress; slog.Default() when nil.
	Log *slog.Logger
	// Failpoints are armed by tests to stop the move at its steps (the
	// Fail* names); nil arms none.
	Failpoints *failpoint.Set
}

// readMove reads what a move starts from: the ledger's identity, its
// stored layout, what d's servers (named by hosts) say of themselves, and
// the move's cursor.
func readMove(ctx context.Context, d *mysqldriver.Driver, hosts []string) (ledger string, stored Layout, servers []Server, cur driver.MoveCursor, err error) {
	if stored, servers, err = Read(ctx, d, hosts); err != nil {
		return
	}
	var found bool
	if ledger, _, found, err = d.View().Identity(ctx); err != nil {
		return
	}
	if !found || stored.Version == 0 {
		err = errors.New("the ledger has no stored layout yet: start an instance on it first")
		return
	}
	cur, err = d.Control().MoveCursor(ctx)
	return
}

// withDefaults is o with each option left zero at its default.
func (o AddOptions) withDefaults() AddOptions {
	if o.Batch <= 0 {
		o.Batch = 1000
	}
	if o.StepRows <= 0 {
		o.StepRows = 5000
	}
	if o.Rest == 0 {
		o.Rest = 2
	}
	if o.Attempts <= 0 {
		o.Attempts = 120
	}
	if o.RestCheckpoints == 0 {
		o.RestCheckpoints = 5
	}
	if o.Drain == 0 {
		o.Drain = 2 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return o
}

// The failpoints of a move, in its order (BILLING_FAILPOINTS of billing
// shards add and billing shards remove).
const (
	FailAfterBegin     = "shards-add-after-begin"     // the new layout and the move's cursor stored
	FailAfterAnnounce  = "shards-add-after-announce"  // a step announced, its keys not yet frozen
	FailAfterFreeze    = "shards-add-after-freeze"    // a step's keys frozen
	FailAfterSettle    = "shards-add-after-settle"    // every checkpoint decided before the freeze applied
	FailBeforeCopy     = "shards-add-before-copy"     // a batch of rows read, not yet written to the new server
	FailAfterBatch     = "shards-add-after-batch"     // a batch of rows moved (written, then deleted)
	FailBeforeUnfreeze = "shards-add-before-unfreeze" // a step's rows all moved, the cursor not yet past them
	FailAfterStep      = "shards-add-after-step"      // the cursor past a step's keys
	FailAfterDone      = "shards-add-after-done"      // the move recorded done
)

// AddReport is what a move (an add or a remove) did.
type AddReport struct {
	Layout    Layout // the new layout
	Slots     int    // slots moved to the new server (a remove: off the drained one)
	RowsMoved int64  // rows moved by this run (a resumed move counts its own)
	Steps     int    // steps done by this run
	Resumed   bool   // the move had begun before this run
	// Drained is the longest wait after a step's announcement for the
	// counting instances to wait for it (AddOptions.Drain).
	Drained time.Duration
	// Paused is the longest step (its keys frozen, checkpoints that
	// write them waiting), Moving the time from the first step's start
	// to the last one's end.
	Paused, Moving time.Duration
}

// Add adds the last of d's servers (named by hosts) to the ledger whose
// layout the others are, and moves to it its share of the rows while the
// instances count: the slots the new placement gives it (placement.Grow),
// with every row of their accounts and event ids, dedup keys included
// (their expiry and counted version kept). The move:
//
//  1. stores the new layout version, its slots, the move as begun and the
//     move's cursor at the first key (driver.MoveCursor), in one
//     transaction that locks every partition row and fences the instances
//     of versions before (storeMove): from then on every decision checks
//     the cursor (txsink: ErrLayoutMoved); an instance of this version
//     counts on, its checkpoint in flight included, one that lacks the
//     new server stops (txsink.ErrNotPlaceable, Verify), and one of a
//     version before stops at its next claim (the layout changed);
//  2. moves the keys step by step, in byte order: a step announces the
//     keys from the cursor to a bound (StepRows rows of each table
//     further, NextKeyBound), waits until every counting instance says
//     it waits for the step (drain: their checkpoints in flight decide
//     first), freezes them, waits until every checkpoint decided before
//     the freeze is applied, moves the rows of those keys whose slot
//     moves (mysqldriver.MoveRows: copied, then deleted, batch by
//     batch), then moves the cursor past them; checkpoints begun while
//     the step is announced or frozen wait for it, and one in flight at
//     the freeze that wrote a frozen key is refused at its decision and
//     built again;
//  3. once the cursor is past every key, records the move as done.
//
// A move interrupted anywhere (a kill, an error) is resumed by running
// Add again with the same servers: the cursor says where, a frozen step is
// moved again (no row is moved twice: a moved row is gone from its old
// server; none is lost: it is deleted only once written to the new one),
// and each change of the cursor is a compare-and-set, so a paused run
// that wakes after another took over fails at its next one.
func Add(ctx context.Context, d *mysqldriver.Driver, hosts []string, opts AddOptions) (*AddReport, error) {
	opts = opts.withDefaults()
	log := opts.Log
	n := d.Len() - 1
	if n < 1 {
		return nil, errors.New("shards add: no server to add")
	}
	ledger, stored, servers, cur, err := readMove(ctx, d, hosts)
	if err != nil {
		return nil, fmt.Errorf("shards add: %w", err)
	}
	rep := &AddReport{}
	newSrv := servers[n]
	switch {
	case !stored.Moving() && stored.Move.Version == stored.Version && len(Compare(ledger, stored, servers)) == 0:
		// Run again after it finished (its answer lost, say): done.
		log.Info("the move to the ledger's layout is already done", "layout", stored.Describe())
		rep.Layout, rep.Slots = stored, slotsOf(stored, n)
		return rep, nil
	case stored.Moving():
		// Resume: the configured list must be the moving layout's.
		if diffs := Compare(ledger, stored, servers); len(diffs) > 0 {
			return nil, &MismatchError{Stored: stored, Differences: append(diffs,
				"a move to this layout is under way: run billing shards add again with its servers (the new one last) to resume it")}
		}
		if len(stored.Servers) != n+1 || stored.Servers[n] != newSrv.Identity.UUID {
			return nil, fmt.Errorf("shards add: the move under way adds %s, not this server", stored.Servers[len(stored.Servers)-1])
		}
		if cur.Version != stored.Version {
			return nil, fmt.Errorf("shards add: the move's cursor is at layout version %d, the move under way is to version %d", cur.Version, stored.Version)
		}
		rep.Resumed = true
		log.Info("resuming the move to the ledger's new layout", "layout", stored.Describe(), "rows_moved", stored.Move.RowsMoved, "keys_moved_below", printable(cur.MovedBelow))
	default:
		if diffs := Compare(ledger, stored, servers[:n]); len(diffs) > 0 {
			return nil, &MismatchError{Stored: stored, Differences: diffs}
		}
		if err := addable(ctx, d, ledger, stored, newSrv, n); err != nil {
			return nil, err
		}
		if stored, cur, err = begin(ctx, d, ledger, stored, cur, newSrv, opts.By, log); err != nil {
			return nil, err
		}
	}
	rep.Layout = stored
	return runMove(ctx, d, stored, cur, opts, rep)
}

// runMove runs the move to the stored layout from the cursor cur (after
// Add's or Remove's begin, or to resume): steps until the cursor is past
// every key, then the move recorded done.
func runMove(ctx context.Context, d *mysqldriver.Driver, stored Layout, cur driver.MoveCursor, opts AddOptions, rep *AddReport) (*AddReport, error) {
	log := opts.Log
	control := d.Server(0).DB()
	step := opts.Failpoints.Inject
	if err := step(FailAfterBegin); err != nil {
		return rep, err
	}
	// This run holds the move from here: a paused run that wakes fails
	// at its next change of the cursor.
	me := cur
	me.Mover = fmt.Sprintf("%s %d", opts.By, time.Now().UnixNano())
	if _, err := mysqldriver.ChangeMoveCursor(ctx, control, cur, me); err != nil {
		return rep, fmt.Errorf("shards: take the move: %w", err)
	}
	cur = me
	before, err := previous(ctx, d, stored)
	if err != nil {
		return rep, err
	}
	m := &mover{d: d, opts: opts, rep: rep, version: stored.Version, control: control, step: step, log: log,
		before: before, next: stored.Placement}
	m.pairs = pairsOf(before, stored.Placement)
	rep.Slots = movedSlots(before, stored.Placement)
	began := time.Now()
	for failed := 0; cur.Moving; {
		t := time.Now()
		next, err := m.moveStep(ctx, cur)
		switch {
		case errors.Is(err, driver.ErrMoveCursorMoved):
			return rep, m.takenOver(ctx, err)
		case err != nil && mysqldriver.Code(err) == driver.Transient && failed < opts.Attempts && ctx.Err() == nil:
			// A server restarted, a connection lost: the step is
			// idempotent from the stored cursor (frozen or not).
			failed++
			log.Warn("a step of the move failed; doing it again from the stored cursor", "attempt", failed, "err", err)
			select {
			case <-ctx.Done():
				return rep, ctx.Err()
			case <-time.After(time.Second):
			}
			if stored, rerr := m.d.Control().MoveCursor(ctx); rerr == nil {
				if stored.Mover != cur.Mover {
					return rep, m.takenOver(ctx, fmt.Errorf("%w: it is %+v", driver.ErrMoveCursorMoved, stored))
				}
				cur = stored
			}
			continue
		case err != nil:
			return rep, err
		}
		cur, failed = next, 0
		took := time.Since(t)
		rep.Steps++
		rep.Paused = max(rep.Paused, took)
		if err := step(FailAfterStep); err != nil {
			return rep, err
		}
		if cur.Moving {
			if err := m.rest(ctx, took); err != nil {
				return rep, err
			}
		}
	}
	rep.Moving = time.Since(began)
	if err := mysqldriver.FinishMove(ctx, control, stored.Version, time.Now()); err != nil {
		return rep, err
	}
	if err := mysqldriver.ForgetStepWaits(ctx, control); err != nil {
		log.Warn("cannot delete the instances' waits for the move's steps (the next move ignores them)", "err", err)
	}
	rep.Layout.Move.State = mysqldriver.MoveDone
	log.Info("the ledger's new layout is complete", "layout", stored.Describe(),
		"slots_moved", rep.Slots, "rows_moved_by_this_run", rep.RowsMoved, "steps", rep.Steps, "longest_step", rep.Paused, "longest_drain", rep.Drained)
	return rep, step(FailAfterDone)
}

// idleRest ends a rest when no checkpoint was decided for that long (an
// instance that stopped counting; longer than a catch-up's checkpoint of
// CHECKPOINT_MAX_RECORDS, about 1.5 s on the bench's machine, so that
// the rest does not end between two of them), and maxRest ends it in any
// case.
const (
	idleRest = 2 * time.Second
	maxRest  = time.Minute
)

// rest waits after a step that took took (see AddOptions.Rest and
// RestCheckpoints). On a ledger where no instance counts (none claimed a
// partition or committed a checkpoint within countingWithin) there is no
// one to rest for.
func (m *mover) rest(ctx context.Context, took time.Duration) error {
	began := time.Now()
	counting, err := mysqldriver.CountingInstances(ctx, m.control, countingWithin)
	if err != nil {
		return err
	}
	if len(counting) == 0 {
		return nil
	}
	least := time.Duration(max(m.opts.Rest, 0) * float64(took))
	want := int64(-1)
	if m.opts.RestCheckpoints > 0 {
		from, err := mysqldriver.CommitSequence(ctx, m.control)
		if err != nil {
			return err
		}
		want = from + int64(m.opts.RestCheckpoints*len(counting))
	}
	last, lastAt := int64(-1), time.Now()
	for {
		elapsed := time.Since(began)
		if elapsed >= least {
			if want < 0 || elapsed >= maxRest {
				return nil
			}
			seq, err := mysqldriver.CommitSequence(ctx, m.control)
			if err != nil {
				return err
			}
			if seq != last {
				last, lastAt = seq, time.Now()
			}
			if seq >= want || time.Since(lastAt) >= idleRest {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// movedSlots counts the slots whose server differs from before to next.
func movedSlots(before, next placement.Placement) int {
	b, nx, n := before.Slotted().Owners(), next.Slotted().Owners(), 0
	for s := range nx {
		if s < len(b) && b[s] != nx[s] {
			n++
		}
	}
	return n
}

// pair is a server that gives rows and one that takes them.
type pair struct{ from, to int }

// pairsOf lists the pairs of servers between which slots move from
// placement before to next, in order.
func pairsOf(before, next placement.Placement) []pair {
	seen := map[pair]bool{}
	var out []pair
	b, nx := before.Slotted().Owners(), next.Slotted().Owners()
	for s := range nx {
		if s < len(b) && b[s] != nx[s] && !seen[pair{b[s], nx[s]}] {
			seen[pair{b[s], nx[s]}] = true
			out = append(out, pair{b[s], nx[s]})
		}
	}
	slices.SortFunc(out, func(x, y pair) int {
		if x.from != y.from {
			return x.from - y.from
		}
		return x.to - y.to
	})
	return out
}

// mover is one run's state of a move.
type mover struct {
	d       *mysqldriver.Driver
	opts    AddOptions
	rep     *AddReport
	version int
	control *sqlx.DB
	step    func(string) error
	log     *slog.Logger
	// before and next are the placements moved from and to; pairs the
	// servers between which rows move.
	before, next placement.Placement
	pairs        []pair
}

// moveStep does (or, announced or frozen already, finishes) the step from
// cur and returns the cursor after it.
func (m *mover) moveStep(ctx context.Context, cur driver.MoveCursor) (driver.MoveCursor, error) {
	keys := mysqldriver.KeyRange{From: cur.MovedBelow, Below: cur.FrozenBelow}
	var decided int64
	var err error
	if !cur.Frozen() {
		if !cur.Announced() {
			announced := cur
			if announced.AnnouncedBelow, err = m.bound(ctx, cur.MovedBelow); err != nil {
				return cur, err
			}
			if _, err = mysqldriver.ChangeMoveCursor(ctx, m.control, cur, announced); err != nil {
				return cur, fmt.Errorf("shards add: announce: %w", err)
			}
			cur = announced
			if err := m.step(FailAfterAnnounce); err != nil {
				return cur, err
			}
		}
		if err := m.drain(ctx, cur); err != nil {
			return cur, err
		}
		frozen := cur
		frozen.FrozenBelow, frozen.AnnouncedBelow = cur.AnnouncedBelow, ""
		if decided, err = mysqldriver.ChangeMoveCursor(ctx, m.control, cur, frozen); err != nil {
			return cur, fmt.Errorf("shards add: freeze: %w", err)
		}
		cur, keys.Below = frozen, frozen.FrozenBelow
	} else if decided, err = mysqldriver.CommitSequence(ctx, m.control); err != nil {
		// Frozen by a run before: every decision before the freeze is
		// numbered up to the counter now.
		return cur, err
	}
	if err := m.step(FailAfterFreeze); err != nil {
		return cur, err
	}
	if err := m.awaitApplied(ctx, decided); err != nil {
		return cur, err
	}
	if err := m.step(FailAfterSettle); err != nil {
		return cur, err
	}
	var moved int64
	for _, p := range m.pairs {
		moving := func(key []byte) bool {
			h := placement.Hash(string(key))
			return m.before.Server(h) == p.from && m.next.Server(h) == p.to
		}
		for _, t := range mysqldriver.MovedTables {
			k, err := m.moveTable(ctx, p, t.Table, t.Key, keys, moving)
			moved += k
			if err != nil {
				return cur, err
			}
		}
	}
	if err := m.step(FailBeforeUnfreeze); err != nil {
		return cur, err
	}
	after := cur
	after.MovedBelow, after.FrozenBelow = keys.Below, ""
	after.Moving = keys.Below < driver.KeysEnd
	if _, err := mysqldriver.ChangeMoveCursor(ctx, m.control, cur, after); err != nil {
		return cur, fmt.Errorf("shards add: unfreeze: %w", err)
	}
	m.log.Info("moved a step of keys to the new server", "keys_from", printable(keys.From), "keys_below", printable(keys.Below), "rows", moved)
	return after, nil
}

// countingWithin is how recent an instance's claim or checkpoint must be
// for it to count (mysqldriver.CountingInstances): a step's drain waits
// for it, and the rests after the steps are its.
const countingWithin = 10 * time.Second

// drain waits, once a step is announced (cur), until every counting
// instance (countingWithin) says it waits for the step
// (driver.Control.AwaitStep: the checkpoint it had in flight at the
// announcement has decided, and it begins none until the step is done),
// at most Drain. A checkpoint in flight when the step freezes that wrote
// one of its keys is refused and built again: the wait spares that work.
// An instance that stopped, or does not say so in time, costs the wait
// and perhaps a refusal; correctness never rests on it (the freeze and
// the decisions' check do).
func (m *mover) drain(ctx context.Context, cur driver.MoveCursor) error {
	if m.opts.Drain < 0 {
		return nil
	}
	began := time.Now()
	want, err := mysqldriver.CountingInstances(ctx, m.control, countingWithin)
	if err != nil {
		return err
	}
	for len(want) > 0 && time.Since(began) < m.opts.Drain {
		waiting, err := mysqldriver.StepWaiters(ctx, m.control, cur)
		if err != nil {
			return err
		}
		want = slices.DeleteFunc(want, func(inst string) bool {
			_, found := slices.BinarySearch(waiting, inst)
			return found
		})
		if len(want) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	took := time.Since(began)
	m.rep.Drained = max(m.rep.Drained, took)
	if len(want) > 0 {
		m.log.Info("freezing a step before every counting instance waits for it (their checkpoints in flight that write its keys are refused and built again)",
			"instances", want, "waited", took)
	}
	return nil
}

// takenOver is the end of a run whose change of the cursor found another
// run's: nil when that one finished the move (this run's rows, written
// without overwriting and deleted where they were, changed nothing), else
// err.
func (m *mover) takenOver(ctx context.Context, err error) error {
	cur, rerr := m.d.Control().MoveCursor(ctx)
	if rerr != nil {
		return errors.Join(err, rerr)
	}
	if cur.Version == m.version && !cur.Moving {
		m.log.Info("another run of billing shards add finished the move meanwhile", "version", m.version)
		return nil
	}
	return fmt.Errorf("shards add: another run of billing shards add holds the move (%s): %w", cur.Mover, err)
}

// bound is the end of the step from from: StepRows rows further in the
// table and server where that is nearest (driver.KeysEnd: the rest).
func (m *mover) bound(ctx context.Context, from string) (string, error) {
	bound := driver.KeysEnd
	var givers []int
	for _, p := range m.pairs {
		if !slices.Contains(givers, p.from) {
			givers = append(givers, p.from)
		}
	}
	for _, i := range givers {
		for _, t := range mysqldriver.MovedTables {
			b, found, err := mysqldriver.NextKeyBound(ctx, m.d.Server(i).DB(), t.Table, t.Key, from, m.opts.StepRows)
			if err != nil {
				return "", err
			}
			if found && b < bound {
				bound = b
			}
		}
	}
	if bound <= from {
		// More than StepRows rows of one key: a step of that key alone.
		bound = from + "\x00"
	}
	return bound, nil
}

// moveTable moves the rows of keys of table from p.from to p.to; a
// transient error (a lost connection, a server restarted, a lock
// wait on a branch left in doubt) costs a new start, after recovery: it
// is idempotent.
func (m *mover) moveTable(ctx context.Context, p pair, table, key string, keys mysqldriver.KeyRange, moving func([]byte) bool) (int64, error) {
	var moved int64
	for attempt := 1; ; attempt++ {
		k, err := mysqldriver.MoveRows(ctx, m.d.Server(p.from), m.d.Server(p.to), table, key, keys, moving, m.opts.Batch, func() error {
			return m.step(FailBeforeCopy)
		}, func(k int64) error {
			if err := mysqldriver.AddMoved(ctx, m.control, m.version, k); err != nil {
				return err
			}
			m.rep.RowsMoved += k
			return m.step(FailAfterBatch)
		})
		moved += k
		if err == nil {
			return moved, nil
		}
		if mysqldriver.Code(err) != driver.Transient || attempt >= m.opts.Attempts || ctx.Err() != nil {
			return moved, fmt.Errorf("shards: from server %d to %d: %w", p.from, p.to, err)
		}
		m.log.Warn("moving rows failed; starting the table's step again", "from_server", p.from, "to_server", p.to, "table", table, "attempt", attempt, "err", err)
		if m.opts.Recover != nil {
			if err := m.opts.Recover(ctx); err != nil {
				m.log.Warn("recovery of checkpoints in doubt failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return moved, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// awaitApplied waits until every checkpoint decided up to decided is
// applied, recovering those left in doubt.
func (m *mover) awaitApplied(ctx context.Context, decided int64) error {
	wait := 5 * time.Millisecond
	logged := time.Now()
	for {
		pos, err := m.d.Control().CommitPosition(ctx)
		if err != nil && mysqldriver.Code(err) != driver.Transient {
			return err
		}
		if err == nil && pos.Visible >= decided {
			return nil
		}
		if time.Since(logged) >= 10*time.Second {
			m.log.Info("waiting for the checkpoints decided before the step's freeze to be applied", "visible", pos.Visible, "decided_before_freeze", decided, "err", err)
			logged = time.Now()
		}
		if wait >= 500*time.Millisecond && m.opts.Recover != nil {
			if err := m.opts.Recover(ctx); err != nil {
				m.log.Warn("recovery of checkpoints in doubt failed; trying again", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// previous is the placement of the layout version before l.
func previous(ctx context.Context, d *mysqldriver.Driver, l Layout) (placement.Placement, error) {
	p, err := ReadVersion(ctx, d, l.Version-1)
	if err != nil {
		return placement.Placement{}, err
	}
	return p.Placement, nil
}

// printable is a key for the log: Go-quoted, so bytes of any kind show.
func printable(key string) string {
	if key == driver.KeysEnd {
		return "(end)"
	}
	return strconv.Quote(key)
}

// addable says why the server cannot be added to the ledger (nil: it can).
func addable(ctx context.Context, d *mysqldriver.Driver, ledger string, stored Layout, s Server, n int) error {
	switch {
	case !s.Found:
		return fmt.Errorf("shards add: %s has no server identity (ledger_server): run billing migrate on it first", s.name(n))
	case s.Control:
		return fmt.Errorf("shards add: %s holds a ledger identity: it is a ledger's control server", s.name(n))
	case s.Identity.Ledger != "" && s.Identity.Ledger != ledger:
		return fmt.Errorf("shards add: %s belongs to another ledger (%s)", s.name(n), s.Identity.Ledger)
	case slices.Contains(stored.Servers, s.Identity.UUID):
		return fmt.Errorf("shards add: %s is already the ledger's", s.name(n))
	}
	for _, t := range mysqldriver.MovedTables {
		empty, err := mysqldriver.TableEmpty(ctx, d.Server(n).DB(), t.Table)
		if err != nil {
			return fmt.Errorf("shards add: %s: %w", s.name(n), err)
		}
		if !empty {
			return fmt.Errorf("shards add: %s holds rows in %s: a server is added empty", s.name(n), t.Table)
		}
	}
	for i := 0; i < n; i++ {
		live, err := mysqldriver.LegacyKeysLive(ctx, d.Server(i).DB())
		if err != nil {
			return fmt.Errorf("shards add: server %d: %w", i, err)
		}
		if live {
			return fmt.Errorf("shards add: server %d still holds dedup keys of the version before generations (dedup_expiry), whose expiry cannot move with them: add the server once they expire (at most DEDUP_TTL after the upgrade; billing status shows the generations)", i)
		}
	}
	st, err := d.Control().Changelog(ctx)
	if err != nil {
		return err
	}
	if st.Snapshot {
		return errors.New("shards add: the changelog's snapshot is still being published, reading the tables server by server: add the server once it is done (billing changelog status)")
	}
	return nil
}

// begin stores the new layout, its move as begun and the move's cursor
// at its first key, and returns the new layout and the cursor.
func begin(ctx context.Context, d *mysqldriver.Driver, ledger string, stored Layout, cur driver.MoveCursor, s Server, by string, log *slog.Logger) (Layout, driver.MoveCursor, error) {
	next, _, err := stored.Placement.Grow(1)
	if err != nil {
		return Layout{}, cur, err
	}
	if err := mysqldriver.ClaimServer(ctx, d.Server(d.Len()-1).DB(), ledger); err != nil {
		return Layout{}, cur, err
	}
	if id, _, err := mysqldriver.ReadServerIdentity(ctx, d.Server(d.Len()-1).DB()); err != nil {
		return Layout{}, cur, err
	} else if id.Ledger != ledger {
		return Layout{}, cur, fmt.Errorf("shards add: the server was claimed by ledger %s meanwhile", id.Ledger)
	}
	l := Layout{Version: stored.Version + 1, Servers: append(slices.Clone(stored.Servers), s.Identity.UUID),
		RecordedAt: time.Now().UTC().Truncate(time.Microsecond), RecordedBy: by, Placement: next}
	l.Move = mysqldriver.MoveState{Version: l.Version, State: mysqldriver.MoveMoving, StartedAt: l.RecordedAt, StartedBy: by}
	moving := driver.MoveCursor{Version: l.Version, Moving: true, Mover: by}
	if err := storeMove(ctx, d, stored, l, cur, moving, log); err != nil {
		return Layout{}, cur, fmt.Errorf("shards add: begin: %w", err)
	}
	log.Info("stored the ledger's new layout; moving rows while the instances count (instances without the new server stop)", "layout", l.Describe(), "slots", next.Slots())
	return l, moving, nil
}

// storeMove stores layout l (the version after stored), its placement and
// its move as begun, and the cursor moving (from cur), in the transaction
// that fences the instances that do not follow the cursor
// (mysqldriver.Control.QuiesceUnfollowing): the epochs of the partitions
// claimed last by an instance of a version before are raised with it, so
// that such an instance stops at its next claim (the layout changed)
// instead of placing keys by the old layout while rows move. An instance
// that follows the cursor counts on: its next attempt places keys by the
// new layout, and the checkpoint it has in flight commits (no key has
// moved yet: txsink.layoutCheck).
func storeMove(ctx context.Context, d *mysqldriver.Driver, stored, l Layout, cur, moving driver.MoveCursor, log *slog.Logger) error {
	err := d.Control().QuiesceUnfollowing(ctx, func(ctx context.Context, tx *sqlx.Tx, q mysqldriver.Quiesced) error {
		if err := mysqldriver.ChangeMoveCursorTx(ctx, tx, cur, moving); err != nil {
			return err
		}
		// The layout's rows are the decisions' to read: locked here, so
		// that two moves do not both begin.
		top, err := mysqldriver.LockLayoutVersion(ctx, tx)
		if err != nil {
			return err
		}
		if top != stored.Version {
			return fmt.Errorf("the ledger's layout became version %d meanwhile", top)
		}
		if added, err := mysqldriver.InsertLayout(ctx, tx, l.Rows()); err != nil {
			return err
		} else if !added {
			return fmt.Errorf("layout version %d exists", l.Version)
		}
		log.Info("fenced the instances that do not follow the move (of versions before): they stop at their next claim", "partitions_fenced", q.Fenced)
		return mysqldriver.StartMove(ctx, tx, l.Version, runsOf(l.Placement), l.RecordedAt, l.RecordedBy)
	})
	if err != nil {
		return err
	}
	// A claim of a partition whose row did not exist yet inserted it
	// beside the transaction above, unfenced, and may have checked the
	// layout before it committed: its epoch is raised now (if it does not
	// follow the cursor).
	if err := d.Control().QuiesceUnfollowing(ctx, func(context.Context, *sqlx.Tx, mysqldriver.Quiesced) error { return nil }); err != nil {
		return fmt.Errorf("fence again: %w", err)
	}
	return nil
}
