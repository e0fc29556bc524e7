package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/bench/naive"
	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/service"
	"github.com/billing/ledger/internal/txsink"
)

// Every variant of the measurement runs in a child process of the bench
// command (the same binary, re-executed with -child), so that its peak RSS
// is its own. The parent and the child talk over pipes:
//
//	child → parent (stdout): "BENCH caught-up <json>", "BENCH result <json>"
//	parent → child (stdin):  "live-start", "live-end <records>", "stop"
//
// The catch-up phase consumes the pre-produced topic as fast as possible
// (throughput, checkpoint durations, round trips). The live phase, for the
// naive job and the service, follows records that the parent produces at a
// fixed rate while the child runs (end-to-end latency).

// Modes.
const (
	modeConsume = "consume-only"
	modeSink    = "sink-only"
	modeNaive   = "naive"
	modeService = "service"
	// modeServicePlain is the service without the changelog, measured by
	// the parent beside the changelog variant's service (the child runs
	// it as modeService).
	modeServicePlain = "service-plain"
)

type childSpec struct {
	Mode        string            `json:"mode"`
	Brokers     []string          `json:"brokers"`
	Topic       string            `json:"topic"`
	Group       string            `json:"group"`
	DSN         string            `json:"dsn"` // through countingNet
	Records     int64             `json:"records"`
	Ends        map[int32]int64   `json:"ends"`
	LiveTopic   string            `json:"live_topic"` // empty, same partitions
	ServiceEnv  map[string]string `json:"service_env"`
	NaiveBatch  int               `json:"naive_batch"`
	NaiveWait   time.Duration     `json:"naive_wait"`
	SinkChunk   int               `json:"sink_chunk"`
	Timeout     time.Duration     `json:"timeout"`
	Watch       map[string]int    `json:"watch"`     // local server processes whose CPU is sampled
	MemLimit    int64             `json:"mem_limit"` // service mode: Go soft memory limit unless GOMEMLIMIT is set; 0: none
	CPUProfile  string            `json:"cpu_profile"`
	HeapProfile string            `json:"heap_profile"`
	// SteadyKeys dedup keys are stored right before the catch-up in the
	// previous generation's table, and as many expired ones in the table
	// the upkeep then empties (steady-state variant, steady.go).
	SteadyKeys int64 `json:"steady_keys"`
	// SampleTables are counted while the catch-up runs (the
	// steady-state-entries variant, tables.go).
	SampleTables []string `json:"sample_tables,omitempty"`
	// Replay: sink-only feeds these checkpoints (partition → next offset,
	// the service's cuts; see replay.go) instead of cutting the topic.
	Replay []map[int32]int64 `json:"replay,omitempty"`
	// MarkAt: once this many records of the catch-up are committed, the
	// child reports "BENCH mark {records}" (the add-server variant starts
	// its move then, grow.go), and its result holds the catch-up's
	// checkpoints (Series).
	MarkAt int64 `json:"mark_at,omitempty"`
}

