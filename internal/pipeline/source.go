package pipeline

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink"
)

// partition is the input state of one assigned partition. It is guarded by
// Pipeline.mu.
type partition struct {
	id    int32
	epoch int64 // the epoch of this instance's claim; checkpoints are fenced by it
	// position is the next offset to process: records below it are ignored
	// (a stale fetch). txsink.StartOffset until the first record of a
	// partition never checkpointed.
	position int64
	// committed is the next offset stored in MySQL as far as this instance
	// knows: the last decided cut.
	committed int64
	records   []record     // valid events since the last seal
	dead      []deadLetter // invalid records since the last seal
	bytes     int          // memory held by records and dead (see record.bytes)
	// rewind is set when buffered state was discarded (an aborted
	// checkpoint): the position must be reread from MySQL before the
	// partition is consumed again, and records fetched meanwhile are dropped.
	rewind bool
}

func (pt *partition) pending() bool {
	return !pt.rewind && pt.position != pt.committed && pt.position != txsink.StartOffset
}

// record is a decoded, valid event and where it came from. It keeps the
// record's key and value: should the event turn out a conflicting repeat
// or an overflow, its dead letter stores them.
type record struct {
	ev        event.Event
	partition int32
	offset    int64
	key       []byte
	value     []byte
	ts        time.Time
}

// recordOverhead approximates a buffered record's memory besides its key,
// value and ids: the struct, the decoded event's fixed part, slice headers.
const recordOverhead = 200

// bytes is the memory a buffered record holds, for the byte budget
// (Config.CheckpointMaxBytes).
func (r *record) bytes() int {
	return len(r.key) + len(r.value) + len(r.ev.EventID) + len(r.ev.AccountID) + recordOverhead
}

// poll is the source: it polls, decodes, buffers per partition, and seals a
// checkpoint (the barrier) every CheckpointInterval or when the buffer
// passes CheckpointMaxRecords. Sealing only cuts the buffers; the
// checkpoint runs on its own goroutine while polling goes on, so a
// checkpoint never stalls consumption longer than the one in flight takes,
// and at twice the bound fetching pauses (backpressure).
func (p *Pipeline) poll(ctx context.Context) {
	for ctx.Err() == nil {
		pollWait, limit := p.pollPlan()
		pctx, cancel := context.WithTimeout(ctx, pollWait)
		p.wake.Store(&cancel)
		fetches := p.cl.PollRecords(pctx, limit)
		p.wake.Store(nil)
		cancel()
		if errors.Is(fetches.Err0(), kgo.ErrClientClosed) {
			return
		}

		p.mu.Lock()
		p.collectLocked()
		p.processLocked(fetches)
		p.rewindLocked(ctx)
		p.maybeSealLocked(ctx)
		var wait chan struct{}
		if n, b := p.bufferedLocked(); p.inflight != nil && (n >= 2*p.cfg.CheckpointMaxRecords || b >= 2*p.cfg.CheckpointMaxBytes) {
			wait = p.inflight.done
		}
		p.updatePendingLocked()
		p.mu.Unlock()
		p.cl.AllowRebalance()
		if wait != nil {
			select {
			case <-wait:
			case <-ctx.Done():
			}
		}
	}
}

// pollPlan is how long the next poll may block (until the next checkpoint
// is due, or briefly while a rewind is pending) and how many records it may
// take: no more than fit in what is left of twice the byte budget if every
// record were as large as a record can be kept. Fetch sizes alone cannot
// bound memory: a compressed batch of small size on the wire can decompress
// into any number of records.
func (p *Pipeline) pollPlan() (time.Duration, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, b := p.bufferedLocked()
	limit := min(p.cfg.MaxPollRecords, max(1, (2*p.cfg.CheckpointMaxBytes-b)/p.maxRecordBytes()))
	for _, pt := range p.parts {
		if pt.rewind {
			return 100 * time.Millisecond, limit
		}
	}
	d := time.Until(p.lastSeal.Add(p.cfg.CheckpointInterval))
	return max(min(d, p.cfg.CheckpointInterval), 5*time.Millisecond), limit
}

// maxRecordBytes is the most memory one buffered record can hold: a valid
// event's value is at most MaxPayloadBytes, a dead letter keeps at most
// DeadLetterPayloadBytes of it; keys are kept up to maxStoredKey.
func (p *Pipeline) maxRecordBytes() int {
	return max(p.cfg.MaxPayloadBytes, p.cfg.DeadLetterPayloadBytes) + maxStoredKey + event.MaxEventIDLen + event.MaxAccountIDLen + recordOverhead + deadLetterOverhead + maxDetail
}

