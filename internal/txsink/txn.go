package txsink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// Txn is one checkpoint's global transaction. Its methods are called by one
// goroutine; Each runs branches in parallel internally. The order of its
// steps, and what a crash between any two of them leaves, is the protocol
// of the package documentation.
type Txn struct {
	s        *Sink
	id       GlobalID
	gtrid    string
	mu       sync.Mutex // guards branches while Each starts them
	branches []*Branch
	decided  bool
	seq      int64 // the decision's number in the commit log
	// layout places the checkpoint's keys (Route); touched are those of
	// moving slots, all says it wrote rows not placed by key (layout.go).
	layout  *layout
	touched []string
	all     bool
}

// Begin starts a checkpoint transaction. No branch exists until it is first
// used: participants a checkpoint does not touch take no part in it.
func (s *Sink) Begin(checkpoint uint64) *Txn {
	id := GlobalID{Instance: s.instance, Checkpoint: checkpoint, Created: s.now()}
	return &Txn{s: s, id: id, gtrid: id.String(), branches: make([]*Branch, s.Participants()), layout: s.layout.Load()}
}

// Gtrid is the global transaction id, also recorded as the checkpoint id of
// the rows the checkpoint writes.
func (t *Txn) Gtrid() string { return t.gtrid }

// CommitSeq is the commit decision's sequence number in the commit log, in
// commit order; 0 before the decision, or when the decision was settled
// after an ambiguous COMMIT (its number is then in the log only).
func (t *Txn) CommitSeq() int64 { return t.seq }

type branchState int

const (
	branchActive   branchState = iota // XA START done, statements may run
	branchPrepared                    // XA END + XA PREPARE done: durable, in doubt until decided
	branchDone                        // committed or rolled back
)

// Branch is one participant's part of a checkpoint: an XA transaction on a
// connection pinned to it for its whole life.
//
// A Branch is used by one goroutine at a time. Any error inside it dooms the
// whole checkpoint (retrying one statement inside an open branch could drop
// or duplicate rows): the caller aborts and replays.
type Branch struct {
	Participant int
	xid         driver.Xid
	txn         *Txn
	conn        driver.Conn // nil once released
	state       branchState
	wrote       bool
}

// MaxStatementBytes is the budget of one statement on the branch's server
// (package stmt): statements built for the branch stay within it.
func (b *Branch) MaxStatementBytes() int { return b.txn.s.MaxStatementBytes(b.Participant) }

// Write runs fn on the ledger's tables in the branch (driver.StoreTx) and
// counts the branch as written, so that it is prepared. A failure is a
// *StatementError naming the participant.
func (b *Branch) Write(fn func(driver.StoreTx) error) error {
	b.wrote = true
	return b.Read(fn)
}

// Read runs fn on the ledger's tables in the branch without counting the
// branch as written: a branch that only read (under locks) is rolled back
// at Prepare, not prepared. A read that turned out to change rows (a
// sealing that found some) calls Wrote.
func (b *Branch) Read(fn func(driver.StoreTx) error) error {
	if err := fn(b.conn.Store()); err != nil {
		return &StatementError{Participant: b.Participant, Err: err}
	}
	return nil
}

// Wrote counts the branch as written.
func (b *Branch) Wrote() { b.wrote = true }

// WriteConn runs fn on the branch's connection and counts the branch as
// written: for tests whose writes are not the ledger's tables.
func (b *Branch) WriteConn(fn func(driver.Conn) error) error {
	b.wrote = true
	if err := fn(b.conn); err != nil {
		return &StatementError{Participant: b.Participant, Err: err}
	}
	return nil
}

// Xid is the branch's XA id.
func (b *Branch) Xid() driver.Xid { return b.xid }

func (b *Branch) xa(ctx context.Context, verb driver.Verb) error {
	return b.conn.XA(ctx, verb, b.xid)
}

// release gives the connection back to the sink when the branch ended
// cleanly, and drops it otherwise, so that no connection in an XA state is
// ever reused.
func (b *Branch) release(clean bool) {
	if b.conn == nil {
		return
	}
	b.txn.s.putBack(b.Participant, b.conn, clean)
	b.conn = nil
}

