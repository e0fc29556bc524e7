package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/ledgerclock"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/waits"
)

// Config is what the pipeline needs; cmd/billing fills it from the
// environment (internal/config, where each setting's default is). Every
// duration and count must be positive unless said otherwise.
type Config struct {
	// Topic is the topic of billing events; Group the consumer group, which
	// also scopes the positions stored in MySQL.
	Topic, Group string
	// CheckpointInterval is how often a checkpoint is taken.
	CheckpointInterval time.Duration
	// CheckpointTimeout bounds one checkpoint until its decision; an older
	// undecided checkpoint is aborted (by its coordinator or a recoverer).
	CheckpointTimeout time.Duration
	// CheckpointMaxRecords and CheckpointMaxBytes take a checkpoint early
	// once that many records, or records holding that much memory
	// (keys, values, decoded ids), are buffered; fetching pauses at twice
	// either while a checkpoint is in flight. Together with the fetch
	// sizes derived from CheckpointMaxBytes they bound the memory of
	// records in the process.
	CheckpointMaxRecords int
	CheckpointMaxBytes   int
	// MaxPollRecords is the most records taken from the client per poll.
	MaxPollRecords int
	// DedupTTL is how long an event id is remembered after its first
	// arrival (processing time; see package dedup).
	DedupTTL time.Duration
	// VersionHorizon is how long after an event's first version (its
	// first arrival, processing time) another revision of it is applied;
	// later, it is a version_past_horizon dead letter (docs/corrections.md).
	// At most DedupTTL: past the key's life the event is forgotten, and a
	// version counts as a new event. 0: half of DedupTTL.
	VersionHorizon time.Duration
	// DedupCacheKeys bounds the event ids remembered in memory; 0 disables
	// the cache (every id is checked in MySQL).
	DedupCacheKeys int
	// DedupReadAheadConns is how many connections per server look up the
	// ids polled while the source is caught up, ahead of their claim, so
	// that the claim finds their pages in the buffer pool (readahead.go);
	// 0 turns the read-ahead off. Size the servers' pools for them
	// (mysqldriver.Options.ReadAheadConns).
	DedupReadAheadConns int
	// DedupCleanupInterval is how often the upkeep of the dedup keys'
	// generations (Keeper) and the retention of ledger entries look for
	// work; the retention deletes DedupCleanupBatch entries per statement.
	DedupCleanupInterval time.Duration
	DedupCleanupBatch    int
	// Window is the billing window over occurred_at: fixed windows aligned
	// to the epoch in UTC, or calendar days or months in a time zone
	// (event.Period), or the ledger's schedule of them (event.Schedule:
	// the service runs on the one stored in the ledger, package periods).
	Window event.Windows
	// WindowCloseAfter: 0 (the default) means windows never close; else a
	// window closes once the topic's watermark has passed its end plus
	// this, and later events of it count in window_adjustments (see
	// eventtime.go).
	WindowCloseAfter time.Duration
	// MaxEventTimeSkew bounds event time by processing time: a record
	// whose occurred_at is later than the checkpoint's processing time
	// (Clock) plus this is an event_time_in_future dead letter, counted
	// nowhere, not remembered as seen, and not in its partition's
	// watermark (see admit).
	MaxEventTimeSkew time.Duration
	// LedgerEntries: every counted event gets a ledger_entries row, in the
	// branch of its account's sums. LedgerEntriesRetention: 0 keeps them
	// forever; else older rows are deleted like expired dedup keys: every
	// DedupCleanupInterval, passes of at most 100 × DedupCleanupBatch rows
	// per server back to back while rows are due (Retention).
	LedgerEntries          bool
	LedgerEntriesRetention time.Duration
	// MaxPayloadBytes: larger record values are dead-lettered as
	// payload_too_large without being parsed.
	MaxPayloadBytes int
	// Decoder decodes records of another format than the JSON contract's
	// (internal/event/format); nil: event.Decoder with MaxPayloadBytes.
	// Its *event.DecodeError is a dead letter, format.ErrSkipped a record
	// passed over (Stats.Skipped).
	Decoder RecordDecoder
	// DeadLetterPayloadBytes bounds the prefix of a record's value a dead
	// letter stores (0 stores none; the size and SHA-256 of the whole value
	// are always stored). A server with a small max_allowed_packet may cut
	// it further.
	DeadLetterPayloadBytes int
	// RecoveryInterval is how often in-doubt branches are resolved;
	// DecisionRetention how long decision rows are kept.
	RecoveryInterval  time.Duration
	DecisionRetention time.Duration
	// CommitLogRetention is how long commit log records are kept (pruned
	// after each recovery pass, below the visible position only); 0 keeps
	// them forever.
	CommitLogRetention time.Duration
	// ShutdownTimeout bounds the final checkpoint when Run's context ends.
	ShutdownTimeout time.Duration
	// AllowGroupChange lets Run start a group that has no stored positions
	// on a ledger that holds positions of the topic under other groups.
	// Such a group starts every partition at the beginning of the log:
	// events older than DedupTTL count a second time. Off, Run refuses
	// with a *GroupChangeError.
	AllowGroupChange bool

	// Clock is the ledger's clock (ledgerclock.Clock.Now): every instant
	// another instance judges, or this one judges against another's, is
	// read from it: dedup expiries, the retention of
	// ledger entries, the processing time events are bounded by, the
	// timestamps written. Run the sink on the same clock (txsink.Config's
	// Now). time.Now when nil.
	Clock func() time.Time

	// KafkaOpts are the client's connection options (brokers, TLS, SASL,
	// timeouts); the pipeline adds the consumer-group options it relies on.
	KafkaOpts []kgo.Opt
	// Logger receives the pipeline's logs; slog.Default() when nil.
	Logger *slog.Logger
	// ProgressInterval: a "progress" line is logged at info this often
	// while there is work (see progressLine); 0 logs none.
	ProgressInterval time.Duration
	// CheckSettings, if set, says whether the settings the instance runs
	// on are still the ledger's (package periods: billing periods change
	// must not run beside an instance, and fences every partition when it
	// runs). It is called after every claim of partitions, before anything
	// of them is fetched, and every RecoveryInterval. It returns an error
	// only when the instance must stop (a failure to check is its to log):
	// the instance then stops without checkpointing what it buffered, and
	// Run returns the error. A checkpoint built on a claim older than the
	// change cannot commit (the change raised the epochs), and one built
	// on a newer claim passed the check first.
	CheckSettings func(context.Context) error
	// Waits lists what the pipeline waits for without a bound of its own
	// (the schema registry while it does not answer): logged, on /waits
	// and in billing status. Nil: logged only.
	Waits *waits.Set
	// Changelog: the instance writes the ledger's changelog
	// (docs/changelog.md): every key a checkpoint changes is read under a
	// row lock first, written absolute or inserted, and the checkpoint's
	// changes go to the outbox in its branches (changes.go). Run the sink
	// with txsink.Config.Changelog set alike.
	Changelog bool
	// Hold, if set, says why checkpoints must wait ("" when they need
	// not): the changelog's backlog is full. No checkpoint is taken while
	// it holds (fetching then pauses by the usual backpressure); revokes
	// and the shutdown still checkpoint what they hold.
	Hold func() string

	// OnCheckpoint, if set, is called after every checkpoint attempt, from
	// the goroutine that ran it. It must not block.
	OnCheckpoint func(CheckpointInfo)
	// Failpoints are armed by tests (FailAssignBeforeClaim); nil arms
	// none.
	Failpoints *failpoint.Set
}

