package pipeline

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/billing/ledger/internal/txsink"
)

// The source's plan: a rewind pass as a pure state machine, as the
// checkpoint's planner (planner.go). A pass takes the partitions whose
// buffered state was discarded (an aborted checkpoint: finishLocked), reads
// their positions stored in MySQL, claims again the ones another instance
// took while the group still gives them to this member, and finds where
// the ones never checkpointed start. ready says what to do next, the
// executor (Pipeline.rewind, source.go) does it and hands back what it
// found with advance; the plan ends with the outcome the executor applies
// to the partitions under the pipeline's lock (applyRewind). The plan never
// does I/O; the executor never decides.
//
// The steps, in order, each one only when it has something to do:
//
//	positions  read the stored positions of the rewinding partitions
//	claim      claim again those whose stored epoch or owner is no longer
//	           this instance's, when their re-claim's backoff has passed
//	settings   check the ledger's settings after that claim, before
//	           anything of the partitions is fetched (Config.CheckSettings)
//	starts     list the topic's start offsets, for the partitions never
//	           checkpointed (stored position txsink.StartOffset)
//	apply      the outcome: restore each partition to its stored position
//	           and seek there, or keep it rewinding (retried next pass)
//
// or nothing (no partition rewinds, or a failure's backoff holds the next
// pass back).
//
// Why claim again rather than drop: an instance paused between its
// recovery and its claim, past the session timeout, wakes up and claims a
// partition the group has meanwhile given here. It soon learns it lost the
// partition, and drops it; dropping it here too would leave it to nobody.
// The group's assignment decides who consumes a partition; the claims only
// fence.
//
// Positions come from MySQL, never from the group's committed offsets. A
// failed step leaves its partitions rewinding, their records dropped, and
// holds the next pass back, doubling from 100 ms to 5 s, so that an outage
// costs a log line every few seconds, not one per poll. A pass that gets
// through (positions read, start offsets listed if needed) starts the
// backoff over, even if its re-claim failed: a failing re-claim alone is
// retried every 100 ms.
// Re-claims back off per partition, doubling from one second to a minute,
// until the claim holds (see reclaimBackoffFor).

// rewindStepKind names a step of a rewind pass.
type rewindStepKind int

const (
	rewindNothing rewindStepKind = iota
	rewindPositions
	rewindClaim
	rewindSettings
	rewindStarts
	rewindApply
)

// rewindStep is what to do next.
type rewindStep struct {
	kind  rewindStepKind
	ids   []int32        // positions, claim, starts: in partition order
	until time.Time      // nothing: held back by a failure until then (zero: nothing rewinds)
	out   *rewindOutcome // apply
}

// rewindResult is what the executor found doing a step: when it finished
// (the host's clock: backoffs are measured from it), and its error.
type rewindResult struct {
	now       time.Time
	err       error
	positions map[int32]txsink.Position // positions, claim
	starts    map[int32]int64           // starts: the log start offset of each partition the listing has
}

// rewindHold is when the next pass may start, after failures.
type rewindHold struct {
	after   time.Time     // no pass before
	backoff time.Duration // the last failure's backoff; 0 after a success
}

// rewindInput is what a pass starts from, read under the pipeline's lock.
type rewindInput struct {
	now      time.Time
	instance string // this instance's owner id (txsink.Sink.Instance)
	hold     rewindHold
	parts    []rewindPart // the rewinding partitions, in partition order
}

// rewindPart is a rewinding partition as the pass sees it.
type rewindPart struct {
	id             int32
	epoch          int64     // of this instance's claim
	reclaimAfter   time.Time // no re-claim before
	reclaimBackoff time.Duration
}

// rewindInputOf is what a pass over parts starts from, at now.
func rewindInputOf(parts map[int32]*partition, now time.Time, instance string, hold rewindHold) rewindInput {
	in := rewindInput{now: now, instance: instance, hold: hold}
	for _, pt := range parts {
		if pt.rewind {
			in.parts = append(in.parts, rewindPart{id: pt.id, epoch: pt.epoch, reclaimAfter: pt.reclaimAfter, reclaimBackoff: pt.reclaimBackoff})
		}
	}
	slices.SortFunc(in.parts, func(a, b rewindPart) int { return int(a.id - b.id) })
	return in
}

// rewindOutcome is what a pass changes: the partitions it rewinds, the
// hold on the next pass, and what it logs.
type rewindOutcome struct {
	parts    []rewound // in partition order
	hold     rewindHold
	failures []rewindFailure
}

