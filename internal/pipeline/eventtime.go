package pipeline

import (
	"fmt"
	"slices"
	"time"

	"github.com/billing/ledger/internal/deadletters"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Event time: watermarks and closing windows.
//
// A partition's watermark is the latest occurred_at of the records below
// its committed position, every record that decodes counted, whatever
// dedup makes of it (a repeat, a conflict, an overflow). It is written by
// the commit decision with the partition's offset (partition_offsets), so
// it is exactly as durable as the offset, survives restarts and
// rebalances, and never goes back. With it the decision writes whether the
// partition was caught up: its position had reached the end of its log
// (the last stable offset the consumer saw).
//
// The topic's watermark is the earliest watermark of the partitions that
// are not caught up: a partition with nothing left to read (idle) does not
// hold it back, and neither does one that never had an event. When every
// partition with a watermark is caught up, it is the latest of them. It is
// combined from the committed rows at each checkpoint, so every instance
// sees the others' partitions as of their last checkpoint.
//
// The ledger's closing frontier (driver.Frontier) is the start of the
// earliest window that is still open: a window closes once the topic's
// watermark has passed its end plus WindowCloseAfter, i.e. every window
// starting before Start(watermark - WindowCloseAfter) is closed. The
// frontier is raised by commit decisions only, and only grows (the topic's
// watermark itself may go back when an idle partition gets records again).
//
// Closing has two steps, both inside checkpoints:
//
//  1. The checkpoint whose watermark passes a window's closing time
//     raises Closed past it. From that checkpoint on, an event of the
//     window counts in window_adjustments, not in billing_windows: each
//     event is judged against the frontier as it stood before it in its
//     partition (the committed frontier, raised by the watermark of the
//     records before and including it), so that the outcome on one
//     partition does not depend on where checkpoints cut it.
//  2. A later checkpoint (the next one of any instance, or one taken only
//     for this when no records come) seals the windows between Sealed and
//     Closed: it sets closed_at on their rows and raises Sealed. After
//     that the rows never change.
//
// Why two steps: a checkpoint of another instance that read the frontier
// before it was raised may still be writing to a closing window. Its
// decision is refused (txsink.ErrFrontierMoved) if the frontier was raised
// past a window it wrote as open; if it decided first, its rows were
// prepared before the raise, hence before the sealing checkpoint looks for
// open rows with a locking read, which waits for them. So when closed_at
// is set, every write to the row that will ever commit has committed.

// Event time is bounded by processing time. A record whose occurred_at is
// later than the checkpoint's processing time plus MaxEventTimeSkew (a
// mistyped year, a producer whose clock runs fast) would raise its
// partition's watermark, and so the closing frontier, past what has
// happened: windows would close early and seal what they held at that
// moment. Such a record is an event_time_in_future dead letter, judged
// where the checkpoint is planned (admit), before anything else: it is
// counted nowhere, its id is not remembered (a corrected copy counts
// once), and it is not part of its partition's watermark. So no cut's
// watermark, and no frontier, is later than the processing time plus
// MaxEventTimeSkew of the checkpoint that wrote it. Each attempt judges
// again with its own processing time: a replay after an abort may admit a
// record an earlier attempt refused (time went on), but only one attempt
// of a snapshot ever commits, so each record has one outcome. Events far
// in the past need nothing of this: they are late.

// admit judges the records of s against processing time now: the ones in
// the future (see above) become dead letters. It returns the snapshot the
// attempt commits: the other records, in order, the dead letters of s and
// the new ones, and every cut's watermark raised by the records of its
// partition that were admitted. s is left as it was, for another attempt.
func admit(s *snapshot, now time.Time, skew time.Duration, prefix int) *snapshot {
	bound := now.Add(skew)
	out := &snapshot{cuts: slices.Clone(s.cuts), records: make([]record, 0, len(s.records)), dead: slices.Clip(s.dead), bytes: s.bytes}
	latest := map[int32]time.Time{}
	for i := range s.records {
		r := &s.records[i]
		if r.ev.OccurredAt.After(bound) {
			out.dead = append(out.dead, deadletters.New(r.partition, r.offset, r.key, r.value, prefix, string(event.ReasonEventTimeInFuture),
				fmt.Sprintf("occurred_at %s is later than the processing time %s plus MAX_EVENT_TIME_SKEW (%s)",
					r.ev.OccurredAt.UTC().Format(time.RFC3339Nano), now.UTC().Format(time.RFC3339Nano), skew), r.ev.EventID))
			continue
		}
		out.records = append(out.records, *r)
		latest[r.partition] = laterOf(latest[r.partition], r.ev.OccurredAt)
	}
	for i := range out.cuts {
		c := &out.cuts[i]
		c.Watermark = laterOf(c.Watermark, latest[c.Partition])
	}
	return out
}

// partTime is a partition's event time: its watermark (zero: none) and
// whether it was caught up with its log.
type partTime struct {
	wm       time.Time
	caughtUp bool
}

// topicWatermark combines the partitions' event times: the earliest
// watermark of the partitions that are not caught up, else the latest
// watermark of all; zero when no partition has one.
func topicWatermark(parts map[int32]partTime) time.Time {
	var active, latest time.Time
	for _, p := range parts {
		if p.wm.IsZero() {
			continue
		}
		if !p.caughtUp && (active.IsZero() || p.wm.Before(active)) {
			active = p.wm
		}
		if p.wm.After(latest) {
			latest = p.wm
		}
	}
	if !active.IsZero() {
		return active
	}
	return latest
}

// closedBefore is the frontier a watermark justifies: the start of the
// window holding watermark - closeAfter; every earlier window ends at or
// before that instant. Zero for a zero watermark.
func closedBefore(w event.Windows, watermark time.Time, closeAfter time.Duration) time.Time {
	if watermark.IsZero() {
		return time.Time{}
	}
	return w.Start(watermark.Add(-closeAfter))
}

// laterOf is the later instant, a zero one counting as none.
func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// eventTimePlan is what a checkpoint does with event time: which of its
// records count as late (their window was closed when they were counted),
// the frontier it raises, and which windows it seals.
type eventTimePlan struct {
	enabled bool
	read    driver.Frontier // as committed when the checkpoint began
	raise   time.Time       // Closed after this checkpoint
	// seal: the rows of windows in [sealFrom, sealTo) are to be sealed
	// (sealTo zero: nothing to seal).
	sealFrom, sealTo time.Time
}

// planEventTime judges every record of the snapshot (setting record.late)
// against the committed event time et, in the order of each partition (the
// barrier appends each partition's records in order). A record's own
// partition is taken as active with the watermark
// of the records up to and including it; the other partitions as
// committed. The raise is the latest frontier any record saw, and the
// frontier of the cut (each of the snapshot's partitions at its cut's
// watermark and flag, the others as committed).
func planEventTime(w event.Windows, closeAfter time.Duration, et txsink.EventTime, records []record, cuts []txsink.PartitionCut) eventTimePlan {
	plan := eventTimePlan{enabled: true, read: et.Frontier, raise: et.Frontier.Closed}
	stored := make(map[int32]partTime, len(et.Partitions)+len(cuts))
	for id, ps := range et.Partitions {
		stored[id] = partTime{wm: ps.Watermark, caughtUp: ps.CaughtUp}
	}
	// The earliest active watermark of the partitions other than p, from
	// the committed rows.
	othersActive := func(p int32) time.Time {
		var out time.Time
		for id, pt := range stored {
			if id != p && !pt.caughtUp && !pt.wm.IsZero() && (out.IsZero() || pt.wm.Before(out)) {
				out = pt.wm
			}
		}
		return out
	}
	running := map[int32]time.Time{}
	others := map[int32]time.Time{}
	for i := range records {
		r := &records[i]
		run, ok := running[r.partition]
		if !ok {
			run = stored[r.partition].wm
			others[r.partition] = othersActive(r.partition)
		}
		run = laterOf(run, r.ev.OccurredAt)
		running[r.partition] = run
		wm := run
		if o := others[r.partition]; !o.IsZero() && o.Before(wm) {
			wm = o
		}
		f := laterOf(et.Frontier.Closed, closedBefore(w, wm, closeAfter))
		plan.raise = laterOf(plan.raise, f)
		r.late = w.Start(r.ev.OccurredAt).Before(f)
	}
	final := stored
	if len(cuts) > 0 {
		final = make(map[int32]partTime, len(stored)+len(cuts))
		for id, pt := range stored {
			final[id] = pt
		}
		for _, c := range cuts {
			final[c.Partition] = partTime{wm: laterOf(stored[c.Partition].wm, c.Watermark), caughtUp: c.CaughtUp}
		}
	}
	plan.raise = laterOf(plan.raise, closedBefore(w, topicWatermark(final), closeAfter))
	if et.Frontier.Closed.After(et.Frontier.Sealed) {
		plan.sealFrom, plan.sealTo = et.Frontier.Sealed, et.Frontier.Closed
	}
	return plan
}

// noWork reports whether the plan has nothing to do for a checkpoint without
// records: no window to close, none to seal.
func (p *eventTimePlan) noWork() bool {
	return !p.raise.After(p.read.Closed) && p.sealTo.IsZero()
}

// change is the frontier change of the checkpoint's decision: openFrom is
// the earliest window start it wrote as open (zero: none); sealed says
// whether its sealing finished (on every server).
func (p *eventTimePlan) change(openFrom time.Time, sealed bool) *txsink.FrontierChange {
	if !p.enabled {
		return nil
	}
	fc := &txsink.FrontierChange{OpenFrom: openFrom, Raise: driver.Frontier{Closed: p.raise}}
	if sealed {
		fc.Raise.Sealed = p.sealTo
	}
	return fc
}
