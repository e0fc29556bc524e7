package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/billing/ledger/internal/deadletters"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/waits"
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
	records   []record             // valid events since the last seal
	dead      []deadletters.Letter // invalid records since the last seal
	bytes     int                  // memory held by records and dead (see record.bytes)
	// rewind is set when buffered state was discarded (an aborted
	// checkpoint): the position must be reread from MySQL before the
	// partition is consumed again, and records fetched meanwhile are dropped.
	rewind bool
	// reclaimAfter holds back claiming the partition again after its claim
	// was taken (see sourceplan.go); reclaimBackoff is the last wait.
	reclaimAfter   time.Time
	reclaimBackoff time.Duration
	// watermark is the partition's stored watermark as of its claim or
	// last rewind (zero: none): the floor of its cuts' watermarks, which
	// each checkpoint raises by the records it admits (see admit; the
	// stored one only ever rises). end is the last stable offset the
	// latest fetch of the partition reported (-1: none yet); committedUp
	// the caught-up flag of the last decided cut, or as read from MySQL.
	watermark   time.Time
	end         int64
	committedUp bool
}

// pending reports whether the partition is to be cut: it moved since the
// last decided cut, or (with closing windows) it became caught up or
// stopped being so, which changes the topic's watermark.
func (pt *partition) pending(closing bool) bool {
	if pt.rewind || pt.position == txsink.StartOffset {
		return false
	}
	return pt.position != pt.committed || (closing && pt.end >= 0 && pt.caughtUp() != pt.committedUp)
}

// caughtUp reports whether the position has reached the end of the log as
// last reported by a fetch.
func (pt *partition) caughtUp() bool {
	return pt.end >= 0 && pt.position != txsink.StartOffset && pt.position >= pt.end
}