// FailAssignBeforeClaim names the failpoint between the recovery and the
// claim of newly assigned partitions, for tests.
const FailAssignBeforeClaim = "assign-before-claim"

func (c *Config) validate() error {
	var errs []error
	if c.Topic == "" || c.Group == "" {
		errs = append(errs, errors.New("Topic and Group are required"))
	}
	for name, d := range map[string]time.Duration{
		"CheckpointInterval": c.CheckpointInterval, "CheckpointTimeout": c.CheckpointTimeout, "DedupTTL": c.DedupTTL,
		"RecoveryInterval": c.RecoveryInterval, "DedupCleanupInterval": c.DedupCleanupInterval,
		"ShutdownTimeout": c.ShutdownTimeout, "DecisionRetention": c.DecisionRetention, "MaxEventTimeSkew": c.MaxEventTimeSkew,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", name))
		}
	}
	if c.CheckpointMaxRecords < 1 || c.CheckpointMaxBytes < 1 || c.MaxPollRecords < 1 || c.DedupCleanupBatch < 1 || c.MaxPayloadBytes < 1 {
		errs = append(errs, errors.New("CheckpointMaxRecords, CheckpointMaxBytes, MaxPollRecords, DedupCleanupBatch and MaxPayloadBytes must be positive"))
	}
	if c.DeadLetterPayloadBytes < 0 {
		errs = append(errs, errors.New("DeadLetterPayloadBytes must not be negative"))
	}
	if c.DedupReadAheadConns < 0 || c.DedupReadAheadConns > MaxReadAheadConns {
		errs = append(errs, fmt.Errorf("DedupReadAheadConns must be between 0 and %d", MaxReadAheadConns))
	}
	if p, ok := c.Window.(event.Period); c.Window == nil || ok && p.IsZero() {
		errs = append(errs, errors.New("Window is required"))
	}
	if c.WindowCloseAfter < 0 || c.LedgerEntriesRetention < 0 || c.CommitLogRetention < 0 {
		errs = append(errs, errors.New("WindowCloseAfter, LedgerEntriesRetention and CommitLogRetention must not be negative"))
	}
	return errors.Join(errs...)
}

