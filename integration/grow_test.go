package integration_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/shards"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// growEnv is a ledger on one server, counting with instances restarted
// with the second server in their list (to be added: they place nothing
// there until the move begins), half of a workload of 3000 events sent (and at
// least counted of them counted), and an empty database on a second
// server to add.
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
	// A rolling restart gives the instances the server to add.
	for i, p := range ps {
		p.Signal(syscall.SIGTERM)
		if err := p.Wait(t, 60*time.Second); err != nil {
			t.Fatalf("%s, stopped for the restart: %v", p.Name, err)
		}
		ps[i] = g.start(t, p.Name+"-both", g.both())
	}
	return g, ps
}

// both is the environment of an instance configured with both servers.
func (g *growEnv) both() map[string]string { return map[string]string{"MYSQL_SHARD_DSNS": g.dsnB} }

// pausedMove starts billing shards add of the second server in one step
// (--step-rows 1000000), stopped (SIGSTOP) at failpoint, and returns it;
// it is woken at the test's end.
func (g *growEnv) pausedMove(t *testing.T, failpoint string) *testenv.Process {
	t.Helper()
	mover := testenv.Start(t, "add", g.bin, g.serviceEnv(map[string]string{"BILLING_FAILPOINTS": failpoint + "=stop"}),
		"shards", "add", "--dsn", g.dsnB, "--step-rows", "1000000")
	if !mover.WaitOutput(context.Background(), "failpoint "+failpoint+": SIGSTOP", 60*time.Second) {
		t.Fatalf("the move never paused at %s:\n%s", failpoint, mover.Output())
	}
	t.Cleanup(func() { mover.Signal(syscall.SIGCONT) })
	return mover
}

// heldCheckpoint stops instance p and starts it again with both servers
// and its first checkpoint stopped (SIGSTOP) between its prepare and its
// decision, over the rest of the stream, sent now; it returns the
// instance, woken at the test's end. (p may not have set up its signal
// handling yet: how it ends does not matter.)
func (g *growEnv) heldCheckpoint(t *testing.T, p *testenv.Process) *testenv.Process {
	t.Helper()
	p.Signal(syscall.SIGTERM)
	_ = p.Wait(t, 60*time.Second)
	env := g.both()
	env["BILLING_FAILPOINTS"] = "after-prepare=stop@1"
	a := g.start(t, "a-held", env)
	testenv.Produce(t, g.brokers, g.topic, g.w.records[g.half:]...)
	if !a.WaitOutput(context.Background(), "failpoint after-prepare: SIGSTOP", 60*time.Second) {
		t.Fatalf("the checkpoint never stopped after its prepare:\n%s", lastLines(a.Output(), 20))
	}
	t.Cleanup(func() { a.Signal(syscall.SIGCONT) })
	return a
}

// moverArgs are billing shards add's: small steps with a rest, so that a
// move of this ledger takes many steps and counting runs between them.
func (g *growEnv) moverArgs() []string {
	return []string{"shards", "add", "--dsn", g.dsnB, "--step-rows", "150", "--rest", "1", "--rest-checkpoints", "0"}
}

// A server added to a counting ledger (billing shards add) while the
// instances count: the command killed (SIGKILL) at each of its steps, and
// a counting instance with it, then both run again. Two instances count,
// configured with both servers; a third, configured with the first server
// only, stops when the move begins (exit 4, saying what to do). The rest
// of the stream, with repeats of events counted before, is sent while the
// move runs. The ledger is exact over both servers, no row is on both, the
// new server holds its share of balances, windows and dedup keys (a repeat
// of a moved key is dropped there), the instances counted while the move
// ran, and none stopped.
func TestAddServerToACountingLedger(t *testing.T) {
	for _, fp := range []string{shards.FailAfterBegin, shards.FailAfterAnnounce + "=kill@3", shards.FailAfterFreeze + "=kill@2", shards.FailAfterBatch + "=kill@3",
		shards.FailBeforeUnfreeze + "=kill@2", shards.FailAfterStep + "=kill@4", shards.FailAfterDone} {
		if !strings.Contains(fp, "=") {
			fp += "=kill"
		}
		t.Run(fp, func(t *testing.T) { addServerKilled(t, fp) })
	}
}

