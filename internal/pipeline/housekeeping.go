package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/ledgerclock"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
)

// housekeeping runs until ctx ends: periodic recovery of in-doubt branches
// (with pruning of old decision rows once nothing of theirs is in doubt,
// and of the commit log's old records), and the cleanup (Cleanup: the
// upkeep of the dedup keys' generations and old ledger entries, in
// goroutines of their own: under sustained load they work without pause,
// and recovery must not wait for them).
func (p *Pipeline) housekeeping(ctx context.Context) {
	var cleanup sync.WaitGroup
	defer cleanup.Wait()
	cleanup.Go(func() { Cleanup(ctx, p.cfg, p.sink, p.pools) })
	recoverT := time.NewTicker(p.cfg.RecoveryInterval)
	defer recoverT.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-recoverT.C:
			if p.checkSettings(ctx) != nil {
				return
			}
			rctx, cancel := context.WithTimeout(ctx, p.cfg.RecoveryInterval)
			res, err := p.sink.Recover(rctx, p.cfg.abortAfter())
			p.recovered(res)
			if err != nil {
				p.log.Warn("recovery pass incomplete", "err", err)
			} else if n, err := p.sink.PruneDecisions(rctx, p.cfg.DecisionRetention, res.Remaining, 1000); err != nil {
				p.log.Warn("pruning decisions failed", "err", err)
			} else if n > 0 {
				p.log.Debug("pruned decisions", "rows", n)
			}
			if p.cfg.CommitLogRetention > 0 {
				PruneCommitLog(rctx, p.sink, p.cfg.CommitLogRetention, p.log)
			}
			cancel()
		}
	}
}

// Cleanup runs, until ctx ends, the upkeep of the dedup keys' generations
// (Keeper) and, with cfg.LedgerEntriesRetention, the retention of ledger
// entries (one connection per server), each in a goroutine of its own,
// every cfg.DedupCleanupInterval, the retention by the ledger's clock
// (cfg.Clock; time.Now when nil), the upkeep by the control server's. Both
// run on the servers' cleanup connections (driver.Store.EmptyKeys,
// DeleteEntries), sized for exactly that: cleanup never holds a
// connection of the pool that checkpoints, recovery and health checks
// use. The service runs it in its housekeeping; benchmarks run it beside
// checkpoints of their own.
func Cleanup(ctx context.Context, cfg Config, sink *txsink.Sink, pools []driver.Store) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	now := cfg.Clock
	if now == nil {
		now = time.Now
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { Keeper(ctx, sink, pools, cfg.DedupCleanupInterval, log) })
	if cfg.LedgerEntriesRetention > 0 {
		wg.Go(func() {
			Retention(ctx, pools, now, cfg.DedupCleanupInterval, cfg.LedgerEntriesRetention, cfg.DedupCleanupBatch, log)
		})
	}
}

// passTimeout bounds one cleanup pass (or the interval, if longer): a pass
// cut short rolls back the statement it was running, its work is lost.
const passTimeout = 30 * time.Second

