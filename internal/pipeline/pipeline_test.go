package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// env is one test's topic and database.
type env struct {
	brokers []string
	topic   string
	dsn     string
	db      *sqlx.DB
}

func newEnv(t *testing.T, partitions int) *env {
	t.Helper()
	return newEnvWith(t, partitions, envOptions{})
}

// envOptions vary a test's topic and database.
type envOptions struct {
	topicConfigs map[string]string // topic-level settings (max.message.bytes)
	dsnParams    string            // appended to the database's DSN ("&maxAllowedPacket=…")
	create       []string          // CREATE DATABASE options ("CHARACTER SET latin1")
	admin        string            // the server's admin DSN (testenv.OwnMariaDB); "": the shared one
}

func newEnvWith(t *testing.T, partitions int, o envOptions) *env {
	t.Helper()
	e := &env{brokers: testenv.Kafka(t)}
	e.topic = testenv.NewTopicWithConfigs(t, e.brokers, partitions, o.topicConfigs)
	if o.admin != "" {
		e.dsn, e.db = testenv.LedgerDBOn(t, o.admin, testenv.RandomName("t_"), o.create...)
	} else {
		e.dsn, e.db = testenv.LedgerDB(t, o.create...)
	}
	e.dsn += o.dsnParams
	return e
}

type ev struct {
	ID       string `json:"event_id"`
	Account  string `json:"account_id"`
	Amount   int64  `json:"amount_minor"`
	Currency string `json:"currency"`
	At       string `json:"occurred_at"`
}

func (e ev) record(key string) *kgo.Record {
	b, _ := json.Marshal(e)
	if key == "" {
		key = e.Account
	}
	return &kgo.Record{Key: []byte(key), Value: b}
}

func produce(t *testing.T, e *env, recs ...*kgo.Record) {
	t.Helper()
	testenv.Produce(t, e.brokers, e.topic, recs...)
}

// instance is one in-process pipeline.
type instance struct {
	p      *Pipeline
	sink   *txsink.Sink
	cancel context.CancelFunc
	done   chan error
	// shutdown cancels Run, waits for it and closes the sink, once.
	shutdown func()
}

// sinkConfig is what start opens the sink with.
type sinkConfig struct {
	txsink.Config
	DSNs []string
}

// testConfig is the pipeline configuration of the tests: fast checkpoints,
// small budgets.
func testConfig(e *env) Config {
	return Config{
		Topic: e.topic, Group: "g-" + e.topic,
		CheckpointInterval: 100 * time.Millisecond, CheckpointTimeout: 10 * time.Second, CheckpointMaxRecords: 10000, CheckpointMaxBytes: 32 << 20,
		MaxPollRecords: 1000, DedupTTL: time.Hour, DedupCacheKeys: 1000, DedupCleanupInterval: time.Second,
		DedupCleanupBatch: 100, Window: hourly, MaxEventTimeSkew: time.Hour, MaxPayloadBytes: 4096, RecoveryInterval: time.Second,
		DecisionRetention: time.Hour, ShutdownTimeout: 10 * time.Second,
		KafkaOpts: []kgo.Opt{kgo.SeedBrokers(e.brokers...), kgo.SessionTimeout(6 * time.Second), kgo.RebalanceTimeout(20 * time.Second)},
		Logger:    testenv.Logger(),
	}
}

// openSink opens the sink of s over MySQL.
func openSink(t *testing.T, s sinkConfig) (*txsink.Sink, *mysqldriver.Driver) {
	t.Helper()
	sink, d, err := mysqldriver.OpenSink(context.Background(), s.DSNs, mysqldriver.Options{LockWaitTimeout: 2 * time.Second}, s.Config)
	if err != nil {
		t.Fatal(err)
	}
	return sink, d
}

func start(t *testing.T, e *env, mod func(*Config, *sinkConfig)) *instance {
	t.Helper()
	scfg := sinkConfig{DSNs: []string{e.dsn}, Config: txsink.Config{Branches: 2, Group: "g-" + e.topic, Topic: e.topic,
		StepTimeout: 10 * time.Second, Logger: testenv.Logger()}}
	cfg := testConfig(e)
	if mod != nil {
		mod(&cfg, &scfg)
	}
	ctx := context.Background()
	sink, d := openSink(t, scfg)
	p, err := New(cfg, sink, d.Stores())
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	in := &instance{p: p, sink: sink, cancel: cancel, done: make(chan error, 1)}
	go func() { in.done <- p.Run(rctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-in.done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("Run did not return within 30s of cancellation")
			}
			sink.Close()
			d.Close()
		})
	}
	in.shutdown = stop
	t.Cleanup(stop)
	return in
}

// stop shuts the instance down (once; the test's cleanup does it too).
func (in *instance) stop(*testing.T) { in.shutdown() }

type balance struct {
	Account  string `db:"account_id"`
	Currency string `db:"currency"`
	Amount   int64  `db:"balance_minor"`
	Count    int64  `db:"event_count"`
}

func balances(t *testing.T, db *sqlx.DB) map[string]balance {
	t.Helper()
	var rows []balance
	if err := db.Select(&rows, `SELECT account_id, currency, balance_minor, event_count FROM account_balances`); err != nil {
		t.Fatal(err)
	}
	m := map[string]balance{}
	for _, r := range rows {
		m[r.Account+"/"+r.Currency] = r
	}
	return m
}

