package txsink

import (
	"errors"
	"fmt"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

var (
	// ErrFenced means a partition of the checkpoint is no longer owned by
	// this instance at the epoch the checkpoint was built under: another
	// instance was assigned it since. Nothing of the checkpoint commits.
	ErrFenced = errors.New("txsink: partition fenced by a newer owner")

	// ErrAborted means the checkpoint's decision is abort: a recoverer
	// decided it first, or the coordinator gave up before deciding.
	ErrAborted = errors.New("txsink: checkpoint aborted")

	// ErrFrontierMoved means another checkpoint closed a window this one
	// wrote to as open since this one read the frontier. Nothing of the
	// checkpoint commits; it is to be built again on the new frontier.
	ErrFrontierMoved = errors.New("txsink: windows closed since the checkpoint read the frontier")

	// ErrOutcomeUnknown means the decision could not be made durable nor
	// proven either way within the deadline (the control server is
	// unreachable). The caller must neither assume commit nor abort: it
	// rereads its positions, which waits for the outcome.
	ErrOutcomeUnknown = errors.New("txsink: checkpoint outcome unknown")

	// ErrChangelogOn means the ledger's changelog is on and this sink's
	// checkpoints do not write it (Config.Changelog): nothing of the
	// checkpoint commits, and the instance must stop (docs/changelog.md).
	ErrChangelogOn = driver.ErrChangelogOn
)

// FencedError names the partition that failed the fence check. It wraps
// ErrFenced.
type FencedError struct {
	Partition   int32
	HeldEpoch   int64
	StoredEpoch int64
	StoredOwner string
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("partition %d fenced: held at epoch %d, stored epoch %d owned by %q", e.Partition, e.HeldEpoch, e.StoredEpoch, e.StoredOwner)
}

func (e *FencedError) Unwrap() error { return ErrFenced }

// FrontierMovedError names the earliest window the checkpoint wrote as
// open and the stored frontier that closed it. It wraps ErrFrontierMoved.
type FrontierMovedError struct {
	OpenFrom, Closed time.Time
}

func (e *FrontierMovedError) Error() string {
	return fmt.Sprintf("the window starting %s was written as open, but windows before %s have been closed since",
		e.OpenFrom.UTC().Format(time.RFC3339), e.Closed.UTC().Format(time.RFC3339))
}

func (e *FrontierMovedError) Unwrap() error { return ErrFrontierMoved }

// PhaseError says in which phase of the protocol a checkpoint failed.
type PhaseError struct {
	Phase string // "prepare", "decide", "commit", "abort"
	Err   error
}

func (e *PhaseError) Error() string { return e.Phase + ": " + e.Err.Error() }
func (e *PhaseError) Unwrap() error { return e.Err }

// StatementError is a failed statement inside a branch. Use errors.As to
// find the participant, and Sink.Code to classify the cause.
type StatementError struct {
	Participant int
	Err         error
}

func (e *StatementError) Error() string {
	return fmt.Sprintf("participant %d: %v", e.Participant, e.Err)
}

func (e *StatementError) Unwrap() error { return e.Err }

// positions converts the driver's rows.
func positions(stored map[int32]driver.Stored) map[int32]Position {
	out := make(map[int32]Position, len(stored))
	for p, s := range stored {
		out[p] = Position{Epoch: s.Epoch, NextOffset: s.NextOffset, Owner: s.Owner, Watermark: s.Watermark, CaughtUp: s.CaughtUp}
	}
	return out
}