func (p *Pipeline) wakePoll() {
	if c := p.wake.Load(); c != nil {
		(*c)()
	}
}

func (p *Pipeline) processLocked(fetches kgo.Fetches) {
	fetches.EachError(func(topic string, partition int32, err error) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrClientClosed) {
			return
		}
		p.log.Error("fetch failed", "topic", topic, "partition", partition, "err", err)
	})
	fetches.EachRecord(func(r *kgo.Record) {
		pt := p.parts[r.Partition]
		if pt == nil || pt.rewind || r.Topic != p.cfg.Topic {
			return
		}
		if pt.position >= 0 && r.Offset < pt.position {
			return // from a fetch older than the last rewind
		}
		pt.position = r.Offset + 1
		if r.Attrs.IsControl() {
			// A transaction marker (KeepControlRecords): nothing to
			// count, but the position moves past it, so that a
			// partition ending in markers is checkpointed up to its
			// end and its lag (end offset - stored position) is zero.
			return
		}
		p.stats.Consumed.Add(1)
		ev, err := p.dec.Decode(r.Value)
		if err != nil {
			reason, eventID := "invalid_record", ""
			var de *event.DecodeError
			if errors.As(err, &de) {
				reason, eventID = string(de.Reason), de.EventID
			}
			d := newDeadLetter(r.Partition, r.Offset, r.Key, r.Value, p.cfg.DeadLetterPayloadBytes, reason, err.Error(), eventID)
			pt.dead = append(pt.dead, d)
			pt.bytes += d.bytes()
			return
		}
		rec := record{ev: ev, partition: r.Partition, offset: r.Offset, key: truncate(r.Key, maxStoredKey), value: r.Value, ts: r.Timestamp}
		pt.records = append(pt.records, rec)
		pt.bytes += rec.bytes()
	})
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
	if p.inflight != nil {
		return
	}
	if n, b := p.bufferedLocked(); time.Since(p.lastSeal) < p.cfg.CheckpointInterval && n < p.cfg.CheckpointMaxRecords && b < p.cfg.CheckpointMaxBytes {
		return
	}
	snap := p.sealLocked()
	if snap == nil {
		return
	}
	in := &inflight{snap: snap, done: make(chan struct{})}
	p.inflight = in
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		in.out = p.runCheckpoint(context.WithoutCancel(ctx), snap)
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
	ids := make([]int32, 0, len(p.parts))
	for id, pt := range p.parts {
		if pt.pending() {
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
		s.cuts = append(s.cuts, txsink.PartitionCut{Partition: id, Epoch: pt.epoch, NextOffset: pt.position})
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
// on the aborted one) and every partition is rewound from MySQL.
func (p *Pipeline) finishLocked(s *snapshot, out outcome) {
	if out.decided {
		for _, c := range s.cuts {
			if pt := p.parts[c.Partition]; pt != nil && pt.epoch == c.Epoch {
				pt.committed = c.NextOffset
			}
		}
		p.commitToGroup(s.cuts)
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
		p.finishLocked(snap, p.runCheckpoint(ctx, snap))
	}
	p.updatePendingLocked()
}

// rewindLocked rereads the committed position of every partition whose
// buffered state was discarded, and restarts fetching there. A partition
// whose stored epoch or owner is no longer this instance's was taken over:
// it is dropped until the group tells this member about it. If MySQL cannot
// be read, the rewind is retried after a backoff (doubling from 100 ms to
// 5 s, so that an outage costs a log line every few seconds, not one per
// poll); the partition's records are dropped meanwhile.
func (p *Pipeline) rewindLocked(ctx context.Context) {
	if time.Now().Before(p.rewindAfter) {
		return
	}
	var ids []int32
	for id, pt := range p.parts {
		if pt.rewind {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pos, err := p.sink.Positions(ctx, ids)
	if err != nil {
		p.rewindFailedLocked("cannot reread positions; retrying", "partitions", ids, "err", err)
		return
	}
	var fromStart []int32
	set := map[int32]kgo.EpochOffset{}
	for _, id := range ids {
		pt := p.parts[id]
		ps, ok := pos[id]
		if !ok || ps.Owner != p.sink.Instance() || ps.Epoch != pt.epoch {
			p.log.Warn("partition taken over by another owner; dropping it", "partition", id, "held_epoch", pt.epoch, "stored_epoch", ps.Epoch)
			delete(p.parts, id)
			continue
		}
		if ps.NextOffset == txsink.StartOffset {
			fromStart = append(fromStart, id)
			continue
		}
		pt.position, pt.committed, pt.rewind = ps.NextOffset, ps.NextOffset, false
		set[id] = kgo.EpochOffset{Epoch: -1, Offset: ps.NextOffset}
	}
	if len(fromStart) == 0 {
		p.rewindBackoff = 0
	} else {
		starts, err := p.adm.ListStartOffsets(ctx, p.cfg.Topic)
		if err != nil {
			p.rewindFailedLocked("cannot list start offsets; retrying", "err", err)
		} else {
			p.rewindBackoff = 0
			for _, id := range fromStart {
				if o, ok := starts.Lookup(p.cfg.Topic, id); ok && o.Err == nil {
					pt := p.parts[id]
					pt.position, pt.committed, pt.rewind = txsink.StartOffset, txsink.StartOffset, false
					set[id] = kgo.EpochOffset{Epoch: -1, Offset: o.Offset}
				}
			}
		}
	}
	if len(set) > 0 {
		p.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{p.cfg.Topic: set})
	}
	p.stats.AssignedParts.Store(int64(len(p.parts)))
}

// rewindFailedLocked logs a failed rewind and holds the next attempt back.
func (p *Pipeline) rewindFailedLocked(msg string, args ...any) {
	p.rewindBackoff = min(max(2*p.rewindBackoff, 100*time.Millisecond), 5*time.Second)
	p.rewindAfter = time.Now().Add(p.rewindBackoff)
	p.log.Warn(msg, append(args, "next_attempt_in", p.rewindBackoff)...)
}

// onAssigned runs when the group gives this member new partitions, before
// fetching them. It resolves branches left in doubt (best effort; recovery
// also runs periodically), claims the partitions in MySQL (raising their
// epochs, which fences every previous owner), and replaces the group's
// offsets with the positions stored in MySQL.
func (p *Pipeline) onAssigned(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	var ids []int32
	for id := range offsets[p.cfg.Topic] {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	rctx, cancel := context.WithTimeout(ctx, p.cfg.CheckpointTimeout/2)
	res, err := p.sink.Recover(rctx, p.cfg.CheckpointTimeout)
	cancel()
	p.recovered(res)
	if err != nil {
		p.log.Warn("recovery before assignment incomplete", "err", err)
	}
	pos, err := p.sink.Claim(ctx, ids)
	if err != nil {
		p.log.Error("cannot claim assigned partitions", "partitions", ids, "err", err)
		return nil, err
	}
	out := map[int32]kgo.Offset{}
	p.mu.Lock()
	for _, id := range ids {
		ps := pos[id]
		p.parts[id] = &partition{id: id, epoch: ps.Epoch, position: ps.NextOffset, committed: ps.NextOffset}
		if ps.NextOffset == txsink.StartOffset {
			out[id] = kgo.NewOffset().AtStart()
		} else {
			out[id] = kgo.NewOffset().At(ps.NextOffset).WithEpoch(-1)
		}
	}
	p.stats.AssignedParts.Store(int64(len(p.parts)))
	p.mu.Unlock()
	p.log.Info("partitions assigned", "partitions", ids, "positions", pos)
	return map[string]map[int32]kgo.Offset{p.cfg.Topic: out}, nil
}

// onRevoked runs before partitions go to another member (and at Close). It
// checkpoints everything buffered, so the next owner resumes exactly where
// this one stopped, then forgets the revoked partitions.
func (p *Pipeline) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, p.cfg.CheckpointTimeout+5*time.Second)
	defer cancel()
	p.drainLocked(dctx)
	for _, id := range revoked[p.cfg.Topic] {
		delete(p.parts, id)
	}
	p.stats.AssignedParts.Store(int64(len(p.parts)))
	p.log.Info("partitions revoked", "partitions", revoked[p.cfg.Topic])
}

// onLost runs when the group moved on without this member (session
// expired, fenced generation). Nothing can be committed for the lost
// partitions any more (their epochs fence it); their buffered state is
// dropped.
func (p *Pipeline) onLost(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inflight != nil {
		wctx, cancel := context.WithTimeout(ctx, p.cfg.CheckpointTimeout+5*time.Second)
		select {
		case <-p.inflight.done:
			p.finishLocked(p.inflight.snap, p.inflight.out)
			p.inflight = nil
		case <-wctx.Done():
		}
		cancel()
	}
	for _, id := range lost[p.cfg.Topic] {
		delete(p.parts, id)
	}
	p.updatePendingLocked()
	p.stats.AssignedParts.Store(int64(len(p.parts)))
	p.log.Warn("partitions lost", "partitions", lost[p.cfg.Topic])
}
