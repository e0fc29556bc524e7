package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink"
)

// snapshot is one sealed checkpoint: the cut of every partition that moved
// and the records below the cuts.
type snapshot struct {
	cuts    []txsink.PartitionCut
	records []record
	dead    []deadLetter
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

// errNeedCareful asks for the checkpoint to be retried in careful mode: the
// server refused a sum as out of range, and only per-event checks against
// the stored values can tell which events to refuse.
var errNeedCareful = errors.New("amount sum out of range")

// runCheckpoint commits one snapshot, bounded by CheckpointTimeout. It
// retries once in careful mode (every key seeded) when the server refused a
// sum; otherwise a failure aborts it and the source replays from MySQL.
func (p *Pipeline) runCheckpoint(ctx context.Context, s *snapshot) outcome {
	p.ckptMu.Lock()
	defer p.ckptMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.CheckpointTimeout)
	defer cancel()
	careful := false
	for {
		info := p.attempt(ctx, s, careful)
		info.Retrying = errors.Is(info.Err, errNeedCareful) && !careful && ctx.Err() == nil
		p.report(info)
		if info.Retrying {
			careful = true
			continue
		}
		return outcome{decided: info.Decided, err: info.Err}
	}
}

// work is what one participant writes in a checkpoint.
type work struct {
	inserts  []dedup.Insert // expired rows to replace
	unclaim  []string       // claimed keys of events that became dead letters
	journal  []string       // every key this checkpoint keeps, for the janitor
	balances []balanceRow
	windows  []windowRow
	dead     []deadLetter
}