// restore sets the partition's input state to a stored position.
func (pt *partition) restore(ps txsink.Position) {
	pt.position, pt.committed, pt.rewind = ps.NextOffset, ps.NextOffset, false
	pt.watermark, pt.committedUp = ps.Watermark, ps.CaughtUp
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
	late      bool // its window was closed when it was counted (set by planEventTime)
	retract   bool // a counted version's retraction (versions.go), never a buffered record
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

		if !p.prepare(ctx, fetches) {
			p.cl.AllowRebalance()
			continue // stopping: the records were not taken, nor their positions
		}
		p.mu.Lock()
		p.collectLocked()
		marks := p.markAheadLocked()
		p.processLocked(fetches)
		p.offerAheadLocked(marks)
		p.mu.Unlock()
		p.rewind(ctx)
		p.mu.Lock()
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

// prepare lets the decoder do the I/O the poll's records need (schemas
// from the registry) before they are decoded under the lock. A registry
// that does not answer is not the records' fault: they are held, and the
// decoder asked again after a backoff (doubling from 100 ms to 5 s) until
// it answers, with a warning per attempt and Stats.RegistryDown set
// meanwhile. The checkpoint in flight completes; no new one is sealed,
// which /readyz and /healthz see as the last checkpoint's age. It returns
// false when ctx ends first.
func (p *Pipeline) prepare(ctx context.Context, fetches kgo.Fetches) bool {
	if p.recDec == nil || fetches.Empty() {
		return true
	}
	recs := fetches.Records()
	backoff := 100 * time.Millisecond
	var wait *waits.Wait
	defer func() {
		if wait != nil {
			wait.End()
		}
	}()
	for {
		err := p.recDec.Prepare(ctx, recs)
		if err == nil {
			if p.stats.RegistryDown.Swap(0) != 0 {
				p.log.Info("schema registry answers again; decoding the held records")
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		p.stats.RegistryDown.Store(1)
		p.stats.RegistryRetries.Add(1)
		if wait == nil {
			wait = p.cfg.Waits.Begin(fmt.Sprintf("the schema registry to answer (%d records held)", len(recs)))
		}
		wait.Still(err.Error())
		p.log.Warn("schema registry unavailable: the poll's records wait for it (none is dead-lettered for it)",
			"records", len(recs), "retry_in", backoff, "err", err)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return false
		}
		backoff = min(2*backoff, 5*time.Second)
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
// DeadLetterPayloadBytes of it; keys are kept up to deadletters.MaxKey.
func (p *Pipeline) maxRecordBytes() int {
	return max(p.cfg.MaxPayloadBytes+deadletters.MaxKey+event.MaxEventIDLen+event.MaxAccountIDLen+recordOverhead,
		deadletters.MaxBytes(p.cfg.DeadLetterPayloadBytes))
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
	fetches.EachTopic(func(ft kgo.FetchTopic) {
		if ft.Topic != p.cfg.Topic {
			return
		}
		ft.EachPartition(func(fp kgo.FetchPartition) {
			if pt := p.parts[fp.Partition]; pt != nil && fp.Err == nil && fp.LastStableOffset >= 0 {
				pt.end = max(pt.end, fp.LastStableOffset)
			}
		})
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
		var ev event.Event
		var err error
		if p.recDec != nil {
			ev, err = p.recDec.Decode(context.Background(), r.Value, r.Headers)
			if errors.Is(err, format.ErrSkipped) {
				// Passed over like a control record: the position moves
				// past it, nothing else records it.
				p.stats.Skipped.Add(1)
				return
			}
			if format.IsUnavailable(err) {
				// prepare resolved the record's schema, so only a cache
				// that lost it since leads here: the record is not at
				// fault. The partition is read again from its committed
				// position (its buffer dropped, as after an abort).
				p.log.Warn("schema registry unavailable while decoding; rereading the partition", "partition", r.Partition, "offset", r.Offset, "err", err)
				pt.position = r.Offset
				pt.records, pt.dead, pt.bytes = nil, nil, 0
				pt.rewind = true
				return
			}
		} else {
			ev, err = p.dec.Decode(r.Value)
		}
		if err != nil {
			reason, eventID := "invalid_record", ""
			var de *event.DecodeError
			if errors.As(err, &de) {
				reason, eventID = string(de.Reason), de.EventID
			}
			d := deadletters.New(r.Partition, r.Offset, r.Key, r.Value, p.cfg.DeadLetterPayloadBytes, reason, err.Error(), eventID)
			pt.dead = append(pt.dead, d)
			pt.bytes += deadletters.Bytes(&d)
			return
		}
		// The key is kept up to what a dead letter of the event would keep.
		rec := record{ev: ev, partition: r.Partition, offset: r.Offset, key: r.Key[:min(len(r.Key), deadletters.MaxKey)], value: r.Value, ts: r.Timestamp}
		pt.records = append(pt.records, rec)
		pt.bytes += rec.bytes()
	})
}

// markAheadLocked notes where each partition's buffer ends before a poll
// is processed, so that offerAheadLocked finds the records it added; nil
// when the read-ahead is off.
func (p *Pipeline) markAheadLocked() map[*partition]int {
	if p.ahead == nil {
		return nil
	}
	marks := make(map[*partition]int, len(p.parts))
	for _, pt := range p.parts {
		marks[pt] = len(pt.records)
	}
	return marks
}

// offerAheadLocked hands the ids of the records the poll just processed
// added (after marks) to the read-ahead, if every assigned partition is
// caught up with the log (the live regime; readahead.go says why not in a
// catch-up).
func (p *Pipeline) offerAheadLocked(marks map[*partition]int) {
	if marks == nil {
		return
	}
	for _, pt := range p.parts {
		// A partition that never had a record fetched is caught up once
		// a fetch says its log is empty.
		empty := pt.position == txsink.StartOffset && pt.end == 0
		if !pt.caughtUp() && !empty {
			return
		}
	}
	var ids []string
	for pt, from := range marks {
		for _, r := range pt.records[min(from, len(pt.records)):] {
			ids = append(ids, r.ev.EventID)
		}
	}
	p.ahead.offer(ids)
}

// rewind runs a rewind pass (sourceplan.go): it rereads the stored
// position of every partition whose buffered state was discarded, claims
// again the ones taken over while this member still holds them, and
// restarts fetching there. The plan decides; rewind does the I/O, outside
// the pipeline's lock (the poll goroutine is the only one that fetches, so
// nothing is fetched meanwhile for the rewinding partitions, whose records
// processLocked drops), and applies the outcome under it.
//
// The whole pass holds ownMu, which onRevoked and onLost take before
// taking partitions away: a re-claim raises the partition's epoch, which
// must happen only while the group still gives it to this member. Claimed
// after a revoke, it would fence the next owner, which would claim it back
// from this one at its next checkpoint, an abort on each side. So a revoke
// waits for the pass, as it waited for the lock when the pass held it.
func (p *Pipeline) rewind(ctx context.Context) {
	p.ownMu.Lock()
	defer p.ownMu.Unlock()
	p.mu.Lock()
	pl := newRewindPlan(rewindInputOf(p.parts, time.Now(), p.sink.Instance(), p.rewindHold))
	p.mu.Unlock()
	if pl.ready().kind == rewindNothing {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		st := pl.ready()
		var r rewindResult
		switch st.kind {
		case rewindNothing:
			return
		case rewindApply:
			p.mu.Lock()
			seeks := applyRewind(p.parts, st.out)
			p.rewindHold = st.out.hold
			if len(seeks) > 0 {
				// Under the lock, from the poll goroutine, before the next
				// poll: the client skips a partition it no longer
				// consumes, and the positions just restored drop what an
				// older fetch still brings (processLocked).
				set := make(map[int32]kgo.EpochOffset, len(seeks))
				for id, o := range seeks {
					set[id] = kgo.EpochOffset{Epoch: -1, Offset: o}
				}
				p.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{p.cfg.Topic: set})
			}
			p.stats.AssignedParts.Store(int64(len(p.parts)))
			p.mu.Unlock()
			p.logRewind(st.out)
			return
		case rewindPositions:
			r.positions, r.err = p.sink.Positions(ctx, st.ids)
		case rewindClaim:
			r.positions, r.err = p.sink.Claim(ctx, st.ids)
		case rewindSettings:
			r.err = p.checkSettings(ctx)
		case rewindStarts:
			var starts kadm.ListedOffsets
			if starts, r.err = p.adm.ListStartOffsets(ctx, p.cfg.Topic); r.err == nil {
				r.starts = map[int32]int64{}
				for _, id := range st.ids {
					if o, ok := starts.Lookup(p.cfg.Topic, id); ok && o.Err == nil {
						r.starts[id] = o.Offset
					}
				}
			}
		}
		r.now = time.Now()
		pl.advance(r)
	}
}

// logRewind logs what a pass did: its failures, and the partitions it
// claimed again.
func (p *Pipeline) logRewind(out *rewindOutcome) {
	for _, f := range out.failures {
		var args []any
		if f.ids != nil {
			args = append(args, "partitions", f.ids)
		}
		p.log.Warn(f.msg, append(args, "err", f.err, "next_attempt_in", f.next)...)
	}
	for _, o := range out.parts {
		if o.claimed {
			p.log.Warn("partition claimed by another instance while still assigned here; claimed again",
				"partition", o.id, "held_epoch", o.epoch, "new_epoch", o.stored.Epoch)
		}
	}
}

// onAssigned runs when the group gives this member new partitions, before
// fetching them. It resolves branches left in doubt (best effort; recovery
// also runs periodically), claims the partitions in MySQL (raising their
// epochs, which fences every previous owner), and replaces the group's
// offsets with the positions stored in MySQL.
func (p *Pipeline) onAssigned(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	select {
	case <-p.started:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if p.startErr != nil {
		return nil, p.startErr
	}
	var ids []int32
	for id := range offsets[p.cfg.Topic] {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	rctx, cancel := context.WithTimeout(ctx, p.cfg.CheckpointTimeout/2)
	res, err := p.sink.Recover(rctx, p.cfg.abortAfter())
	cancel()
	p.recovered(res)
	if err != nil {
		p.log.Warn("recovery before assignment incomplete", "err", err)
	}
	if err := p.cfg.Failpoints.Inject(FailAssignBeforeClaim); err != nil {
		return nil, err
	}
	pos, err := p.sink.Claim(ctx, ids)
	if err != nil {
		p.log.Error("cannot claim assigned partitions", "partitions", ids, "err", err)
		return nil, err
	}
	if err := p.checkSettings(ctx); err != nil {
		return nil, err
	}
	out := map[int32]kgo.Offset{}
	p.mu.Lock()
	for _, id := range ids {
		ps := pos[id]
		p.parts[id] = &partition{id: id, epoch: ps.Epoch, position: ps.NextOffset, committed: ps.NextOffset,
			watermark: ps.Watermark, committedUp: ps.CaughtUp, end: -1}
		if ps.NextOffset == txsink.StartOffset {
			out[id] = kgo.NewOffset().AtStart()
		} else {
			out[id] = kgo.NewOffset().At(ps.NextOffset).WithEpoch(-1)
		}
	}
	p.stats.AssignedParts.Store(int64(len(p.parts)))
	p.topicPartitions = p.countTopicPartitions(ctx)
	p.updateAloneLocked()
	p.mu.Unlock()
	p.log.Info("partitions assigned", "partitions", ids, "positions", claimedText(ids, pos))
	return map[string]map[int32]kgo.Offset{p.cfg.Topic: out}, nil
}

// onRevoked runs before partitions go to another member (and at Close). It
// checkpoints everything buffered, so the next owner resumes exactly where
// this one stopped, then forgets the revoked partitions.
func (p *Pipeline) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	p.ownMu.Lock()
	defer p.ownMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, p.cfg.CheckpointTimeout+5*time.Second)
	defer cancel()
	if p.failure.Load() == nil {
		p.drainLocked(dctx)
	}
	ids := slices.Sorted(slices.Values(revoked[p.cfg.Topic]))
	positions := p.committedTextLocked(ids)
	for _, id := range ids {
		delete(p.parts, id)
	}
	p.updateAloneLocked()
	p.stats.AssignedParts.Store(int64(len(p.parts)))
	if len(ids) > 0 { // a standby's revoke at shutdown revokes nothing
		p.log.Info("partitions revoked", "partitions", ids, "committed", positions)
	}
}

// onLost runs when the group moved on without this member (session
// expired, fenced generation). Nothing can be committed for the lost
// partitions any more (their epochs fence it); their buffered state is
// dropped.
func (p *Pipeline) onLost(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
	p.ownMu.Lock()
	defer p.ownMu.Unlock()
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
	ids := slices.Sorted(slices.Values(lost[p.cfg.Topic]))
	positions := p.committedTextLocked(ids)
	for _, id := range ids {
		delete(p.parts, id)
	}
	p.updateAloneLocked()
	p.updatePendingLocked()
	p.stats.AssignedParts.Store(int64(len(p.parts)))
	if len(ids) > 0 {
		p.log.Warn("partitions lost", "partitions", ids, "committed", positions)
	}
}

// countTopicPartitions is the topic's partition count from the broker's
// metadata, 0 when it cannot be had (then the instance counts as sharing
// the topic: the safe side).
func (p *Pipeline) countTopicPartitions(ctx context.Context) int {
	mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	td, err := p.adm.ListTopics(mctx, p.cfg.Topic)
	if err != nil {
		p.log.Warn("topic metadata unavailable; dedup claims run in lock order", "err", err)
		return 0
	}
	t, ok := td[p.cfg.Topic]
	if !ok || t.Err != nil {
		return 0
	}
	return len(t.Partitions)
}

// updateAloneLocked tells the checkpointer whether this instance holds
// every partition of the topic (then its claims meet no other instance's:
// execution.claim).
func (p *Pipeline) updateAloneLocked() {
	alone := p.topicPartitions > 0 && len(p.parts) >= p.topicPartitions
	if p.ckpt.alone.Swap(alone) != alone {
		p.log.Info("dedup claims", "in_parallel", alone, "partitions_held", len(p.parts), "topic_partitions", p.topicPartitions)
	}
}

// claimedText describes claimed positions for the log, in partition order:
// "p0 at 1432 (epoch 3), p1 from the start (epoch 1)", with each
// partition's watermark when it has one.
func claimedText(ids []int32, pos map[int32]txsink.Position) string {
	parts := make([]string, 0, len(ids))
	for _, id := range ids {
		ps := pos[id]
		s := fmt.Sprintf("p%d at %d", id, ps.NextOffset)
		if ps.NextOffset == txsink.StartOffset {
			s = fmt.Sprintf("p%d from the start", id)
		}
		s += fmt.Sprintf(" (epoch %d", ps.Epoch)
		if !ps.Watermark.IsZero() {
			s += ", watermark " + ps.Watermark.UTC().Format(time.RFC3339)
		}
		parts = append(parts, s+")")
	}
	return strings.Join(parts, ", ")
}

// committedTextLocked describes the committed positions of partitions this
// instance holds, for the log: "p0 at 1432, p1 from the start".
func (p *Pipeline) committedTextLocked(ids []int32) string {
	parts := make([]string, 0, len(ids))
	for _, id := range ids {
		pt := p.parts[id]
		switch {
		case pt == nil:
			parts = append(parts, fmt.Sprintf("p%d unknown", id))
		case pt.committed == txsink.StartOffset:
			parts = append(parts, fmt.Sprintf("p%d from the start", id))
		default:
			parts = append(parts, fmt.Sprintf("p%d at %d", id, pt.committed))
		}
	}
	return strings.Join(parts, ", ")
}
