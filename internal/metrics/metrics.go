package metrics

import (
	"database/sql"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/billing/ledger/internal/buildinfo"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

const namespace = "billing"

// Phases of a checkpoint attempt, as named in pipeline.CheckpointInfo.
var phases = []string{"dedup", "aggregate", "write", "prepare", "decide", "commit"}

// Options configure [New].
type Options struct {
	// Stats are the pipeline's running totals. They can also be attached
	// later (Attach): before, the totals read 0.
	Stats *pipeline.Stats
	// DedupCacheKeys, if set, returns the number of event ids the pipeline
	// holds in memory (billing_dedup_cache_keys).
	DedupCacheKeys func() int
	// Topic and Group label the lag and dead-letter gauges.
	Topic, Group string
	// CheckpointTimeout is exported as billing_checkpoint_timeout_seconds,
	// so that alert rules can compare ages with the setting in force.
	CheckpointTimeout time.Duration
	// Build labels billing_build_info; buildinfo.Get() when zero.
	Build buildinfo.Info
	// Now is the clock (tests); time.Now by default.
	Now func() time.Time
	// Process adds the Go runtime and process collectors.
	Process bool
}

// Metrics is the service's metric set. Its methods are safe for concurrent
// use.
type Metrics struct {
	reg          *prometheus.Registry
	now          func() time.Time
	started      time.Time
	topic, group string

	stats     atomic.Pointer[pipeline.Stats]
	cacheKeys atomic.Pointer[func() int]
	stall     atomic.Pointer[func() time.Duration]

	deadLetters    *prometheus.CounterVec
	ckptDuration   prometheus.Histogram
	phaseDuration  *prometheus.HistogramVec
	ckptFailures   *prometheus.CounterVec
	ckptAborts     *prometheus.CounterVec
	e2eLatency     prometheus.Histogram
	mysqlErrors    *prometheus.CounterVec
	isolations     *prometheus.CounterVec
	oversizedRows  prometheus.Counter
	stalledSteps   prometheus.Counter
	lag            *prometheus.GaugeVec
	dlWaiting      *prometheus.GaugeVec
	inDoubt        *prometheus.GaugeVec
	inDoubtAge     *prometheus.GaugeVec
	foreignInDoubt *prometheus.GaugeVec
	purgeHistory   *prometheus.GaugeVec
	unapplied      prometheus.Gauge
	unappliedAge   prometheus.Gauge
	dedupRows      *prometheus.GaugeVec
	sampleFailures *prometheus.CounterVec

	mu       sync.Mutex // guards lagParts and dlReasons
	lagParts map[int32]bool
	// dlReasons are the reasons with a waiting gauge outside the
	// pre-registered set (a reason of an older or newer build).
	dlReasons map[string]bool
}

// New builds the metric set in a new private registry.
func New(o Options) *Metrics {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Build == (buildinfo.Info{}) {
		o.Build = buildinfo.Get()
	}
	m := &Metrics{reg: prometheus.NewRegistry(), now: o.Now, started: o.Now(), topic: o.Topic, group: o.Group,
		lagParts: map[int32]bool{}, dlReasons: map[string]bool{}}
	if o.Stats != nil {
		m.Attach(o.Stats, o.DedupCacheKeys, nil)
	}
	stat := func(v func(*pipeline.Stats) int64) func() float64 {
		return func() float64 {
			if st := m.stats.Load(); st != nil {
				return float64(v(st))
			}
			return 0
		}
	}
	counter := func(name, help string, v func(*pipeline.Stats) int64, labels prometheus.Labels) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help, ConstLabels: labels}, stat(v))
	}
	gauge := func(name, help string, v func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, v)
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: "build_info",
			Help:        "Always 1; the labels name the running build (version and commit stamped at link time, Go version).",
			ConstLabels: prometheus.Labels{"version": o.Build.Version, "commit": o.Build.Commit, "go_version": o.Build.GoVersion}},
			func() float64 { return 1 }),
		counter("records_consumed_total", "Records taken from Kafka; a replay after an aborted checkpoint counts again.", func(s *pipeline.Stats) int64 { return s.Consumed.Load() }, nil),
		counter("records_skipped_total", "Records passed over, neither events nor dead letters: CloudEvents of a type EVENT_CLOUDEVENT_TYPES does not select (a replay counts again).", func(s *pipeline.Stats) int64 { return s.Skipped.Load() }, nil),
		counter("schema_registry_retries_total", "Attempts to fetch the schemas of a poll's records that found the schema registry unavailable (network error, timeout, a status other than 404); the records waited, none was dead-lettered for it.", func(s *pipeline.Stats) int64 { return s.RegistryRetries.Load() }, nil),
		gauge("schema_registry_unavailable", "1 while the schema registry does not answer and a poll's records wait for it (nothing is counted meanwhile), else 0.", stat(func(s *pipeline.Stats) int64 { return s.RegistryDown.Load() })),
		counter("events_counted_total", "Valid events committed to the ledger (each event once).", func(s *pipeline.Stats) int64 { return s.Counted.Load() }, nil),
		counter("duplicates_dropped_total", "Repeated event ids dropped in committed checkpoints (dedup hits).", func(s *pipeline.Stats) int64 { return s.Duplicates.Load() }, nil),
		counter("checkpoints_total", "Checkpoint attempts by outcome.", func(s *pipeline.Stats) int64 { return s.Checkpoints.Load() }, prometheus.Labels{"outcome": "committed"}),
		counter("checkpoints_total", "Checkpoint attempts by outcome.", func(s *pipeline.Stats) int64 { return s.Aborts.Load() }, prometheus.Labels{"outcome": "aborted"}),
		counter("indoubt_resolved_total", "Prepared XA branches left in doubt (crash, lost connection) that recovery resolved, by outcome.",
			func(s *pipeline.Stats) int64 { return s.RecoveredCommit.Load() }, prometheus.Labels{"outcome": "committed"}),
		counter("indoubt_resolved_total", "Prepared XA branches left in doubt (crash, lost connection) that recovery resolved, by outcome.",
			func(s *pipeline.Stats) int64 { return s.RecoveredAbort.Load() }, prometheus.Labels{"outcome": "rolled_back"}),
		counter("dedup_read_ahead_ids_total", "Polled event ids the dedup read-ahead looked up before their claim (read), or dropped unread (dropped: its queue was full, their barrier had passed, or no checkpoint had read the generations yet).",
			func(s *pipeline.Stats) int64 { return s.ReadAhead.Load() }, prometheus.Labels{"outcome": "read"}),
		counter("dedup_read_ahead_ids_total", "Polled event ids the dedup read-ahead looked up before their claim (read), or dropped unread (dropped: its queue was full, their barrier had passed, or no checkpoint had read the generations yet).",
			func(s *pipeline.Stats) int64 { return s.ReadAheadDropped.Load() }, prometheus.Labels{"outcome": "dropped"}),
		counter("dedup_read_ahead_failures_total", "Statements of the dedup read-ahead that failed or passed their bound (the claim then reads the keys itself).",
			func(s *pipeline.Stats) int64 { return s.ReadAheadFailed.Load() }, nil),
		gauge("partitions_assigned", "Partitions this instance currently owns (claimed in MySQL).", stat(func(s *pipeline.Stats) int64 { return s.AssignedParts.Load() })),
		gauge("records_pending", "Records consumed and not yet covered by a decided checkpoint (buffered or in flight).", stat(func(s *pipeline.Stats) int64 { return s.Pending.Load() })),
		gauge("last_checkpoint_timestamp_seconds", "Unix time of the last committed checkpoint; 0 before the first.", func() float64 {
			if st := m.stats.Load(); st != nil {
				if n := st.LastCheckpoint.Load(); n != 0 {
					return float64(n) / 1e9
				}
			}
			return 0
		}),
		gauge("last_checkpoint_age_seconds", "Seconds since the last committed checkpoint (since the process started, before the first). Grows while the pipeline is idle: alert on it together with lag.", func() float64 {
			return m.now().Sub(m.lastCheckpoint()).Seconds()
		}),
		gauge("checkpoint_stall_seconds", "How long records have waited with no checkpoint committed; 0 when none wait. /healthz fails once it exceeds LIVENESS_MAX_CHECKPOINT_AGE.", func() float64 {
			if f := m.stall.Load(); f != nil {
				return (*f)().Seconds()
			}
			return 0
		}),
		gauge("checkpoint_timeout_seconds", "The CHECKPOINT_TIMEOUT setting: undecided XA branches older than this are rolled back by recovery.", func() float64 {
			return o.CheckpointTimeout.Seconds()
		}),
		gauge("dedup_cache_keys", "Event ids held in the in-memory dedup cache (a count of keys, bounded by DEDUP_CACHE_KEYS).", func() float64 {
			if f := m.cacheKeys.Load(); f != nil {
				return float64((*f)())
			}
			return 0
		}),
	)

	m.deadLetters = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "dead_letters_total",
		Help: "Dead letters committed, by reason (see internal/event reasons; other = a reason this build does not know)."}, []string{"reason"})
	for _, r := range event.AllReasons() {
		m.deadLetters.WithLabelValues(string(r))
	}
	m.deadLetters.WithLabelValues("other")

	m.ckptDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "checkpoint_duration_seconds",
		Help: "Duration of committed checkpoints, from the start of dedup to the end of XA COMMIT.", Buckets: durationBuckets})
	m.phaseDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "checkpoint_phase_duration_seconds",
		Help: "Duration of each phase of committed checkpoints.", Buckets: durationBuckets}, []string{"phase"})
	m.ckptFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "checkpoint_failures_total",
		Help: "Checkpoint attempts that failed, by the phase that failed. Before decide the checkpoint is aborted and replayed; in commit it is decided and recovery rolls it forward."}, []string{"phase"})
	m.ckptAborts = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "checkpoint_aborts_total",
		Help: "Checkpoint attempts aborted (failed before their decision: rolled back, then retried or replayed), by cause: fenced, aborted_by_recovery, frontier_moved, outcome_unknown, a MySQL error kind of billing_mysql_errors_total, canceled (CHECKPOINT_TIMEOUT or stopping), other. They sum to billing_checkpoints_total{outcome=\"aborted\"}."}, []string{"cause"})
	for _, c := range AbortCauses() {
		m.ckptAborts.WithLabelValues(c)
	}
	m.e2eLatency = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "end_to_end_latency_seconds",
		Help: "From a record's Kafka timestamp (set by the producer or the broker) to the commit of the checkpoint covering it: end-to-end latency, producer clock skew included.", Buckets: latencyBuckets})
	m.mysqlErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "mysql_errors_total",
		Help: "MySQL errors that failed a checkpoint attempt, by kind."}, []string{"kind"})
	m.isolations = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "isolations_total",
		Help: "Isolations of the records the database refuses, by outcome: rejected (records dead-lettered as rejected_by_database), not_a_record (the checkpoint fails with no record in it: a trigger, constraint or setting on a statement every checkpoint runs), not_reproduced (trials do not reproduce the failure consistently), interrupted. Only rejected dead-letters anything."}, []string{"outcome"})
	for _, o := range pipeline.IsolationOutcomes() {
		m.isolations.WithLabelValues(o)
	}
	m.oversizedRows = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "oversized_rows_total",
		Help: "Checkpoint attempts that failed because a row exceeded the statement budget its size was computed for: a bug (the record is isolated, the checkpoint goes on); please report it."})
	for _, p := range phases {
		m.ckptFailures.WithLabelValues(p)
		m.phaseDuration.WithLabelValues(p)
	}
	m.ckptFailures.WithLabelValues("other")
	for _, k := range mysqldriver.ErrorKinds() {
		m.mysqlErrors.WithLabelValues(k)
	}
	m.lag = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "consumer_lag_records",
		Help: "Per partition owned by this instance: the partition's last stable offset minus the next offset stored in MySQL (records not yet committed to the ledger). Summed over the instances of a group, each partition counts once."}, []string{"topic", "group", "partition"})
	m.dlWaiting = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "dead_letters_waiting",
		Help: "Dead letters not re-injected, of the partitions this instance owns, by reason (sampled). Summed over the instances of a group, each counts once."}, []string{"topic", "reason"})
	for _, r := range event.AllReasons() {
		m.dlWaiting.WithLabelValues(o.Topic, string(r))
	}
	m.inDoubt = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "xa_branches_in_doubt",
		Help: "Prepared XA branches of this ledger on each MySQL server (XA RECOVER, sampled; branches of other ledgers sharing a server are left out once this ledger has its id)."}, []string{"server"})
	m.inDoubtAge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "xa_oldest_in_doubt_age_seconds",
		Help: "Age of the oldest prepared XA branch of this service on each MySQL server; 0 when none (sampled)."}, []string{"server"})
	m.foreignInDoubt = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "xa_foreign_branches_in_doubt",
		Help: "Prepared XA branches on each MySQL server that are not this ledger's (another ledger's, left over, forged): the service never resolves them, and while one lasts InnoDB purge cannot advance on that server (sampled)."}, []string{"server"})
	m.purgeHistory = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "mysql_purge_history_length",
		Help: "InnoDB undo history not yet purged on each MySQL server (information_schema.INNODB_METRICS trx_rseg_history_len, sampled); it grows without end while a transaction or prepared XA branch stays open."}, []string{"server"})
	m.unapplied = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "commit_log_unapplied",
		Help: "Commit decisions of the ledger whose branches have not all committed yet (checkpoint_commits.applied_at NULL, sampled): readers of the commit position (invoicing, the changelog) wait for the oldest."})
	m.unappliedAge = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "commit_log_oldest_unapplied_age_seconds",
		Help: "Age of the oldest commit decision not yet applied, by the control server's clock; 0 when none (sampled). While it grows, the visible position stands still."})
	m.dedupRows = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "dedup_keys_estimate",
		Help: "Estimated rows of the dedup key tables (every generation's) per MySQL server (information_schema TABLE_ROWS, an InnoDB estimate)."}, []string{"server"})
	m.sampleFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "metrics_sample_failures_total",
		Help: "Failed background samples, by what was sampled; the previous values are kept."}, []string{"sample"})
	for _, s := range samples {
		m.sampleFailures.WithLabelValues(s)
	}
	m.stalledSteps = prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "move_steps_stalled_total",
		Help: "Steps of a live move (billing shards add or remove) that outlasted half of CHECKPOINT_TIMEOUT under a checkpoint of this instance, which then stopped waiting for them: the move's command stopped (run it again: it resumes). While the step is frozen, checkpoints that write its keys are refused."})
	m.reg.MustRegister(m.deadLetters, m.ckptDuration, m.phaseDuration, m.ckptFailures, m.ckptAborts, m.e2eLatency, m.mysqlErrors, m.isolations, m.oversizedRows, m.stalledSteps, m.lag,
		m.dlWaiting, m.inDoubt, m.inDoubtAge, m.foreignInDoubt, m.purgeHistory, m.unapplied, m.unappliedAge, m.dedupRows, m.sampleFailures)
	if o.Process {
		m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

// What the sampler samples, the label values of
// billing_metrics_sample_failures_total.
const (
	SampleLag         = "lag"
	SampleDedupKeys   = "dedup_keys"
	SampleDeadLetters = "dead_letters"
	SampleInDoubt     = "in_doubt"
	SamplePurge       = "purge_history"
	SampleCommitLog   = "commit_log"
)

var samples = []string{SampleLag, SampleDedupKeys, SampleDeadLetters, SampleInDoubt, SamplePurge, SampleCommitLog}

// Attach connects the pipeline once it exists: its running totals, the
// size of its dedup cache and the stall that /healthz judges (either func
// may be nil).
func (m *Metrics) Attach(st *pipeline.Stats, dedupCacheKeys func() int, stall func() time.Duration) {
	m.stats.Store(st)
	if dedupCacheKeys != nil {
		m.cacheKeys.Store(&dedupCacheKeys)
	}
	if stall != nil {
		m.stall.Store(&stall)
	}
}

// KafkaHooks returns a kgo option that exports the Kafka client's own
// metrics (franz-go's kprom plugin) as billing_kafka_*: connections, bytes
// and errors per broker, fetched batches and records per topic, request
// latency. Give it to exactly one client: the pipeline's.
func (m *Metrics) KafkaHooks() kgo.Opt {
	// kprom's default detail has no batch or record counts: ask for them
	// (billing_kafka_fetch_records_total, …), keeping its defaults.
	return kgo.WithHooks(kprom.NewMetrics(namespace, kprom.Subsystem("kafka"), kprom.Registry(m.reg),
		kprom.FetchAndProduceDetail(kprom.ByNode, kprom.ByTopic, kprom.UncompressedBytes, kprom.Batches, kprom.Records)))
}

// AddDB exports the statistics of a connection pool (go_sql_* from
// client_golang's DB stats collector: open, in use and idle connections,
// waits for a connection, closes by reason), labelled db_name = name.
func (m *Metrics) AddDB(name string, db *sql.DB) {
	m.reg.MustRegister(collectors.NewDBStatsCollector(db, name))
}

var (
	durationBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	latencyBuckets  = []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800}
)

