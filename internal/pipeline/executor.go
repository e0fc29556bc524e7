package pipeline

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The executor: it runs each step of the plan (planner.go) against the
// store and the sink, feeds the results back, and keeps the attempt's
// books (timings, the failure, CheckpointInfo). It decides nothing about
// the checkpoint's content.

// execution is one attempt being executed.
type execution struct {
	c    *Checkpointer
	p    *planner
	tx   *txsink.Txn
	info CheckpointInfo
	mark time.Time // the end of the last phase timed
	done map[string]bool
	seal time.Duration // the longest sealing of a participant
}

// attempt runs the checkpoint protocol once: the plan's steps, then (not a
// trial) prepare, decide and commit. Any failure before the decision
// aborts every branch. After the decision the checkpoint is committed even
// if delivering XA COMMIT fails (recovery rolls it forward). A trial stops
// after the writes and rolls everything back (isolate.go): it only tells
// whether the writes would succeed.
func (c *Checkpointer) attempt(ctx context.Context, s *snapshot, careful, trial bool, uncreated []lockKey) CheckpointInfo {
	// now is the checkpoint's processing time, on the ledger's clock:
	// dedup expiries, and every timestamp written. Durations are measured
	// on the host's monotonic clock (started). With the changelog it is
	// truncated to the microsecond as DATETIME(6) keeps it (MySQL 8.4
	// rounds what MariaDB truncates; the after images are the rows as
	// stored).
	started, now := time.Now(), c.cfg.Clock()
	if c.cfg.Changelog {
		now = now.Truncate(time.Microsecond)
	}
	c.seq++
	tx := c.sink.Begin(c.seq)
	// The checkpoint places its keys by the layout of its Begin, which
	// its decision checks against a move (txsink: Txn.Route).
	cfg := c.planConfig(tx, careful, trial)
	cfg.uncreated = uncreated
	p := newPlanner(cfg, s, now, c.cache)
	x := &execution{c: c, p: p, tx: tx, mark: started, done: map[string]bool{}}
	snap := p.snapshot()
	x.info = CheckpointInfo{Gtrid: x.tx.Gtrid(), Started: started, Careful: careful, Records: len(snap.records) + len(snap.dead), Bytes: snap.bytes,
		Partitions: len(snap.cuts), Cuts: snap.cuts, Phases: map[string]time.Duration{}, DeadLetters: map[string]int{}}
	return x.run(ctx, now)
}

func (c *Checkpointer) planConfig(route placement, careful, trial bool) planConfig {
	return planConfig{window: c.cfg.Window, closeAfter: c.cfg.WindowCloseAfter, skew: c.cfg.MaxEventTimeSkew, ttl: c.cfg.dedupTTL(),
		prefix: c.cfg.DeadLetterPayloadBytes, entries: c.cfg.LedgerEntries, route: route, servers: len(c.pools), careful: careful, trial: trial,
		changelog: c.cfg.Changelog, shared: !c.alone.Load(), horizon: c.cfg.versionHorizon()}
}

// run executes the steps until the decision, a failure, or the plan's end.
func (x *execution) run(ctx context.Context, now time.Time) CheckpointInfo {
	for {
		st := x.p.ready()
		if st.kind.pure() {
			x.p.advance(result{})
			x.phase(st.kind.phase()) // dedup ends with classification, aggregate with counting
			continue
		}
		var r result
		var err error
		switch st.kind {
		case stepSkip:
			x.info.skipped = true
			return x.info
		case stepTrialDone:
			return x.fail(ctx, "trial", nil)
		case stepUncounted:
			return x.fail(ctx, st.kind.phase(), &uncountedError{keys: st.uncounted})
		case stepDecide:
			return x.decide(ctx, st.decision, now)
		case stepEventTime:
			r.eventTime, err = x.c.sink.EventTime(ctx)
		case stepGenerations:
			r.generations, err = x.c.sink.KeyGenerations(ctx)
			if err == nil {
				s := r.generations
				x.c.generations.Store(&s)
			}
		case stepRegister:
			err = x.c.sink.RegisterKeyLifetime(ctx, st.lifetime)
		case stepClaim:
			r.contested, r.earlier, err = x.claim(ctx, st.claim, st.claims)
		case stepLookup:
			r.found, err = x.lookup(ctx, st.claim.Write, st.lookups)
		case stepSeed:
			r.seeded, err = x.seed(ctx, st.seeds)
		case stepWrite:
			if x.c.beforeWrite != nil {
				x.c.beforeWrite()
			}
			r.sealed, err = x.write(ctx, st, now)
		}
		if err != nil {
			if st.kind == stepWrite {
				err = writeFailure(err, x.c.sink.Code(err), x.p.cfg.careful)
			}
			return x.fail(ctx, st.kind.phase(), err)
		}
		x.p.advance(r)
		if st.kind == stepEventTime && x.p.ready().kind != stepSkip {
			// Windows closed by the last checkpoint are this one's to
			// seal: the next one is due only if this one leaves some.
			x.c.eventTimeDue.Store(false)
		}
		if st.kind == stepWrite {
			x.phase("write")
			if !st.seal.to.IsZero() {
				x.info.Phases["seal"] = x.seal // part of write
			}
		}
	}
}