// childResult is what a child reports.
type childResult struct {
	Mode      string  `json:"mode"`
	Records   int64   `json:"records"`    // catch-up records consumed or committed
	CatchUpS  float64 `json:"catch_up_s"` // wall time of the catch-up, start-up included
	TimedOut  bool    `json:"timed_out"`
	Failed    int     `json:"failed_attempts"`
	Invalid   int64   `json:"invalid,omitempty"`
	CatchUp   unitStats
	CPU       map[string]float64 `json:"cpu_cores"` // during the catch-up
	RoundTrip float64            `json:"round_trips_per_unit"`
	RTKinds   map[string]float64 `json:"round_trips_per_unit_by_kind"`
	Cuts      []map[int32]int64  `json:"cuts,omitempty"` // service: its catch-up checkpoints' cuts, for sink-only to replay
	// Series: the catch-up's checkpoints in commit order (the service's,
	// and any with MarkAt).
	Series []seriesPoint `json:"series,omitempty"`
	// Steady-state: keys the catch-up inserted, and stored keys deleted by
	// the end of the catch-up.
	SteadyInserted int64 `json:"steady_inserted,omitempty"`
	SteadyDeleted  int64 `json:"steady_deleted,omitempty"`
	// Tables: the row counts of SampleTables during the catch-up;
	// LiveTables during the live phase, where the input comes at the
	// steady -live-rate the ledger keeps up with (what the cleanup must
	// keep bounded in production, beside a catch-up at full speed).
	Tables     map[string]rowStats `json:"tables,omitempty"`
	LiveTables map[string]rowStats `json:"live_tables,omitempty"`

	LiveRecords int64     `json:"live_records"`
	Live        unitStats `json:"live"`
	LatP50      float64   `json:"latency_p50_ms"`
	LatP99      float64   `json:"latency_p99_ms"`
	LatMax      float64   `json:"latency_max_ms"`
	LiveRT      float64   `json:"live_round_trips_per_unit"`
	LiveTimeout bool      `json:"live_timed_out"`

	// The changelog variant: from a checkpoint's commit in MySQL to its
	// changes visible to a read_committed consumer (changelog.go).
	ChangelogP50 float64 `json:"changelog_visible_p50_ms,omitempty"`
	ChangelogP99 float64 `json:"changelog_visible_p99_ms,omitempty"`
	ChangelogN   int     `json:"changelog_checkpoints_seen,omitempty"`
	// The same in the live phase (checkpoints of CHECKPOINT_INTERVAL).
	ChangelogLiveP50 float64 `json:"changelog_live_visible_p50_ms,omitempty"`
	ChangelogLiveP99 float64 `json:"changelog_live_visible_p99_ms,omitempty"`
	ChangelogLiveN   int     `json:"changelog_live_checkpoints_seen,omitempty"`

	// IO: InnoDB's IO counters over the catch-up (iostats.go).
	IO *innodbIO `json:"innodb,omitempty"`

	PeakRSSMiB float64 `json:"peak_rss_mib"`
	Err        string  `json:"error,omitempty"`
}

// collector gathers units from the OnCheckpoint / OnBatch hooks.
type collector struct {
	mu        sync.Mutex
	live      bool
	liveStart time.Time
	committed int64
	inserted  int64 // keys inserted (events counted) in the catch-up
	catchUp   []unit
	liveUnits []unit
	lat       []float64
	failed    int
	changed   chan struct{}
	// onMark, if not nil, is called once, when the catch-up's committed
	// records first reach markAt (childSpec.MarkAt).
	markAt int64
	onMark func(committed int64)
}

func newCollector() *collector { return &collector{changed: make(chan struct{}, 1)} }

func (c *collector) add(u unit, visible time.Time, times []time.Time) {
	c.mu.Lock()
	c.committed += int64(u.records)
	if c.live {
		c.liveUnits = append(c.liveUnits, u)
		for _, ts := range times {
			if !ts.Before(c.liveStart) {
				c.lat = append(c.lat, ms(visible.Sub(ts)))
			}
		}
	} else {
		c.catchUp = append(c.catchUp, u)
		c.inserted += int64(u.counted)
	}
	var mark func(int64)
	if !c.live && c.onMark != nil && c.committed >= c.markAt {
		mark, c.onMark = c.onMark, nil
	}
	committed := c.committed
	c.mu.Unlock()
	if mark != nil {
		mark(committed)
	}
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

func (c *collector) fail() {
	c.mu.Lock()
	c.failed++
	c.mu.Unlock()
}

func (c *collector) startLive() {
	c.mu.Lock()
	c.liveStart = time.Now()
	c.mu.Unlock()
}

func (c *collector) total() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.committed
}