// Registry is the private registry (tests, extra collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, Timeout: 10 * time.Second})
}

// lastCheckpoint is the time of the last committed checkpoint, or the start
// of the process before the first.
func (m *Metrics) lastCheckpoint() time.Time {
	if st := m.stats.Load(); st != nil {
		if n := st.LastCheckpoint.Load(); n != 0 {
			return time.Unix(0, n)
		}
	}
	return m.started
}

// OnCheckpoint records one checkpoint attempt. It is meant to be chained
// into pipeline.Config.OnCheckpoint; it never blocks.
func (m *Metrics) OnCheckpoint(info pipeline.CheckpointInfo) {
	if info.Err != nil && !info.Retrying {
		m.ckptFailures.WithLabelValues(known(info.FailedPhase, phases)).Inc()
		if kind, ok := mysqldriver.ErrorKind(info.Err); ok {
			m.mysqlErrors.WithLabelValues(kind).Inc()
		}
	}
	if cause := AbortCause(info); cause != "" {
		m.ckptAborts.WithLabelValues(cause).Inc()
	}
	if tl := (*stmt.TooLargeError)(nil); errors.As(info.Err, &tl) {
		m.oversizedRows.Inc()
	}
	if info.Isolation != "" {
		m.isolations.WithLabelValues(known(info.Isolation, pipeline.IsolationOutcomes())).Inc()
	}
	if info.StepStalled {
		m.stalledSteps.Inc()
	}
	if !info.Decided {
		return
	}
	// Decided: its dead letters and events are in the ledger (even if a
	// late XA COMMIT failed: recovery rolls it forward).
	for reason, n := range info.DeadLetters {
		m.deadLetters.WithLabelValues(known(reason, reasons)).Add(float64(n))
	}
	if info.Err != nil {
		return
	}
	m.ckptDuration.Observe(info.Duration.Seconds())
	for p, d := range info.Phases {
		m.phaseDuration.WithLabelValues(known(p, phases)).Observe(d.Seconds())
	}
	end := info.Started.Add(info.Duration)
	for _, ts := range info.RecordTimes {
		if !ts.IsZero() {
			m.e2eLatency.Observe(max(end.Sub(ts).Seconds(), 0))
		}
	}
}