// abortAfter is the age past which recovery aborts an undecided branch:
// CheckpointTimeout, by which its coordinator gives up, plus the most two
// instances' clocks can differ (the gtrid carries the coordinator's
// clock), so that no healthy checkpoint is aborted.
func (c *Config) abortAfter() time.Duration { return c.CheckpointTimeout + ledgerclock.Margin }

// dedupTTL is how long a dedup key lives: DedupTTL plus the most two
// instances' clocks can differ (the key's expiry is written by one
// instance and judged, and deleted, by any), so that it never lives less
// than DedupTTL.
func (c *Config) dedupTTL() time.Duration { return c.DedupTTL + ledgerclock.Margin }

// Versions are how long a dedup key lives and how long after an event's
// first version a later one is applied, as the checkpoints classify
// versions by (dedup.ClassifyVersions): for the tools that judge a record
// as the pipeline would (reinject).
func (c *Config) Versions() (keyTTL, horizon time.Duration) { return c.dedupTTL(), c.versionHorizon() }

// versionHorizon is VersionHorizon, or its default, within DedupTTL.
func (c *Config) versionHorizon() time.Duration {
	if c.VersionHorizon <= 0 {
		return c.DedupTTL / 2
	}
	return min(c.VersionHorizon, c.DedupTTL)
}

// fetchOpts bound what the Kafka client buffers by the byte budget: at most
// maxConcurrentFetches fetches of CheckpointMaxBytes/4 each (one of at
// least 1 MiB, so that progress never depends on the budget: a broker
// always returns a partition's first batch, however large).
func (c *Config) fetchOpts() []kgo.Opt {
	const maxConcurrentFetches = 2
	fetch := int32(min(max(c.CheckpointMaxBytes/4, 1<<20), 1<<30))
	return []kgo.Opt{
		kgo.FetchMaxBytes(fetch),
		kgo.FetchMaxPartitionBytes(min(fetch, 1<<20)),
		kgo.MaxConcurrentFetches(maxConcurrentFetches),
	}
}

// CheckpointInfo describes one checkpoint attempt, for metrics and
// benchmarks.
type CheckpointInfo struct {
	Gtrid       string
	Records     int            // records covered (valid and dead-lettered)
	Bytes       int            // memory the records held while buffered
	Counted     int            // events added to the ledger
	Late        int            // of Counted: in window_adjustments, their window closed
	Sealed      int            // billing_windows rows sealed (closed_at set)
	Changes     int            // changes written to the changelog's outbox
	Duplicates  int            // repeats dropped
	DeadLetters map[string]int // by reason
	Partitions  int
	Cuts        []txsink.PartitionCut // where the checkpoint leaves each partition it covers (read-only)
	Careful     bool                  // a retry with per-event overflow checks against stored values
	Started     time.Time
	Duration    time.Duration
	Phases      map[string]time.Duration // dedup, write, prepare, decide, commit
	Err         error                    // nil when committed
	FailedPhase string
	Offsets     string      // on failure: the offsets covered, per partition ("p3:120-4511")
	Decided     bool        // the commit decision is durable (even if Err is a late XA COMMIT failure)
	CommitSeq   int64       // the decision's number in the commit log (0: not decided, or not known)
	Retrying    bool        // Err is the expected refusal of the fast path; the checkpoint is retried at once in careful mode
	Isolation   string      // when Err started an isolation of the records the database refuses: its outcome (Isolation*)
	StepStalled bool        // before this attempt, a step of a live move outlasted half of CheckpointTimeout and is no longer waited for (its mover stopped)
	RecordTimes []time.Time // Kafka timestamps of the records, for end-to-end latency

	skipped bool // a checkpoint without records that found nothing to do
}