// waitFor waits until n records are committed; false on timeout.
func (c *collector) waitFor(n int64, timeout time.Duration) bool {
	deadline := time.After(timeout)
	for c.total() < n {
		select {
		case <-c.changed:
		case <-deadline:
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
	return true
}

// ChildFlag is the flag under which Run re-executes the running binary:
// `<binary> -child <arg>`, arg for Child.
const ChildFlag = "child"

// childBurn is the arg of the background load's process (-load).
const childBurn = "burn"

// Child is the child process's side of Run: arg is what the parent passed
// after -child. It runs one measurement and reports it on stdout, or
// spins as the background load until killed.
func Child(arg string) error {
	if arg == childBurn {
		burn()
		return nil
	}
	var spec childSpec
	if err := json.Unmarshal([]byte(arg), &spec); err != nil {
		return &specError{err}
	}
	return child(spec)
}

// specError is a -child arg that is not a measurement's spec.
type specError struct{ err error }

func (e *specError) Error() string { return e.err.Error() }
func (e *specError) Unwrap() error { return e.err }

// ChildExitCode is the exit status of a child that Child failed with err:
// 2 when its arg was not a spec (a usage error), 1 otherwise.
func ChildExitCode(err error) int {
	if _, ok := errors.AsType[*specError](err); ok {
		return 2
	}
	return 1
}

// child runs one mode and writes its reports to stdout.
func child(spec childSpec) error {
	roundTrips := registerCountingNet()
	dsn := spec.DSN
	if dsn == "" {
		dsn = "bench:bench@tcp(127.0.0.1:3306)/unused"
	}
	cfg, err := serviceConfig(spec.ServiceEnv, spec.Brokers, dsn)
	if err != nil {
		return err
	}
	cfg.KafkaTopic, cfg.KafkaGroup = spec.Topic, spec.Group
	if _, ok := os.LookupEnv("GOMEMLIMIT"); !ok && spec.Mode == modeService && spec.MemLimit > 0 {
		debug.SetMemoryLimit(spec.MemLimit) // as cmd/billing does
	}
	in := bufio.NewScanner(os.Stdin)
	cmds := make(chan string, 4)
	go func() {
		for in.Scan() {
			cmds <- in.Text()
		}
		close(cmds)
	}()
	var res childResult
	switch spec.Mode {
	case modeConsume:
		res, err = consumeOnly(spec)
	case modeSink:
		res, err = sinkOnly(spec, cfg, roundTrips)
	case modeNaive, modeService:
		res, err = streaming(spec, cfg, cmds, roundTrips)
	case modeInstance:
		res, err = instanceChild(spec, cfg, cmds)
	default:
		return fmt.Errorf("unknown mode %q", spec.Mode)
	}
	if err != nil {
		res.Err = err.Error()
	}
	res.Mode = spec.Mode
	res.PeakRSSMiB = peakRSS()
	report("result", res)
	return nil
}

// logCheckpoint writes one line per checkpoint attempt to the child's log.
func logCheckpoint(info pipeline.CheckpointInfo) {
	errText := ""
	if info.Err != nil {
		errText = info.Err.Error()
	}
	phases := map[string]float64{}
	for k, v := range info.Phases {
		phases[k] = ms(v)
	}
	b, _ := json.Marshal(map[string]any{"gtrid": info.Gtrid, "records": info.Records, "counted": info.Counted,
		"duplicates": info.Duplicates, "partitions": info.Partitions, "careful": info.Careful, "ms": ms(info.Duration),
		"phases_ms": phases, "decided": info.Decided, "failed_phase": info.FailedPhase, "err": errText})
	fmt.Fprintf(os.Stderr, "checkpoint %s\n", b)
}

func report(kind string, v any) {
	b, _ := json.Marshal(v)
	fmt.Printf("BENCH %s %s\n", kind, b)
}

// childLogger logs to the child's log file, at info (the service logs
// little at info: assignments, revocations, failures).
func childLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// consumeOnly reads the topic from the start to the end offsets with a plain
// franz-go consumer assigned every partition (read_committed, as the
// service), and does nothing else with the records.
func consumeOnly(spec childSpec) (childResult, error) {
	var res childResult
	start := time.Now()
	cpu := newCPUMeter(spec.Watch)
	cl, err := topicReader(spec)
	if err != nil {
		return res, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), spec.Timeout)
	defer cancel()
	next := map[int32]int64{}
	var units []unit

	done := func() bool {
		for p, end := range spec.Ends {
			if next[p] < end {
				return false
			}
		}
		return true
	}
	for !done() {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			res.TimedOut = true
			break
		}
		if err := fs.Err0(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return res, err
		}
		n := 0
		fs.EachRecord(func(r *kgo.Record) {
			n++
			next[r.Partition] = r.Offset + 1
		})
		if n > 0 {
			units = append(units, unit{end: time.Now(), records: n})
			res.Records += int64(n)
		}
	}
	res.CatchUpS = time.Since(start).Seconds()
	res.CPU = cpu.cores()
	res.CatchUp = summarize(units, start)
	res.CatchUp.P50, res.CatchUp.P99, res.CatchUp.Max = 0, 0, 0 // a poll has no meaningful duration
	return res, nil
}