func addServerKilled(t *testing.T, failpoints string) {
	g, ps := newGrowEnv(t, "grow", 200, "a", "b")
	e, dbB, w, half := g.testEnv, g.dbB, g.w, g.half
	a, b := ps[0], ps[1]
	old := e.start(t, "old", nil)
	// Every 7th record of the first half again, under another key, with
	// the rest: a repeat whose key moved must be dropped.
	var repeats []*kgo.Record
	for i := 0; i < half; i += 7 {
		repeats = append(repeats, &kgo.Record{Key: []byte(fmt.Sprintf("again-%d", i)), Value: w.records[i].Value})
	}
	rest := append(slices.Clone(w.records[half:]), repeats...)
	dbs := []*sqlx.DB{e.db, dbB}

	mover := testenv.Start(t, "add-1", e.bin, e.serviceEnv(map[string]string{"BILLING_FAILPOINTS": failpoints}), g.moverArgs()...)
	// The rest of the stream, in slices, while the move runs.
	sent := make(chan struct{})
	t.Cleanup(func() { <-sent })
	go func() {
		defer close(sent)
		for i := 0; i < len(rest); i += 100 {
			testenv.Produce(t, e.brokers, e.topic, rest[i:min(i+100, len(rest))]...)
			time.Sleep(50 * time.Millisecond)
		}
	}()
	err := mover.Wait(t, 120*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the move was not killed at %s: %v\n%s", failpoints, err, lastLines(mover.Output(), 20))
	}
	// A counting instance killed with it, and started again.
	b.Signal(syscall.SIGKILL)
	_ = b.Wait(t, 30*time.Second)
	b = e.start(t, "b2", g.both())
	_, before := ledgerOver(t, dbs)
	mover = testenv.Start(t, "add-2", e.bin, e.serviceEnv(nil), g.moverArgs()...)
	if err := mover.Wait(t, 120*time.Second); err != nil {
		t.Fatalf("resumed move: %v\n%s", err, mover.Output())
	}
	_, after := ledgerOver(t, dbs)
	<-sent
	waitExactOver(t, dbs, w, 120*time.Second)
	t.Logf("counted %d events while the resumed move ran (%d before it, %d in all)", after-before, before, w.events)
	if failpoints != shards.FailAfterDone+"=kill" && !strings.Contains(mover.Output(), "moved a step of keys") {
		t.Errorf("the resumed move moved no step:\n%s", lastLines(mover.Output(), 20))
	}

	// The instance without the new server stopped, saying what to do.
	err = old.Wait(t, 60*time.Second)
	if !errors.As(err, &exit) || exit.ExitCode() != 4 || !strings.Contains(old.Output(), "to MYSQL_SHARD_DSNS") {
		t.Fatalf("instance old, configured with the first server only: %v, want exit 4 saying to add the server:\n%s", err, lastLines(old.Output(), 20))
	}
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
	for _, p := range []*testenv.Process{a, b} {
		if p.Exited() {
			t.Fatalf("%s stopped:\n%s", p.Name, lastLines(p.Output(), 20))
		}
	}
}

// A checkpoint held between its prepare and its decision (the instance
// stopped by a failpoint, its branches holding rows of the first server),
// built after the move began, while a step freezes every key: the mover
// waits for its locks; once the instance wakes, its decision finds the
// keys frozen and is refused (txsink.ErrLayoutMoved), so the rows it wrote
// on the old server are rolled back and written again on the new one,
// never deleted by the move after they committed. Without the decision's
// check the step moved the balances as they were before it (176 events
// lost).
func TestAddServerRefusesACheckpointHeldAcrossTheMove(t *testing.T) {
	g, ps := newGrowEnv(t, "held", 1000, "a")
	e, w := g.testEnv, g.w
	// The move begun (its fence passed), then paused.
	mover := g.pausedMove(t, shards.FailAfterBegin)
	a := g.heldCheckpoint(t, ps[0])
	mover.Signal(syscall.SIGCONT)
	// The step's delete waits for the held branch's locks (a lock wait
	// timeout, then the table's step again).
	if !mover.WaitOutput(context.Background(), "starting the table's step again", 30*time.Second) || mover.Exited() {
		t.Fatalf("the move ended while a prepared checkpoint held rows it moves:\n%s", mover.Output())
	}
	a.Signal(syscall.SIGCONT)
	if err := mover.Wait(t, 120*time.Second); err != nil {
		t.Fatalf("shards add: %v\n%s", err, mover.Output())
	}
	waitExactOver(t, []*sqlx.DB{e.db, g.dbB}, w, 120*time.Second)
	if !strings.Contains(a.Output(), "layout moved") {
		t.Errorf("the held checkpoint was not refused for the move:\n%s", lastLines(a.Output(), 30))
	}
	if a.Exited() {
		t.Fatalf("a stopped:\n%s", lastLines(a.Output(), 20))
	}
}