// phase ends the named phase of CheckpointInfo.Phases (once).
func (x *execution) phase(name string) {
	if x.done[name] {
		return
	}
	x.done[name] = true
	t := time.Now()
	x.info.Phases[name] = t.Sub(x.mark)
	x.mark = t
}

// books copies what the plan counted into the info (the rows sealed once
// the branches are prepared: decide).
func (x *execution) books() {
	t := &x.p.tally
	x.info.Duplicates, x.info.Counted, x.info.Late = t.duplicates, t.counted, t.late
	x.info.Careful = x.info.Careful || t.careful
	for reason, n := range t.deadLetters {
		x.info.DeadLetters[reason] = n
	}
}

// fail aborts the attempt: every branch rolls back.
func (x *execution) fail(ctx context.Context, phase string, err error) CheckpointInfo {
	x.books()
	x.info.Err, x.info.FailedPhase = err, phase
	if err != nil {
		x.info.Offsets = offsetRanges(x.p.snapshot())
	}
	if aerr := x.tx.Abort(ctx); aerr != nil {
		x.c.log.Warn("abort incomplete; recovery resolves the rest", "checkpoint", x.info.Gtrid, "err", aerr)
	}
	x.info.Duration = time.Since(x.info.Started)
	return x.info
}

// claim claims each participant's keys in its branch: each inserts its
// keys into the generation written, then reads them under shared locks in
// each generation read, in that order (the order is what makes two claims
// of one key under different generations see each other: package dedup).
//
// Beside other instances, the participants claim one after the other in
// participant order, and each participant's keys in key order (the store
// sorts them): one lock order over the dedup keys for every instance of
// the ledger. Claimed in parallel, two instances with two contested keys
// (an event repeated on two partitions) on two participants could each
// take one and wait for the other's: the branches are separate
// transactions, so no server sees the cycle, and it ends only at
// innodb_lock_wait_timeout with an aborted checkpoint on both sides (issue
// 21: three instances on one backlog). In order, an instance waits only
// for a key after every key it holds, so the checkpoint holding that key
// is claiming later keys or past its claims: the wait ends with its
// commit. An instance that holds every partition (Checkpointer.alone)
// meets no other claims and claims in parallel: in order, a single
// instance ran at 0.80 of its rate (docs/performance.md).
//
// Ordered, a claim's wait is in no cycle (every instance writes its
// newest generation first, then reads the older ones: the order is by
// participant, then generation, newest first, then id; only an instance
// whose generations are a rotation behind may differ, for one attempt,
// which its decision then refuses), so it ends with the holder's
// decision. That can be longer away than
// MYSQL_LOCK_WAIT_TIMEOUT, meant to end the cycles nobody sees: the holder
// may itself wait for a third instance's checkpoint, one checkpoint per
// instance ahead: a convoy of three instances on 2 cores outlasts a 5 s
// lock wait. Beside other instances the claims therefore wait up to the
// attempt's own deadline (CHECKPOINT_TIMEOUT), and the branch's bound is
// set back before its later statements.
func (x *execution) claim(ctx context.Context, c dedup.Claim, claims [][]driver.DedupKey) ([][]driver.Contested, []driver.DedupKey, error) {
	contested := make([][]driver.Contested, len(claims))
	earlier := make([][]driver.DedupKey, len(claims))
	rounds := [][]int{nonEmpty(claims)}
	var wait time.Duration
	if x.p.cfg.shared {
		wait = x.c.cfg.CheckpointTimeout
		if d, ok := ctx.Deadline(); ok {
			wait = time.Until(d)
		}
		rounds = nil
		for _, p := range nonEmpty(claims) {
			rounds = append(rounds, []int{p})
		}
	}
	for _, ps := range rounds {
		err := x.tx.Each(ctx, ps, func(ctx context.Context, b *txsink.Branch) error {
			keys := claims[b.Participant]
			ids := make([]string, len(keys))
			for i, k := range keys {
				ids[i] = k.ID
			}
			err := b.Write(func(st driver.StoreTx) (err error) {
				if wait > 0 {
					if err := st.SetLockWait(ctx, wait); err != nil {
						return err
					}
				}
				contested[b.Participant], err = st.ClaimKeys(ctx, c.Write, keys)
				return err
			})
			for _, g := range c.Read {
				if err != nil {
					break
				}
				err = b.Read(func(st driver.StoreTx) error {
					found, err := st.LockKeys(ctx, g, ids)
					earlier[b.Participant] = append(earlier[b.Participant], found...)
					return err
				})
			}
			if err == nil && wait > 0 {
				err = b.Read(func(st driver.StoreTx) error { return st.SetLockWait(ctx, 0) })
			}
			return err
		})
		if err != nil {
			return contested, slices.Concat(earlier...), err
		}
	}
	return contested, slices.Concat(earlier...), nil
}

