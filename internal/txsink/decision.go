package txsink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// PartitionCut is where a checkpoint cuts one partition: every record below
// NextOffset is covered, and the cut is only valid while the partition is
// still held at Epoch.
type PartitionCut struct {
	Partition  int32
	Epoch      int64
	NextOffset int64
	// Watermark is the latest event time of the partition's records below
	// NextOffset (zero: none); the stored one is raised to it, never
	// lowered. CaughtUp says NextOffset had reached the end of the log.
	Watermark time.Time
	CaughtUp  bool
}

// FrontierChange is what a checkpoint does with the ledger's closing
// frontier (driver.Frontier) at its decision, under the decision's lock:
// the decision is refused (ErrFrontierMoved) if the stored Closed instant
// is after OpenFrom, the earliest window start the checkpoint wrote as
// open (zero: it wrote none); else the frontier is raised to Raise.
type FrontierChange struct {
	OpenFrom time.Time
	Raise    driver.Frontier
}

// Decide is the commit point: in one local transaction on the control
// server, the fence (see fence) over the checkpoint's partitions, the new
// next offsets, and the commit decision, whose primary key makes it a
// compare-and-set against a recoverer's abort.
//
// With a frontier change (nil: the frontier is not touched), the same
// transaction checks and raises the ledger's closing frontier (see
// FrontierChange and frontierCheck). With keys (nil: the checkpoint
// claimed no dedup key), the decision is refused (driver.ErrKeysMoved)
// unless *keys, the generation the checkpoint claimed its keys in, is
// still the current one (package dedup: generations).
//
// The decision also checks the move's cursor (layout.go): a checkpoint
// that placed a key the live move has passed or frozen since its Begin is
// refused (ErrLayoutMoved).
//
// The decision also appends the checkpoint to the commit log (see
// CommitSeq), applied at once if no branch was prepared.
//
// Decide returns nil only once the decision is durable. It returns an error
// wrapping ErrFenced, ErrFrontierMoved, driver.ErrKeysMoved, ErrChangelogOn
// or ErrAborted when the checkpoint must abort, and one wrapping
// ErrOutcomeUnknown when the commit of the
// local transaction was ambiguous and the outcome could not be settled in
// time.
func (t *Txn) Decide(ctx context.Context, cuts []PartitionCut, f *FrontierChange, keys *driver.Generation) error {
	if err := t.s.cfg.Failpoints.Inject(FailAfterPrepare); err != nil {
		return &PhaseError{"decide", err}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.s.cfg.StepTimeout)
	defer cancel()
	dc := make([]driver.Cut, len(cuts))
	for i, c := range cuts {
		dc[i] = driver.Cut{Partition: c.Partition, NextOffset: c.NextOffset, Watermark: c.Watermark, CaughtUp: c.CaughtUp}
	}
	var fc *driver.FrontierChange
	if f != nil {
		fc = &driver.FrontierChange{Raise: f.Raise, Check: func(stored driver.Frontier) error { return frontierCheck(f.OpenFrom, stored) }}
	}
	// A checkpoint that prepared no branch has nothing left to commit: its
	// decision is applied at once.
	applied := true
	for _, b := range t.started() {
		applied = applied && b.state != branchPrepared
	}
	d := driver.Decision{Gtrid: t.gtrid, Outcome: driver.Committed, By: t.s.instance, At: t.s.now().UTC(), Changelog: t.s.cfg.Changelog}
	seq, err := t.s.control.Commit(ctx, d, t.s.scope(), dc, func(stored []driver.Stored) error {
		return fence(t.s.instance, cuts, stored)
	}, fc, keys, t.layoutGuard(), applied)
	switch {
	case errors.Is(err, driver.ErrDecided):
		return &PhaseError{"decide", fmt.Errorf("%w: a recoverer decided first", ErrAborted)}
	case errors.Is(err, driver.ErrAmbiguous):
		// The COMMIT may or may not have landed. Compare-and-set an
		// abort: it waits for the first transaction's locks, then tells
		// which one won.
		t.s.log.Warn("ambiguous decision, settling it", "gtrid", t.gtrid, "err", err)
		o, err2 := t.s.decide(ctx, t.gtrid, driver.Aborted)
		switch {
		case err2 != nil:
			return &PhaseError{"decide", fmt.Errorf("%w: %w (then %w)", ErrOutcomeUnknown, err, err2)}
		case o != driver.Committed:
			return &PhaseError{"decide", fmt.Errorf("%w: decided abort after an ambiguous commit", ErrAborted)}
		}
	case err != nil:
		return &PhaseError{"decide", err}
	}
	t.decided, t.seq = true, seq
	return t.s.cfg.Failpoints.Inject(FailAfterDecision)
}

// decide inserts a decision for gtrid unless one exists, and returns the
// decision that holds: its own if the insert won, the existing one
// otherwise. Transient failures (another transaction deciding the same
// gtrid holds the row) are retried until ctx ends.
func (s *Sink) decide(ctx context.Context, gtrid string, want driver.Outcome) (driver.Outcome, error) {
	for {
		o, err := s.control.Decide(ctx, driver.Decision{Gtrid: gtrid, Outcome: want, By: s.instance, At: s.now().UTC()})
		if err == nil {
			return o, nil
		}
		if s.Code(err) != driver.Transient || ctx.Err() != nil {
			return "", fmt.Errorf("decide %s %s: %w", want, gtrid, err)
		}
	}
}
