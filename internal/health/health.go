package health

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/waits"
)

// The service's HTTP endpoints.
const (
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
	PathMetrics = "/metrics"
	PathWaits   = waits.Path // the instance's waits in progress
	PathRecords = "/records" // what the instance did with the records it took (Records)
)

// Paths lists every path the service serves (manifests are checked
// against it).
func Paths() []string { return []string{PathHealthz, PathReadyz, PathMetrics, PathWaits, PathRecords} }

// Records are the totals of the records an instance's pipeline took since
// it started, as its PathRecords endpoint serves them (JSON) and `billing
// status` shows them: the records skipped are in no table of the ledger,
// so the instances that skipped them are where they are counted. Like the
// metrics, a record read again after an aborted checkpoint counts again.
type Records struct {
	// Since is when the pipeline started; zero while the instance is
	// still starting (the totals are then 0).
	Since time.Time `json:"since"`
	// Consumed are the records taken from Kafka.
	Consumed int64 `json:"consumed"`
	// Skipped are the records passed over, neither events nor dead
	// letters: CloudEvents of a type EVENT_CLOUDEVENT_TYPES does not
	// select.
	Skipped int64 `json:"skipped"`
}

// Records returns the pipeline's totals (zero before Start).
func (m *Monitor) Records() Records {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.checks == nil || m.checks.Stats == nil {
		return Records{}
	}
	st := m.checks.Stats
	return Records{Since: m.running, Consumed: st.Consumed.Load(), Skipped: st.Skipped.Load()}
}

// Options configure a Monitor.
type Options struct {
	// ReadyMaxAge (READY_MAX_CHECKPOINT_AGE): not ready once records have
	// waited this long without a committed checkpoint.
	ReadyMaxAge time.Duration
	// MaxStall (LIVENESS_MAX_CHECKPOINT_AGE): not alive once records have
	// waited this long without a committed checkpoint.
	MaxStall time.Duration
	// CheckInterval (HEALTH_CHECK_INTERVAL): how often Checks run.
	CheckInterval time.Duration
	// Now is the clock (tests); time.Now by default.
	Now func() time.Time
}

// Checks are the round trips behind readiness, supplied once the pipeline
// runs.
type Checks struct {
	// Stats are the pipeline's running totals.
	Stats *pipeline.Stats
	// MySQL checks that every server answers.
	MySQL func(ctx context.Context) error
	// Membership asks the group coordinator whether this client is a
	// member of the group, and how many partitions of the topic it was
	// assigned; a member of a group that is rebalancing is not one yet.
	// An error means Kafka could not be asked.
	Membership func(ctx context.Context) (member bool, assigned int, err error)
	// Hold, if set, says why checkpoints are held on purpose ("" when they
	// are not): the changelog's backlog is full. The instance is then not
	// ready, saying why, but alive: restarting it would not help.
	Hold func() string
}

// Monitor holds the state of both probes. Its methods are safe for
// concurrent use.
type Monitor struct {
	o     Options
	phase atomic.Pointer[string] // startup phase; "" once running

	mu           sync.Mutex
	checks       *Checks
	running      time.Time // when the pipeline started
	waitingSince time.Time // since when records wait (zero: none wait)
	zeroSince    time.Time // when none was last seen pending (zero: some are)
	failedSince  bool      // the last checkpoint attempt failed
	checked      bool      // a round of checks completed
	mysqlErr     error
	kafkaErr     error
	member       bool
	assigned     int
}

// New returns a Monitor in the first startup phase, "starting".
func New(o Options) *Monitor {
	if o.Now == nil {
		o.Now = time.Now
	}
	m := &Monitor{o: o}
	m.SetPhase("starting")
	return m
}

// SetPhase names the startup phase in progress ("migrating the schema",
// "checking grants", …); probes report it until Start.
func (m *Monitor) SetPhase(phase string) { m.phase.Store(&phase) }

// Phase returns the startup phase, "" once running.
func (m *Monitor) Phase() string { return *m.phase.Load() }

// Start ends startup: the pipeline runs, and c is what readiness checks.
// Recovery and the first claim happen inside the pipeline; readiness waits
// for group membership and the claim of the assigned partitions.
func (m *Monitor) Start(c Checks) {
	m.mu.Lock()
	m.checks = &c
	m.running = m.o.Now()
	m.mu.Unlock()
	m.SetPhase("")
}

