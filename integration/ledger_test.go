package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/testenv"
)

// This file holds what the pipeline tests share: a test environment (topic,
// database, service binary), a deterministic workload with known totals, and
// exact checks of the ledger.

const billingPkg = "github.com/billing/ledger/cmd/billing"

type testEnv struct {
	brokers []string
	topic   string
	dsn     string
	db      *sqlx.DB
	bin     string
}

func newTestEnv(t *testing.T, partitions int) *testEnv {
	t.Helper()
	e := &testEnv{brokers: testenv.Kafka(t), bin: testenv.Binary(t, billingPkg)}
	e.topic = testenv.NewTopic(t, e.brokers, partitions)
	e.dsn = testenv.NewDatabase(t)
	db, err := sqlx.Open("mysql", e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	e.db = db
	return e
}

// serviceEnv is the service's configuration for tests: short intervals so
// that many checkpoints, rebalances and recoveries happen in seconds.
func (e *testEnv) serviceEnv(extra map[string]string) map[string]string {
	env := map[string]string{
		"KAFKA_BROKERS":           strings.Join(e.brokers, ","),
		"KAFKA_TOPIC":             e.topic,
		"KAFKA_GROUP":             "g-" + e.topic,
		"MYSQL_DSN":               e.dsn,
		"MYSQL_BRANCHES":          "2",
		"MYSQL_LOCK_WAIT_TIMEOUT": "1s",
		"CHECKPOINT_INTERVAL":     "100ms",
		"CHECKPOINT_TIMEOUT":      "4s",
		"CHECKPOINT_MAX_RECORDS":  "300",
		"KAFKA_MAX_POLL_RECORDS":  "100",
		"KAFKA_SESSION_TIMEOUT":   "6s",
		"KAFKA_REBALANCE_TIMEOUT": "10s",
		"RECOVERY_INTERVAL":       "1s",
		"DECISION_RETENTION":      "1h",
		"SHUTDOWN_TIMEOUT":        "10s",
		"HTTP_ADDR":               "",
		"LOG_FORMAT":              "text",
		"LOG_LEVEL":               envOr("TEST_SERVICE_LOG_LEVEL", "info"),
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

func (e *testEnv) start(t *testing.T, name string, extra map[string]string) *testenv.Process {
	t.Helper()
	return testenv.Start(t, name, e.bin, e.serviceEnv(extra))
}

type billingEvent struct {
	ID       string `json:"event_id"`
	Account  string `json:"account_id"`
	Amount   int64  `json:"amount_minor"`
	Currency string `json:"currency"`
	At       string `json:"occurred_at"`
}

// workload is a deterministic stream of events with known totals.
type workload struct {
	records []*kgo.Record
	want    map[string]total // by "account/currency"
	events  int64            // distinct valid events
}

type total struct{ amount, count int64 }

// newWorkload makes n distinct events over 40 accounts and two currencies,
// spread over three billing windows; every 5th event is sent a second time
// under another key, so that the repeat usually lands on another partition
// (and in a later checkpoint).
func newWorkload(prefix string, n int) *workload {
	w := &workload{want: map[string]total{}}
	var repeats []*kgo.Record
	base := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	for i := range n {
		cur := []string{"EUR", "USD"}[i%2]
		ev := billingEvent{
			ID:       fmt.Sprintf("%s-%d", prefix, i),
			Account:  fmt.Sprintf("acct-%d", i%40),
			Amount:   int64(i%17*100 - 300),
			Currency: cur,
			At:       base.Add(time.Duration(i%3) * time.Hour).Add(time.Duration(i) * time.Second).Format(time.RFC3339),
		}
		b, _ := json.Marshal(ev)
		w.records = append(w.records, &kgo.Record{Key: []byte(ev.Account), Value: b})
		if i%5 == 0 {
			repeats = append(repeats, &kgo.Record{Key: []byte("elsewhere-" + ev.ID), Value: b})
		}
		k := ev.Account + "/" + cur
		t := w.want[k]
		t.amount += ev.Amount
		t.count++
		w.want[k] = t
		w.events++
		// Interleave the repeats a little later in the stream.
		if i%50 == 49 {
			w.records = append(w.records, repeats...)
			repeats = nil
		}
	}
	w.records = append(w.records, repeats...)
	return w
}

// ledger reads account_balances; before the service created the table it
// is empty.
func ledger(t *testing.T, db *sqlx.DB) (map[string]total, int64) {
	t.Helper()
	var exists int
	if err := db.Get(&exists, `SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'account_balances'`); err != nil {
		t.Fatal(err)
	}
	if exists == 0 {
		return map[string]total{}, 0
	}
	var rows []struct {
		Account  string `db:"account_id"`
		Currency string `db:"currency"`
		Amount   int64  `db:"balance_minor"`
		Count    int64  `db:"event_count"`
	}
	if err := db.Select(&rows, `SELECT account_id, currency, balance_minor, event_count FROM account_balances`); err != nil {
		t.Fatal(err)
	}
	m := map[string]total{}
	var n int64
	for _, r := range rows {
		m[r.Account+"/"+r.Currency] = total{r.Amount, r.Count}
		n += r.Count
	}
	return m, n
}

// waitExact waits until the ledger counts as many events as the workload,
// then checks every balance exactly, that the windows add up to the
// balances, and that no dead letter was written.
func waitExact(t *testing.T, db *sqlx.DB, w *workload, timeout time.Duration) {
	t.Helper()
	waitExactOver(t, []*sqlx.DB{db}, w, timeout)
}

// waitExactOver is waitExact over the servers of a ledger (each balance on
// one of them).
func waitExactOver(t *testing.T, dbs []*sqlx.DB, w *workload, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var n int64
	for time.Now().Before(deadline) {
		if _, n = ledgerOver(t, dbs); n >= w.events {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // give a surplus the chance to show
	got, n := ledgerOver(t, dbs)
	if n != w.events {
		t.Fatalf("ledger counts %d events, want %d (lost %d, or counted twice %d)", n, w.events, max(w.events-n, 0), max(n-w.events, 0))
	}
	var diffs []string
	for k, want := range w.want {
		if got[k] != want {
			diffs = append(diffs, fmt.Sprintf("%s: got %+v want %+v", k, got[k], want))
		}
	}
	if len(got) != len(w.want) {
		diffs = append(diffs, fmt.Sprintf("%d balance rows, want %d", len(got), len(w.want)))
	}
	if len(diffs) > 0 {
		t.Fatalf("ledger differs:\n%s", strings.Join(diffs, "\n"))
	}
	var winSum, winCount, dead int64
	for _, db := range dbs {
		var s, c, d int64
		if err := db.Get(&s, `SELECT COALESCE(SUM(amount_minor),0) FROM billing_windows`); err != nil {
			t.Fatal(err)
		}
		_ = db.Get(&c, `SELECT COALESCE(SUM(event_count),0) FROM billing_windows`)
		_ = db.Get(&d, `SELECT COUNT(*) FROM dead_letters`)
		winSum, winCount, dead = winSum+s, winCount+c, dead+d
	}
	var balSum int64
	for _, v := range got {
		balSum += v.amount
	}
	if winSum != balSum || winCount != w.events || dead != 0 {
		t.Fatalf("windows sum %d over %d events (balances %d over %d); %d dead letters", winSum, winCount, balSum, w.events, dead)
	}
}

// ledgerOver is ledger over the servers of a ledger: each balance on one of
// them.
func ledgerOver(t *testing.T, dbs []*sqlx.DB) (map[string]total, int64) {
	t.Helper()
	all := map[string]total{}
	var n int64
	for i, db := range dbs {
		m, c := ledger(t, db)
		for k, v := range m {
			if _, dup := all[k]; dup {
				t.Fatalf("balance %s on server %d and on an earlier one", k, i)
			}
			all[k] = v
		}
		n += c
	}
	return all, n
}

// instanceOf extracts the instance id a service logged at start.
func instanceOf(t *testing.T, p *testenv.Process) string {
	t.Helper()
	if !p.WaitOutput(context.Background(), "instance=", 30*time.Second) {
		t.Fatalf("%s did not log its instance id", p.Name)
	}
	out := p.Output()
	i := strings.Index(out, "instance=") + len("instance=")
	j := strings.IndexAny(out[i:], " \n")
	return out[i : i+j]
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