// Aborted reports whether the attempt failed before its decision: nothing
// of it committed, and its records are retried or replayed. A decided
// checkpoint whose late XA COMMIT failed is not aborted (recovery rolls it
// forward). Stats.Aborts counts these attempts; metrics labels them by
// cause.
func (info CheckpointInfo) Aborted() bool { return info.Err != nil && !info.Decided }

// RecordDecoder decodes a record's value and headers into an event
// (format.Decoder). Prepare is called with every poll's records before
// they are decoded, outside the pipeline's lock: it does the I/O decoding
// them needs (fetching schemas from a registry), so that Decode needs
// none. While it returns a format.UnavailableError the poll's records are
// held (nothing is decoded, nothing is dead-lettered for it) and Prepare
// is called again after a backoff.
type RecordDecoder interface {
	Prepare(ctx context.Context, recs []*kgo.Record) error
	Decode(ctx context.Context, value []byte, headers []kgo.RecordHeader) (event.Event, error)
}

// Stats are running totals of what the pipeline has committed.
type Stats struct {
	Consumed atomic.Int64 // records taken from Kafka (a replay counts again)
	Skipped  atomic.Int64 // records the decoder passed over (format.ErrSkipped; a replay counts again)
	// RegistryDown is 1 while the schema registry does not answer and a
	// poll's records wait for it; RegistryRetries counts the attempts
	// that found it so.
	RegistryDown    atomic.Int64
	RegistryRetries atomic.Int64
	Counted         atomic.Int64 // events committed to the ledger
	Duplicates      atomic.Int64 // repeats dropped in committed checkpoints
	DeadLetters     atomic.Int64 // dead letters committed
	Checkpoints     atomic.Int64 // checkpoints committed
	Aborts          atomic.Int64 // checkpoint attempts aborted
	LastCheckpoint  atomic.Int64 // Unix nanos of the last committed checkpoint
	AssignedParts   atomic.Int64
	// Pending is the number of records consumed and not yet covered by a
	// decided checkpoint (buffered or in flight): 0 means caught up with
	// everything fetched. PendingBytes is the memory they hold.
	Pending         atomic.Int64
	PendingBytes    atomic.Int64
	RecoveredCommit atomic.Int64 // in-doubt branches rolled forward
	RecoveredAbort  atomic.Int64 // in-doubt branches rolled back
	// The dedup read-ahead (readahead.go): ids looked up ahead of their
	// claim, ids dropped unread (queue full, barrier passed, no
	// generations read yet), and statements that failed.
	ReadAhead        atomic.Int64
	ReadAheadDropped atomic.Int64
	ReadAheadFailed  atomic.Int64
}

// Pipeline consumes the topic as a group member and commits the ledger
// exactly once. See the package documentation for the design.
type Pipeline struct {
	cfg  Config
	log  *slog.Logger
	sink *txsink.Sink
	cl   *kgo.Client
	adm  *kadm.Client
	// topicPartitions: the topic's partition count at the last
	// assignment (0: unknown); guarded by mu.
	topicPartitions int
	dec             *event.Decoder
	recDec          RecordDecoder // nil: dec
	stats           Stats

	// mu guards the partition states and the checkpoint in flight. The
	// poll loop holds it while it processes a poll; the rebalance callbacks
	// hold it while they run (BlockRebalanceOnPoll makes the two
	// alternate); the assignment hook holds it to add partitions.
	mu       sync.Mutex
	parts    map[int32]*partition
	inflight *inflight
	lastSeal time.Time
	lastTick time.Time // of the last event-time tick (see eventTimeTickLocked)

	rewindHold rewindHold // when the next rewind pass may start (after failures)

	// ownMu serializes a rewind pass, whose re-claims must happen while
	// the group still gives the partitions to this member, with the
	// callbacks that take partitions away (onRevoked, onLost); see
	// Pipeline.rewind. Taken before mu.
	ownMu sync.Mutex

	ckpt  *Checkpointer // commits the snapshots the barrier cuts
	pools []driver.Store
	// ahead reads the polled ids' pages ahead of their claim (nil: off).
	ahead *readAhead

	groupMu      sync.Mutex // guards groupPending
	groupPending map[int32]kgo.EpochOffset
	groupSignal  chan struct{}

	// started is closed by Run once the group is checked (checkGroup), and
	// startErr is what the check found. The Kafka client joins the group
	// as soon as it has the topic's metadata, which can be before Run has
	// begun: onAssigned waits here, so that nothing is claimed for a group
	// Run refuses (a claim stores the group's positions, after which the
	// check would let it pass and replay the topic).
	started  chan struct{}
	startErr error

	wake atomic.Pointer[context.CancelFunc] // cancels the poll in progress
	wg   sync.WaitGroup                     // checkpoint goroutines

	// failure is why the instance stops on its own (see
	// Config.CheckSettings); stopRun ends Run's polling for it.
	failure atomic.Pointer[error]
	stopRun atomic.Pointer[context.CancelFunc]
}

