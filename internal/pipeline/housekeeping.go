package pipeline

import (
	"context"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/txsink"
)

// housekeeping runs until ctx ends: periodic recovery of in-doubt branches
// (with pruning of old decision rows once nothing of theirs is in doubt),
// and continuous deletion of expired dedup keys on every server.
func (p *Pipeline) housekeeping(ctx context.Context) {
	recoverT := time.NewTicker(p.cfg.RecoveryInterval)
	defer recoverT.Stop()
	cleanT := time.NewTicker(p.cfg.DedupCleanupInterval)
	defer cleanT.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-recoverT.C:
			rctx, cancel := context.WithTimeout(ctx, p.cfg.RecoveryInterval)
			res, err := p.sink.Recover(rctx, p.cfg.CheckpointTimeout)
			p.recovered(res)
			if err != nil {
				p.log.Warn("recovery pass incomplete", "err", err)
			} else if n, err := p.sink.PruneDecisions(rctx, p.cfg.DecisionRetention, res.Remaining, 1000); err != nil {
				p.log.Warn("pruning decisions failed", "err", err)
			} else if n > 0 {
				p.log.Debug("pruned decisions", "rows", n)
			}
			cancel()
		case <-cleanT.C:
			cctx, cancel := context.WithTimeout(ctx, p.cfg.DedupCleanupInterval)
			CleanExpired(cctx, p.pools, p.cfg.DedupCleanupBatch, p.log)
			cancel()
		}
	}
}

// CleanExpired is one pass of the janitor: on every server, it deletes the
// expired dedup keys of due journal rows, batch keys per statement and at
// most 100 batches, and returns how many it deleted. Failures are logged;
// the next pass retries.
func CleanExpired(ctx context.Context, pools []Pool, batch int, log *slog.Logger) int64 {
	var total int64
	for i, pool := range pools {
		n, err := dedup.Cleanup(ctx, pool.DB(), time.Now(), batch, 100*batch, pool.MaxStatementBytes())
		total += n
		if err != nil {
			log.Warn("dedup cleanup failed", "server", i, "err", err)
		} else if n > 0 {
			log.Debug("expired dedup keys deleted", "server", i, "keys", n)
		}
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
