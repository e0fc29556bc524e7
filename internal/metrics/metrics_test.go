package metrics

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/buildinfo"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

func newTest(t *testing.T) (*Metrics, *pipeline.Stats, *time.Time) {
	t.Helper()
	st := &pipeline.Stats{}
	now := time.Unix(1_700_000_000, 0)
	m := New(Options{Stats: st, Now: func() time.Time { return now }, DedupCacheKeys: func() int { return 42 },
		Topic: "billing-events", Group: "billing-ledger", CheckpointTimeout: 30 * time.Second,
		Build: buildinfo.Info{Version: "v1.2.3", Commit: "abc123", GoVersion: "go1.26.8"}})
	return m, st, &now
}

// TestRegistryLintAndPreregistration: the metric set passes promlint, and
// every dead-letter reason, phase and error kind is exported at 0 before
// anything happens (dashboards and alerts see complete series).
func TestRegistryLintAndPreregistration(t *testing.T) {
	m, _, _ := newTest(t)
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	for _, r := range event.AllReasons() {
		if v := value(t, m, "billing_dead_letters_total", map[string]string{"reason": string(r)}); v != 0 {
			t.Errorf("reason %s starts at %v", r, v)
		}
	}
	if n := len(series(t, m, "billing_dead_letters_total")); n != len(event.AllReasons())+1 {
		t.Errorf("dead letter series = %d, want every reason + other = %d", n, len(event.AllReasons())+1)
	}
	if n := len(series(t, m, "billing_mysql_errors_total")); n != len(mysqldriver.ErrorKinds()) {
		t.Errorf("mysql error series = %d, want %d", n, len(mysqldriver.ErrorKinds()))
	}
	if n := len(series(t, m, "billing_checkpoint_failures_total")); n != len(phases)+1 {
		t.Errorf("failure series = %d, want %d", n, len(phases)+1)
	}
}