// attempt runs the checkpoint protocol once:
//
//  1. dedup: ids not in the cache are looked up on their participants (a
//     branch per participant, in parallel) and every record is classified
//     in arrival order;
//  2. aggregate the new events per account and per window, checking 64-bit
//     overflow per event (keys whose overflow the server could miss start
//     from their stored values, read under row locks; see aggregate);
//  3. write dedup keys, aggregates and dead letters, each participant its
//     share, in parallel;
//  4. prepare every branch that wrote, decide (fenced), commit.
//
// Any failure before the decision aborts every branch. After the decision
// the checkpoint is committed even if delivering XA COMMIT fails (recovery
// rolls it forward).
func (p *Pipeline) attempt(ctx context.Context, s *snapshot, careful bool) (info CheckpointInfo) {
	now := time.Now()
	p.seq++
	tx := p.sink.Begin(p.seq)
	info = CheckpointInfo{Gtrid: tx.Gtrid(), Started: now, Careful: careful, Records: len(s.records) + len(s.dead), Bytes: s.bytes,
		Partitions: len(s.cuts), Phases: map[string]time.Duration{}, DeadLetters: map[string]int{}}
	mark := now
	phase := func(name string) {
		t := time.Now()
		info.Phases[name] = t.Sub(mark)
		mark = t
	}
	fail := func(phaseName string, err error) CheckpointInfo {
		info.Err, info.FailedPhase = err, phaseName
		if aerr := tx.Abort(ctx); aerr != nil {
			p.log.Warn("abort incomplete; recovery resolves the rest", "checkpoint", info.Gtrid, "err", aerr)
		}
		info.Duration = time.Since(now)
		return info
	}
	P := p.sink.Participants()

	// 1. Dedup. Every id the cache does not know is claimed on its
	// participant: its key is inserted unless a row exists. Only the ids of
	// statements that met an existing row are looked up, on a pooled
	// connection outside the branches, which sees the committed rows and
	// not this checkpoint's own inserts.
	keys := make([]dedup.Key, len(s.records))
	known := map[string]dedup.Seen{}
	claims := make([][]dedup.Insert, P)
	queued := make(map[string]struct{}, len(s.records))
	expires := now.Add(p.cfg.DedupTTL)
	for i := range s.records {
		ev := &s.records[i].ev
		keys[i] = dedup.Key{ID: ev.EventID, Fingerprint: ev.Fingerprint()}
		if seen, ok := p.cache.Get(ev.EventID, now); ok {
			known[ev.EventID] = seen
			continue
		}
		if _, ok := queued[ev.EventID]; !ok {
			queued[ev.EventID] = struct{}{}
			at := p.sink.Route(ev.EventID)
			claims[at] = append(claims[at], dedup.Insert{ID: ev.EventID, Fingerprint: keys[i].Fingerprint, ExpiresAt: expires})
		}
	}
	suspects := make([][]string, P)
	err := tx.Each(ctx, nonEmpty(claims), func(ctx context.Context, b *txsink.Branch) error {
		var err error
		suspects[b.Participant], err = dedup.Claim(ctx, b, claims[b.Participant])
		return err
	})
	if err != nil {
		return fail("dedup", err)
	}
	for i, ids := range suspects {
		if len(ids) == 0 {
			continue
		}
		if err := dedup.Lookup(ctx, pool{p.sink.ServerOf(i), p.sink.MaxStatementBytes(i)}, ids, known); err != nil {
			return fail("dedup", err)
		}
	}
	verdicts, inserts := dedup.Classify(now, p.cfg.DedupTTL, keys, known)
	phase("dedup")

	// 2. Aggregate.
	agg := newAggregate(p.cfg.BillingWindow)
	dead := slices.Clone(s.dead)
	var fresh []*record
	for i, v := range verdicts {
		switch v {
		case dedup.Duplicate:
			info.Duplicates++
		case dedup.Conflict:
			dead = append(dead, p.deadLetter(&s.records[i], string(event.ReasonConflictingDuplicate),
				fmt.Sprintf("event_id %q was first seen with different content (account, amount, currency or occurred_at)", s.records[i].ev.EventID)))
		case dedup.New:
			fresh = append(fresh, &s.records[i])
		}
	}
	evs := make([]*event.Event, len(fresh))
	for i, r := range fresh {
		evs[i] = &r.ev
	}
	rb, rw := agg.riskyKeys(evs, careful)
	if len(rb)+len(rw) > 0 {
		info.Careful = true
		if err := p.seed(ctx, tx, agg, rb, rw); err != nil {
			return fail("aggregate", err)
		}
	}
	overflowed := map[string]bool{}
	for _, r := range fresh {
		if agg.add(&r.ev) {
			info.Counted++
			continue
		}
		overflowed[r.ev.EventID] = true
		dead = append(dead, p.deadLetter(r, string(event.ReasonAmountOverflow),
			fmt.Sprintf("adding amount_minor %d to account %q %s would overflow a signed 64-bit sum", r.ev.AmountMinor, r.ev.AccountID, r.ev.Currency)))
	}
	phase("aggregate")

	// 3. Write, every participant its share. Claimed keys are written
	// already; expired rows are replaced here, and the claimed keys of
	// events that became dead letters are taken back.
	works := make([]work, P)
	for _, in := range inserts {
		at := p.sink.Route(in.ID)
		switch {
		case overflowed[in.ID]:
			if !in.Replace {
				works[at].unclaim = append(works[at].unclaim, in.ID)
			}
		case in.Replace:
			works[at].inserts = append(works[at].inserts, in)
			works[at].journal = append(works[at].journal, in.ID)
		default:
			works[at].journal = append(works[at].journal, in.ID)
		}
	}
	for _, r := range agg.balanceRows() {
		at := p.sink.Route(r.account)
		works[at].balances = append(works[at].balances, r)
	}
	for _, r := range agg.windowRows() {
		at := p.sink.Route(r.account)
		works[at].windows = append(works[at].windows, r)
	}
	for _, d := range dead {
		at := int(d.partition) % P
		works[at].dead = append(works[at].dead, d)
		info.DeadLetters[d.reason]++
	}
	var writers []int
	for i, w := range works {
		if len(w.journal)+len(w.unclaim)+len(w.balances)+len(w.windows)+len(w.dead) > 0 {
			writers = append(writers, i)
		}
	}
	err = tx.Each(ctx, writers, func(ctx context.Context, b *txsink.Branch) error {
		w := &works[b.Participant]
		if err := dedup.Unclaim(ctx, b, w.unclaim); err != nil {
			return err
		}
		if err := dedup.Store(ctx, b, w.inserts, now); err != nil {
			return err
		}
		if err := dedup.Journal(ctx, b, expires, w.journal); err != nil {
			return err
		}
		if err := writeBalances(ctx, b, w.balances, now); err != nil {
			return err
		}
		if err := writeWindows(ctx, b, w.windows, now); err != nil {
			return err
		}
		return writeDeadLetters(ctx, b, p.cfg.Topic, info.Gtrid, w.dead, now)
	})
	if err != nil {
		if txsink.IsOverflow(err) && !careful {
			err = fmt.Errorf("%w: %w", errNeedCareful, err)
		}
		return fail("write", err)
	}
	phase("write")

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
	if err := tx.Decide(ctx, s.cuts); err != nil {
		return fail("decide", err)
	}
	phase("decide")
	info.Decided = true
	if err := tx.Commit(ctx); err != nil {
		info.Err, info.FailedPhase = err, "commit"
		p.log.Error("checkpoint decided but not fully committed; recovery will roll it forward", "checkpoint", info.Gtrid, "err", err)
	}
	phase("commit")
	info.Duration = time.Since(now)

	for _, in := range inserts {
		if !overflowed[in.ID] {
			p.cache.Add(in.ID, dedup.Seen{Fingerprint: in.Fingerprint, ExpiresAt: in.ExpiresAt}, now)
		}
	}
	p.cacheLen.Store(int64(p.cache.Len()))
	p.stats.Counted.Add(int64(info.Counted))
	p.stats.Duplicates.Add(int64(info.Duplicates))
	p.stats.DeadLetters.Add(int64(len(dead)))
	p.stats.Checkpoints.Add(1)
	p.stats.LastCheckpoint.Store(time.Now().UnixNano())
	if p.cfg.OnCheckpoint != nil {
		info.RecordTimes = make([]time.Time, len(s.records))
		for i := range s.records {
			info.RecordTimes[i] = s.records[i].ts
		}
	}
	return info
}

