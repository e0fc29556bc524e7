package pipeline

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/txsink"
)

// housekeeping runs until ctx ends: periodic recovery of in-doubt branches
// (with pruning of old decision rows once nothing of theirs is in doubt,
// and of the commit log's old records), the janitor (expired dedup keys,
// in a goroutine of its own: under sustained load it works without pause,
// and recovery must not wait for it), and the deletion of ledger entries
// older than their retention, on every server.
func (p *Pipeline) housekeeping(ctx context.Context) {
	var janitor sync.WaitGroup
	defer janitor.Wait()
	janitor.Go(func() {
		Janitor(ctx, p.pools, p.cfg.Clock, p.cfg.DedupCleanupInterval, p.cfg.DedupCleanupBatch, p.sink.Participants()/len(p.pools), p.log)
	})
	recoverT := time.NewTicker(p.cfg.RecoveryInterval)
	defer recoverT.Stop()
	retentionT := time.NewTicker(p.cfg.DedupCleanupInterval)
	defer retentionT.Stop()
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
		case <-retentionT.C:
			if p.cfg.LedgerEntriesRetention > 0 {
				cctx, cancel := context.WithTimeout(ctx, p.cfg.DedupCleanupInterval)
				DeleteOldEntries(cctx, p.pools, p.cfg.Clock().Add(-p.cfg.LedgerEntriesRetention), p.cfg.DedupCleanupBatch, p.log)
				cancel()
			}
		}
	}
}

// Janitor deletes expired dedup keys on every server until ctx ends. At
// start and then every interval it runs cleanup passes one after the other
// for as long as the last one left due keys behind: keys are deleted as
// fast as they expire (in steady state, as fast as checkpoints insert
// them) however short the interval, and a backlog is worked off at once
// rather than one bounded pass per tick. Each pass is bounded in keys, and
// in time by passTimeout or interval, whichever is longer (a pass cut short
// rolls back the journal row it was deleting: its work is lost). Keys are
// expired by now, the ledger's clock (see Config.Clock).
func Janitor(ctx context.Context, pools []Pool, now func() time.Time, interval time.Duration, batch, workers int, log *slog.Logger) {
	const passTimeout = 30 * time.Second
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for ctx.Err() == nil {
			cctx, cancel := context.WithTimeout(ctx, max(interval, passTimeout))
			more := cleanupPass(cctx, pools, now, batch, workers, log)
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

// cleanupPass is one pass of the janitor: on every server, workers
// connections in parallel (each takes a due journal row of its own) delete
// the expired dedup keys of due journal rows, batch keys per statement and
// at most 100 batches each. It reports whether due rows may be left (a
// worker used its whole budget). Failures are logged; the next pass
// retries.
func cleanupPass(ctx context.Context, pools []Pool, now func() time.Time, batch, workers int, log *slog.Logger) (more bool) {
	workers = max(workers, 1)
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for i, pool := range pools {
		for range workers {
			wg.Go(func() {
				n, err := dedup.Cleanup(ctx, pool.DB(), now(), batch, 100*batch, pool.MaxStatementBytes())
				if err != nil {
					log.Warn("dedup cleanup failed", "server", i, "err", err)
				} else if n > 0 {
					log.Debug("expired dedup keys deleted", "server", i, "keys", n)
				}
				if err == nil && n >= int64(100*batch) {
					mu.Lock()
					more = true
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return more
}

// DeleteOldEntries is one pass of the ledger entries' retention: on every
// server, it deletes the entries created before before, batch rows per
// statement and at most 100 batches, and returns how many it deleted.
// Failures are logged; the next pass retries.
func DeleteOldEntries(ctx context.Context, pools []Pool, before time.Time, batch int, log *slog.Logger) int64 {
	var total int64
	for i, pool := range pools {
		n, err := deleteOldEntries(ctx, pool.DB(), before, batch, 100*batch)
		total += n
		if err != nil {
			log.Warn("ledger entries retention failed", "server", i, "err", err)
		} else if n > 0 {
			log.Debug("old ledger entries deleted", "server", i, "entries", n)
		}
	}
	return total
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
