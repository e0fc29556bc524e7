package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Checkpointer commits snapshots: the checkpoint coordinator. It runs the
// plan (plan.go) over the sink's participants and the two-phase commit,
// retries where a retry can succeed, and isolates records the database
// refuses (isolate.go). It owns the dedup cache and the checkpoint
// sequence: its checkpoints run one at a time.
type Checkpointer struct {
	cfg   Config
	log   *slog.Logger
	sink  *txsink.Sink
	pools []driver.Store
	stats *Stats

	mu       sync.Mutex // held by the checkpoint running; guards cache and seq
	cache    *dedup.Cache
	seq      uint64
	cacheLen atomic.Int64 // cache.Len() after the last checkpoint, for metrics
	// eventTimeDue: the last committed checkpoint closed windows that are
	// not sealed yet (see EventTimeDue).
	eventTimeDue atomic.Bool
}

// NewCheckpointer builds a checkpoint coordinator over sink and the ledger
// stores of the sink's servers (in the same order: mysqldriver's
// Driver.Stores, or memdriver servers). cfg is validated as by New;
// cfg.KafkaOpts is not used. The pipeline builds its own; benchmarks and
// tests use one alone to commit records that did not come from Kafka.
func NewCheckpointer(cfg Config, sink *txsink.Sink, pools []driver.Store) (*Checkpointer, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	return newCheckpointer(cfg, sink, pools, &Stats{}), nil
}

func newCheckpointer(cfg Config, sink *txsink.Sink, pools []driver.Store, stats *Stats) *Checkpointer {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	return &Checkpointer{cfg: cfg, log: cfg.Logger, sink: sink, pools: pools, stats: stats, cache: dedup.NewCache(cfg.DedupCacheKeys)}
}

// Record is one decoded event and where it came from, for Checkpoint.
type Record struct {
	Event      event.Event
	Partition  int32
	Offset     int64
	Timestamp  time.Time
	Key, Value []byte
}

// Checkpoint commits recs as one checkpoint cut at cuts (the partitions
// must have been claimed on the sink at the epochs the cuts name), with
// the retries and isolation of the pipeline's checkpoints. It returns
// whether the commit decision was taken and the error, if any.
func (c *Checkpointer) Checkpoint(ctx context.Context, recs []Record, cuts []txsink.PartitionCut) (bool, error) {
	s := &snapshot{cuts: cuts, records: make([]record, len(recs))}
	for i, r := range recs {
		s.records[i] = record{ev: r.Event, partition: r.Partition, offset: r.Offset, ts: r.Timestamp, key: r.Key, value: r.Value}
	}
	out := c.run(ctx, s)
	return out.decided, out.err
}

// Stats are the totals of the checkpoints committed.
func (c *Checkpointer) Stats() *Stats { return c.stats }

// CacheKeys is the number of event ids in the dedup cache after the last
// checkpoint.
func (c *Checkpointer) CacheKeys() int { return int(c.cacheLen.Load()) }

// maxFrontierRetries bounds the immediate retries of a checkpoint whose
// decision found windows closed under it; beyond, it is replayed.
const maxFrontierRetries = 3

// maxSealRows bounds the window rows one checkpoint seals on one server;
// the next checkpoint goes on.
const maxSealRows = 10 * stmt.MaxRows

// errNeedCareful asks for the checkpoint to be retried in careful mode: the
// server refused a sum as out of range, and only per-event checks against
// the stored values can tell which events to refuse.
var errNeedCareful = errors.New("amount sum out of range")