// rewound is one partition's outcome.
type rewound struct {
	id    int32
	epoch int64 // the epoch the pass was planned at: the partition is applied to only if it still holds it
	// stored is the position read or claimed: the partition's watermark
	// and caught-up flag are its, and its next offset unless fromStart.
	stored txsink.Position
	// seek is where fetching restarts: stored.NextOffset, or the log's
	// start for a partition never checkpointed; -1: the partition keeps
	// rewinding (its start could not be listed), retried next pass.
	seek int64
	// claimed: the partition was claimed again (at stored.Epoch), and its
	// next re-claim is held back for backoff, until after.
	claimed bool
	backoff time.Duration
	after   time.Time
}

// rewindFailure is a failed step, for the log.
type rewindFailure struct {
	msg  string
	ids  []int32 // nil: the step was not about partitions
	err  error
	next time.Duration // the backoff it set
}

// rewindPlan is one pass.
type rewindPlan struct {
	in      rewindInput
	hold    rewindHold
	step    rewindStep
	out     []rewound
	fails   []rewindFailure
	due     []int32   // the partitions being claimed again
	claimAt time.Time // when their claim became due
	claimed map[int32]txsink.Position
}

// newRewindPlan plans a pass over in.
func newRewindPlan(in rewindInput) *rewindPlan {
	pl := &rewindPlan{in: in, hold: in.hold}
	switch {
	case in.now.Before(in.hold.after):
		pl.step = rewindStep{kind: rewindNothing, until: in.hold.after}
	case len(in.parts) == 0:
		pl.step = rewindStep{kind: rewindNothing}
	default:
		ids := make([]int32, len(in.parts))
		for i, pt := range in.parts {
			ids[i] = pt.id
		}
		pl.step = rewindStep{kind: rewindPositions, ids: ids}
	}
	return pl
}

// ready returns the next step.
func (pl *rewindPlan) ready() rewindStep { return pl.step }

// advance takes the result of the step ready returned.
func (pl *rewindPlan) advance(r rewindResult) {
	switch pl.step.kind {
	case rewindPositions:
		if r.err != nil {
			pl.fail(r.now, "cannot reread positions; retrying", pl.step.ids, r.err)
			pl.finish()
			return
		}
		for _, pt := range pl.in.parts {
			ps, ok := r.positions[pt.id]
			if !ok || ps.Owner != pl.in.instance || ps.Epoch != pt.epoch {
				// Taken over (or its row gone): claimed again once its
				// backoff has passed; rewinding meanwhile.
				if r.now.After(pt.reclaimAfter) {
					pl.due = append(pl.due, pt.id)
				}
				continue
			}
			pl.out = append(pl.out, rewound{id: pt.id, epoch: pt.epoch, stored: ps, seek: ps.NextOffset})
		}
		if len(pl.due) > 0 {
			pl.claimAt = r.now
			pl.step = rewindStep{kind: rewindClaim, ids: pl.due}
			return
		}
		pl.afterClaim()
	case rewindClaim:
		if r.err != nil {
			pl.fail(r.now, "cannot claim again partitions taken over while still assigned here; retrying", pl.due, r.err)
			pl.afterClaim()
			return
		}
		pl.claimed = r.positions
		pl.step = rewindStep{kind: rewindSettings}
	case rewindSettings:
		if r.err == nil {
			for _, pt := range pl.in.parts {
				ps, ok := pl.claimed[pt.id]
				if !ok || !slices.Contains(pl.due, pt.id) {
					continue // not claimed: still rewinding
				}
				b := reclaimBackoffFor(pt.reclaimBackoff)
				pl.out = append(pl.out, rewound{id: pt.id, epoch: pt.epoch, stored: ps, seek: ps.NextOffset,
					claimed: true, backoff: b, after: pl.claimAt.Add(b)})
			}
		}
		// Else the instance stops (the check failed it): nothing of the
		// partitions claimed is fetched.
		pl.afterClaim()
	case rewindStarts:
		if r.err != nil {
			pl.fail(r.now, "cannot list start offsets; retrying", nil, r.err)
			pl.finish()
			return
		}
		pl.hold.backoff = 0
		for i := range pl.out {
			if o := &pl.out[i]; o.stored.NextOffset == txsink.StartOffset {
				if start, ok := r.starts[o.id]; ok {
					o.seek = start
				}
			}
		}
		pl.finish()
	}
}