// A checkpoint held between its prepare and its decision (its instance
// stopped by a failpoint) from before the move began: the begin does not
// fence an instance that follows the move's cursor, so when the checkpoint
// wakes before the first step freezes, the step only announced, it
// commits (no key has moved: the keys it placed are where the move reads
// them), and when it wakes after a step froze keys (the mover waited for
// it to say it waits, then froze without it) it is refused
// (txsink.ErrLayoutMoved) and built again. Either way the ledger is exact
// over both servers. Fencing every instance at the begin, as the move did
// before migration 00014, would refuse the first ones too; accepting the
// last would lose the events it counted.
func TestAddServerBeginKeepsTheCheckpointInFlight(t *testing.T) {
	for _, tc := range []struct {
		wake    string // the mover's failpoint at which the checkpoint wakes
		refused bool
	}{{shards.FailAfterBegin, false}, {shards.FailAfterAnnounce, false}, {shards.FailAfterFreeze, true}} {
		t.Run(tc.wake, func(t *testing.T) {
			g, ps := newGrowEnv(t, "inflight", 1000, "a")
			e, w := g.testEnv, g.w
			a := g.heldCheckpoint(t, ps[0])
			mover := g.pausedMove(t, tc.wake)
			dbs := []*sqlx.DB{e.db, g.dbB}
			_, before := ledgerOver(t, dbs)
			a.Signal(syscall.SIGCONT)
			// The held checkpoint's decision: refused, or committed.
			if tc.refused {
				if !a.WaitOutput(context.Background(), "layout moved", 60*time.Second) {
					t.Fatalf("the held checkpoint was not refused for the step it met:\n%s", lastLines(a.Output(), 30))
				}
			} else {
				waitCountedOver(t, dbs, before+1, 60*time.Second)
			}
			held := a.Output()
			mover.Signal(syscall.SIGCONT)
			if err := mover.Wait(t, 120*time.Second); err != nil {
				t.Fatalf("shards add: %v\n%s", err, mover.Output())
			}
			waitExactOver(t, dbs, w, 120*time.Second)
			if strings.Contains(held, "fenced") {
				t.Errorf("the begin fenced an instance that follows the move:\n%s", lastLines(held, 30))
			}
			if got := strings.Contains(held, "layout moved"); got != tc.refused {
				t.Errorf("the held checkpoint refused for the move: %v, want %v:\n%s", got, tc.refused, lastLines(held, 30))
			}
			if a.Exited() {
				t.Fatalf("a stopped:\n%s", lastLines(a.Output(), 20))
			}
		})
	}
}

// A run of billing shards add paused (SIGSTOP) with a batch of rows read
// but not written, while another run takes the move over and finishes it
// and an instance counts on the new layout, changes nothing once it
// wakes: its stale rows never overwrite the new server's, its deletes find
// nothing left, and its next change of the move's cursor finds the other
// run's: it ends, the move being done.
func TestPausedAddChangesNothingAfterAnotherFinished(t *testing.T) {
	g, ps := newGrowEnv(t, "paused", 1000, "a")
	e, w, half, a := g.testEnv, g.w, g.half, ps[0]

	paused := testenv.Start(t, "add-paused", e.bin, e.serviceEnv(map[string]string{"BILLING_FAILPOINTS": shards.FailBeforeCopy + "=stop@1"}), g.moverArgs()...)
	if !paused.WaitOutput(context.Background(), "failpoint "+shards.FailBeforeCopy+": SIGSTOP", 60*time.Second) {
		t.Fatalf("the move never paused:\n%s", paused.Output())
	}
	t.Cleanup(func() { paused.Signal(syscall.SIGCONT) })
	other := testenv.Start(t, "add-2", e.bin, e.serviceEnv(nil), g.moverArgs()...)
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
	if !strings.Contains(paused.Output(), "another run of billing shards add finished the move") {
		t.Errorf("the paused run did not notice the other's:\n%s", lastLines(paused.Output(), 20))
	}
	waitExactOver(t, dbs, w, 30*time.Second)
	if a.Exited() {
		t.Fatalf("a stopped:\n%s", lastLines(a.Output(), 20))
	}
}