// topicReader is a plain consumer of every partition of the topic from its
// start, read_committed, as the service reads it (no group).
func topicReader(spec childSpec) (*kgo.Client, error) {
	assign := map[int32]kgo.Offset{}
	for p := range spec.Ends {
		assign[p] = kgo.NewOffset().AtStart()
	}
	return kgo.NewClient(kgo.SeedBrokers(spec.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{spec.Topic: assign}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
}

// topicChunks reads the topic and decodes it, in poll order (the order the
// service sees it in), a chunk at a time: the sink-only limit holds one
// chunk in memory, not the topic.
type topicChunks struct {
	cl      *kgo.Client
	dec     *event.Decoder
	ends    map[int32]int64
	next    map[int32]int64
	pending []pipeline.Record
	invalid int64
}

func newTopicChunks(spec childSpec, maxPayload int) (*topicChunks, error) {
	cl, err := topicReader(spec)
	if err != nil {
		return nil, err
	}
	return &topicChunks{cl: cl, dec: event.NewDecoder(maxPayload), ends: spec.Ends, next: map[int32]int64{}}, nil
}

func (c *topicChunks) done() bool {
	for p, end := range c.ends {
		if c.next[p] < end {
			return false
		}
	}
	return true
}

// chunk returns the next n decoded records (fewer at the end, none after).
func (c *topicChunks) chunk(ctx context.Context, n int) ([]pipeline.Record, error) {
	for len(c.pending) < n && !c.done() {
		fs := c.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("reading the topic: %w", ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			c.next[r.Partition] = r.Offset + 1
			ev, err := c.dec.Decode(r.Value)
			if err != nil {
				c.invalid++
				return
			}
			c.pending = append(c.pending, pipeline.Record{Event: ev, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp})
		})
	}
	k := min(n, len(c.pending))
	out := slices.Clone(c.pending[:k])
	c.pending = slices.Delete(c.pending, 0, k)
	return out, nil
}

// openLedger opens the benchmark's ledger as the service opens its own
// (service.OpenLedger: migrations checked, grants checked, the sink on the
// ledger's clock) and stores or checks the period settings, and returns
// the pipeline configuration the service would run with, hooked to
// onCheckpoint.
func openLedger(ctx context.Context, cfg config.Config, onCheckpoint func(pipeline.CheckpointInfo)) (*service.Ledger, pipeline.Config, error) {
	log := childLogger()
	if cfg.ChangelogTopicPrefix != "" {
		// Its checkpoints would fill an outbox nobody publishes.
		return nil, pipeline.Config{}, fmt.Errorf("sink-only has no publisher: CHANGELOG_TOPIC_PREFIX must be empty (the changelog variant measures the service)")
	}
	dsns, err := service.ResolveDSNs(cfg, log)
	if err != nil {
		return nil, pipeline.Config{}, err
	}
	l, err := service.OpenLedger(ctx, cfg, dsns, nil, log, nil)
	if err != nil {
		return nil, pipeline.Config{}, err
	}
	_, schedule, err := l.Periods(ctx, cfg, log)
	if err != nil {
		l.Close()
		return nil, pipeline.Config{}, err
	}
	pc := service.PipelineConfig(cfg, nil, log, onCheckpoint)
	pc.Clock, pc.Window = l.Clock.Now, schedule
	return l, pc, nil
}

// sinkOnly feeds checkpoints to the checkpoint protocol without Kafka in
// the timed part: what MySQL sustains for the service's statements. It is
// the MySQL side of the limit, so it must bound the service from above: the
// same checkpoints (the service's, replayed: replay.go) through the same
// Checkpointer, no coordination (no poll loop, no barrier, no rebalance),
// and no memory pressure (one checkpoint decoded at a time, no soft memory
// limit). Only the checkpoints are timed: the units are laid end to end on
// a clock that stops while the next checkpoint's records are read and
// decoded.
func sinkOnly(spec childSpec, cfg config.Config, roundTrips *sqlCounter) (childResult, error) {
	var res childResult
	next, invalid, closeSource, err := sinkSource(spec, cfg)
	if err != nil {
		return res, err
	}
	defer closeSource()
	ctx, cancel := context.WithTimeout(context.Background(), spec.Timeout)
	defer cancel()
	col := newCollector()
	var busy time.Duration // checkpoint time so far: the stopped clock
	start := time.Now()
	l, pc, err := openLedger(ctx, cfg, func(info pipeline.CheckpointInfo) {
		logCheckpoint(info)
		busy += info.Duration
		if info.Err != nil && !info.Decided {
			col.fail()
			return
		}
		col.add(unit{end: start.Add(busy), dur: info.Duration, records: info.Records, counted: info.Counted, phases: info.Phases}, time.Time{}, nil)
	})
	if err != nil {
		return res, err
	}
	defer l.Close()
	var parts []int32
	for p := range spec.Ends {
		parts = append(parts, p)
	}
	pos, err := l.Sink.Claim(ctx, parts)
	if err != nil {
		return res, err
	}
	var steady *steadyKeys
	if spec.SteadyKeys > 0 {
		if steady, err = storeSteadyKeys(ctx, spec.DSN, spec.SteadyKeys, pc.DedupTTL); err != nil {
			return res, err
		}
		defer steady.close()
	}
	// The cleanup (the upkeep of the dedup keys' generations, the
	// retention of ledger entries) runs
	// beside the checkpoints, as in the service.
	jctx, stopCleanup := context.WithCancel(ctx)
	var cleanup sync.WaitGroup
	defer cleanup.Wait()
	defer stopCleanup()
	cleanup.Go(func() { pipeline.Cleanup(jctx, pc, l.Sink, l.Driver.Stores()) })
	bc, err := pipeline.NewCheckpointer(pc, l.Sink, l.Driver.Stores())
	if err != nil {
		return res, err
	}
	rt0, kinds0 := roundTrips.snapshot()
	cpu := newCPUMeter(spec.Watch)
	iom := newIOMeter(spec.DSN)
	stopSampling, err := startSampling(spec)
	if err != nil {
		return res, err
	}
	for {
		cpu.pause()
		recs, cut, err := next(ctx)
		cpu.resume()
		if err != nil {
			res.TimedOut = true
			break
		}
		if len(cut) == 0 {
			break
		}
		var cuts []txsink.PartitionCut
		for _, p := range parts {
			if n, ok := cut[p]; ok {
				cuts = append(cuts, txsink.PartitionCut{Partition: p, Epoch: pos[p].Epoch, NextOffset: n})
			}
		}
		for {
			decided, err := bc.Checkpoint(ctx, recs, cuts)
			if decided || ctx.Err() != nil {
				break
			}
			slog.Warn("sink-only checkpoint failed; retrying it", "err", err)
		}
		if ctx.Err() != nil {
			res.TimedOut = true
			break
		}
	}
	if cfg.WindowCloseAfter > 0 && ctx.Err() == nil {
		// The service seals the windows closed by its last checkpoint in
		// one taken for that alone: so does this loop.
		if _, err := bc.Checkpoint(ctx, nil, nil); err != nil {
			slog.Warn("sink-only sealing checkpoint failed", "err", err)
		}
	}
	res.Tables = stopSampling()
	if err := steadyResult(ctx, steady, col, &res); err != nil {
		return res, err
	}
	res.Invalid = invalid()
	res.CatchUpS = busy.Seconds()
	res.CPU = cpu.cores()
	res.IO = iom.done()
	rt1, kinds1 := roundTrips.snapshot()
	res.Records = col.total()
	res.Failed = col.failed
	res.CatchUp = summarize(col.catchUp, start)
	res.RoundTrip, res.RTKinds = perUnit(rt1-rt0, kinds0, kinds1, len(col.catchUp))
	return res, nil
}

// steadyResult records the steady-state figures of the catch-up.
func steadyResult(ctx context.Context, steady *steadyKeys, col *collector, res *childResult) error {
	if steady == nil {
		return nil
	}
	col.mu.Lock()
	res.SteadyInserted = col.inserted
	col.mu.Unlock()
	var err error
	res.SteadyDeleted, err = steady.deleted(ctx)
	return err
}

// sinkSource is where sink-only's checkpoints come from: the service's
// cuts replayed when the spec has them, else the topic cut in poll order
// every SinkChunk records. next returns a checkpoint's records and its cut
// (partition → next offset), an empty cut after the last.
func sinkSource(spec childSpec, cfg config.Config) (next func(context.Context) ([]pipeline.Record, map[int32]int64, error), invalid func() int64, closeFn func(), err error) {
	if len(spec.Replay) > 0 {
		r, err := newCutReplay(spec, cfg.MaxPayloadBytes)
		if err != nil {
			return nil, nil, nil, err
		}
		return r.chunk, func() int64 { return r.invalid }, r.close, nil
	}
	chunks, err := newTopicChunks(spec, cfg.MaxPayloadBytes)
	if err != nil {
		return nil, nil, nil, err
	}
	next = func(ctx context.Context) ([]pipeline.Record, map[int32]int64, error) {
		recs, err := chunks.chunk(ctx, spec.SinkChunk)
		if err != nil || len(recs) == 0 {
			return nil, nil, err
		}
		cut := map[int32]int64{}
		for _, r := range recs {
			cut[r.Partition] = r.Offset + 1
		}
		return recs, cut, nil
	}
	return next, func() int64 { return chunks.invalid }, chunks.cl.Close, nil
}

func perUnit(total int64, before, after map[string]int64, units int) (float64, map[string]float64) {
	if units == 0 {
		return 0, nil
	}
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = float64(d) / float64(units)
		}
	}
	return float64(total) / float64(units), out
}