func deadReasons(t *testing.T, db *sqlx.DB) map[string]int {
	t.Helper()
	var rows []struct {
		Reason string `db:"reason"`
		N      int    `db:"n"`
	}
	if err := db.Select(&rows, `SELECT reason, COUNT(*) AS n FROM dead_letters GROUP BY reason`); err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, r := range rows {
		m[r.Reason] = r.N
	}
	return m
}

// waitCounted waits until the ledger holds want events in total.
func waitCounted(t *testing.T, db *sqlx.DB, want int64, dead int) {
	t.Helper()
	var got, gotDead int64
	count := func() {
		_ = db.Get(&got, `SELECT COALESCE(SUM(event_count), 0) FROM account_balances`)
		_ = db.Get(&gotDead, `SELECT COUNT(*) FROM dead_letters`)
	}
	testenv.Eventually(t, 60*time.Second, "events counted", func() (bool, string) {
		count()
		return got >= want && gotDead >= int64(dead), fmt.Sprintf("%d events and %d dead letters, want %d and %d", got, gotDead, want, dead)
	})
	time.Sleep(300 * time.Millisecond) // would a surplus show up?
	count()
	if got != want || gotDead != int64(dead) {
		t.Fatalf("counted %d events and %d dead letters, want %d and %d", got, gotDead, want, dead)
	}
}

const t0 = "2026-11-29T13:05:00Z"

// Guarantees 1–3 in one pass: valid events count once, repeats within the
// TTL are dropped (also across partitions and checkpoints), conflicting
// repeats and bad input become dead letters.
func TestEndToEndDedupAndDeadLetters(t *testing.T) {
	e := newEnv(t, 4)
	var recs []*kgo.Record
	for i := range 50 {
		recs = append(recs, ev{fmt.Sprintf("e-%d", i), fmt.Sprintf("acct-%d", i%5), int64(100 + i), "EUR", t0}.record(""))
	}
	// Exact repeats, keyed elsewhere so they land on other partitions.
	for i := range 10 {
		recs = append(recs, ev{fmt.Sprintf("e-%d", i), fmt.Sprintf("acct-%d", i%5), int64(100 + i), "EUR", t0}.record(fmt.Sprintf("other-%d", i)))
	}
	produce(t, e, recs...)
	in := start(t, e, nil)
	waitCounted(t, e.db, 50, 0)

	// A later checkpoint: repeats of committed events, a conflicting
	// repeat, and malformed records.
	produce(t, e,
		ev{"e-1", "acct-1", 101, "EUR", t0}.record(""),
		ev{"e-2", "acct-2", 999, "EUR", t0}.record(""),
		&kgo.Record{Key: []byte("acct-1"), Value: []byte(`{"event_id":`)},
		&kgo.Record{Key: []byte("acct-1"), Value: []byte(`{"event_id":"x","account_id":"a","amount_minor":1.5,"currency":"EUR","occurred_at":"2026-11-29T13:05:00Z"}`)},
		ev{"e-100", "acct-1", 7, "eur", t0}.record(""),
	)
	waitCounted(t, e.db, 50, 4)
	got := balances(t, e.db)
	for a := range 5 {
		var want int64
		for i := a; i < 50; i += 5 {
			want += int64(100 + i)
		}
		if b := got[fmt.Sprintf("acct-%d/EUR", a)]; b.Amount != want || b.Count != 10 {
			t.Errorf("acct-%d = %+v, want %d over 10 events", a, b, want)
		}
	}
	reasons := deadReasons(t, e.db)
	if reasons["conflicting_duplicate"] != 1 || reasons["invalid_json"] != 1 || reasons["amount_not_integer"] != 1 || reasons["invalid_currency"] != 1 {
		t.Errorf("dead letters by reason = %v", reasons)
	}
	// Dead letters can be found by their event id whenever the payload
	// named a valid one.
	var named []string
	if err := e.db.Select(&named, `SELECT CONCAT(reason, '=', COALESCE(event_id, 'NULL')) FROM dead_letters ORDER BY reason`); err != nil {
		t.Fatal(err)
	}
	if want := "[amount_not_integer=x conflicting_duplicate=e-2 invalid_currency=e-100 invalid_json=NULL]"; fmt.Sprint(named) != want {
		t.Errorf("dead letters' event ids = %v, want %s", named, want)
	}
	st := in.p.Stats()
	if st.Duplicates.Load() != 11 {
		t.Errorf("duplicates = %d, want 11", st.Duplicates.Load())
	}
	groupOffsetsFollowMySQL(t, e)
}

// Guarantee 7: after checkpoints, the positions stored in MySQL are also
// the consumer group's committed offsets, so standard lag tools work.
func groupOffsetsFollowMySQL(t *testing.T, e *env) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(30 * time.Second)
	var diff string
	for time.Now().Before(deadline) {
		var rows []struct {
			Partition int32 `db:"kafka_partition"`
			Next      int64 `db:"next_offset"`
		}
		if err := e.db.Select(&rows, `SELECT kafka_partition, next_offset FROM partition_offsets WHERE kafka_topic = ?`, e.topic); err != nil {
			t.Fatal(err)
		}
		offs, err := adm.FetchOffsets(context.Background(), "g-"+e.topic)
		diff = ""
		if err != nil {
			diff = err.Error()
		}
		for _, r := range rows {
			if r.Next < 0 {
				continue // never checkpointed
			}
			if o, ok := offs.Lookup(e.topic, r.Partition); !ok || o.At != r.Next {
				diff += fmt.Sprintf(" partition %d: group %d, MySQL %d;", r.Partition, o.At, r.Next)
			}
		}
		if diff == "" && len(rows) > 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("group offsets do not follow MySQL:%s", diff)
}
