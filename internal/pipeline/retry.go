package pipeline

import (
	"errors"
	"fmt"
	"slices"

	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
)

// What run does after an attempt (see run): a pure function of the
// attempt's outcome and of what the earlier attempts of the snapshot did.

// maxFrontierRetries bounds the immediate retries of a checkpoint whose
// decision found windows closed under it; beyond, it is replayed.
const maxFrontierRetries = 3

// maxLayoutRetries bounds the immediate retries of a checkpoint whose
// decision found the ledger's layout moved under it (txsink.ErrLayoutMoved,
// at most one per step of a live move, each retried on the layout read
// then); beyond, it is replayed.
const maxLayoutRetries = 8

// maxRaceRetries bounds the immediate retries, with the changelog, of a
// checkpoint whose write met a row created since it read (a duplicate key:
// the changelog's insert of a row a locking read found absent); beyond, it
// is replayed. Without the changelog such a failure takes the ladder's
// other rungs, as before.
const maxRaceRetries = 3

// errNeedCareful asks for the checkpoint to be retried in careful mode: the
// server refused a sum as out of range, and only per-event checks against
// the stored values can tell which events to refuse.
var errNeedCareful = errors.New("amount sum out of range")

// uncountedError aborts an attempt whose seed created rows (beside other
// instances: lockOrder) that no counted event writes: retried at once
// without creating them.
type uncountedError struct{ keys []lockKey }

// ErrCreatedUncounted is what an attempt aborted by an uncountedError is
// (errors.Is): a row its seed created counts no event.
var ErrCreatedUncounted = errors.New("sums rows created by the seed count no event")

func (e *uncountedError) Error() string {
	return fmt.Sprintf("%d sums rows created by the seed count no event (every event on them refused)", len(e.keys))
}

func (e *uncountedError) Is(target error) bool { return target == ErrCreatedUncounted }

// writeFailure is the error of a failed write step: an overflow of the
// fast path names the careful retry it calls for.
func writeFailure(err error, code driver.Code, careful bool) error {
	if code == driver.Overflow && !careful {
		return fmt.Errorf("%w: %w", errNeedCareful, err)
	}
	return err
}

// attemptOutcome is what run's decision depends on in an attempt's result.
type attemptOutcome struct {
	failed    bool        // an error before the decision
	stopped   bool        // run's own context ended
	code      driver.Code // the error's classification by the servers
	moved     bool        // txsink.ErrFrontierMoved or driver.ErrKeysMoved
	relaid    bool        // txsink.ErrLayoutMoved
	refused   bool        // a refusal of the data a trial can reproduce (refusedForData)
	oversized bool        // of refused: a row over its statement's budget (a bug)
	// lostInWrite: a Transient failure of the write step. MariaDB answers
	// a statement over a max_allowed_packet lowered since the budget was
	// read by dropping the connection while the client sends it, not with
	// error 1153 (drivertest's TooLargeOnceTheLimitFell): a lost
	// connection there may be a limit that fell.
	lostInWrite bool
	// raced: a Duplicate failure of the write step with the changelog: a
	// row was created since this attempt read it absent.
	raced bool
	// uncounted: the keys whose rows the seed created for nothing
	// (uncountedError).
	uncounted []lockKey
}

func (c *Checkpointer) outcomeOf(info CheckpointInfo, stopped bool) attemptOutcome {
	var u *uncountedError
	var uncounted []lockKey
	if errors.As(info.Err, &u) {
		uncounted = u.keys
	}
	return attemptOutcome{uncounted: uncounted, relaid: errors.Is(info.Err, txsink.ErrLayoutMoved), failed: info.Err != nil && !info.Decided, stopped: stopped, code: c.sink.Code(info.Err),
		moved: errors.Is(info.Err, txsink.ErrFrontierMoved) || errors.Is(info.Err, driver.ErrKeysMoved), refused: c.refusedForData(info.Err), oversized: oversized(info.Err),
		lostInWrite: c.sink.Code(info.Err) == driver.Transient && info.FailedPhase == stepWrite.phase(),
		raced:       c.cfg.Changelog && c.sink.Code(info.Err) == driver.Duplicate && info.FailedPhase == stepWrite.phase()}
}

