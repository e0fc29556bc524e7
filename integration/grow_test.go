package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/shards"
	"github.com/billing/ledger/internal/testenv"
)

// growEnv is a ledger on one server, counting with instances a and b,
// half of a workload of 3000 events sent (and at least min counted), and
// an empty database on a second server to add.
type growEnv struct {
	*testEnv
	dsnB string
	dbB  *sqlx.DB
	w    *workload
	half int
}

func newGrowEnv(t *testing.T, prefix string, counted int64, instances ...string) (*growEnv, []*testenv.Process) {
	t.Helper()
	g := &growEnv{testEnv: newTestEnv(t, 4), dsnB: testenv.NewDatabaseOn(t, testenv.MySQL2(t), testenv.RandomName("t_"))}
	var err error
	if g.dbB, err = sqlx.Open("mysql", g.dsnB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.dbB.Close() })
	g.w = newWorkload(prefix, 3000)
	g.half = len(g.w.records) / 2
	var ps []*testenv.Process
	for _, name := range instances {
		ps = append(ps, g.start(t, name, nil))
	}
	testenv.Produce(t, g.brokers, g.topic, g.w.records[:g.half]...)
	waitCountedOver(t, []*sqlx.DB{g.db}, counted, 60*time.Second)
	return g, ps
}

// A server added to a counting ledger (billing shards add), the command
// killed (SIGKILL) at each of its steps and run again: two instances count
// on one server; the move fences them (they stop, exit 4); two instances
// configured with both servers wait for it, then count the rest of the
// stream, with repeats of events counted before the move. The ledger is
// exact over both servers, no row is on both, and the new server holds its
// share of balances, windows and dedup keys (a repeat of a moved key is
// dropped there).
func TestAddServerToACountingLedger(t *testing.T) {
	for _, fp := range []string{shards.FailAfterFence, shards.FailAfterSettle, shards.FailAfterBatch + "=kill@2", shards.FailBeforeDone, shards.FailAfterDone} {
		if !strings.Contains(fp, "=") {
			fp += "=kill"
		}
		t.Run(fp, func(t *testing.T) { addServerKilled(t, fp) })
	}
}

func addServerKilled(t *testing.T, failpoints string) {
	g, ps := newGrowEnv(t, "grow", 200, "a", "b")
	e, dsnB, dbB, w, half := g.testEnv, g.dsnB, g.dbB, g.w, g.half
	a, b := ps[0], ps[1]
	// Every 7th record of the first half again, under another key, after
	// the move: a repeat whose key moved must be dropped.
	var repeats []*kgo.Record
	for i := 0; i < half; i += 7 {
		repeats = append(repeats, &kgo.Record{Key: []byte(fmt.Sprintf("again-%d", i)), Value: w.records[i].Value})
	}
	var err error

	both := map[string]string{"MYSQL_SHARD_DSNS": dsnB}
	mover := testenv.Start(t, "add-1", e.bin, e.serviceEnv(map[string]string{"BILLING_FAILPOINTS": failpoints}), "shards", "add", "--dsn", dsnB)
	err = mover.Wait(t, 120*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the move was not killed at %s: %v\n%s", failpoints, err, lastLines(mover.Output(), 20))
	}
	for _, p := range []*testenv.Process{a, b} {
		err := p.Wait(t, 60*time.Second)
		if !errors.As(err, &exit) || exit.ExitCode() != 4 || !strings.Contains(p.Output(), "not the ledger's layout") {
			t.Fatalf("instance %s on the old layout: %v, want exit 4 for the layout change:\n%s", p.Name, err, lastLines(p.Output(), 20))
		}
	}
	// Instances on the new layout wait for the move (unless it was
	// done), which is resumed.
	c := e.start(t, "c", both)
	d := e.start(t, "d", both)
	if failpoints != shards.FailAfterDone+"=kill" && !c.WaitOutput(context.Background(), "waiting for the move", 30*time.Second) {
		t.Fatalf("c did not wait for the move:\n%s", lastLines(c.Output(), 20))
	}
	mover = testenv.Start(t, "add-2", e.bin, e.serviceEnv(nil), "shards", "add", "--dsn", dsnB)
	if err := mover.Wait(t, 120*time.Second); err != nil {
		t.Fatalf("resumed move: %v\n%s", err, mover.Output())
	}
	testenv.Produce(t, e.brokers, e.topic, append(w.records[half:], repeats...)...)
	dbs := []*sqlx.DB{e.db, dbB}
	waitExactOver(t, dbs, w, 120*time.Second)
	for _, table := range []string{"account_balances", "billing_windows", "dedup_keys"} {
		keyCols := map[string]string{"account_balances": "account_id, currency", "billing_windows": "account_id, currency, window_start", "dedup_keys": "event_id"}[table]
		var keysA, keysB []string
		if err := e.db.Select(&keysA, "SELECT CONCAT_WS('/', "+keyCols+") FROM "+table); err != nil {
			t.Fatal(err)
		}
		if err := dbB.Select(&keysB, "SELECT CONCAT_WS('/', "+keyCols+") FROM "+table); err != nil {
			t.Fatal(err)
		}
		if len(keysB) == 0 {
			t.Errorf("the new server holds no row of %s", table)
		}
		inA := map[string]bool{}
		for _, k := range keysA {
			inA[k] = true
		}
		onBoth := 0
		for _, k := range keysB {
			if inA[k] {
				onBoth++
			}
		}
		if onBoth > 0 {
			t.Errorf("%s: %d rows on both servers", table, onBoth)
		}
		t.Logf("%s: %d rows on the first server, %d on the new one", table, len(keysA), len(keysB))
	}
	for _, p := range []*testenv.Process{c, d} {
		if p.Exited() {
			t.Fatalf("%s stopped:\n%s", p.Name, lastLines(p.Output(), 20))
		}
	}
}