// instance is a running naive job or service.
type instance struct {
	runErr chan error
	cancel context.CancelFunc
	close  func()
	ready  func() bool // assigned and fetching
}

// stop ends the instance and returns Run's error.
func (in *instance) stop() error {
	in.cancel()
	var err error
	select {
	case err = <-in.runErr:
	case <-time.After(time.Minute):
		err = errors.New("did not stop within a minute")
	}
	in.close()
	return err
}

// start runs the naive job or the service on topic, reporting to col.
// onStart, if not nil, is called once the instance starts consuming: for
// the service when its pipeline starts, after the service's start-up
// checks (the old child skipped them: the catch-up is timed from here, so
// that its figures stay those of the pipeline), for the naive job at once.
func start(spec childSpec, cfg config.Config, topic, group string, col *collector, onStart func()) (*instance, error) {
	if onStart == nil {
		onStart = func() {}
	}
	cfg.KafkaTopic, cfg.KafkaGroup = topic, group
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{runErr: make(chan error, 1), cancel: cancel}
	var run func() error
	switch spec.Mode {
	case modeNaive:
		db, err := naive.OpenDB(spec.DSN)
		if err != nil {
			cancel()
			return nil, err
		}
		j, err := naive.New(ctx, naive.Config{
			Topic: topic, Consumer: group, KafkaOpts: []kgo.Opt{kgo.SeedBrokers(cfg.KafkaBrokers...)},
			BatchRecords: spec.NaiveBatch, BatchWait: spec.NaiveWait, BillingWindow: cfg.Period().Size(), // fixed windows only
			MaxPayloadBytes: cfg.MaxPayloadBytes, Logger: childLogger(),
			OnBatch: func(b naive.BatchInfo) {
				col.add(unit{end: time.Now(), dur: b.Duration, records: b.Records, phases: b.Phases}, b.Visible, b.RecordTimes)
			},
		}, db)
		if err != nil {
			cancel()
			db.Close()
			return nil, err
		}
		run = func() error { return j.Run(ctx) }
		onStart()
		in.close = func() { j.Close(); db.Close() }
		in.ready = func() bool { return true } // assigned at New
	case modeService:
		// The service as it ships (service.Run): TLS, SASL and the client
		// id as configured, the migrations and grants checked, the
		// ledger's clock and period settings, metrics and health; only
		// HTTP_ADDR is empty.
		var started atomic.Pointer[pipeline.Pipeline]
		o := service.Options{Logger: childLogger(), OnStart: func(p *pipeline.Pipeline) {
			started.Store(p)
			onStart()
		}, OnCheckpoint: func(info pipeline.CheckpointInfo) {
			logCheckpoint(info)
			if info.Err != nil && !info.Decided {
				col.fail()
				return
			}
			now := time.Now()
			cut := map[int32]int64{}
			for _, c := range info.Cuts {
				cut[c.Partition] = c.NextOffset
			}
			col.add(unit{end: now, dur: info.Duration, records: info.Records, counted: info.Counted, phases: info.Phases, cut: cut}, now, info.RecordTimes)
		}}
		run = func() error { return service.Run(ctx, cfg, o) }
		in.close = func() {}
		parts := int64(len(spec.Ends))
		in.ready = func() bool {
			p := started.Load()
			return p != nil && p.Stats().AssignedParts.Load() == parts
		}
	}
	go func() { in.runErr <- run() }()
	return in, nil
}

