package pipeline

import (
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

// Checkpointer commits snapshots: the checkpoint coordinator. It executes
// the plan (planner.go, executor.go) over the sink's participants and the
// two-phase commit, retries where a retry can succeed (retry.go), and
// isolates records the database refuses (isolate.go). It owns the dedup
// cache and the checkpoint sequence: its checkpoints run one at a time.
type Checkpointer struct {
	cfg   Config
	log   *slog.Logger
	sink  *txsink.Sink
	pools []driver.Store
	stats *Stats

	mu    sync.Mutex // held by the checkpoint running; guards cache, seq and stalled
	cache *dedup.Cache
	seq   uint64
	// stalled is the move's cursor a checkpoint last waited for in vain
	// (followLayout): the next ones do not wait for it again.
	stalled  *driver.MoveCursor
	cacheLen atomic.Int64 // cache.Len() after the last checkpoint, for metrics
	// eventTimeDue: the last committed checkpoint closed windows that are
	// not sealed yet (see EventTimeDue).
	eventTimeDue atomic.Bool
	// alone: this instance holds every partition of the topic, so no other
	// live instance claims dedup keys beside it and its participants may
	// claim in parallel (see execution.claim). The pipeline sets it at
	// every assignment and revocation; a Checkpointer of NewCheckpointer
	// is alone.
	alone atomic.Bool
	// generations is the dedup keys' generations as the last checkpoint
	// read them (nil before), for the read-ahead.
	generations atomic.Pointer[driver.KeyGenerations]
	// beforeWrite, set by tests only, runs before each attempt's write
	// step: another instance's checkpoint can commit between this one's
	// reads and its writes.
	beforeWrite func()
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
	c := newCheckpointer(cfg, sink, pools, &Stats{})
	c.alone.Store(true)
	return c, nil
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

// maxSealRows bounds the window rows one checkpoint seals on one server;
// the next checkpoint goes on.
const maxSealRows = 10 * stmt.MaxRows

// run commits one snapshot. Each attempt is bounded by CheckpointTimeout.
// An attempt that fails before its decision is aborted; what follows is
// the ladder's (retry.go): retried at once (the frontier moved, careful
// after an overflow, once more after a refusal of the data), after
// rereading the servers' limits (TooLarge), after isolating the records
// the database refuses (isolate.go; if no record is responsible, the
// checkpoint fails and is replayed), or reported: the source then replays
// whatever was not decided from MySQL.
func (c *Checkpointer) run(ctx context.Context, s *snapshot) outcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	var l ladder
	for {
		stalled, err := c.followLayout(ctx)
		if err != nil {
			return outcome{err: err}
		}
		actx, cancel := context.WithTimeout(ctx, c.cfg.CheckpointTimeout)
		info := c.attempt(actx, s, l.careful, false, l.uncreated)
		cancel()
		info.StepStalled = stalled
		if info.skipped {
			return outcome{decided: true}
		}
		o := c.outcomeOf(info, ctx.Err() != nil)
		if o.failed && !o.stopped && o.oversized {
			c.log.Error("bug: a row exceeded the statement budget its size was computed for; the record responsible will be isolated, please report",
				"checkpoint", info.Gtrid, "offsets", offsetRanges(s), "err", info.Err)
		}
		var m move
		m, l = l.next(o)
		switch m {
		case moveRefresh:
			for _, p := range c.pools {
				if err := p.RefreshLimits(ctx); err != nil {
					c.log.Warn("cannot reread the server's max_allowed_packet", "err", err)
				}
			}
			info.Retrying = true
		case moveRetry:
			info.Retrying = true
		case moveIsolate:
			next, n, result := c.isolate(ctx, s, l.careful, info.Err)
			info.Isolation = result
			c.report(info)
			if afterIsolation(n) == moveReport {
				return outcome{decided: false, err: info.Err}
			}
			s = next
			continue
		}
		c.report(info)
		if !info.Retrying {
			return outcome{decided: info.Decided, err: info.Err}
		}
	}
}

// EventTimeDue reports whether windows closed by the last checkpoints wait
// to be sealed (or could close), so that a checkpoint is due even without
// records.
func (c *Checkpointer) EventTimeDue() bool { return c.eventTimeDue.Load() }

// report logs an attempt and hands it to OnCheckpoint. A failure names the
// partitions and offsets it covered, so that a checkpoint that keeps
// failing on the same records can be found.
func (c *Checkpointer) report(info CheckpointInfo) {
	if info.Aborted() {
		c.stats.Aborts.Add(1)
	}
	if info.Err != nil {
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

// frozenPoll is how often a checkpoint waiting for a step of a move
// rereads the move's cursor; stepPoll how often an idle checkpointer does
// while a move is under way (followSteps).
const (
	frozenPoll = 10 * time.Millisecond
	stepPoll   = 100 * time.Millisecond
)

// followLayout places the next attempt's keys by the ledger's layout as
// it is now (txsink.Sink.Refresh): a live move's cursor, read before
// every attempt (one point read on the control server). While a step of
// the move is announced or under way the attempt waits for it, up to half
// the checkpoint's timeout, and says so once (Sink.AwaitStep: the mover
// freezes the step once the checkpoints begun before its announcement
// have decided): a checkpoint that wrote one of the step's keys would be
// refused at its decision, and nearly every one does. It fails only when
// the layout cannot be followed (txsink.ErrNotPlaceable: the instance
// stops); a failed read leaves the last layout read, which the decision
// checks.
//
// A step that outlasts the wait has a mover that stopped (killed, or cut
// off from the control server) or is far slower than its steps should
// be: the checkpoints after the one that waited in vain do not wait for
// the same cursor again, or every checkpoint would wait half its timeout
// until someone resumes the move. They go on and are refused only if they
// write one of a frozen step's keys. It reports whether this call gave up
// on a step (CheckpointInfo.StepStalled).
func (c *Checkpointer) followLayout(ctx context.Context) (stalled bool, err error) {
	wait := time.NewTimer(c.cfg.CheckpointTimeout / 2)
	defer wait.Stop()
	for {
		if err := c.sink.Refresh(ctx); err != nil {
			if errors.Is(err, txsink.ErrNotPlaceable) {
				return false, err
			}
			c.log.Warn("cannot read the ledger's layout; placing keys by the last read", "err", err)
			return false, nil
		}
		cur := c.sink.Cursor()
		if !c.sink.Stepping() || (c.stalled != nil && *c.stalled == cur) {
			return false, nil
		}
		c.awaitStep(ctx)
		select {
		case <-ctx.Done():
			return false, nil
		case <-wait.C:
			c.stalled = &cur
			c.log.Warn("a step of the ledger's live move did not end within half a checkpoint's timeout; checkpoints no longer wait for it (is billing shards add or remove still running? run it again to resume the move)",
				"version", cur.Version, "announced_below", cur.AnnouncedBelow, "frozen_below", cur.FrozenBelow, "mover", cur.Mover)
			return true, nil
		case <-time.After(frozenPoll):
		}
	}
}

// awaitStep says that this checkpointer, with no checkpoint in flight,
// waits for the step the sink last read announced (a failure only costs
// the mover its wait).
func (c *Checkpointer) awaitStep(ctx context.Context) {
	if err := c.sink.AwaitStep(ctx); err != nil {
		c.log.Warn("cannot record the wait for the move's step", "err", err)
	}
}

// followSteps runs until ctx ends: while a live move is under way, an
// idle checkpointer (no checkpoint running) reads the move's cursor every
// stepPoll and says it waits for each step announced (followLayout's
// AwaitStep), so that the mover need not wait for this instance's next
// checkpoint to freeze a step. A checkpoint that begins meanwhile reads
// the cursor first, so it waits for the step too, unless one already
// waited for this very cursor in vain (followLayout): then it may be
// refused by the freeze, as any checkpoint of an instance that does not
// wait.
func (c *Checkpointer) followSteps(ctx context.Context) {
	t := time.NewTicker(stepPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !c.sink.Cursor().Moving || !c.mu.TryLock() {
			continue
		}
		if err := c.sink.Refresh(ctx); err == nil {
			c.awaitStep(ctx)
		}
		c.mu.Unlock()
	}
}