// A run of billing shards add paused (SIGSTOP) with a batch of rows read
// but not written, while another run finishes the move and instances count
// on the new layout, changes nothing once it wakes: its stale rows never
// overwrite the new server's, its deletes find nothing left, and its
// record of the move is of one already done.
func TestPausedAddChangesNothingAfterAnotherFinished(t *testing.T) {
	g, ps := newGrowEnv(t, "paused", 1000, "a")
	e, dsnB, w, half, a := g.testEnv, g.dsnB, g.w, g.half, ps[0]

	paused := testenv.Start(t, "add-paused", e.bin, e.serviceEnv(map[string]string{"BILLING_FAILPOINTS": shards.FailBeforeCopy + "=stop@1"}),
		"shards", "add", "--dsn", dsnB)
	if !paused.WaitOutput(context.Background(), "failpoint "+shards.FailBeforeCopy+": SIGSTOP", 60*time.Second) {
		t.Fatalf("the move never paused:\n%s", paused.Output())
	}
	t.Cleanup(func() { paused.Signal(syscall.SIGCONT) })
	_ = a.Wait(t, 60*time.Second)
	c := e.start(t, "c", map[string]string{"MYSQL_SHARD_DSNS": dsnB})
	other := testenv.Start(t, "add-2", e.bin, e.serviceEnv(nil), "shards", "add", "--dsn", dsnB)
	if err := other.Wait(t, 120*time.Second); err != nil {
		t.Fatalf("the second run: %v\n%s", err, other.Output())
	}
	// Every balance on the new server changes after the move.
	testenv.Produce(t, e.brokers, e.topic, w.records[half:]...)
	dbs := []*sqlx.DB{e.db, g.dbB}
	waitExactOver(t, dbs, w, 120*time.Second)
	paused.Signal(syscall.SIGCONT)
	if err := paused.Wait(t, 60*time.Second); err != nil {
		t.Fatalf("the paused run, woken: %v\n%s", err, paused.Output())
	}
	waitExactOver(t, dbs, w, 30*time.Second)
	if c.Exited() {
		t.Fatalf("c stopped:\n%s", lastLines(c.Output(), 20))
	}
}

// A move is not a change of a row: with the changelog on (and ledger
// entries, which move too), a server added between two halves of a stream
// leaves every chain of the changelog unbroken (the next change of a moved
// row takes up from its image before the move), and the last images equal
// the rows of both servers; the outbox a checkpoint left on the first
// server before the fence is published from there.
func TestAddServerKeepsTheChangelogsChains(t *testing.T) {
	prefix := testenv.RandomName("grow-cl-")
	cleanupChangelogTopics(t, testenv.Kafka(t), prefix)
	env := func(extra map[string]string) map[string]string {
		m := map[string]string{"CHANGELOG_TOPIC_PREFIX": prefix, "CHANGELOG_LEASE": "2s", "CHANGELOG_TOPIC_PARTITIONS": "3",
			"CHANGELOG_TOPIC_REPLICATION": "1", "LEDGER_ENTRIES": "true"}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	e := newTestEnv(t, 4)
	dsnB := testenv.NewDatabaseOn(t, testenv.MySQL2(t), testenv.RandomName("t_"))
	w := newWorkload("grow-cl", 2000)
	half := len(w.records) / 2
	a := e.start(t, "a", env(nil))
	testenv.Produce(t, e.brokers, e.topic, w.records[:half]...)
	waitCountedOver(t, []*sqlx.DB{e.db}, 500, 60*time.Second)
	mover := testenv.Start(t, "add", e.bin, e.serviceEnv(env(nil)), "shards", "add", "--dsn", dsnB)
	if err := mover.Wait(t, 120*time.Second); err != nil {
		t.Fatalf("shards add: %v\n%s", err, mover.Output())
	}
	_ = a.Wait(t, 60*time.Second)
	c := e.start(t, "c", env(map[string]string{"MYSQL_SHARD_DSNS": dsnB}))
	testenv.Produce(t, e.brokers, e.topic, w.records[half:]...)
	dbB, err := sqlx.Open("mysql", dsnB)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dbB.Close() })
	waitExactOver(t, []*sqlx.DB{e.db, dbB}, w, 120*time.Second)
	waitPublished(t, e.dsn, 60*time.Second)
	summary, rows, err := changelogMatches(context.Background(), e.brokers, e.dsn, prefix, dsnB)
	if err != nil {
		t.Fatal(err)
	}
	var onB int
	if err := dbB.Get(&onB, `SELECT COUNT(*) FROM ledger_entries`); err != nil {
		t.Fatal(err)
	}
	if onB == 0 || rows["ledger_entries"] == 0 {
		t.Fatalf("ledger entries: %d on the new server, %d in all", onB, rows["ledger_entries"])
	}
	t.Log(summary)
	if c.Exited() {
		t.Fatalf("c stopped:\n%s", lastLines(c.Output(), 20))
	}
}

// waitCountedOver waits until the servers' balances count at least n events.
func waitCountedOver(t *testing.T, dbs []*sqlx.DB, n int64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if _, got := ledgerOver(t, dbs); got >= n {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("fewer than %d events counted in %v", n, timeout)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