// SetLag replaces the per-partition lag; partitions absent from lag (no
// longer owned) are removed.
func (m *Metrics) SetLag(lag map[int32]int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for p := range m.lagParts {
		if _, ok := lag[p]; !ok {
			m.lag.DeleteLabelValues(m.topic, m.group, strconv.Itoa(int(p)))
			delete(m.lagParts, p)
		}
	}
	for p, n := range lag {
		m.lag.WithLabelValues(m.topic, m.group, strconv.Itoa(int(p))).Set(float64(n))
		m.lagParts[p] = true
	}
}

// SetDeadLettersWaiting replaces the counts of dead letters not
// re-injected, by reason; every known reason absent from counts is 0. A
// reason this build does not know keeps its own series while it has rows.
func (m *Metrics) SetDeadLettersWaiting(counts map[string]int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range reasons {
		m.dlWaiting.WithLabelValues(m.topic, r).Set(float64(counts[r]))
	}
	for r := range m.dlReasons {
		if counts[r] == 0 {
			m.dlWaiting.DeleteLabelValues(m.topic, r)
			delete(m.dlReasons, r)
		}
	}
	for r, n := range counts {
		if known(r, reasons) == "other" && n > 0 && len(r) <= 64 {
			m.dlWaiting.WithLabelValues(m.topic, r).Set(float64(n))
			m.dlReasons[r] = true
		}
	}
}