// run commits one snapshot. Each attempt is bounded by CheckpointTimeout.
// An attempt that fails before its decision is aborted; then:
//
//   - another checkpoint closed a window this one wrote to as open
//     (txsink.ErrFrontierMoved): retried at once, on the new frontier;
//   - the server refused a sum (Overflow): retried once in careful mode,
//     every key seeded, each event checked against the stored values;
//   - a statement exceeded the server's packet limit (TooLarge): the limits
//     are reread and the snapshot retried once, cut to the new budget;
//   - the server refused the data itself (Data), or a row exceeded its
//     statement's budget (a bug, logged as one): retried once (one failure
//     could be a fluke); failing again, the records responsible are
//     isolated and become rejected_by_database dead letters, and the rest
//     is retried; if no record is responsible (isolate.go), the checkpoint
//     fails and is replayed;
//   - anything else (a lock wait, a lost connection, a fenced partition):
//     the checkpoint fails, and the source replays it from MySQL.
func (c *Checkpointer) run(ctx context.Context, s *snapshot) outcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	careful, refreshed, dataRetried, isolated := false, false, false, false
	moved := 0
	for {
		actx, cancel := context.WithTimeout(ctx, c.cfg.CheckpointTimeout)
		info := c.attempt(actx, s, careful, false)
		cancel()
		if info.skipped {
			return outcome{decided: true}
		}
		if info.Err != nil && !info.Decided && ctx.Err() == nil {
			data := c.refusedForData(info.Err)
			if oversized(info.Err) {
				c.log.Error("bug: a row exceeded the statement budget its size was computed for; the record responsible will be isolated, please report",
					"checkpoint", info.Gtrid, "offsets", offsetRanges(s), "err", info.Err)
			}
			switch code := c.sink.Code(info.Err); {
			case errors.Is(info.Err, txsink.ErrFrontierMoved) && moved < maxFrontierRetries:
				// Another checkpoint closed a window this one wrote to:
				// built again on the new frontier, its events of that
				// window become late.
				moved++
				info.Retrying = true
			case code == driver.Overflow && !careful:
				careful, info.Retrying = true, true
			case code == driver.TooLarge && !refreshed:
				refreshed, info.Retrying = true, true
				for _, p := range c.pools {
					if err := p.RefreshLimits(ctx); err != nil {
						c.log.Warn("cannot reread the server's max_allowed_packet", "err", err)
					}
				}
			case data && !dataRetried:
				dataRetried, info.Retrying = true, true
			case data && !isolated:
				isolated = true
				next, n, result := c.isolate(ctx, s, careful, info.Err)
				info.Isolation = result
				c.report(info)
				if n == 0 {
					return outcome{decided: false, err: info.Err}
				}
				s = next
				continue
			}
		}
		c.report(info)
		if !info.Retrying {
			return outcome{decided: info.Decided, err: info.Err}
		}
	}
}

