package pipeline

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Read-ahead of the dedup keys. With a dedup table larger than
// the buffer pool and random event ids, nearly every claim of a new key
// must read its leaf page from disk, synchronously, in the branch that
// claims it: at the barrier, a live checkpoint's dedup phase waits on the
// disk for every key of its interval, and each record waits for that on
// top of its wait for the barrier. The read-ahead moves those reads to
// before the barrier. While the source is caught up with the log (the live
// regime: the next checkpoint's records arrive over a whole interval, and
// latency is what matters), the ids of each poll are looked up without
// locks (driver.Store.LookupKeys, on the servers' pools) in every table
// the next claim will touch (dedup.ClaimAt under the generations the last
// checkpoint read), which brings their leaves into the buffer pool; the
// claim at the barrier then finds them there.
//
// It decides nothing: what it reads is dropped, it takes no lock and
// writes nothing, so it cannot change what any checkpoint counts (a
// lookup never waits for a branch: drivertest's
// Store/LookupsReadCommittedRowsOnly). Nor does it hold anything up: the
// poll loop hands ids over without waiting (they are dropped when
// readAheadQueue ids per connection are waiting already), a statement
// is bounded by readAheadTimeout, and a chunk whose checkpoint is over is
// dropped unread.
//
// What a live claim still misses is what the read-ahead had not read by
// the barrier: the ids polled in its last moments (each miss is a
// synchronous read in the claiming branch, two with a previous
// generation, one after another in key order), and, in an instance that
// starts on a log it is caught up with, the whole first checkpoint's ids
// if the read-ahead waited for a checkpoint to read the generations. So
// a chunk polled before a barrier is still read after it, while its
// claim is under way (the other connections put several reads in flight
// for the claim's misses); a poll's ids are spread over the connections
// in chunks of at least readAheadMinChunk rather than read in one
// statement; and before the first checkpoint the read-ahead reads the
// generations itself (firstGenerations).
//
// In a catch-up it is off: records buffered there are claimed seconds
// later in checkpoints of many thousands of keys whose claims run in
// parallel already, and pages read that early would be evicted before
// the claim.
//
// It pays only when the pool keeps what it read until the barrier, about
// one 16 KiB leaf per new id of an interval (docs/performance.md,
// "Read-ahead"); with every leaf in memory it costs a point read per id
// and gains nothing. DedupReadAheadConns sets its connections (0: off).

const (
	// readAheadChunk is the most ids per statement, and readAheadMinChunk
	// the fewest a poll's ids are split into (fewer per chunk would cost a
	// statement per few ids): a poll's ids are shared by all connections,
	// so that the disk has that many reads in flight.
	readAheadChunk    = 256
	readAheadMinChunk = 16
	// readAheadQueue is how many ids may wait per connection; beyond,
	// they are dropped (the claim reads them itself). Bounded in ids, not
	// chunks, so that small polls split in small chunks cannot fill it.
	readAheadQueue = 8 * readAheadChunk
	// readAheadTimeout bounds one statement.
	readAheadTimeout = 2 * time.Second
)

// MaxReadAheadConns bounds Config.DedupReadAheadConns: beyond about four
// reads in flight this disk served no more (docs/performance.md), and each
// connection is one more per instance on every server.
const MaxReadAheadConns = 4

// readAhead looks up polled ids ahead of their claim; a nil *readAhead is
// off. The pipeline owns it: Run starts run and stops it with its context.
type readAhead struct {
	log   *slog.Logger
	pools []driver.Store
	place placement // which server holds an id's participant
	clock func() time.Time
	// generations is the state the last checkpoint read (nil before the
	// first): a stale one costs a lookup in a table the claim no longer
	// reads, nothing else.
	generations func() *driver.KeyGenerations
	// first is read from the control server when no checkpoint has read
	// the generations yet (an instance that starts on a log it is caught
	// up with: its first checkpoint's ids would otherwise all be
	// dropped, and it would be the slowest of its live phase).
	first    firstGenerations
	conns    int
	chunks   chan aheadChunk
	queued   atomic.Int64  // ids in chunks
	barriers atomic.Uint64 // barriers passed
	stats    *Stats
}

// aheadChunk is ids polled after barrier number barrier.
type aheadChunk struct {
	barrier uint64
	ids     []string
}

// generationsReader reads the generations' state (txsink.Sink).
type generationsReader interface {
	KeyGenerations(ctx context.Context) (driver.KeyGenerations, error)
}