func (t *Txn) branch(ctx context.Context, participant int) (*Branch, error) {
	t.mu.Lock()
	b := t.branches[participant]
	t.mu.Unlock()
	if b != nil {
		return b, nil
	}
	// A connection kept from an earlier checkpoint may have died with the
	// server in between: one retry on a fresh connection.
	var err error
	for try := 0; try < 2; try++ {
		var c driver.Conn
		if c, err = t.s.acquire(ctx, participant); err != nil {
			continue
		}
		b = &Branch{Participant: participant, txn: t, conn: c,
			xid: t.s.ledger.Xid(t.gtrid, Qualifier{Participant: participant, Conn: c.ID(), Ledger: t.s.ledger.ID})}
		if err = b.xa(ctx, driver.Start); err == nil {
			break
		}
		b.release(false)
		b = nil
	}
	if err != nil {
		return nil, &StatementError{Participant: participant, Err: err}
	}
	t.mu.Lock()
	t.branches[participant] = b
	t.mu.Unlock()
	return b, nil
}

// Each runs fn on the branch of every listed participant, in parallel,
// starting branches as needed. It returns the errors of all that failed.
func (t *Txn) Each(ctx context.Context, participants []int, fn func(context.Context, *Branch) error) error {
	if len(participants) == 0 {
		return nil
	}
	errs := make([]error, len(participants))
	var wg sync.WaitGroup
	for i, p := range participants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := t.branch(ctx, p)
			if err == nil {
				err = fn(ctx, b)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// started returns the branches that exist, in participant order.
func (t *Txn) started() []*Branch {
	var bs []*Branch
	for _, b := range t.branches {
		if b != nil {
			bs = append(bs, b)
		}
	}
	return bs
}

// Prepare ends every branch and prepares those that wrote something;
// read-only branches are rolled back instead (an empty branch is not
// prepared). Once Prepare returns nil, every write of the checkpoint is
// durable on its server and waits for the decision.
func (t *Txn) Prepare(ctx context.Context) error {
	fp := t.s.cfg.Failpoints
	if err := fp.Inject(FailBeforePrepare); err != nil {
		return &PhaseError{"prepare", err}
	}
	var writers []*Branch
	for _, b := range t.started() {
		if b.wrote {
			writers = append(writers, b)
			continue
		}
		// Read-only: end it, roll it back, keep the connection.
		err := b.xa(ctx, driver.End)
		if err == nil {
			err = b.xa(ctx, driver.Rollback)
		}
		b.state = branchDone
		b.release(err == nil)
		t.branches[b.Participant] = nil
	}
	if len(writers) == 0 {
		return nil
	}
	// The first branch alone, then the rest in parallel: the failpoint
	// between them then has a well-defined meaning.
	if err := writers[0].prepare(ctx, t.s.cfg.StepTimeout); err != nil {
		return &PhaseError{"prepare", &StatementError{Participant: writers[0].Participant, Err: err}}
	}
	if err := fp.Inject(FailBetweenPrepare); err != nil {
		return &PhaseError{"prepare", err}
	}
	errs := make([]error, len(writers))
	var wg sync.WaitGroup
	for i, b := range writers[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.prepare(ctx, t.s.cfg.StepTimeout); err != nil {
				errs[i] = &StatementError{Participant: b.Participant, Err: err}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return &PhaseError{"prepare", err}
	}
	return nil
}

// prepare ends and prepares the branch. It runs under its own deadline,
// detached from the caller's cancellation: a connection closed by a
// cancelled context half-way through PREPARE would leave the outcome
// unknown for no reason.
func (b *Branch) prepare(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := b.xa(ctx, driver.End); err != nil {
		return err
	}
	if err := b.xa(ctx, driver.Prepare); err != nil {
		return err
	}
	b.state = branchPrepared
	return nil
}

// Commit delivers XA COMMIT to every prepared branch. It must only be
// called after Decide returned nil. A branch whose connection broke is
// committed through a fresh connection; a branch the server no longer knows
// was committed by a recoverer, since nothing rolls back a branch decided
// commit. If some branch still cannot be committed when the step times
// out, Commit returns an error: the checkpoint is decided and its offsets
// already moved, so the caller must not replay it; recovery rolls the
// branch forward later. Every branch's connection is released either way.
//
// Once every branch has committed, the checkpoint is marked applied in the
// commit log, best effort: one small statement whose failure is only
// logged, since recovery marks what a coordinator could not (see Recover).
func (t *Txn) Commit(ctx context.Context) error {
	if !t.decided {
		return &PhaseError{"commit", errors.New("commit before decision")}
	}
	defer t.releaseAll()
	var prepared []*Branch
	for _, b := range t.started() {
		if b.state == branchPrepared {
			prepared = append(prepared, b)
		}
	}
	if len(prepared) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.s.cfg.StepTimeout)
	defer cancel()
	if err := t.s.resolveBranch(ctx, prepared[0], true); err != nil {
		return &PhaseError{"commit", err}
	}
	if err := t.s.cfg.Failpoints.Inject(FailBetweenCommits); err != nil {
		return &PhaseError{"commit", err}
	}
	errs := make([]error, len(prepared))
	var wg sync.WaitGroup
	for i, b := range prepared[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = t.s.resolveBranch(ctx, b, true)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return &PhaseError{"commit", err}
	}
	if err := t.s.cfg.Failpoints.Inject(FailAfterCommit); err != nil {
		return err
	}
	if _, err := t.s.control.MarkApplied(ctx, []string{t.gtrid}); err != nil {
		t.s.log.Warn("checkpoint committed but not marked applied; recovery marks it", "gtrid", t.gtrid, "err", err)
	}
	return nil
}

// Abort rolls back every branch of a checkpoint that was not decided
// commit. Prepared branches first get an abort decision, so that a
// recoverer may roll back whatever this call cannot reach without waiting
// for the branch to age. Abort is best effort: what it leaves in doubt,
// recovery resolves by the same decision. Every branch's connection is
// released either way.
func (t *Txn) Abort(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.s.cfg.StepTimeout)
	defer cancel()
	if t.decided {
		return &PhaseError{"abort", errors.New("abort after a commit decision")}
	}
	var anyPrepared bool
	for _, b := range t.started() {
		anyPrepared = anyPrepared || b.state == branchPrepared
	}
	if anyPrepared {
		// A prepared branch is rolled back only under an abort decision
		// that won: without one, a commit may still be (or have been)
		// decided, and the branches are left to recovery.
		outcome, err := t.s.decide(ctx, t.gtrid, driver.Aborted)
		if err != nil {
			t.releaseAll()
			return &PhaseError{"abort", fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)}
		}
		if outcome == driver.Committed {
			// Only possible after an ambiguous Decide: the commit won.
			t.decided = true
			return t.Commit(ctx)
		}
	}
	defer t.releaseAll()
	var errs []error
	for _, b := range t.started() {
		switch b.state {
		case branchActive:
			err := b.xa(ctx, driver.End)
			if err == nil {
				err = b.xa(ctx, driver.Rollback)
			}
			b.state = branchDone
			b.release(err == nil)
		case branchPrepared:
			if err := t.s.resolveBranch(ctx, b, false); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return &PhaseError{"abort", err}
	}
	return nil
}

// Abandon gives the transaction up without resolving anything, as a
// coordinator that dies does: every branch's connection is dropped, an
// unprepared branch rolls back with it, and a prepared one stays in doubt,
// for recovery to resolve by the decision record.
func (t *Txn) Abandon() { t.releaseAll() }

// releaseAll drops the connection of every branch that still holds one: a
// step that gave up on a branch must not leak its connection (nor pool it
// in an XA state).
func (t *Txn) releaseAll() {
	for _, b := range t.started() {
		b.release(false)
	}
}

// resolveBranch sends XA COMMIT or ROLLBACK for a prepared branch, first on
// its own connection, then through the server from fresh connections,
// until it succeeds, the server says the xid is unknown (already resolved:
// its own connection is gone, so it cannot be attached to it), or ctx ends.
func (s *Sink) resolveBranch(ctx context.Context, b *Branch, commit bool) error {
	verb := driver.Rollback
	if commit {
		verb = driver.Commit
	}
	sv := s.servers[s.ServerOf(b.Participant)]
	if b.conn != nil {
		err := b.xa(ctx, verb)
		if err == nil || sv.Code(err) == driver.UnknownXid {
			b.state = branchDone
			b.release(err == nil)
			return nil
		}
		b.release(false)
	}
	backoff := 50 * time.Millisecond
	for {
		err := sv.Resolve(ctx, b.xid, commit)
		if err == nil || sv.Code(err) == driver.UnknownXid {
			b.state = branchDone
			return nil
		}
		s.log.Warn("XA resolution failed, retrying", "verb", string(verb), "gtrid", b.xid.Gtrid, "bqual", b.xid.Bqual,
			"server", s.ServerOf(b.Participant), "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("XA %s %s/%s on server %d: %w (last error: %w)", verb, b.xid.Gtrid, b.xid.Bqual, s.ServerOf(b.Participant), ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}