// attempt runs the checkpoint protocol once:
//
//  0. event time: records later than the processing time plus
//     MaxEventTimeSkew become dead letters (admit); with closing windows,
//     the frontier and the partitions'
//     watermarks as committed; each record is judged late or not, and the
//     frontier to raise and the windows to seal are planned (eventtime.go);
//  1. dedup: ids the cache does not know are claimed on their participants
//     (a branch each, in parallel); the ids of claim statements that met a
//     stored key are looked up; every record is classified in arrival
//     order;
//  2. aggregate the new events per account and per window, checking 64-bit
//     overflow per event (keys whose overflow the server could miss start
//     from their stored values, read under row locks; see aggregate);
//  3. write dedup keys, aggregates, ledger entries and dead letters, each
//     participant its share, in parallel, and seal the windows to seal;
//  4. prepare every branch that wrote, decide (fenced, with the frontier
//     checked and raised), commit.
//
// Any failure before the decision aborts every branch. After the decision
// the checkpoint is committed even if delivering XA COMMIT fails (recovery
// rolls it forward). A trial stops after step 3 and rolls everything back
// (isolate.go): it only tells whether the writes would succeed.
func (c *Checkpointer) attempt(ctx context.Context, s *snapshot, careful, trial bool) (info CheckpointInfo) {
	// now is the checkpoint's processing time, on the ledger's clock:
	// dedup expiries, and every timestamp written. Durations are measured
	// on the host's monotonic clock (started).
	started, now := time.Now(), c.cfg.Clock()
	ttl := c.cfg.dedupTTL()
	prefix := c.cfg.DeadLetterPayloadBytes
	s = admit(s, now, c.cfg.MaxEventTimeSkew, prefix)
	c.seq++
	tx := c.sink.Begin(c.seq)
	info = CheckpointInfo{Gtrid: tx.Gtrid(), Started: started, Careful: careful, Records: len(s.records) + len(s.dead), Bytes: s.bytes,
		Partitions: len(s.cuts), Cuts: s.cuts, Phases: map[string]time.Duration{}, DeadLetters: map[string]int{}}
	mark := started
	phase := func(name string) {
		t := time.Now()
		info.Phases[name] = t.Sub(mark)
		mark = t
	}
	fail := func(phaseName string, err error) CheckpointInfo {
		info.Err, info.FailedPhase = err, phaseName
		if err != nil {
			info.Offsets = offsetRanges(s)
		}
		if aerr := tx.Abort(ctx); aerr != nil {
			c.log.Warn("abort incomplete; recovery resolves the rest", "checkpoint", info.Gtrid, "err", aerr)
		}
		info.Duration = time.Since(started)
		return info
	}

	// 0. Event time.
	var et eventTimePlan
	if c.cfg.WindowCloseAfter > 0 {
		read, err := c.sink.EventTime(ctx)
		if err != nil {
			return fail("eventtime", err)
		}
		et = planEventTime(c.cfg.Window, c.cfg.WindowCloseAfter, read, s.records, s.cuts)
		if len(s.records)+len(s.dead)+len(s.cuts) == 0 && et.noWork() {
			info.skipped = true
			return info
		}
		c.eventTimeDue.Store(false)
	}

	// 1. Dedup. Only the ids of claim statements that met a stored row are
	// looked up, on a pooled connection outside the branches, which sees
	// the committed rows and not this checkpoint's own inserts.
	cp := planClaims(s.records, c.cache, now, ttl, c.sink)
	suspects := make([][]string, c.sink.Participants())
	err := tx.Each(ctx, nonEmpty(cp.claims), func(ctx context.Context, b *txsink.Branch) error {
		return b.Write(func(st driver.StoreTx) (err error) {
			suspects[b.Participant], err = st.ClaimKeys(ctx, toDedupKeys(cp.claims[b.Participant]))
			return err
		})
	})
	if err != nil {
		return fail("dedup", err)
	}
	for i, ids := range suspects {
		if len(ids) > 0 {
			found, err := c.pools[c.sink.ServerOf(i)].LookupKeys(ctx, ids)
			if err != nil {
				return fail("dedup", err)
			}
			for _, k := range found {
				cp.known[k.ID] = dedup.Seen{Fingerprint: k.Fingerprint, ExpiresAt: k.ExpiresAt}
			}
		}
	}
	o := classify(s.records, s.dead, cp, now, ttl, prefix)
	info.Duplicates = o.duplicates
	phase("dedup")

	// 2. Aggregate.
	agg := newAggregate(c.cfg.Window)
	rb, rw, ra := agg.riskyKeys(o.fresh, careful)
	if len(rb)+len(rw)+len(ra) > 0 {
		info.Careful = true
		if err := c.seed(ctx, tx, agg, rb, rw, ra); err != nil {
			return fail("aggregate", err)
		}
	}
	o.count(agg, prefix, c.cfg.LedgerEntries)
	info.Counted, info.Late = o.counted, o.late
	phase("aggregate")

	// 3. Write, every participant its share; the first participant of each
	// server seals the closed windows' rows there.
	works := planWrites(&o, agg, c.cfg.Window, c.sink)
	if !et.sealTo.IsZero() {
		for i := range c.pools {
			works[c.sealer(i)].seal = true
		}
	}
	openFrom := earliestOpen(works)
	sealed := make([]int, len(works))
	sealDone := make([]bool, len(works))
	sealTook := make([]time.Duration, len(works))
	var writers []int
	for i := range works {
		if !works[i].empty() {
			writers = append(writers, i)
		}
	}
	for _, d := range o.dead {
		info.DeadLetters[d.Reason]++
	}
	expires := now.Add(ttl)
	err = tx.Each(ctx, writers, func(ctx context.Context, b *txsink.Branch) error {
		w := &works[b.Participant]
		// Each write only when it has rows: a branch counts as written
		// (and is prepared) only once a statement changed something.
		for _, step := range []struct {
			n  int
			fn func(st driver.StoreTx) error
		}{
			{len(w.unclaim), func(st driver.StoreTx) error { return st.UnclaimKeys(ctx, w.unclaim) }},
			{len(w.replace), func(st driver.StoreTx) error { return st.ReplaceKeys(ctx, w.replace, now) }},
			{len(w.journal), func(st driver.StoreTx) error { return st.JournalKeys(ctx, expires, w.journal) }},
			{len(w.balances), func(st driver.StoreTx) error { return st.WriteBalances(ctx, w.balances, now) }},
			{len(w.windows), func(st driver.StoreTx) error { return st.WriteWindows(ctx, w.windows, now) }},
			{len(w.adjusts), func(st driver.StoreTx) error { return st.WriteAdjustments(ctx, w.adjusts, info.Gtrid, now) }},
			{len(w.entries), func(st driver.StoreTx) error { return st.WriteEntries(ctx, c.cfg.Topic, info.Gtrid, w.entries, now) }},
			{len(w.dead), func(st driver.StoreTx) error { return st.WriteDeadLetters(ctx, c.cfg.Topic, info.Gtrid, w.dead, now) }},
		} {
			if step.n == 0 {
				continue
			}
			if err := b.Write(step.fn); err != nil {
				return err
			}
		}
		if w.seal {
			// After this branch's own writes; they are all in windows
			// the frontier keeps open, never in the ones sealed here.
			t := time.Now()
			err := b.Read(func(st driver.StoreTx) (err error) {
				sealed[b.Participant], sealDone[b.Participant], err = st.SealWindows(ctx, et.sealFrom, et.sealTo, maxSealRows, now)
				return err
			})
			if sealed[b.Participant] > 0 {
				b.Wrote()
			}
			sealTook[b.Participant] = time.Since(t)
			return err
		}
		return nil
	})
	if err != nil {
		if c.sink.Code(err) == driver.Overflow && !careful {
			err = fmt.Errorf("%w: %w", errNeedCareful, err)
		}
		return fail("write", err)
	}
	phase("write")
	if !et.sealTo.IsZero() {
		info.Phases["seal"] = slices.Max(sealTook) // part of write
	}
	if trial {
		return fail("trial", nil)
	}

	// 4. Two-phase commit.
	if err := ctx.Err(); err != nil {
		return fail("prepare", fmt.Errorf("checkpoint timeout before prepare: %w", err))
	}
	if err := tx.Prepare(ctx); err != nil {
		return fail("prepare", err)
	}
	phase("prepare")
	if err := ctx.Err(); err != nil {
		// Past the deadline a recoverer may abort these branches: do not
		// race it.
		return fail("decide", fmt.Errorf("checkpoint timeout before decision: %w", err))
	}
	allSealed := !et.sealTo.IsZero()
	for i := range works {
		info.Sealed += sealed[i]
		if works[i].seal && !sealDone[i] {
			allSealed = false
		}
	}
	if err := tx.Decide(ctx, s.cuts, et.change(openFrom, allSealed)); err != nil {
		return fail("decide", err)
	}
	phase("decide")
	info.Decided, info.CommitSeq = true, tx.CommitSeq()
	if err := tx.Commit(ctx); err != nil {
		info.Err, info.FailedPhase = err, "commit"
		c.log.Error("checkpoint decided but not fully committed; recovery will roll it forward", "checkpoint", info.Gtrid, "err", err)
	}
	phase("commit")
	info.Duration = time.Since(started)

	for _, in := range o.inserts {
		if !o.overflowed[in.ID] {
			c.cache.Add(in.ID, dedup.Seen{Fingerprint: in.Fingerprint, ExpiresAt: in.ExpiresAt}, now)
		}
	}
	c.cacheLen.Store(int64(c.cache.Len()))
	c.stats.Counted.Add(int64(info.Counted))
	c.stats.Duplicates.Add(int64(info.Duplicates))
	c.stats.DeadLetters.Add(int64(len(o.dead)))
	c.stats.Checkpoints.Add(1)
	c.stats.LastCheckpoint.Store(time.Now().UnixNano())
	if et.enabled && (et.raise.After(et.read.Closed) || !et.sealTo.IsZero() && !allSealed) {
		// Windows closed by this checkpoint are to be sealed by the next
		// one, which is due even if no records come.
		c.eventTimeDue.Store(true)
	}
	if c.cfg.OnCheckpoint != nil {
		info.RecordTimes = make([]time.Time, len(s.records))
		for i := range s.records {
			info.RecordTimes[i] = s.records[i].ts
		}
	}
	return info
}