// New builds a pipeline over an open sink and the ledger stores of its
// servers (in the sink's order: mysqldriver's Driver.Stores, or memdriver
// servers). The Kafka client is created here and joins the group once it
// has the topic's metadata; it claims no partition before Run has checked
// the group.
func New(cfg Config, sink *txsink.Sink, pools []driver.Store) (*Pipeline, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	p := &Pipeline{
		cfg:    cfg,
		log:    cfg.Logger,
		sink:   sink,
		dec:    event.NewDecoder(cfg.MaxPayloadBytes),
		recDec: cfg.Decoder,
		parts:  map[int32]*partition{},
		pools:  pools,

		groupSignal: make(chan struct{}, 1),
		started:     make(chan struct{}),
	}
	opts := append([]kgo.Opt{}, cfg.KafkaOpts...)
	opts = append(opts, cfg.fetchOpts()...)
	opts = append(opts,
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topic),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Markers are delivered (records of aborted transactions are
		// still dropped): the source moves its position past them.
		kgo.KeepControlRecords(),
		// Positions come from MySQL; an out-of-range one means events were
		// deleted before they were counted: fail loudly, never skip.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.AdjustFetchOffsetsFn(p.onAssigned),
		kgo.OnPartitionsRevoked(p.onRevoked),
		kgo.OnPartitionsLost(p.onLost),
		kgo.WithLogger(kgoLogger{p.log}),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("pipeline: kafka client: %w", err)
	}
	p.cl = cl
	p.adm = kadm.NewClient(cl)
	p.ckpt = newCheckpointer(cfg, sink, pools, &p.stats)
	p.ahead = newReadAhead(cfg, pools, sink, p.ckpt.generations.Load, &p.stats)
	return p, nil
}

// Stats returns the running totals.
func (p *Pipeline) Stats() *Stats { return &p.stats }

// DedupCacheKeys is the number of event ids held in the in-memory dedup
// cache after the last checkpoint.
func (p *Pipeline) DedupCacheKeys() int { return p.ckpt.CacheKeys() }

// Client is the pipeline's Kafka client (for lag metrics).
func (p *Pipeline) Client() *kgo.Client { return p.cl }

// Run consumes until ctx ends, then shuts down: it stops fetching, waits
// for the checkpoint in flight, takes a final checkpoint bounded by
// ShutdownTimeout, and leaves the group. It returns nil after a clean
// shutdown; whatever it could not commit is replayed by the next owner.
func (p *Pipeline) Run(ctx context.Context) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	p.stopRun.Store(&stop)
	err := p.checkGroup(ctx)
	p.startErr = err
	close(p.started)
	if err != nil {
		p.cl.Close()
		return err
	}
	if res, err := p.sink.Recover(ctx, p.cfg.abortAfter()); err != nil {
		p.log.Warn("recovery at start incomplete; retried in the background", "err", err)
	} else {
		p.recovered(res)
	}
	hctx, stopHousekeeping := context.WithCancel(context.WithoutCancel(ctx))
	var hk sync.WaitGroup
	hk.Add(5)
	go func() {
		defer hk.Done()
		p.housekeeping(hctx)
	}()
	go func() {
		defer hk.Done()
		p.ckpt.followSteps(hctx)
	}()
	go func() {
		defer hk.Done()
		p.ahead.run(hctx)
	}()
	go func() {
		defer hk.Done()
		p.progress(hctx)
	}()
	go func() {
		defer hk.Done()
		p.groupCommitter(hctx)
	}()

	p.poll(ctx)

	// Shutdown: the final checkpoint, then leave the group (Close revokes,
	// and onRevoked commits whatever is still buffered); stopped for a
	// failure, nothing more is checkpointed.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.ShutdownTimeout)
	defer cancel()
	if p.failure.Load() == nil {
		p.mu.Lock()
		p.drainLocked(sctx)
		p.mu.Unlock()
	}
	done := make(chan struct{})
	go func() {
		p.cl.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-sctx.Done():
		p.log.Error("leaving the group did not finish within SHUTDOWN_TIMEOUT")
	}
	p.wg.Wait()
	stopHousekeeping()
	hk.Wait()
	// No checkpoint of this instance from here: a live move's steps need
	// not wait for it.
	lctx, cancelLeave := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	if err := p.sink.LeaveMove(lctx); err != nil {
		p.log.Warn("cannot record for the live move that this instance stopped (its next steps wait for it a while)", "err", err)
	}
	cancelLeave()
	if f := p.failure.Load(); f != nil {
		return *f
	}
	return nil
}

