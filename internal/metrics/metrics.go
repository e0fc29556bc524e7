package metrics

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/pipeline"
)

const namespace = "billing"

// Phases of a checkpoint attempt, as named in pipeline.CheckpointInfo.
var phases = []string{"dedup", "aggregate", "write", "prepare", "decide", "commit"}

// Options configure [New].
type Options struct {
	// Stats are the pipeline's running totals (required).
	Stats *pipeline.Stats
	// DedupCacheKeys, if set, returns the number of event ids the pipeline
	// holds in memory; without it billing_dedup_keys_memory is not exported.
	DedupCacheKeys func() int
	// Now is the clock (tests); time.Now by default.
	Now func() time.Time
	// Process adds the Go runtime and process collectors.
	Process bool
}

// Metrics is the service's metric set. Its methods are safe for concurrent
// use.
type Metrics struct {
	reg     *prometheus.Registry
	now     func() time.Time
	started time.Time
	stats   *pipeline.Stats

	deadLetters    *prometheus.CounterVec
	ckptDuration   prometheus.Histogram
	phaseDuration  *prometheus.HistogramVec
	ckptFailures   *prometheus.CounterVec
	commitLatency  prometheus.Histogram
	mysqlErrors    *prometheus.CounterVec
	lag            *prometheus.GaugeVec
	dedupRows      *prometheus.GaugeVec
	sampleFailures *prometheus.CounterVec

	mu       sync.Mutex // guards lagParts
	lagParts map[int32]bool
}

// New builds the metric set in a new private registry.
func New(o Options) *Metrics {
	if o.Now == nil {
		o.Now = time.Now
	}
	m := &Metrics{reg: prometheus.NewRegistry(), now: o.Now, started: o.Now(), stats: o.Stats, lagParts: map[int32]bool{}}
	st := o.Stats
	counter := func(name, help string, v func() int64, labels prometheus.Labels) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(v()) })
	}
	gauge := func(name, help string, v func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, v)
	}
	m.reg.MustRegister(
		counter("records_consumed_total", "Records taken from Kafka; a replay after an aborted checkpoint counts again.", st.Consumed.Load, nil),
		counter("events_counted_total", "Valid events committed to the ledger (each event once).", st.Counted.Load, nil),
		counter("duplicates_dropped_total", "Repeated event ids dropped in committed checkpoints.", st.Duplicates.Load, nil),
		counter("checkpoints_total", "Checkpoint attempts by outcome.", st.Checkpoints.Load, prometheus.Labels{"outcome": "committed"}),
		counter("checkpoints_total", "Checkpoint attempts by outcome.", st.Aborts.Load, prometheus.Labels{"outcome": "aborted"}),
		counter("indoubt_resolved_total", "Prepared XA branches left in doubt (crash, lost connection) that recovery resolved, by outcome.",
			st.RecoveredCommit.Load, prometheus.Labels{"outcome": "committed"}),
		counter("indoubt_resolved_total", "Prepared XA branches left in doubt (crash, lost connection) that recovery resolved, by outcome.",
			st.RecoveredAbort.Load, prometheus.Labels{"outcome": "rolled_back"}),
		gauge("partitions_assigned", "Partitions this instance currently owns.", func() float64 { return float64(st.AssignedParts.Load()) }),
		gauge("last_checkpoint_timestamp_seconds", "Unix time of the last committed checkpoint; 0 before the first.", func() float64 {
			if n := st.LastCheckpoint.Load(); n != 0 {
				return float64(n) / 1e9
			}
			return 0
		}),
		gauge("last_checkpoint_age_seconds", "Seconds since the last committed checkpoint (since the process started, before the first). Grows while the pipeline is idle: alert on it together with lag.", func() float64 {
			return m.now().Sub(m.lastCheckpoint()).Seconds()
		}),
	)
	if o.DedupCacheKeys != nil {
		m.reg.MustRegister(gauge("dedup_keys_memory", "Event ids held in the in-memory dedup cache.", func() float64 { return float64(o.DedupCacheKeys()) }))
	}

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
	m.commitLatency = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "commit_latency_seconds",
		Help: "From a record's Kafka timestamp to the commit of the checkpoint covering it (includes producer clock skew).", Buckets: latencyBuckets})
	m.mysqlErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "mysql_errors_total",
		Help: "MySQL errors that failed a checkpoint attempt, by kind."}, []string{"kind"})
	for _, p := range phases {
		m.ckptFailures.WithLabelValues(p)
		m.phaseDuration.WithLabelValues(p)
	}
	m.ckptFailures.WithLabelValues("other")
	for _, k := range ErrorKinds() {
		m.mysqlErrors.WithLabelValues(k)
	}
	m.lag = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "consumer_lag_records",
		Help: "Per partition owned by this instance: the partition's last stable offset minus the next offset stored in MySQL (records not yet committed to the ledger; transaction markers count)."}, []string{"partition"})
	m.dedupRows = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "dedup_keys_estimate",
		Help: "Estimated rows of dedup_keys per MySQL server (information_schema TABLE_ROWS, an InnoDB estimate)."}, []string{"server"})
	m.sampleFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "metrics_sample_failures_total",
		Help: "Failed background samples, by what was sampled; the previous values are kept."}, []string{"sample"})
	for _, s := range []string{"lag", "dedup_keys"} {
		m.sampleFailures.WithLabelValues(s)
	}
	m.reg.MustRegister(m.deadLetters, m.ckptDuration, m.phaseDuration, m.ckptFailures, m.commitLatency, m.mysqlErrors, m.lag, m.dedupRows, m.sampleFailures)
	if o.Process {
		m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
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
	if n := m.stats.LastCheckpoint.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return m.started
}

// OnCheckpoint records one checkpoint attempt. It is meant to be chained
// into pipeline.Config.OnCheckpoint; it never blocks.
func (m *Metrics) OnCheckpoint(info pipeline.CheckpointInfo) {
	if info.Err != nil && !info.Retrying {
		m.ckptFailures.WithLabelValues(known(info.FailedPhase, phases)).Inc()
		if kind, ok := ErrorKind(info.Err); ok {
			m.mysqlErrors.WithLabelValues(kind).Inc()
		}
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
			m.commitLatency.Observe(max(end.Sub(ts).Seconds(), 0))
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
			m.lag.DeleteLabelValues(strconv.Itoa(int(p)))
			delete(m.lagParts, p)
		}
	}
	for p, n := range lag {
		m.lag.WithLabelValues(strconv.Itoa(int(p))).Set(float64(n))
		m.lagParts[p] = true
	}
}

// SetDedupRows sets the dedup_keys estimate of one server (by index in
// the DSN list, control server 0).
func (m *Metrics) SetDedupRows(server int, rows int64) {
	m.dedupRows.WithLabelValues(strconv.Itoa(server)).Set(float64(rows))
}

// SampleFailed counts a failed sample ("lag" or "dedup_keys").
func (m *Metrics) SampleFailed(sample string) {
	m.sampleFailures.WithLabelValues(sample).Inc()
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