// seed reads, under row locks, the stored balances and window sums of the
// given keys, each from the participant that owns the account.
func (c *Checkpointer) seed(ctx context.Context, tx *txsink.Txn, agg *aggregate, rb map[balanceKey]bool, rw, ra map[windowKey]bool) error {
	P := c.sink.Participants()
	bkeys := make([][]balanceKey, P)
	wkeys := [2][][]windowKey{make([][]windowKey, P), make([][]windowKey, P)} // windows, adjustments
	for k := range rb {
		at := c.sink.Route(k.account)
		bkeys[at] = append(bkeys[at], k)
	}
	for j, m := range []map[windowKey]bool{rw, ra} {
		for k := range m {
			at := c.sink.Route(k.account)
			wkeys[j][at] = append(wkeys[j][at], k)
		}
	}
	used := make([]bool, P)
	for i := range P {
		// Lock in key order, as the writes do.
		slices.SortFunc(bkeys[i], func(x, y balanceKey) int {
			return cmp.Or(strings.Compare(x.account, y.account), strings.Compare(x.currency, y.currency))
		})
		for j := range wkeys {
			slices.SortFunc(wkeys[j][i], func(x, y windowKey) int {
				return cmp.Or(strings.Compare(x.account, y.account), strings.Compare(x.currency, y.currency), cmp.Compare(x.start, y.start))
			})
		}
		used[i] = len(bkeys[i])+len(wkeys[0][i])+len(wkeys[1][i]) > 0
	}
	var participants []int
	for i, u := range used {
		if u {
			participants = append(participants, i)
		}
	}
	balances := make([]map[balanceKey]total, P)
	windows := [2][]map[windowKey]total{make([]map[windowKey]total, P), make([]map[windowKey]total, P)}
	err := tx.Each(ctx, participants, func(ctx context.Context, b *txsink.Branch) error {
		return b.Read(func(st driver.StoreTx) error {
			var err error
			if balances[b.Participant], err = lockBalances(ctx, st, bkeys[b.Participant]); err != nil {
				return err
			}
			if windows[0][b.Participant], err = lockWindows(ctx, st.LockWindows, wkeys[0][b.Participant]); err != nil {
				return err
			}
			windows[1][b.Participant], err = lockWindows(ctx, st.LockAdjustments, wkeys[1][b.Participant])
			return err
		})
	})
	if err != nil {
		return err
	}
	// A key without a stored row starts at zero, written as absolute too.
	for k := range rb {
		agg.seedBalance(k, total{})
	}
	for j, m := range []map[windowKey]bool{rw, ra} {
		for k := range m {
			agg.seedWindow(k, total{}, j == 1)
		}
	}
	for i := range P {
		for k, t := range balances[i] {
			agg.seedBalance(k, t)
		}
		for j := range windows {
			for k, t := range windows[j][i] {
				agg.seedWindow(k, t, j == 1)
			}
		}
	}
	return nil
}

