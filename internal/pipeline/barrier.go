package pipeline

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/billing/ledger/internal/deadletters"

	"github.com/billing/ledger/internal/txsink"
)

// The barrier. Under one lock (Pipeline.mu) the source cuts every assigned
// partition at its current position and hands the records below the cuts
// to a checkpoint: a snapshot. With a single source task the barrier is
// aligned by construction: nothing of the next checkpoint can overtake it.
// The snapshot is committed on its own goroutine while polling goes on
// (asynchronous snapshot); at most one is in flight, and fetching pauses
// when twice the record or byte budget is buffered behind it.

// snapshot is one sealed checkpoint: the cut of every partition that moved
// and the records below the cuts.
type snapshot struct {
	cuts    []txsink.PartitionCut
	records []record
	dead    []deadletters.Letter
	bytes   int // memory held by records and dead
}

type inflight struct {
	snap *snapshot
	done chan struct{} // closed when out is set
	out  outcome
}

// outcome is what the source needs to know: whether the offsets moved
// (decided), and the error if anything failed.
type outcome struct {
	decided bool
	err     error
}

// updatePendingLocked publishes how many consumed records no decided
// checkpoint covers yet.
func (p *Pipeline) updatePendingLocked() {
	n, b := p.bufferedLocked()
	if p.inflight != nil {
		n += len(p.inflight.snap.records) + len(p.inflight.snap.dead)
		b += p.inflight.snap.bytes
	}
	p.stats.Pending.Store(int64(n))
	p.stats.PendingBytes.Store(int64(b))
}

// bufferedLocked returns the records buffered for the next checkpoint and
// the memory they hold.
func (p *Pipeline) bufferedLocked() (records, bytes int) {
	for _, pt := range p.parts {
		records += len(pt.records) + len(pt.dead)
		bytes += pt.bytes
	}
	return records, bytes
}

// maybeSealLocked takes a checkpoint when one is due and none is in flight.
func (p *Pipeline) maybeSealLocked(ctx context.Context) {
	if p.inflight != nil || p.failure.Load() != nil || p.cfg.Hold != nil && p.cfg.Hold() != "" {
		return
	}
	if n, b := p.bufferedLocked(); time.Since(p.lastSeal) < p.cfg.CheckpointInterval && n < p.cfg.CheckpointMaxRecords && b < p.cfg.CheckpointMaxBytes {
		return
	}
	snap := p.sealLocked()
	if snap == nil {
		if snap = p.eventTimeTickLocked(); snap == nil {
			return
		}
	}
	in := &inflight{snap: snap, done: make(chan struct{})}
	p.inflight = in
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		in.out = p.ckpt.run(context.WithoutCancel(ctx), snap)
		close(in.done)
		p.wakePoll()
	}()
}

// sealLocked is the barrier: it cuts every assigned partition at its
// current position, in one step under the lock, and moves the buffered
// records into a snapshot. Records polled later belong to the next
// checkpoint. It returns nil when no partition moved.
func (p *Pipeline) sealLocked() *snapshot {
	p.lastSeal = time.Now()
	p.ahead.barrier()
	ids := make([]int32, 0, len(p.parts))
	for id, pt := range p.parts {
		if pt.pending(p.cfg.WindowCloseAfter > 0) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	slices.Sort(ids)
	n := 0
	for _, id := range ids {
		n += len(p.parts[id].records)
	}
	s := &snapshot{cuts: make([]txsink.PartitionCut, 0, len(ids)), records: make([]record, 0, n)}
	for _, id := range ids {
		pt := p.parts[id]
		s.cuts = append(s.cuts, txsink.PartitionCut{Partition: id, Epoch: pt.epoch, NextOffset: pt.position,
			Watermark: pt.watermark, CaughtUp: pt.caughtUp()})
		s.records = append(s.records, pt.records...)
		s.dead = append(s.dead, pt.dead...)
		s.bytes += pt.bytes
		// The records are copied: keep the buffer's capacity for the next
		// checkpoint, cleared so that it pins no payload.
		clear(pt.records)
		pt.records, pt.dead, pt.bytes = pt.records[:0], nil, 0
	}
	return s
}

// eventTimeTickLocked returns an empty snapshot when windows may wait to
// be closed or sealed while no partition moved: after a checkpoint that
// closed windows (they are sealed by the next one), and every
// RecoveryInterval, since the other instances' checkpoints, or their
// partitions becoming caught up, may have moved the topic's watermark. The
// checkpoint finds out from MySQL whether there is anything to do, and
// skips the transaction otherwise.
func (p *Pipeline) eventTimeTickLocked() *snapshot {
	if p.cfg.WindowCloseAfter <= 0 {
		return nil
	}
	if !p.ckpt.EventTimeDue() && time.Since(p.lastTick) < p.cfg.RecoveryInterval {
		return nil
	}
	p.lastTick = time.Now()
	return &snapshot{}
}

// collectLocked applies the outcome of the checkpoint in flight, if it has
// finished.
func (p *Pipeline) collectLocked() {
	if p.inflight == nil {
		return
	}
	select {
	case <-p.inflight.done:
		p.finishLocked(p.inflight.snap, p.inflight.out)
		p.inflight = nil
	default:
	}
}

// finishLocked applies a checkpoint's outcome to the partitions. Decided:
// the cuts are the new committed positions. Not decided: everything
// buffered since the last committed checkpoint is discarded (it was built
// on the aborted one) and every partition is rewound from MySQL; unless
// the snapshot cut no partition (an event-time tick): nothing was built on
// it.
func (p *Pipeline) finishLocked(s *snapshot, out outcome) {
	if errors.Is(out.err, txsink.ErrNotPlaceable) {
		// The ledger grew onto a server this instance was not given.
		p.fail(out.err)
	}
	if out.decided {
		for _, c := range s.cuts {
			if pt := p.parts[c.Partition]; pt != nil && pt.epoch == c.Epoch {
				pt.committed, pt.committedUp = c.NextOffset, c.CaughtUp
			}
		}
		p.commitToGroup(s.cuts)
		return
	}
	if len(s.cuts) == 0 {
		return
	}
	for _, pt := range p.parts {
		pt.records, pt.dead, pt.bytes = nil, nil, 0
		pt.rewind = true
	}
}

// drainLocked waits for the checkpoint in flight and then checkpoints
// whatever is buffered, synchronously. Used before partitions are revoked
// and at shutdown, so that the next owner starts where this one stopped.
func (p *Pipeline) drainLocked(ctx context.Context) {
	if p.inflight != nil {
		select {
		case <-p.inflight.done:
			p.finishLocked(p.inflight.snap, p.inflight.out)
			p.inflight = nil
		case <-ctx.Done():
			p.log.Warn("checkpoint in flight did not finish before the deadline; leaving it to recovery")
			return
		}
	}
	if snap := p.sealLocked(); snap != nil {
		p.finishLocked(snap, p.ckpt.run(ctx, snap))
	}
	p.updatePendingLocked()
}