// workOff runs pass at start and then every interval, and each time again
// and again for as long as it reports that due rows are left: rows are
// deleted as fast as they become due (in steady state, as fast as
// checkpoints insert them) however short the interval, and a backlog is
// worked off at once rather than one bounded pass per tick. Each pass is
// bounded in rows by pass itself, in time by passTimeout or interval,
// whichever is longer.
func workOff(ctx context.Context, interval time.Duration, pass func(ctx context.Context) (more bool)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for ctx.Err() == nil {
			cctx, cancel := context.WithTimeout(ctx, max(interval, passTimeout))
			more := pass(cctx)
			cancel()
			if !more {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Keeper keeps the dedup keys' generations until ctx ends: every interval
// it takes the steps dedup.Keep says are due, by the control server's
// clock, one after the other (keepStep): it empties the table of a
// generation whose keys have all expired, on every server, and records
// it; it makes the next generation current once the current one has been
// for a key lifetime. Instances run it side by side: each step is a
// compare-and-set on the control server, and emptying a table twice is
// harmless.
func Keeper(ctx context.Context, sink *txsink.Sink, pools []driver.Store, interval time.Duration, log *slog.Logger) {
	workOff(ctx, interval, func(ctx context.Context) bool { return keepStep(ctx, sink, pools, log) })
}

// markTries bounds the attempts to record an emptied table in one step
// (each fails at once while a decision holds the state shared), and
// markPause is the pause between them.
const (
	markTries = 20
	markPause = 25 * time.Millisecond
)

// keepStep takes the steps of the upkeep that are due, emptying first
// (the next generation may need the table), and reports whether more may
// be (more). A table is emptied while the state is held shared
// (HoldKeyGenerations): no rotation can give it to a newer generation
// meanwhile, however long the emptying takes. A failure is logged and the
// step tried again at the next pass: a table that cannot be emptied yet
// (a straggling or prepared branch holds it, keys of the version before
// may still be live) only lets keys live longer.
func keepStep(ctx context.Context, sink *txsink.Sink, pools []driver.Store, log *slog.Logger) (more bool) {
	s, err := sink.KeyGenerations(ctx)
	if err != nil {
		log.Warn("dedup generations: cannot read the state", "err", err)
		return false
	}
	k := dedup.Keep(s)
	if k.Empty >= 0 && emptyGeneration(ctx, sink, pools, k.Empty, log) {
		return true
	}
	if !k.Rotate {
		return false
	}
	ok, err := sink.RotateKeys(ctx, s.Current)
	if err != nil {
		log.Warn("dedup generations: rotation failed", "from", s.Current, "err", err)
		return false
	}
	if ok {
		log.Info("dedup generations: next generation current", "generation", s.Current+1, "table", (s.Current + 1).Table())
	}
	return ok
}

// emptyGeneration empties generation g's table on every server under the
// held state, if g is still the one to empty, and records it; it reports
// whether the state changed (a step was taken, here or by another
// instance).
func emptyGeneration(ctx context.Context, sink *txsink.Sink, pools []driver.Store, g driver.Generation, log *slog.Logger) bool {
	err := sink.HoldKeyGenerations(ctx, func(held driver.KeyGenerations) error {
		if dedup.Keep(held).Empty != g {
			return errMoved
		}
		for i, pool := range pools {
			if err := pool.EmptyKeys(ctx, g, held.Now.Add(-ledgerclock.Margin)); err != nil {
				return fmt.Errorf("server %d: %w", i, err)
			}
		}
		return nil
	})
	switch {
	case errors.Is(err, errMoved):
		return true
	case errors.Is(err, driver.ErrKeysLive):
		log.Info("dedup generations: generation 0's table (dedup_keys) waits for the keys the version before generations journaled to expire", "err", err)
		return false
	case err != nil:
		log.Warn("dedup generations: emptying a table failed; tried again at the next pass", "generation", g, "err", err)
		return false
	}
	for range markTries {
		ok, err := sink.MarkKeysEmptied(ctx, g)
		if err != nil {
			log.Warn("dedup generations: recording an emptied table failed", "generation", g, "err", err)
			return false
		}
		if ok {
			log.Info("dedup generations: table emptied", "generation", g, "table", g.Table())
			return true
		}
		if s, err := sink.KeyGenerations(ctx); err != nil || s.Emptied >= g {
			return err == nil // recorded by another instance
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(markPause):
		}
	}
	return false
}

// errMoved: the state changed between a step's plan and its lock.
var errMoved = errors.New("dedup generations moved")

// Retention deletes the ledger entries created more than retention ago on
// every server until ctx ends, passes back to back while entries are due
// (workOff): the table stays bounded however fast
// checkpoints insert entries, as long as one connection per server deletes
// them faster. Entries are aged by now, the ledger's clock.
func Retention(ctx context.Context, pools []driver.Store, now func() time.Time, interval, retention time.Duration, batch int, log *slog.Logger) {
	workOff(ctx, interval, func(ctx context.Context) bool {
		_, more := DeleteOldEntries(ctx, pools, now().Add(-retention), batch, log)
		return more
	})
}

// DeleteOldEntries is one pass of the ledger entries' retention: on every
// server in parallel, it deletes the entries created before before, batch
// rows per statement and at most 100 batches, and returns how many it
// deleted and whether due entries may be left (a server used its whole
// budget). Failures are logged; the next pass retries.
func DeleteOldEntries(ctx context.Context, pools []driver.Store, before time.Time, batch int, log *slog.Logger) (deleted int64, more bool) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for i, pool := range pools {
		wg.Go(func() {
			n, err := pool.DeleteEntries(ctx, before, batch, 100*batch)
			if err != nil {
				log.Warn("ledger entries retention failed", "server", i, "err", err)
			} else if n > 0 {
				log.Debug("old ledger entries deleted", "server", i, "entries", n)
			}
			mu.Lock()
			defer mu.Unlock()
			deleted += n
			more = more || err == nil && n >= int64(100*batch)
		})
	}
	wg.Wait()
	return deleted, more
}

// Commit log pruning: records per statement, and statements per pass. A
// pass deletes up to 100,000 records, more than the decisions a control
// server takes between two passes (a few thousand per second at most,
// docs/performance.md), so the log stays within its retention.
const (
	commitLogPruneBatch  = 1000
	commitLogPruneBudget = 100
)

// PruneCommitLog is one pass of the commit log's retention: it deletes
// the records older than retention below the visible position (see
// txsink.Sink.PruneCommitLog), commitLogPruneBatch per statement and at
// most commitLogPruneBudget statements, and returns how many it deleted.
// Failures are logged; the next pass retries.
func PruneCommitLog(ctx context.Context, sink *txsink.Sink, retention time.Duration, log *slog.Logger) int64 {
	var total int64
	for range commitLogPruneBudget {
		n, err := sink.PruneCommitLog(ctx, retention, commitLogPruneBatch)
		total += n
		if err != nil {
			log.Warn("commit log retention failed", "err", err)
			break
		}
		if n < commitLogPruneBatch {
			break
		}
	}
	if total > 0 {
		log.Debug("old commit log records deleted", "records", total)
	}
	return total
}

// commitToGroup queues the decided positions for the Kafka group, for lag
// tools only: MySQL stays the authority. It never blocks: the group
// committer sends the newest position of every partition, so a later cut
// supersedes one not yet sent. Sending happens off the caller's locks
// because a commit waits for any join or sync in progress, and the
// assignment hook of that join may be waiting for the pipeline's lock.
func (p *Pipeline) commitToGroup(cuts []txsink.PartitionCut) {
	p.groupMu.Lock()
	if p.groupPending == nil {
		p.groupPending = map[int32]kgo.EpochOffset{}
	}
	for _, c := range cuts {
		p.groupPending[c.Partition] = kgo.EpochOffset{Epoch: -1, Offset: c.NextOffset}
	}
	p.groupMu.Unlock()
	select {
	case p.groupSignal <- struct{}{}:
	default:
	}
}

// groupCommitter sends queued positions to the group until ctx ends.
func (p *Pipeline) groupCommitter(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.groupSignal:
		}
		p.groupMu.Lock()
		offs := p.groupPending
		p.groupPending = nil
		p.groupMu.Unlock()
		if len(offs) == 0 {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		p.cl.CommitOffsetsSync(cctx, map[string]map[int32]kgo.EpochOffset{p.cfg.Topic: offs},
			func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, _ *kmsg.OffsetCommitResponse, err error) {
				if err != nil {
					p.log.Debug("committing offsets to the group failed (lag tools only)", "err", err)
				}
			})
		cancel()
	}
}
