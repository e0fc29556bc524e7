package naive_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/bench/naive"
	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/service"
	"github.com/billing/ledger/internal/service/servicetest"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
	"github.com/billing/ledger/migrations"
)

// These tests show, against real Kafka and MariaDB, the failure modes the
// package documentation lists, and run the service on the same input to
// show that it does not have them.

const t0 = "2026-11-29T13:05:00Z"

type ev struct {
	ID       string `json:"event_id"`
	Account  string `json:"account_id"`
	Amount   int64  `json:"amount_minor"`
	Currency string `json:"currency"`
	At       string `json:"occurred_at"`
}

func events(n int) []ev {
	var out []ev
	for i := range n {
		out = append(out, ev{fmt.Sprintf("e-%d", i), fmt.Sprintf("acct-%d", i%3), int64(100 + i), "EUR", t0})
	}
	return out
}

func produce(t *testing.T, brokers []string, topic string, evs ...ev) {
	t.Helper()
	var recs []*kgo.Record
	for _, e := range evs {
		b, _ := json.Marshal(e)
		recs = append(recs, &kgo.Record{Key: []byte(e.Account), Value: b})
	}
	testenv.Produce(t, brokers, topic, recs...)
}

// database returns a fresh database with the ledger schema and
// naive_offsets.
func database(t *testing.T) *sqlx.DB {
	t.Helper()
	dsn, _ := testenv.LedgerDB(t)
	db, err := naive.OpenDB(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := naive.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db
}

// running is a naive job in its goroutine: done closes when Run returns
// err.
type running struct {
	done chan struct{}
	err  error
}

// job runs the naive consumer until the test ends or it fails.
func job(t *testing.T, brokers []string, topic string, db *sqlx.DB, fps *failpoint.Set) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	j, err := naive.New(ctx, naive.Config{
		Topic: topic, Consumer: "naive", KafkaOpts: []kgo.Opt{kgo.SeedBrokers(brokers...)},
		BatchRecords: 10, BatchWait: 200 * time.Millisecond, BillingWindow: time.Hour, MaxPayloadBytes: 4096,
		Failpoints: fps, Logger: testenv.Logger(),
	}, db)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r := &running{done: make(chan struct{})}
	go func() {
		r.err = j.Run(ctx)
		close(r.done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Error("naive job did not stop")
		}
		j.Close()
	})
	return r
}

// runService runs the exactly-once pipeline on the topic into db until the
// test ends.
func runService(t *testing.T, brokers []string, topic string, dsn string, fps *failpoint.Set) *pipeline.Pipeline {
	t.Helper()
	// The service's own configuration (config.Defaults), with a test's
	// timings; one branch, and checkpoints of ten records.
	c := servicetest.Config(brokers, dsn, topic)
	c.KafkaGroup, c.MySQLBranches, c.CheckpointMaxRecords, c.KafkaMaxPollRecords = "svc-"+topic, 1, 10, 10
	sinkCfg := servicetest.Sink(c, testenv.Logger())
	sinkCfg.Failpoints = fps
	ctx, cancel := context.WithCancel(context.Background())
	sink, dbs, err := mysqldriver.OpenSink(ctx, []string{dsn}, service.MySQLOptions(c), sinkCfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	p, err := pipeline.New(servicetest.Pipeline(c, testenv.Logger()), sink, dbs.Stores())
	if err != nil {
		cancel()
		sink.Close()
		dbs.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("service did not stop")
		}
		sink.Close()
		dbs.Close()
	})
	return p
}

// serviceDatabase is database for the service: the DSN is needed for the
// sink.
func serviceDatabase(t *testing.T) (*sqlx.DB, string) {
	t.Helper()
	dsn := testenv.NewDatabase(t)
	db, err := mysqldriver.OpenDB(dsn, 5*time.Second, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := migrations.Up(context.Background(), db.DB, testenv.Logger(), nil); err != nil {
		t.Fatal(err)
	}
	return db, dsn
}

func counted(t *testing.T, db *sqlx.DB) (events, amount int64) {
	t.Helper()
	var r struct {
		N int64 `db:"n"`
		A int64 `db:"a"`
	}
	if err := db.Get(&r, `SELECT COALESCE(SUM(event_count), 0) AS n, COALESCE(SUM(balance_minor), 0) AS a FROM account_balances`); err != nil {
		t.Fatal(err)
	}
	return r.N, r.A
}

func windowCount(t *testing.T, db *sqlx.DB) int64 {
	t.Helper()
	var n int64
	if err := db.Get(&n, `SELECT COALESCE(SUM(event_count), 0) FROM billing_windows`); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitFor polls cond until it holds or 60 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, what, func() (bool, string) { return cond(), "" })
}

// settle waits a little and checks that the count does not move on.
func settle(t *testing.T, db *sqlx.DB, want int64) {
	t.Helper()
	time.Sleep(700 * time.Millisecond)
	if n, _ := counted(t, db); n != want {
		t.Fatalf("counted %d events after settling, want %d", n, want)
	}
}