// ladder is what the attempts of one snapshot have tried so far.
type ladder struct {
	careful, refreshed, dataRetried, isolated bool
	moved, raced, relaid                      int
	// uncreated: the keys attempts created for nothing, not to create again
	uncreated []lockKey
}

// move is what run does next.
type move int

const (
	moveReport  move = iota // report the attempt and return its outcome
	moveRetry               // report it and retry at once
	moveRefresh             // reread the servers' limits, report, retry
	moveIsolate             // isolate the records responsible, then retry the rest
)

var moveNames = [...]string{"report", "retry", "refresh", "isolate"}

func (m move) String() string { return moveNames[m] }

// next is the move after an attempt with outcome o, and the ladder after
// it:
//
//   - another checkpoint closed a window this one wrote to as open
//     (txsink.ErrFrontierMoved), or the dedup keys' generation moved on
//     between the claims and the decision (driver.ErrKeysMoved, a
//     rotation: at most once a DEDUP_TTL): retried at once, on the new
//     frontier or generation, up to maxFrontierRetries times;
//   - a live move of the ledger's rows passed a key the attempt placed
//     (txsink.ErrLayoutMoved): retried at once on the layout read then,
//     up to maxLayoutRetries times;
//   - the seed created rows no counted event writes (uncountedError):
//     retried at once without creating them (at most once per key);
//   - a write met a row created since the attempt read it absent
//     (Duplicate in the write step): retried at once, whose reads then
//     find it, up to maxRaceRetries times;
//   - the server refused a sum (Overflow): retried once in careful mode,
//     every key seeded, each event checked against the stored values;
//   - a statement exceeded the server's packet limit (TooLarge), or the
//     write step lost its connection (how MariaDB refuses a statement over
//     a limit lowered since it was read): the limits are reread and the
//     snapshot retried once, cut to the new budget (without it a lowered
//     limit would fail every replay until a restart);
//   - the server refused the data itself (Data, or an Overflow in careful
//     mode), or a row exceeded its statement's budget (a bug): retried
//     once (one failure could be a fluke); failing again, the records
//     responsible are isolated;
//   - anything else, a failure after the decision, or run's context ended:
//     reported, and the source replays what was not decided.
func (l ladder) next(o attemptOutcome) (move, ladder) {
	if !o.failed || o.stopped {
		return moveReport, l
	}
	switch {
	case len(o.uncounted) > 0:
		// Each such retry creates fewer keys: it ends.
		l.uncreated = slices.Concat(l.uncreated, o.uncounted)
		return moveRetry, l
	case o.moved && l.moved < maxFrontierRetries:
		l.moved++
		return moveRetry, l
	case o.relaid && l.relaid < maxLayoutRetries:
		l.relaid++
		return moveRetry, l
	case o.raced && l.raced < maxRaceRetries:
		l.raced++
		return moveRetry, l
	case o.code == driver.Overflow && !l.careful:
		l.careful = true
		return moveRetry, l
	case (o.code == driver.TooLarge || o.lostInWrite) && !l.refreshed:
		l.refreshed = true
		return moveRefresh, l
	case o.refused && !l.dataRetried:
		l.dataRetried = true
		return moveRetry, l
	case o.refused && !l.isolated:
		l.isolated = true
		return moveIsolate, l
	}
	return moveReport, l
}

// afterIsolation is the move once an isolation found found records: the
// rest is retried; none (the failure is not a record's: isolation's empty
// case, or it could not be reproduced), the checkpoint fails and is
// replayed.
func afterIsolation(found int) move {
	if found == 0 {
		return moveReport
	}
	return moveRetry
}