// lookup reads the contested keys of generation g on their servers'
// pools, one participant after the other.
func (x *execution) lookup(ctx context.Context, g driver.Generation, ls []lookup) ([]driver.DedupKey, error) {
	var found []driver.DedupKey
	for _, l := range ls {
		ks, err := x.c.pools[l.server].LookupKeys(ctx, g, l.ids)
		if err != nil {
			return nil, err
		}
		found = append(found, ks...)
	}
	return found, nil
}

// seed reads the risky keys' stored sums under row locks, each participant
// in its branch: in parallel when alone, beside other instances one
// participant after the other, in participant order, as the claims (and
// for the same reason: two branches are two transactions, and a cycle
// through them is one no server sees). With the keys lockOrder widened,
// every lock an instance's seed takes is then after every one it holds,
// in one order over every participant: each table's keys are locked and
// read with the missing ones created (which locks them all, stored or
// not, in key order), but for the keys an earlier attempt created for
// nothing, only read (out of order if missing: lockOrder).
func (x *execution) seed(ctx context.Context, seeds []seedKeys) ([]seededSums, error) {
	var participants []int
	for i := range seeds {
		if !seeds[i].empty() {
			participants = append(participants, i)
		}
	}
	rounds := [][]int{participants}
	if x.p.cfg.shared {
		rounds = nil
		for _, p := range participants {
			rounds = append(rounds, []int{p})
		}
	}
	out := make([]seededSums, len(seeds))
	for _, ps := range rounds {
		err := x.tx.Each(ctx, ps, func(ctx context.Context, b *txsink.Branch) error {
			k, s := &seeds[b.Participant], &out[b.Participant]
			// A branch that created rows and writes none (an attempt
			// aborted before its writes) rolls them back at Prepare.
			return b.Read(func(st driver.StoreTx) (err error) {
				var rows []driver.BalanceRow
				var wins []driver.WindowRow
				var adjs []driver.AdjustmentRow
				if len(k.create.balances) > 0 {
					if s.balances, s.created.balances, err = st.CreateBalances(ctx, k.create.balances); err != nil {
						return err
					}
				}
				if len(k.balances) > 0 {
					if rows, err = st.LockBalances(ctx, k.balances); err != nil {
						return err
					}
					s.balances = append(s.balances, rows...)
				}
				if len(k.create.windows) > 0 {
					if s.windows, s.created.windows, err = st.CreateWindows(ctx, k.create.windows); err != nil {
						return err
					}
				}
				if len(k.windows) > 0 {
					if wins, err = st.LockWindows(ctx, k.windows); err != nil {
						return err
					}
					s.windows = append(s.windows, wins...)
				}
				if len(k.create.adjusts) > 0 {
					if s.adjusts, s.created.adjusts, err = st.CreateAdjustments(ctx, k.create.adjusts); err != nil {
						return err
					}
				}
				if len(k.adjusts) > 0 {
					adjs, err = st.LockAdjustments(ctx, k.adjusts)
					s.adjusts = append(s.adjusts, adjs...)
				}
				return err
			})
		})
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// turns makes the writers from participant from on write their sums in
// turn, in participant order: a writer's turn begins once the previous
// one's sums are written (or it failed).
type turns struct {
	wait, done []chan struct{} // by participant; nil: not in turn
}

func newTurns(n, from int, writers []int) turns {
	t := turns{wait: make([]chan struct{}, n), done: make([]chan struct{}, n)}
	var prev chan struct{}
	for _, p := range writers {
		if p < from {
			continue
		}
		t.wait[p], t.done[p] = prev, make(chan struct{})
		prev = t.done[p]
	}
	return t
}

// write runs every participant's share in its branch, in parallel, but
// for the sums of the participants from st.turnFrom on, which take their
// turns (beside other instances: their rows are locked in one order,
// lockOrder); the sealing comes after the branch's own writes (they are
// all in windows the frontier keeps open, never in the ones sealed here),
// and with the changelog the branch's changes go to the outbox last, in
// the same branch.
func (x *execution) write(ctx context.Context, st step, now time.Time) ([]sealResult, error) {
	sealed := make([]sealResult, len(st.works))
	took := make([]time.Duration, len(st.works))
	changes := make([]int, len(st.works))
	var writers []int
	for i := range st.works {
		if !st.works[i].empty() {
			writers = append(writers, i)
		}
	}
	turns := newTurns(len(st.works), st.turnFrom, writers)
	if !st.seal.to.IsZero() {
		// Sealing writes every row of the closed windows on each
		// server, placed by no key of the checkpoint's.
		x.tx.TouchAll()
	}
	err := x.tx.Each(ctx, writers, func(ctx context.Context, b *txsink.Branch) error {
		w := &st.works[b.Participant]
		kept, err := x.writeRows(ctx, b, w, turns.wait[b.Participant], turns.done[b.Participant], now)
		if err != nil {
			return err
		}
		s := &sealed[b.Participant]
		if w.seal {
			t := time.Now()
			err := b.Read(func(tx driver.StoreTx) (err error) {
				s.rows, s.done, err = tx.SealWindows(ctx, st.seal.from, st.seal.to, st.seal.max, now)
				return err
			})
			if len(s.rows) > 0 {
				b.Wrote()
			}
			took[b.Participant] = time.Since(t)
			if err != nil {
				return err
			}
		}
		if !x.p.cfg.changelog {
			return nil
		}
		changes[b.Participant], err = x.writeOutbox(ctx, b, w, kept, s.rows, now)
		return err
	})
	for _, n := range changes {
		x.info.Changes += n
	}
	x.seal = slices.Max(took)
	return sealed, err
}

// writeRows writes one participant's rows, each table only when it has
// rows: a branch counts as written (and is prepared) only once a
// statement changed something. Adding a table adds a line here and its
// driver method. In turn (done not nil), its sums (balances, windows,
// adjustments) are written once wait is closed (nil: at once), and done
// is closed after them, or when it fails. It returns the keys of the
// ledger entries that were stored already (a replay of the topic) and
// were kept as they were.
func (x *execution) writeRows(ctx context.Context, b *txsink.Branch, w *work, wait, done chan struct{}, now time.Time) (kept []driver.EntryKey, err error) {
	gtrid, topic, g := x.info.Gtrid, x.c.cfg.Topic, x.p.generation()
	turnOver := func() {
		if done != nil {
			close(done)
			done = nil
		}
	}
	defer turnOver()
	inTurn := false
	for _, step := range []struct {
		n    int
		sums bool // in turn
		fn   func(st driver.StoreTx) error
	}{
		{len(w.unclaim), false, func(st driver.StoreTx) error { return st.UnclaimKeys(ctx, g, w.unclaim) }},
		{len(w.replace), false, func(st driver.StoreTx) error { return st.ReplaceKeys(ctx, g, w.replace, now) }},
		{len(w.update), false, func(st driver.StoreTx) error { return st.UpdateKeys(ctx, g, w.update) }},
		{len(w.balances), true, func(st driver.StoreTx) error { return st.WriteBalances(ctx, w.balances, now) }},
		{len(w.windows), true, func(st driver.StoreTx) error { return st.WriteWindows(ctx, w.windows, now) }},
		{len(w.adjusts), true, func(st driver.StoreTx) error { return st.WriteAdjustments(ctx, w.adjusts, gtrid, now) }},
		{len(w.entries), false, func(st driver.StoreTx) (err error) {
			kept, err = st.WriteEntries(ctx, topic, gtrid, w.entries, now)
			return err
		}},
		{len(w.dead), false, func(st driver.StoreTx) error { return st.WriteDeadLetters(ctx, topic, gtrid, w.dead, now) }},
	} {
		if step.sums && !inTurn && done != nil {
			inTurn = true
			if wait != nil {
				select {
				case <-wait:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
		}
		if !step.sums && inTurn {
			turnOver()
			inTurn = false
		}
		if step.n == 0 {
			continue
		}
		if err := b.Write(step.fn); err != nil {
			return nil, err
		}
	}
	return kept, nil
}

// writeOutbox writes the participant's changes (its rows', and its
// sealing's) to the outbox, packed into rows within its server's budget.
// It returns how many changes it wrote.
func (x *execution) writeOutbox(ctx context.Context, b *txsink.Branch, w *work, kept []driver.EntryKey, sealed []driver.WindowRow, now time.Time) (int, error) {
	changes := append(rowChanges(w, &x.p.images, kept, x.info.Gtrid, x.c.cfg.Topic, now), sealChanges(sealed, now)...)
	if len(changes) == 0 {
		return 0, nil
	}
	pk := pack(changes, b.MaxStatementBytes())
	return len(changes), b.Write(func(st driver.StoreTx) error {
		return st.WriteOutbox(ctx, x.info.Gtrid, b.Participant, pk.Blobs, pk.Counts, now)
	})
}

// decide runs the two-phase commit of the planned decision, then updates
// the cache and the stats.
func (x *execution) decide(ctx context.Context, d decision, now time.Time) CheckpointInfo {
	x.books()
	if err := ctx.Err(); err != nil {
		return x.fail(ctx, "prepare", fmt.Errorf("checkpoint timeout before prepare: %w", err))
	}
	if err := x.tx.Prepare(ctx); err != nil {
		return x.fail(ctx, "prepare", err)
	}
	x.phase("prepare")
	x.info.Sealed = x.p.tally.sealed
	if err := ctx.Err(); err != nil {
		// Past the deadline a recoverer may abort these branches: do not
		// race it.
		return x.fail(ctx, "decide", fmt.Errorf("checkpoint timeout before decision: %w", err))
	}
	if err := x.tx.Decide(ctx, d.cuts, d.frontier, d.keys); err != nil {
		return x.fail(ctx, "decide", err)
	}
	x.phase("decide")
	x.info.Decided, x.info.CommitSeq = true, x.tx.CommitSeq()
	if err := x.tx.Commit(ctx); err != nil {
		x.info.Err, x.info.FailedPhase = err, "commit"
		x.c.log.Error("checkpoint decided but not fully committed; recovery will roll it forward", "checkpoint", x.info.Gtrid, "err", err)
	}
	x.phase("commit")
	x.info.Duration = time.Since(x.info.Started)
	x.committed(now)
	return x.info
}

// committed applies a decided checkpoint to the cache, the stats and the
// event-time tick.
func (x *execution) committed(now time.Time) {
	c := x.c
	for _, in := range x.p.remember() {
		c.cache.Add(in.ID, dedup.Seen{Fingerprint: in.Fingerprint, ExpiresAt: in.ExpiresAt, Versioned: in.Versioned}, now)
	}
	c.cacheLen.Store(int64(c.cache.Len()))
	c.stats.Counted.Add(int64(x.info.Counted))
	c.stats.Duplicates.Add(int64(x.info.Duplicates))
	c.stats.DeadLetters.Add(int64(len(x.p.o.dead)))
	c.stats.Checkpoints.Add(1)
	c.stats.LastCheckpoint.Store(time.Now().UnixNano())
	if x.p.eventTimeDue() {
		c.eventTimeDue.Store(true)
	}
	if c.cfg.OnCheckpoint != nil {
		recs := x.p.snapshot().records
		x.info.RecordTimes = make([]time.Time, len(recs))
		for i := range recs {
			x.info.RecordTimes[i] = recs[i].ts
		}
	}
}