// SetInDoubt sets the number of the service's prepared XA branches on one
// server and the age of the oldest.
func (m *Metrics) SetInDoubt(server int, n int, oldest time.Duration) {
	m.inDoubt.WithLabelValues(strconv.Itoa(server)).Set(float64(n))
	m.inDoubtAge.WithLabelValues(strconv.Itoa(server)).Set(oldest.Seconds())
}

// SetCommitLog sets the number of unapplied commit decisions and the age
// of the oldest.
func (m *Metrics) SetCommitLog(unapplied int64, oldest time.Duration) {
	m.unapplied.Set(float64(unapplied))
	m.unappliedAge.Set(oldest.Seconds())
}

// SetForeignInDoubt sets the number of prepared XA branches on one server
// that are not this ledger's.
func (m *Metrics) SetForeignInDoubt(server int, n int) {
	m.foreignInDoubt.WithLabelValues(strconv.Itoa(server)).Set(float64(n))
}

// SetPurgeHistory sets the undo history length of one server.
func (m *Metrics) SetPurgeHistory(server int, n int64) {
	m.purgeHistory.WithLabelValues(strconv.Itoa(server)).Set(float64(n))
}

// SetDedupRows sets the dedup_keys estimate of one server (by index in
// the DSN list, control server 0).
func (m *Metrics) SetDedupRows(server int, rows int64) {
	m.dedupRows.WithLabelValues(strconv.Itoa(server)).Set(float64(rows))
}

// SampleFailed counts a failed sample (one of the Sample* names).
func (m *Metrics) SampleFailed(sample string) {
	m.sampleFailures.WithLabelValues(known(sample, samples)).Inc()
}

var reasons = func() []string {
	var out []string
	for _, r := range event.AllReasons() {
		out = append(out, string(r))
	}
	return out
}()

// known returns v if it is in set, "other" otherwise: label values stay a
// fixed, bounded set whatever the pipeline reports.
func known(v string, set []string) string {
	for _, s := range set {
		if s == v {
			return v
		}
	}
	return "other"
}