// aheadSink is what the read-ahead needs of the sink: where an id's key
// lives, and the generations before a checkpoint has read them.
type aheadSink interface {
	placement
	generationsReader
}

func newReadAhead(cfg Config, pools []driver.Store, sink aheadSink, generations func() *driver.KeyGenerations, stats *Stats) *readAhead {
	if cfg.DedupReadAheadConns <= 0 {
		return nil
	}
	return &readAhead{log: cfg.Logger, pools: pools, place: sink, clock: cfg.Clock, generations: generations,
		first: firstGenerations{control: sink}, conns: cfg.DedupReadAheadConns,
		chunks: make(chan aheadChunk, cfg.DedupReadAheadConns*readAheadQueue/readAheadMinChunk), stats: stats}
}

// firstGenerations reads the generations once for the read-ahead, until a
// checkpoint has; after a failure it tries again no sooner than
// firstGenerationsRetry later (the chunks meanwhile are dropped: the
// claims read their keys themselves).
type firstGenerations struct {
	control generationsReader
	mu      sync.Mutex
	read    *driver.KeyGenerations
	failed  time.Time
}

const firstGenerationsRetry = time.Second

func (f *firstGenerations) get(ctx context.Context) *driver.KeyGenerations {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.read != nil || time.Since(f.failed) < firstGenerationsRetry {
		return f.read
	}
	rctx, cancel := context.WithTimeout(ctx, readAheadTimeout)
	defer cancel()
	s, err := f.control.KeyGenerations(rctx)
	if err != nil {
		f.failed = time.Now()
		return nil
	}
	f.read = &s
	return f.read
}

// offer hands the ids of a poll to the connections, without waiting. ids
// is the caller's no more.
func (a *readAhead) offer(ids []string) {
	if a == nil {
		return
	}
	b := a.barriers.Load()
	size := min(max((len(ids)+a.conns-1)/a.conns, readAheadMinChunk), readAheadChunk)
	for len(ids) > 0 {
		n := min(len(ids), size)
		if a.queued.Load()+int64(n) > int64(a.conns*readAheadQueue) {
			a.stats.ReadAheadDropped.Add(int64(len(ids)))
			return
		}
		select {
		case a.chunks <- aheadChunk{barrier: b, ids: ids[:n:n]}:
			a.queued.Add(int64(n))
		default:
			a.stats.ReadAheadDropped.Add(int64(len(ids)))
			return
		}
		ids = ids[n:]
	}
}

// barrier says that a barrier passed: what was polled before it is being
// claimed, and what was polled before the barrier before it was claimed.
func (a *readAhead) barrier() {
	if a != nil {
		a.barriers.Add(1)
	}
}

// run reads ahead on conns goroutines until ctx ends.
func (a *readAhead) run(ctx context.Context) {
	if a == nil {
		return
	}
	var wg sync.WaitGroup
	for range a.conns {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case c := <-a.chunks:
					a.queued.Add(-int64(len(c.ids)))
					// c's checkpoint is sealed at barrier c.barrier+1;
					// one sealed later means it is over (at most one is
					// in flight).
					if a.barriers.Load() > c.barrier+1 {
						a.stats.ReadAheadDropped.Add(int64(len(c.ids)))
						continue
					}
					a.read(ctx, c.ids)
				}
			}
		})
	}
	wg.Wait()
}

// read looks ids up in every table the next claim touches, on each id's
// server.
func (a *readAhead) read(ctx context.Context, ids []string) {
	s := a.generations()
	if s == nil {
		s = a.first.get(ctx)
	}
	if s == nil {
		a.stats.ReadAheadDropped.Add(int64(len(ids)))
		return
	}
	c := dedup.ClaimAt(*s, a.clock())
	tables := append([]driver.Generation{c.Write}, c.Read...)
	byServer := make([][]string, len(a.pools))
	for _, id := range ids {
		sv := a.place.ServerOf(a.place.Route(id))
		byServer[sv] = append(byServer[sv], id)
	}
	for sv, ids := range byServer {
		if len(ids) == 0 {
			continue
		}
		for _, g := range tables {
			rctx, cancel := context.WithTimeout(ctx, readAheadTimeout)
			_, err := a.pools[sv].LookupKeys(rctx, g, ids)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					a.stats.ReadAheadFailed.Add(1)
					a.log.Debug("dedup read-ahead failed; the claim reads the keys itself", "server", sv, "generation", g, "err", err)
				}
				return
			}
		}
		a.stats.ReadAhead.Add(int64(len(ids)))
	}
}