// afterClaim lists the start offsets if a partition was never
// checkpointed, or finishes.
func (pl *rewindPlan) afterClaim() {
	slices.SortFunc(pl.out, func(a, b rewound) int { return int(a.id - b.id) })
	var fromStart []int32
	for i := range pl.out {
		if o := &pl.out[i]; o.stored.NextOffset == txsink.StartOffset {
			o.seek = -1 // until its start is listed
			fromStart = append(fromStart, o.id)
		}
	}
	if len(fromStart) > 0 {
		pl.step = rewindStep{kind: rewindStarts, ids: fromStart}
		return
	}
	// The pass reached the positions: the backoff starts over. (A failed
	// re-claim has set the hold already: its next attempt waits for it.)
	pl.hold.backoff = 0
	pl.finish()
}

func (pl *rewindPlan) finish() {
	pl.step = rewindStep{kind: rewindApply, out: &rewindOutcome{parts: pl.out, hold: pl.hold, failures: pl.fails}}
}

// fail holds the next pass back: doubling from 100 ms to 5 s.
func (pl *rewindPlan) fail(now time.Time, msg string, ids []int32, err error) {
	pl.hold.backoff = min(max(2*pl.hold.backoff, 100*time.Millisecond), 5*time.Second)
	pl.hold.after = now.Add(pl.hold.backoff)
	pl.fails = append(pl.fails, rewindFailure{msg: msg, ids: ids, err: err, next: pl.hold.backoff})
}

// reclaimBackoffFor is the wait before a partition claimed again may be
// claimed again once more: two members each believing the partition
// theirs (one of them not yet told it lost it) would take the claim from
// each other at every checkpoint; doubling from one second up to a minute,
// until the claim holds.
func reclaimBackoffFor(last time.Duration) time.Duration {
	return min(max(2*last, time.Second), time.Minute)
}

// applyRewind applies a pass's outcome to the partitions, under the
// pipeline's lock, and returns where fetching restarts, by partition. A
// partition applies only if it is still the one planned: held, rewinding,
// at the epoch the pass saw. (The executor holds the callbacks that take
// partitions away until the pass is applied, see Pipeline.ownMu; a
// partition assigned meanwhile is a new claim and is not the pass's.)
func applyRewind(parts map[int32]*partition, out *rewindOutcome) map[int32]int64 {
	seeks := map[int32]int64{}
	for _, o := range out.parts {
		pt := parts[o.id]
		if pt == nil || !pt.rewind || pt.epoch != o.epoch {
			continue
		}
		if o.claimed {
			pt.epoch, pt.reclaimBackoff, pt.reclaimAfter = o.stored.Epoch, o.backoff, o.after
		}
		pt.watermark, pt.committedUp = o.stored.Watermark, o.stored.CaughtUp
		switch {
		case o.seek < 0:
			continue // still rewinding
		case o.stored.NextOffset == txsink.StartOffset:
			pt.position, pt.committed, pt.rewind = txsink.StartOffset, txsink.StartOffset, false
		default:
			pt.restore(o.stored)
		}
		seeks[o.id] = o.seek
	}
	return seeks
}

// String describes a step, for the scenario files.
func (st rewindStep) String() string {
	switch st.kind {
	case rewindNothing:
		if st.until.IsZero() {
			return "nothing to do"
		}
		return "nothing to do before " + st.until.UTC().Format("15:04:05.000")
	case rewindPositions:
		return "read positions " + partsText(st.ids)
	case rewindClaim:
		return "claim again " + partsText(st.ids)
	case rewindSettings:
		return "check settings"
	case rewindStarts:
		return "list start offsets for " + partsText(st.ids)
	}
	var b strings.Builder
	b.WriteString("apply:")
	for _, o := range st.out.parts {
		fmt.Fprintf(&b, "\n  p%d", o.id)
		switch {
		case o.seek < 0:
			b.WriteString(" never checkpointed, its start unknown: keeps rewinding")
		case o.stored.NextOffset == txsink.StartOffset:
			fmt.Fprintf(&b, " from the start: seek %d", o.seek)
		default:
			fmt.Fprintf(&b, " at %d: seek %d", o.stored.NextOffset, o.seek)
		}
		if o.claimed {
			fmt.Fprintf(&b, "; claimed again at epoch %d (held %d), no re-claim before %s", o.stored.Epoch, o.epoch,
				o.after.UTC().Format("15:04:05.000"))
		}
	}
	for _, f := range st.out.failures {
		fmt.Fprintf(&b, "\n  failed: %s", f.msg)
		if f.ids != nil {
			b.WriteString(" " + partsText(f.ids))
		}
		fmt.Fprintf(&b, ": %v (next attempt in %s)", f.err, f.next)
	}
	if len(st.out.failures) > 0 {
		fmt.Fprintf(&b, "\n  next pass after %s", st.out.hold.after.UTC().Format("15:04:05.000"))
	}
	return b.String()
}

func partsText(ids []int32) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprintf("p%d", id)
	}
	return strings.Join(s, " ")
}