func nextOffset(t *testing.T, db *sqlx.DB) int64 {
	t.Helper()
	var n []int64
	if err := db.Select(&n, `SELECT next_offset FROM naive_offsets WHERE kafka_partition = 0`); err != nil {
		t.Fatal(err)
	}
	if len(n) == 0 {
		return 0
	}
	return n[0]
}

func sum(evs []ev) int64 {
	var s int64
	for _, e := range evs {
		s += e.Amount
	}
	return s
}

// A repeat that arrives in a later batch is counted a second time by the
// naive job: it dedups inside a batch only. The service drops it.
func TestCrossBatchDuplicateCountedTwice(t *testing.T) {
	brokers := testenv.Kafka(t)
	topic := testenv.NewTopic(t, brokers, 1)
	evs := events(10)
	repeat := evs[3]

	ndb := database(t)
	sdb, sdsn := serviceDatabase(t)
	produce(t, brokers, topic, evs...)
	nerr := job(t, brokers, topic, ndb, nil)
	runService(t, brokers, topic, sdsn, nil)

	// The first batch is written and its offsets recorded before the
	// repeat exists: the repeat can only fall into a later batch.
	waitFor(t, "the naive job's first batch", func() bool { return nextOffset(t, ndb) == 10 })
	waitFor(t, "the service's first checkpoint", func() bool { n, _ := counted(t, sdb); return n == 10 })
	produce(t, brokers, topic, repeat)

	waitFor(t, "the naive job to read the repeat", func() bool { return nextOffset(t, ndb) == 11 })
	if n, a := counted(t, ndb); n != 11 || a != sum(evs)+repeat.Amount {
		t.Fatalf("naive: %d events, amount %d; want the repeat counted twice: 11 events, amount %d", n, a, sum(evs)+repeat.Amount)
	}
	if n := windowCount(t, ndb); n != 11 {
		t.Fatalf("naive: windows count %d events, want 11", n)
	}
	select {
	case <-nerr.done:
		t.Fatalf("naive job stopped: %v", nerr.err)
	default:
	}

	// The service: exactly once (the repeat is a duplicate of a committed
	// key, found in the dedup state).
	settle(t, sdb, 10)
	if _, a := counted(t, sdb); a != sum(evs) {
		t.Fatalf("service: amount %d, want %d", a, sum(evs))
	}
}

// A crash between the results commit and the offset write makes the naive
// job count the whole batch again on restart. The service, stopped at the
// equivalent step (its results prepared, its offsets not yet decided),
// counts every event once.
func TestCrashBetweenResultsAndOffsetsDoubleCounts(t *testing.T) {
	brokers := testenv.Kafka(t)
	topic := testenv.NewTopic(t, brokers, 1)
	evs := events(10)
	produce(t, brokers, topic, evs...)

	ndb := database(t)
	fps, err := failpoint.Parse(naive.FailAfterResults + "=error@1")
	if err != nil {
		t.Fatal(err)
	}
	// The "crash": Run stops right after the results committed.
	crashed := job(t, brokers, topic, ndb, fps)
	select {
	case <-crashed.done:
		if !errors.Is(crashed.err, failpoint.ErrInjected) {
			t.Fatalf("naive job ended with %v, want the injected crash", crashed.err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("naive job did not reach the failpoint")
	}
	if n, _ := counted(t, ndb); n != 10 {
		t.Fatalf("after the crash: %d events counted, want the batch's 10", n)
	}
	if o := nextOffset(t, ndb); o != 0 {
		t.Fatalf("after the crash: offset %d recorded, want none", o)
	}

	// Restart: the batch is read again from the recorded offsets.
	job(t, brokers, topic, ndb, nil)
	waitFor(t, "the restarted naive job's batch", func() bool { return nextOffset(t, ndb) == 10 })
	if n, a := counted(t, ndb); n != 20 || a != 2*sum(evs) {
		t.Fatalf("naive after restart: %d events, amount %d; want every event counted twice: 20, %d", n, a, 2*sum(evs))
	}

	// The service with its first checkpoint failed between prepare and
	// decision: it aborts, replays, and counts each event once.
	sdb, sdsn := serviceDatabase(t)
	sfps, err := failpoint.Parse(txsink.FailAfterPrepare + "=error@1")
	if err != nil {
		t.Fatal(err)
	}
	p := runService(t, brokers, topic, sdsn, sfps)
	waitFor(t, "the service to count the events", func() bool { n, _ := counted(t, sdb); return n >= 10 })
	settle(t, sdb, 10)
	if a := p.Stats().Aborts.Load(); a < 1 {
		t.Fatalf("service: %d aborted checkpoints, want the injected one", a)
	}
	if _, a := counted(t, sdb); a != sum(evs) {
		t.Fatalf("service: amount %d, want %d", a, sum(evs))
	}
	if n := windowCount(t, sdb); n != 10 {
		t.Fatalf("service: windows count %d events, want 10", n)
	}
}