// streaming runs the naive job or the service: the catch-up on the
// workload topic, then, on an empty topic of its own (so that no live
// record ever reaches another mode's catch-up), a fresh instance in the
// same process and database, fed live by the parent.
func streaming(spec childSpec, cfg config.Config, cmds <-chan string, roundTrips *sqlCounter) (childResult, error) {
	var res childResult
	col := newCollector()
	if spec.MarkAt > 0 {
		col.markAt, col.onMark = spec.MarkAt, func(n int64) { report("mark", map[string]int64{"records": n}) }
	}
	var steady *steadyKeys
	if spec.SteadyKeys > 0 && spec.Mode == modeService {
		var err error
		if steady, err = storeSteadyKeys(context.Background(), spec.DSN, spec.SteadyKeys, cfg.DedupTTL); err != nil {
			return res, err
		}
		defer steady.close()
	}
	stopSampling, err := startSampling(spec)
	if err != nil {
		return res, err
	}
	stopProfile := startCPUProfile(spec.CPUProfile)
	cpu := newCPUMeter(spec.Watch)
	iom := newIOMeter(spec.DSN)
	mark := startMark{roundTrips: roundTrips} // storing the steady keys is not the catch-up's
	mark.take()
	vis, err := watchVisibility(cfg)
	if err != nil {
		return res, err
	}
	defer vis.close()
	in, err := start(spec, cfg, spec.Topic, spec.Group, col, mark.take)
	if err != nil {
		return res, err
	}
	caughtUp := waitOrFail(col, spec.Records, spec.Timeout, in.runErr)
	begin, rt0, kinds0 := mark.get()
	res.CatchUpS = time.Since(begin).Seconds()
	res.CPU = cpu.cores()
	res.IO = iom.done()
	if vis != nil {
		time.Sleep(2 * time.Second) // the last checkpoints' transactions
		res.ChangelogP50, res.ChangelogP99, res.ChangelogN = vis.take()
	}
	res.Tables = stopSampling()
	if err := steadyResult(context.Background(), steady, col, &res); err != nil {
		return res, err
	}
	stopProfile()
	writeHeapProfile(spec.HeapProfile)
	rt1, kinds1 := roundTrips.snapshot()
	if err := in.stop(); err != nil {
		res.Err = err.Error()
	}
	col.mu.Lock()
	res.Records, res.Failed = col.committed, col.failed
	res.CatchUp = summarize(col.catchUp, begin)
	res.RoundTrip, res.RTKinds = perUnit(rt1-rt0, kinds0, kinds1, len(col.catchUp))
	if spec.Mode == modeService {
		for _, u := range col.catchUp {
			if u.records > 0 {
				res.Cuts = append(res.Cuts, u.cut)
			}
		}
	}
	if spec.MarkAt > 0 || spec.Mode == modeService {
		for _, u := range col.catchUp {
			res.Series = append(res.Series, seriesPoint{EndNs: u.end.UnixNano(), Records: u.records})
		}
	}
	col.mu.Unlock()
	res.TimedOut = !caughtUp
	res.Mode = spec.Mode

	var live *instance
	if caughtUp && res.Err == "" && spec.LiveTopic != "" {
		col.mu.Lock()
		col.live, col.committed = true, 0
		col.mu.Unlock()
		live, err = start(spec, cfg, spec.LiveTopic, spec.Group+"-live", col, nil)
		if err != nil {
			res.Err = "live instance: " + err.Error()
		} else {
			deadline := time.Now().Add(time.Minute)
			for !live.ready() && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	report("caught-up", res)
	if live == nil {
		return res, nil
	}
	defer func() {
		if err := live.stop(); err != nil && res.Err == "" {
			res.Err = err.Error()
		}
	}()
	stopLiveSampling := func() map[string]rowStats { return nil }
	for cmd := range cmds {
		switch {
		case cmd == "live-start":
			if stop, err := startSampling(spec); err != nil {
				childLogger().Warn("counting rows in the live phase", "err", err)
			} else {
				stopLiveSampling = stop
			}
			col.startLive()
			vis.take() // the live phase's checkpoints only
		case strings.HasPrefix(cmd, "live-end "):
			n, _ := strconv.ParseInt(strings.TrimPrefix(cmd, "live-end "), 10, 64)
			res.LiveRecords = n
			rt0, _ := roundTrips.snapshot()
			ok := waitOrFail(col, n, spec.Timeout, live.runErr)
			rt1, _ := roundTrips.snapshot()
			res.LiveTables = stopLiveSampling()
			if vis != nil {
				time.Sleep(2 * time.Second) // the last checkpoints' transactions
				res.ChangelogLiveP50, res.ChangelogLiveP99, res.ChangelogLiveN = vis.take()
			}
			col.mu.Lock()
			res.LiveTimeout = !ok
			res.Live = summarize(col.liveUnits, col.liveStart)
			lat := col.lat
			res.LatP50, res.LatP99 = quantile(lat, 0.5), quantile(lat, 0.99)
			if len(lat) > 0 {
				res.LatMax = lat[len(lat)-1]
			}
			if len(col.liveUnits) > 0 {
				res.LiveRT = float64(rt1-rt0) / float64(len(col.liveUnits))
			}
			res.Failed = col.failed
			col.mu.Unlock()
			return res, nil
		case cmd == "stop":
			return res, nil
		}
	}
	return res, nil
}

// startMark is when a catch-up starts and the SQL round trips so far.
type startMark struct {
	roundTrips *sqlCounter
	mu         sync.Mutex
	at         time.Time
	rt         int64
	kinds      map[string]int64
}

func (m *startMark) take() {
	rt, kinds := m.roundTrips.snapshot()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.at, m.rt, m.kinds = time.Now(), rt, kinds
}

func (m *startMark) get() (time.Time, int64, map[string]int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.at, m.rt, m.kinds
}

// waitOrFail waits until n records are committed, the timeout passes, or
// the job fails.
func waitOrFail(col *collector, n int64, timeout time.Duration, runErr chan error) bool {
	ok := make(chan bool, 1)
	go func() { ok <- col.waitFor(n, timeout) }()
	select {
	case r := <-ok:
		return r
	case err := <-runErr:
		runErr <- err // for finish
		return false
	}
}

func startCPUProfile(path string) func() {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		slog.Warn("cpu profile", "err", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		slog.Warn("cpu profile", "err", err)
		f.Close()
		return func() {}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
		})
	}
}

func writeHeapProfile(path string) {
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		slog.Warn("heap profile", "err", err)
		return
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		slog.Warn("heap profile", "err", err)
	}
}

// startSampling starts counting the rows of spec.SampleTables (none: stop
// returns nil).
func startSampling(spec childSpec) (stop func() map[string]rowStats, err error) {
	if len(spec.SampleTables) == 0 {
		return func() map[string]rowStats { return nil }, nil
	}
	return sampleTables(spec.DSN, spec.SampleTables)
}