// TestStatsExported: the running totals of pipeline.Stats appear as
// counters and gauges with their current values.
func TestStatsExported(t *testing.T) {
	m, st, now := newTest(t)
	st.Consumed.Store(10)
	st.Counted.Store(7)
	st.Duplicates.Store(2)
	st.Checkpoints.Store(3)
	st.Aborts.Store(1)
	st.RecoveredCommit.Store(4)
	st.RecoveredAbort.Store(5)
	st.AssignedParts.Store(6)
	st.ReadAhead.Store(11)
	st.ReadAheadDropped.Store(12)
	st.ReadAheadFailed.Store(13)
	*now = now.Add(90 * time.Second)
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"billing_records_consumed_total", nil, 10},
		{"billing_events_counted_total", nil, 7},
		{"billing_duplicates_dropped_total", nil, 2},
		{"billing_checkpoints_total", map[string]string{"outcome": "committed"}, 3},
		{"billing_checkpoints_total", map[string]string{"outcome": "aborted"}, 1},
		{"billing_indoubt_resolved_total", map[string]string{"outcome": "committed"}, 4},
		{"billing_indoubt_resolved_total", map[string]string{"outcome": "rolled_back"}, 5},
		{"billing_partitions_assigned", nil, 6},
		{"billing_dedup_read_ahead_ids_total", map[string]string{"outcome": "read"}, 11},
		{"billing_dedup_read_ahead_ids_total", map[string]string{"outcome": "dropped"}, 12},
		{"billing_dedup_read_ahead_failures_total", nil, 13},
		{"billing_dedup_cache_keys", nil, 42},
		{"billing_checkpoint_timeout_seconds", nil, 30},
		{"billing_build_info", map[string]string{"version": "v1.2.3", "commit": "abc123", "go_version": "go1.26.8"}, 1},
		{"billing_last_checkpoint_age_seconds", nil, 90}, // since start: no checkpoint yet
		{"billing_last_checkpoint_timestamp_seconds", nil, 0},
	}
	for _, c := range checks {
		if got := value(t, m, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	st.LastCheckpoint.Store(now.Add(-5 * time.Second).UnixNano())
	if got := value(t, m, "billing_last_checkpoint_age_seconds", nil); got != 5 {
		t.Errorf("age after a checkpoint = %v, want 5", got)
	}
	if got := value(t, m, "billing_last_checkpoint_timestamp_seconds", nil); got != float64(now.Add(-5*time.Second).Unix()) {
		t.Errorf("timestamp = %v", got)
	}
}

// value gathers the registry and returns the value of the series name with
// exactly labels; it fails the test if there is none.
func value(t *testing.T, m *Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	for _, s := range series(t, m, name) {
		if matches(s, labels) {
			switch {
			case s.Counter != nil:
				return s.Counter.GetValue()
			case s.Gauge != nil:
				return s.Gauge.GetValue()
			case s.Histogram != nil:
				return float64(s.Histogram.GetSampleCount())
			}
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// series returns the series of one metric family.
func series(t *testing.T, m *Metrics, name string) []*dto.Metric {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

func matches(s *dto.Metric, labels map[string]string) bool {
	if len(s.GetLabel()) != len(labels) {
		return false
	}
	for _, l := range s.GetLabel() {
		if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
			return false
		}
	}
	return true
}

func TestOnCheckpoint(t *testing.T) {
	m, _, _ := newTest(t)
	start := time.Unix(1_700_000_000, 0)
	// Committed: durations, dead letters by reason (an unknown one folds
	// into other), commit latency per record.
	m.OnCheckpoint(pipeline.CheckpointInfo{
		Decided: true, Started: start, Duration: 2 * time.Second,
		Phases:      map[string]time.Duration{"dedup": time.Second, "commit": time.Second, "weird-phase": time.Second},
		DeadLetters: map[string]int{"invalid_json": 3, "conflicting_duplicate": 1, "secret payload here": 2},
		RecordTimes: []time.Time{start.Add(-3 * time.Second), start.Add(-8 * time.Second)},
	})
	// Failed before the decision, with a lock wait timeout: counted as a
	// failure and a MySQL error; its dead letters are not committed.
	m.OnCheckpoint(pipeline.CheckpointInfo{
		Err:         &txsink.PhaseError{Phase: "write", Err: fmt.Errorf("branch 1: %w", &mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"})},
		FailedPhase: "write", DeadLetters: map[string]int{"invalid_json": 100},
	})
	// Decided, then XA COMMIT failed: its dead letters count, its failure
	// too.
	m.OnCheckpoint(pipeline.CheckpointInfo{
		Decided: true, Err: errors.New("commit: driver: bad connection"), FailedPhase: "commit",
		DeadLetters: map[string]int{"invalid_json": 1},
	})
	checks := []struct {
		name string
		got  float64
		want float64
	}{
		{"invalid_json", value(t, m, "billing_dead_letters_total", map[string]string{"reason": "invalid_json"}), 4},
		{"conflicting_duplicate", value(t, m, "billing_dead_letters_total", map[string]string{"reason": "conflicting_duplicate"}), 1},
		{"other reason", value(t, m, "billing_dead_letters_total", map[string]string{"reason": "other"}), 2},
		{"write failures", value(t, m, "billing_checkpoint_failures_total", map[string]string{"phase": "write"}), 1},
		{"commit failures", value(t, m, "billing_checkpoint_failures_total", map[string]string{"phase": "commit"}), 1},
		{"lock wait timeouts", value(t, m, "billing_mysql_errors_total", map[string]string{"kind": mysqldriver.KindLockWaitTimeout}), 1},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if n := len(series(t, m, "billing_dead_letters_total")); n != len(event.AllReasons())+1 {
		t.Errorf("an unknown reason created a series: %d series", n)
	}
	if n := len(series(t, m, "billing_checkpoint_phase_duration_seconds")); n != len(phases)+1 {
		t.Errorf("phase series = %d, want %d (known phases + other)", n, len(phases)+1)
	}
	if n := len(series(t, m, "billing_checkpoint_duration_seconds")); n != 1 {
		t.Errorf("checkpoint duration series = %d", n)
	}
	// Histogram sample counts: one committed checkpoint, two latencies.
	body := scrape(t, m)
	for _, want := range []string{
		"billing_checkpoint_duration_seconds_count 1",
		"billing_checkpoint_duration_seconds_sum 2",
		"billing_end_to_end_latency_seconds_count 2",
		"billing_end_to_end_latency_seconds_sum 15", // (2+3) + (2+8)
		`billing_checkpoint_phase_duration_seconds_count{phase="dedup"} 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if strings.Contains(body, "secret payload here") {
		t.Error("an unknown reason leaked into a label value")
	}
}

func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("scrape status %d", rec.Code)
	}
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func TestSetLagDropsStalePartitions(t *testing.T) {
	m, _, _ := newTest(t)
	m.SetLag(map[int32]int64{0: 5, 1: 7})
	m.SetLag(map[int32]int64{1: 2})
	if n := len(series(t, m, "billing_consumer_lag_records")); n != 1 {
		t.Fatalf("lag series = %d, want 1 (partition 0 no longer owned)", n)
	}
	if v := value(t, m, "billing_consumer_lag_records", map[string]string{"topic": "billing-events", "group": "billing-ledger", "partition": "1"}); v != 2 {
		t.Fatalf("lag of partition 1 = %v", v)
	}
	m.SetDedupRows(1, 1234)
	if v := value(t, m, "billing_dedup_keys_estimate", map[string]string{"server": "1"}); v != 1234 {
		t.Fatalf("dedup rows = %v", v)
	}
}

// TestDeadLettersWaiting: every known reason has a series from the start;
// a sample sets each (absent = 0); a reason this build does not know gets
// its own series while it has rows, and loses it after.
func TestDeadLettersWaiting(t *testing.T) {
	m, _, _ := newTest(t)
	if n := len(series(t, m, "billing_dead_letters_waiting")); n != len(event.AllReasons()) {
		t.Fatalf("waiting series = %d, want one per reason (%d)", n, len(event.AllReasons()))
	}
	lbl := func(r string) map[string]string { return map[string]string{"topic": "billing-events", "reason": r} }
	m.SetDeadLettersWaiting(map[string]int64{"invalid_json": 3, "from_the_future": 2})
	if v := value(t, m, "billing_dead_letters_waiting", lbl("invalid_json")); v != 3 {
		t.Errorf("invalid_json = %v", v)
	}
	if v := value(t, m, "billing_dead_letters_waiting", lbl("from_the_future")); v != 2 {
		t.Errorf("unknown reason = %v", v)
	}
	m.SetDeadLettersWaiting(map[string]int64{"invalid_currency": 1})
	if v := value(t, m, "billing_dead_letters_waiting", lbl("invalid_json")); v != 0 {
		t.Errorf("invalid_json after re-injection = %v, want 0", v)
	}
	if n := len(series(t, m, "billing_dead_letters_waiting")); n != len(event.AllReasons()) {
		t.Errorf("the unknown reason's series stayed: %d series", n)
	}
	m.SetInDoubt(1, 2, 45*time.Second)
	if v := value(t, m, "billing_xa_oldest_in_doubt_age_seconds", map[string]string{"server": "1"}); v != 45 {
		t.Errorf("oldest in doubt = %v", v)
	}
	if v := value(t, m, "billing_xa_branches_in_doubt", map[string]string{"server": "1"}); v != 2 {
		t.Errorf("in doubt = %v", v)
	}
	m.SetForeignInDoubt(1, 3)
	if v := value(t, m, "billing_xa_foreign_branches_in_doubt", map[string]string{"server": "1"}); v != 3 {
		t.Errorf("foreign in doubt = %v", v)
	}
	m.SetPurgeHistory(0, 182060)
	if v := value(t, m, "billing_mysql_purge_history_length", map[string]string{"server": "0"}); v != 182060 {
		t.Errorf("purge history = %v", v)
	}
}

// TestAttachLater: before the pipeline exists the totals read 0; once
// attached, the running totals, the cache size and the stall show.
func TestAttachLater(t *testing.T) {
	m := New(Options{})
	if v := value(t, m, "billing_events_counted_total", nil); v != 0 {
		t.Fatalf("counted before attach = %v", v)
	}
	st := &pipeline.Stats{}
	st.Counted.Store(9)
	st.Pending.Store(4)
	m.Attach(st, func() int { return 5 }, func() time.Duration { return 3 * time.Second })
	for name, want := range map[string]float64{"billing_events_counted_total": 9, "billing_records_pending": 4,
		"billing_dedup_cache_keys": 5, "billing_checkpoint_stall_seconds": 3} {
		if v := value(t, m, name, nil); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	if v := value(t, m, "billing_build_info", map[string]string{"version": buildinfo.Get().Version, "commit": buildinfo.Get().Commit, "go_version": buildinfo.Get().GoVersion}); v != 1 {
		t.Errorf("build info = %v", v)
	}
}

// TestKafkaAndDBCollectors: the kprom hooks export the client's metrics as
// billing_kafka_* once a client with them talks to a broker (a fake
// cluster here), and AddDB exports a pool's statistics labelled by name.
func TestKafkaAndDBCollectors(t *testing.T) {
	m, _, _ := newTest(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), m.KafkaHooks(), kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if v, ok := sum(t, m, "billing_kafka_connects_total"); !ok || v < 1 {
		t.Errorf("billing_kafka_connects_total = %v (present %v), want >= 1", v, ok)
	}
	// Records fetched are counted (docs/operations.md lists
	// billing_kafka_fetch_records_total; kprom's default omits it).
	prod, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("a")}, &kgo.Record{Value: []byte("b")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for got := 0; got < 2 && ctx.Err() == nil; {
		got += len(cl.PollFetches(ctx).Records())
	}
	if v, ok := sum(t, m, "billing_kafka_fetch_records_total"); !ok || v != 2 {
		t.Errorf("billing_kafka_fetch_records_total = %v (present %v), want 2", v, ok)
	}
	db, err := sql.Open("mysql", "u:p@tcp(127.0.0.1:1)/x")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(7)
	m.AddDB("0", db)
	if v := value(t, m, "go_sql_max_open_connections", map[string]string{"db_name": "0"}); v != 7 {
		t.Errorf("go_sql_max_open_connections = %v, want 7", v)
	}
}

// sum adds up every series of a family; ok is false when it is absent.
func sum(t *testing.T, m *Metrics, name string) (float64, bool) {
	t.Helper()
	ss := series(t, m, name)
	var v float64
	for _, s := range ss {
		v += s.GetCounter().GetValue() + s.GetGauge().GetValue()
	}
	return v, len(ss) > 0
}

// TestIsolationsAndOversizedRows: each isolation counts once by its
// outcome (every outcome exported at 0 before), an unknown outcome folds
// into none of them, and an attempt that failed on a row over its
// statement budget counts as an oversized row whatever wraps it.
func TestIsolationsAndOversizedRows(t *testing.T) {
	m, _, _ := newTest(t)
	for _, o := range pipeline.IsolationOutcomes() {
		if v := value(t, m, "billing_isolations_total", map[string]string{"outcome": o}); v != 0 {
			t.Errorf("outcome %s starts at %v", o, v)
		}
	}
	tooLarge := fmt.Errorf("write: %w", &stmt.TooLargeError{Row: 0, Bytes: 524299, Budget: 524288})
	m.OnCheckpoint(pipeline.CheckpointInfo{Err: tooLarge, FailedPhase: "write", Retrying: true})
	m.OnCheckpoint(pipeline.CheckpointInfo{Err: tooLarge, FailedPhase: "write", Isolation: pipeline.IsolationRejected})
	m.OnCheckpoint(pipeline.CheckpointInfo{Err: errors.New("1644"), FailedPhase: "write", Isolation: pipeline.IsolationNotARecord})
	m.OnCheckpoint(pipeline.CheckpointInfo{Err: errors.New("1644"), FailedPhase: "write", Isolation: pipeline.IsolationNotARecord})
	m.OnCheckpoint(pipeline.CheckpointInfo{Err: errors.New("x"), FailedPhase: "write", Isolation: "made-up"})
	for o, want := range map[string]float64{pipeline.IsolationRejected: 1, pipeline.IsolationNotARecord: 2, pipeline.IsolationNotReproduced: 0, "other": 1} {
		if got := value(t, m, "billing_isolations_total", map[string]string{"outcome": o}); got != want {
			t.Errorf("isolations %s = %v, want %v", o, got, want)
		}
	}
	if got := value(t, m, "billing_oversized_rows_total", nil); got != 2 {
		t.Errorf("oversized rows = %v, want 2", got)
	}
}

// A stalled step of a live move counts once per attempt that gave up on
// it, committed or not; the counter is exported at 0 before.
func TestStalledMoveSteps(t *testing.T) {
	m, _, _ := newTest(t)
	if got := value(t, m, "billing_move_steps_stalled_total", nil); got != 0 {
		t.Fatalf("starts at %v", got)
	}
	m.OnCheckpoint(pipeline.CheckpointInfo{StepStalled: true, Decided: true})
	m.OnCheckpoint(pipeline.CheckpointInfo{Decided: true})
	m.OnCheckpoint(pipeline.CheckpointInfo{StepStalled: true, Err: errors.New("refused by the move's freeze"), FailedPhase: "decide"})
	if got := value(t, m, "billing_move_steps_stalled_total", nil); got != 2 {
		t.Errorf("stalled steps = %v, want 2", got)
	}
}