// OnCheckpoint follows checkpoint outcomes (chained into
// pipeline.Config.OnCheckpoint). A careful-mode retry is not a failure.
func (m *Monitor) OnCheckpoint(info pipeline.CheckpointInfo) {
	if info.Retrying {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failedSince = !info.Decided
}

// Run refreshes the checks every CheckInterval until ctx ends, each round
// bounded by the interval.
func (m *Monitor) Run(ctx context.Context) {
	t := time.NewTicker(m.o.CheckInterval)
	defer t.Stop()
	for {
		m.Check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Check runs one round of checks (nothing before Start).
func (m *Monitor) Check(ctx context.Context) {
	m.mu.Lock()
	c := m.checks
	m.mu.Unlock()
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, m.o.CheckInterval)
	defer cancel()
	var mysqlErr error
	if c.MySQL != nil {
		mysqlErr = c.MySQL(ctx)
	}
	member, assigned, kafkaErr := false, 0, error(nil)
	if c.Membership != nil {
		member, assigned, kafkaErr = c.Membership(ctx)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checked, m.mysqlErr, m.kafkaErr, m.member, m.assigned = true, mysqlErr, kafkaErr, member, assigned
	m.stallLocked()
}

// stallLocked returns how long records have waited without a committed
// checkpoint (0 when none wait), and how many wait. The wait counts from
// the latest of: the last committed checkpoint, the moment records started
// waiting (as seen by a check or a probe), and the pipeline's start, so
// that an instance idle for hours is not judged by its old checkpoint the
// moment a record arrives.
func (m *Monitor) stallLocked() (time.Duration, int64) {
	if m.checks == nil || m.checks.Stats == nil {
		return 0, 0
	}
	st := m.checks.Stats
	now := m.o.Now()
	pending := st.Pending.Load()
	if pending == 0 {
		if m.zeroSince.IsZero() {
			m.zeroSince = now
		}
		return 0, 0
	}
	if !m.zeroSince.IsZero() {
		// A failed checkpoint drops its records and reads them again: the
		// count touches zero for a moment while they still wait. Only a
		// zero not contradicted for a while (two check intervals) ends the
		// wait; a committed checkpoint ends it anyway (since, below).
		if now.Sub(m.zeroSince) >= max(2*m.o.CheckInterval, time.Second) {
			m.waitingSince = time.Time{}
		}
		m.zeroSince = time.Time{}
	}
	if m.waitingSince.IsZero() {
		m.waitingSince = now
	}
	since := m.running
	if n := st.LastCheckpoint.Load(); n != 0 && time.Unix(0, n).After(since) {
		since = time.Unix(0, n)
	}
	if m.waitingSince.After(since) {
		since = m.waitingSince
	}
	return max(now.Sub(since), 0), pending
}

// Stall is how long records have waited without a committed checkpoint (0
// when none wait), as /healthz judges it; exported as a metric.
func (m *Monitor) Stall() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, _ := m.stallLocked()
	return d
}

// Live reports liveness and a short reason.
func (m *Monitor) Live() (bool, string) {
	if p := m.Phase(); p != "" {
		return true, "alive, starting: " + p
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	stall, pending := m.stallLocked()
	if why := m.holdLocked(); why != "" {
		return true, "alive, holding checkpoints: " + why
	}
	if stall > m.o.MaxStall {
		return false, fmt.Sprintf("wedged: %d records have waited %s with no checkpoint committed (LIVENESS_MAX_CHECKPOINT_AGE %s)",
			pending, stall.Round(time.Second), m.o.MaxStall)
	}
	return true, "ok"
}

// Ready reports readiness and a short reason.
func (m *Monitor) Ready() (bool, string) {
	if p := m.Phase(); p != "" {
		return false, "starting: " + p
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case !m.checked:
		return false, "starting: first check of MySQL, Kafka and the group"
	case m.mysqlErr != nil:
		return false, "MySQL: " + errText(m.mysqlErr)
	case m.kafkaErr != nil:
		return false, "Kafka: " + errText(m.kafkaErr)
	case !m.member:
		return false, "not a member of the group (joining, or the group is rebalancing)"
	}
	if why := m.holdLocked(); why != "" {
		return false, why
	}
	parts := m.checks.Stats.AssignedParts.Load()
	if m.assigned > 0 && parts == 0 {
		return false, fmt.Sprintf("claiming the %d partitions assigned", m.assigned)
	}
	stall, pending := m.stallLocked()
	if stall > m.o.ReadyMaxAge {
		if m.failedSince {
			return false, fmt.Sprintf("no checkpoint committed for %s and the last attempt failed", stall.Round(time.Second))
		}
		return false, fmt.Sprintf("no checkpoint committed for %s while %d records wait", stall.Round(time.Second), pending)
	}
	switch {
	case parts == 0:
		return true, "standby (a member of the group with no partitions)"
	case pending == 0 && !m.failedSince:
		return true, "idle"
	default:
		return true, "checkpointing"
	}
}

// errText shortens an error for a probe's body.
func errText(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer within HEALTH_CHECK_INTERVAL"
	}
	s := err.Error()
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// holdLocked is why checkpoints are held ("" when they are not).
func (m *Monitor) holdLocked() string {
	if m.checks == nil || m.checks.Hold == nil {
		return ""
	}
	return m.checks.Hold()
}