// sealer is the participant that seals the closed windows' rows on server
// i: its first.
func (c *Checkpointer) sealer(server int) int {
	return server * (c.sink.Participants() / len(c.pools))
}

// EventTimeDue reports whether windows closed by the last checkpoints wait
// to be sealed (or could close), so that a checkpoint is due even without
// records.
func (c *Checkpointer) EventTimeDue() bool { return c.eventTimeDue.Load() }

// report logs an attempt and hands it to OnCheckpoint. A failure names the
// partitions and offsets it covered, so that a checkpoint that keeps
// failing on the same records can be found.
func (c *Checkpointer) report(info CheckpointInfo) {
	if info.Err != nil {
		if !info.Decided {
			c.stats.Aborts.Add(1)
		}
		lvl := c.log.Warn
		if info.Retrying {
			lvl = c.log.Info
		}
		lvl("checkpoint failed", "checkpoint", info.Gtrid, "phase", info.FailedPhase, "decided", info.Decided,
			"records", info.Records, "partitions", info.Partitions, "offsets", info.Offsets, "retrying", info.Retrying, "err", info.Err)
	} else {
		c.log.Debug("checkpoint committed", "checkpoint", info.Gtrid, "records", info.Records, "counted", info.Counted,
			"duplicates", info.Duplicates, "duration", info.Duration)
	}
	if c.cfg.OnCheckpoint != nil {
		c.cfg.OnCheckpoint(info)
	}
}

// offsetRanges names the offsets a snapshot covers, per partition:
// "p3:120-4511".
func offsetRanges(s *snapshot) string {
	lo, hi := map[int32]int64{}, map[int32]int64{}
	see := func(p int32, o int64) {
		if v, ok := lo[p]; !ok || o < v {
			lo[p] = o
		}
		if v, ok := hi[p]; !ok || o > v {
			hi[p] = o
		}
	}
	for i := range s.records {
		see(s.records[i].partition, s.records[i].offset)
	}
	for i := range s.dead {
		see(s.dead[i].Partition, s.dead[i].Offset)
	}
	parts := slices.Sorted(func(yield func(int32) bool) {
		for p := range lo {
			if !yield(p) {
				return
			}
		}
	})
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "p%d:%d-%d", p, lo[p], hi[p])
	}
	return b.String()
}