// seed reads, under row locks, the stored balances and window sums of the
// given keys, each from the participant that owns the account.
func (p *Pipeline) seed(ctx context.Context, tx *txsink.Txn, agg *aggregate, rb map[balanceKey]bool, rw map[windowKey]bool) error {
	P := p.sink.Participants()
	bkeys := make([][]balanceKey, P)
	wkeys := make([][]windowKey, P)
	for k := range rb {
		at := p.sink.Route(k.account)
		bkeys[at] = append(bkeys[at], k)
	}
	for k := range rw {
		at := p.sink.Route(k.account)
		wkeys[at] = append(wkeys[at], k)
	}
	for i := range P {
		// Lock in key order, as the writes do.
		slices.SortFunc(bkeys[i], func(x, y balanceKey) int {
			return cmp.Or(strings.Compare(x.account, y.account), strings.Compare(x.currency, y.currency))
		})
		slices.SortFunc(wkeys[i], func(x, y windowKey) int {
			return cmp.Or(strings.Compare(x.account, y.account), strings.Compare(x.currency, y.currency), cmp.Compare(x.start, y.start))
		})
	}
	participants := nonEmpty(bkeys)
	for _, i := range nonEmpty(wkeys) {
		if len(bkeys[i]) == 0 {
			participants = append(participants, i)
		}
	}
	balances := make([]map[balanceKey]total, P)
	windows := make([]map[windowKey]total, P)
	err := tx.Each(ctx, participants, func(ctx context.Context, b *txsink.Branch) error {
		var err error
		if balances[b.Participant], err = readBalances(ctx, b, bkeys[b.Participant]); err != nil {
			return err
		}
		windows[b.Participant], err = readWindows(ctx, b, wkeys[b.Participant])
		return err
	})
	if err != nil {
		return err
	}
	// A key without a stored row starts at zero, written as absolute too.
	for k := range rb {
		agg.seedBalance(k, total{})
	}
	for k := range rw {
		agg.seedWindow(k, total{})
	}
	for i := range P {
		for k, t := range balances[i] {
			agg.seedBalance(k, t)
		}
		for k, t := range windows[i] {
			agg.seedWindow(k, t)
		}
	}
	return nil
}

func (p *Pipeline) deadLetter(r *record, reason, detail string) deadLetter {
	return newDeadLetter(r.partition, r.offset, r.key, r.value, p.cfg.DeadLetterPayloadBytes, reason, detail, r.ev.EventID)
}

func (p *Pipeline) report(info CheckpointInfo) {
	if info.Err != nil {
		if !info.Decided {
			p.stats.Aborts.Add(1)
		}
		lvl := p.log.Warn
		if info.Retrying {
			lvl = p.log.Info
		}
		lvl("checkpoint failed", "checkpoint", info.Gtrid, "phase", info.FailedPhase, "decided", info.Decided,
			"records", info.Records, "partitions", info.Partitions, "err", info.Err)
	} else {
		p.log.Debug("checkpoint committed", "checkpoint", info.Gtrid, "records", info.Records, "counted", info.Counted,
			"duplicates", info.Duplicates, "duration", info.Duration)
	}
	if p.cfg.OnCheckpoint != nil {
		p.cfg.OnCheckpoint(info)
	}
}

func nonEmpty[T any](by [][]T) []int {
	var out []int
	for i, v := range by {
		if len(v) > 0 {
			out = append(out, i)
		}
	}
	return out
}

// pool runs dedup lookups on a server's pool, outside any branch.
type pool struct {
	db     *sqlx.DB
	budget int
}

func (q pool) MaxStatementBytes() int { return q.budget }

func (q pool) Select(ctx context.Context, dest any, query string, args ...any) error {
	return q.db.SelectContext(ctx, dest, query, args...)
}