// checkSettings runs Config.CheckSettings; an error stops the instance.
func (p *Pipeline) checkSettings(ctx context.Context) error {
	if p.cfg.CheckSettings == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := p.cfg.CheckSettings(ctx)
	if err != nil {
		p.fail(err)
	}
	return err
}

// fail stops the instance for err, once: polling ends, and nothing more
// is checkpointed.
func (p *Pipeline) fail(err error) {
	if !p.failure.CompareAndSwap(nil, &err) {
		return
	}
	p.log.Error("stopping", "err", err)
	if stop := p.stopRun.Load(); stop != nil {
		(*stop)()
	}
	p.wakePoll()
}

// GroupChangeError refuses to start a consumer group without stored
// positions on a ledger whose topic has positions under other groups (a
// renamed KAFKA_GROUP): it would replay the topic from its start.
type GroupChangeError struct {
	Group, Topic string
	Stored       []string // the groups with positions stored for the topic
}

func (e *GroupChangeError) Error() string {
	return fmt.Sprintf("consumer group %q has no positions stored for topic %q, but this ledger holds positions of that topic under %q: "+
		"starting it would replay the topic from its beginning, and events older than DEDUP_TTL would count twice. "+
		"Use the group that wrote this ledger (KAFKA_GROUP), or set ALLOW_GROUP_CHANGE=true to replay deliberately", e.Group, e.Topic, e.Stored)
}

// checkGroup refuses a group change unless it is allowed (see
// Config.AllowGroupChange).
func (p *Pipeline) checkGroup(ctx context.Context) error {
	groups, err := p.sink.Groups(ctx)
	if err != nil {
		return fmt.Errorf("pipeline: %w", err)
	}
	if len(groups) == 0 || slices.Contains(groups, p.cfg.Group) {
		return nil
	}
	if p.cfg.AllowGroupChange {
		p.log.Warn("starting a consumer group without stored positions on a ledger that has them under other groups: the topic is replayed from its start (ALLOW_GROUP_CHANGE)",
			"group", p.cfg.Group, "stored_groups", groups)
		return nil
	}
	return &GroupChangeError{Group: p.cfg.Group, Topic: p.cfg.Topic, Stored: groups}
}

func (p *Pipeline) recovered(r txsink.RecoveryResult) {
	p.stats.RecoveredCommit.Add(int64(r.Committed))
	p.stats.RecoveredAbort.Add(int64(r.RolledBack))
}

// kgoLogger forwards franz-go's warnings and errors to slog.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelWarn
	if level == kgo.LogLevelError {
		lv = slog.LevelError
	}
	k.l.Log(context.Background(), lv, "kafka: "+msg, keyvals...)
}

// Features returns the features of the store the configuration runs (the
// store declares its privileges by feature: mysqldriver.Access).
func (c Config) Features() map[driver.Feature]bool {
	return map[driver.Feature]bool{
		driver.FeatureAlways:    true,
		driver.FeatureClosing:   c.WindowCloseAfter > 0,
		driver.FeatureEntries:   c.LedgerEntries,
		driver.FeatureRetention: c.LedgerEntries && c.LedgerEntriesRetention > 0,
		driver.FeatureChangelog: c.Changelog,
	}
}