// A move is not a change of a row: with the changelog on (and ledger
// entries, which move too), a server added between two halves of a stream
// leaves every chain of the changelog unbroken (the next change of a moved
// row takes up from its image before the move), and the last images equal
// the rows of both servers. The second half is sent while the move runs.
// billing compare finds the grown ledger EXACT against one rebuilt from
// the topic on one server.
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
	// Restarted with the server to add.
	a.Signal(syscall.SIGTERM)
	_ = a.Wait(t, 60*time.Second)
	c := e.start(t, "c", env(map[string]string{"MYSQL_SHARD_DSNS": dsnB}))
	mover := testenv.Start(t, "add", e.bin, e.serviceEnv(env(nil)), "shards", "add", "--dsn", dsnB, "--step-rows", "200")
	testenv.Produce(t, e.brokers, e.topic, w.records[half:]...)
	if err := mover.Wait(t, 120*time.Second); err != nil {
		t.Fatalf("shards add: %v\n%s", err, mover.Output())
	}
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

	// The grown ledger equals one rebuilt from the topic on one server.
	rebuiltDSN := testenv.NewDatabase(t)
	rebuilt := map[string]string{"MYSQL_DSN": rebuiltDSN, "KAFKA_GROUP": "rebuilt-" + e.topic, "LEDGER_ENTRIES": "true"}
	e.start(t, "rebuilt", rebuilt)
	rdb, err := sqlx.Open("mysql", rebuiltDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	waitExactOver(t, []*sqlx.DB{rdb}, w, 120*time.Second)
	out, code := e.cliRun(t, env(map[string]string{"MYSQL_SHARD_DSNS": dsnB}), "compare", "--other-dsn", rebuiltDSN)
	if code != 0 || !strings.Contains(out, "EXACT") {
		t.Fatalf("billing compare of the grown ledger with a rebuilt one: exit %d\n%s", code, out)
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

// A server added and drained again (billing shards remove) while the
// instances count, the drain killed at a step and run again: the ledger is
// exact over both servers during it, the drained server holds no keyed
// row after it, and an instance configured without it counts on, exact
// on the first server alone, repeats of events once on the drained server
// dropped.
func TestRemoveServerWhileCounting(t *testing.T) {
	g, ps := newGrowEnv(t, "drain", 1000, "a")
	e, w, half, dbB := g.testEnv, g.w, g.half, g.dbB
	add := testenv.Start(t, "add", e.bin, e.serviceEnv(nil), g.moverArgs()...)
	if err := add.Wait(t, 120*time.Second); err != nil {
		t.Fatalf("shards add: %v\n%s", err, add.Output())
	}
	sent := make(chan struct{})
	t.Cleanup(func() { <-sent })
	go func() {
		defer close(sent)
		for i := half; i < len(w.records); i += 100 {
			testenv.Produce(t, e.brokers, e.topic, w.records[i:min(i+100, len(w.records))]...)
			time.Sleep(50 * time.Millisecond)
		}
	}()
	removeArgs := []string{"shards", "remove", "--dsn", g.dsnB, "--step-rows", "150", "--rest", "1", "--rest-checkpoints", "0"}
	armed := g.both()
	armed["BILLING_FAILPOINTS"] = shards.FailAfterBatch + "=kill@2"
	killed := testenv.Start(t, "remove-1", e.bin, e.serviceEnv(armed), removeArgs...)
	err := killed.Wait(t, 120*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the drain was not killed: %v\n%s", err, lastLines(killed.Output(), 20))
	}
	again := testenv.Start(t, "remove-2", e.bin, e.serviceEnv(g.both()), removeArgs...)
	if err := again.Wait(t, 120*time.Second); err != nil {
		t.Fatalf("shards remove, run again: %v\n%s", err, again.Output())
	}
	<-sent
	waitExactOver(t, []*sqlx.DB{e.db, dbB}, w, 120*time.Second)
	for _, m := range mysqldriver.MovedTables {
		var n int
		if err := dbB.Get(&n, "SELECT COUNT(*) FROM "+m.Table); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("the drained server still holds %d rows of %s", n, m.Table)
		}
	}
	if ps[0].Exited() {
		t.Fatalf("a stopped during the drain:\n%s", lastLines(ps[0].Output(), 20))
	}
	ps[0].Signal(syscall.SIGTERM)
	_ = ps[0].Wait(t, 60*time.Second)
	one := e.start(t, "a-one", nil)
	var repeats []*kgo.Record
	for i := 0; i < len(w.records); i += 11 {
		repeats = append(repeats, &kgo.Record{Key: []byte(fmt.Sprintf("again-%d", i)), Value: w.records[i].Value})
	}
	testenv.Produce(t, e.brokers, e.topic, repeats...)
	time.Sleep(2 * time.Second)
	waitExactOver(t, []*sqlx.DB{e.db}, w, 60*time.Second)
	if one.Exited() {
		t.Fatalf("the instance without the drained server stopped:\n%s", lastLines(one.Output(), 20))
	}
}
