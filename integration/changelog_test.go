package integration_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/changelogtest"
	"github.com/billing/ledger/internal/publisher"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// The changelog out of the service on real Kafka and MariaDB, exactly
// once, through kill -9 and a pause: an instance killed after a
// checkpoint's branches prepared (the Debezium problem: their outbox rows
// roll back with them) and a publisher killed after its Kafka commit
// before its MySQL bookkeeping; then a publisher paused (SIGSTOP) with a
// transaction produced and not committed, while another instance takes
// the lease and initialises the transactional id (which aborts the paused
// one's transaction and fences it); the paused one resumes and fails to
// commit. A read_committed consumer then finds every key's chain unbroken,
// nothing twice, and the last images, the sealed windows and the entries
// equal to MariaDB's tables.
func TestChangelogExactlyOnceThroughKillsAndAPause(t *testing.T) {
	e := newTestEnv(t, 6)
	prefix := "cl-" + e.topic
	cleanupChangelogTopics(t, e.brokers, prefix)
	w := newWorkload("cl", 3000)
	half := len(w.records) / 2
	testenv.Produce(t, e.brokers, e.topic, w.records[:half]...)
	env := func(fps string) map[string]string {
		return map[string]string{"CHANGELOG_TOPIC_PREFIX": prefix, "CHANGELOG_LEASE": "2s", "CHANGELOG_TOPIC_PARTITIONS": "3",
			"CHANGELOG_TOPIC_REPLICATION": "1", "CHANGELOG_TRANSACTION_MAX_EVENTS": "150", "LEDGER_ENTRIES": "true",
			"WINDOW_CLOSE_AFTER": "30m", "BILLING_FAILPOINTS": fps}
	}
	// The first publisher dies at its third transaction after the Kafka
	// commit; the second instance, at its first checkpoint after prepare
	// (the second half of the events arrives once it runs).
	p0 := e.start(t, "p0", env("changelog-after-kafka=kill@3"))
	if !p0.WaitOutput(context.Background(), "publishing the changelog", 60*time.Second) {
		t.Fatalf("p0 never published:\n%s", p0.Output())
	}
	p1 := e.start(t, "p1", env("after-prepare=kill@1"))
	if !p1.WaitOutput(context.Background(), "msg=starting", 60*time.Second) {
		t.Fatalf("p1 never started:\n%s", p1.Output())
	}
	testenv.Produce(t, e.brokers, e.topic, w.records[half:]...)
	for _, c := range []struct {
		p  *testenv.Process
		at string
	}{{p0, "changelog-after-kafka"}, {p1, "after-prepare"}} {
		if err := c.p.Wait(t, 120*time.Second); err == nil || !strings.Contains(err.Error(), "killed") ||
			!strings.Contains(c.p.Output(), "failpoint "+c.at+": SIGKILL") {
			t.Fatalf("ended with %v, want killed at %s:\n%s", err, c.at, c.p.Output())
		}
	}

	paused := e.start(t, "paused", env("changelog-after-produce=stop@2"))
	if !paused.WaitOutput(context.Background(), "failpoint changelog-after-produce: SIGSTOP", 90*time.Second) {
		t.Fatalf("the publisher never paused:\n%s", paused.Output())
	}
	next := e.start(t, "next", env(""))
	if !next.WaitOutput(context.Background(), "publishing the changelog", 60*time.Second) {
		t.Fatalf("the next instance never took over the publishing:\n%s", next.Output())
	}
	paused.Signal(syscall.SIGCONT)
	waitCounted(t, e, w, 120*time.Second)
	waitSealed(t, e, 60*time.Second)
	waitPublished(t, e.dsn, 60*time.Second)
	if !paused.WaitOutput(context.Background(), "changelog publishing stopped", 30*time.Second) {
		t.Errorf("the paused publisher's transaction did not fail once it resumed:\n%s", paused.Output())
	}
	for _, p := range []*testenv.Process{paused, next} {
		p.Signal(syscall.SIGTERM)
		if err := p.Wait(t, 30*time.Second); err != nil {
			t.Errorf("exit: %v", err)
		}
	}
	checkChangelog(t, e.brokers, e.dsn, prefix)
}

// waitCounted waits until the balances are exactly the workload's, and
// checks that the windows and adjustments sum to them (waitExact without
// windows that close).
func waitCounted(t *testing.T, e *testEnv, w *workload, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, timeout, "every event counted once", func() (bool, string) {
		got, n := ledger(t, e.db)
		for k, want := range w.want {
			if got[k] != want {
				return false, fmt.Sprintf("%d events counted; %s: %+v, want %+v", n, k, got[k], want)
			}
		}
		return n == w.events && len(got) == len(w.want), fmt.Sprintf("%d events counted, want %d", n, w.events)
	})
	var sums struct{ Amount, Count int64 }
	if err := e.db.Get(&sums, `SELECT COALESCE(SUM(amount_minor),0) AS amount, COALESCE(SUM(event_count),0) AS count FROM
		(SELECT amount_minor, event_count FROM billing_windows UNION ALL SELECT amount_minor, event_count FROM window_adjustments) AS x`); err != nil {
		t.Fatal(err)
	}
	if sums.Count != w.events {
		t.Fatalf("windows and adjustments count %d events, want %d", sums.Count, w.events)
	}
}

// waitSealed waits until a window of the workload is sealed. Sealing is
// the checkpoint after the one that closes a window, which follows the one
// whose events moved the watermark past it: the events can all be counted
// and every decision published before it, and a test that checks the
// changelog of closed windows must not stop the service until then (it
// did, once, under load: closed_windows had no row).
func waitSealed(t *testing.T, e *testEnv, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, timeout, "a window sealed", func() (bool, string) {
		var n int
		err := e.db.Get(&n, `SELECT COUNT(*) FROM billing_windows WHERE closed_at IS NOT NULL`)
		return err == nil && n > 0, fmt.Sprintf("%d sealed (%v)", n, err)
	})
}

// waitPublished waits until every commit decision is applied and
// published (the hint: the outbox rows are deleted).
func waitPublished(t *testing.T, dsn string, timeout time.Duration) {
	t.Helper()
	if err := published(context.Background(), dsn, timeout); err != nil {
		t.Fatal(err)
	}
}

func published(ctx context.Context, dsn string, timeout time.Duration) error {
	d, err := mysqldriver.Open(ctx, []string{dsn}, mysqldriver.Options{})
	if err != nil {
		return err
	}
	defer d.Close()
	deadline := time.Now().Add(timeout)
	for {
		pos, err1 := d.Control().CommitPosition(ctx)
		st, err2 := d.Control().Changelog(ctx)
		if err1 == nil && err2 == nil && pos.Visible == pos.Decided && st.Published == pos.Decided {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not every checkpoint published within %s: position %+v, changelog %+v (%v %v)", timeout, pos, st, err1, err2)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkChangelog reads the changelog's topics read_committed and checks
// them against the ledger's tables.
func checkChangelog(t *testing.T, brokers []string, dsn, prefix string) {
	t.Helper()
	summary, rows, err := changelogMatches(context.Background(), brokers, dsn, prefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{changelog.AccountBalances, changelog.BillingWindows, changelog.ClosedWindows, changelog.LedgerEntries} {
		if rows[table] == 0 {
			t.Errorf("%s: no row: the run exercised nothing", table)
		}
	}
	t.Log(summary)
}

// changelogMatches is the consumer's check of the changelog of prefix
// against the ledger's tables (changelogtest.Consume, Compare), on the
// ledger's servers (dsn, then shards): a summary and the rows of each
// table.
func changelogMatches(ctx context.Context, brokers []string, dsn, prefix string, shards ...string) (string, map[string]int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c, err := changelogtest.Consume(ctx, []kgo.Opt{kgo.SeedBrokers(brokers...)}, prefix)
	if err != nil {
		return "", nil, err
	}
	d, err := mysqldriver.Open(ctx, append([]string{dsn}, shards...), mysqldriver.Options{})
	if err != nil {
		return "", nil, err
	}
	defer d.Close()
	scanners := make([]changelogtest.Scanner, d.Len())
	for i := range scanners {
		scanners[i] = d.Server(i)
	}
	rows, err := changelogtest.TableRows(ctx, scanners)
	if err != nil {
		return "", nil, err
	}
	if err := c.Compare(rows); err != nil {
		return "", nil, err
	}
	n := map[string]int{}
	for table, r := range rows {
		n[table] = len(r)
	}
	return fmt.Sprintf("%d events read, chains unbroken, the last images equal MariaDB's rows (%d balances, %d windows, %d sealed, %d adjustments, %d entries)",
		c.Events, n[changelog.AccountBalances], n[changelog.BillingWindows], n[changelog.ClosedWindows],
		n[changelog.WindowAdjustments], n[changelog.LedgerEntries]), n, nil
}

// cleanupChangelogTopics deletes the changelog's topics when the test
// ends (the service creates them).
func cleanupChangelogTopics(t *testing.T, brokers []string, prefix string) {
	t.Cleanup(func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			return
		}
		defer cl.Close()
		topics := []string{publisher.ProgressTopic(prefix)}
		for _, tb := range changelog.Tables() {
			topics = append(topics, publisher.Topic(prefix, tb.Name))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = kadm.NewClient(cl).DeleteTopics(ctx, topics...)
	})
}

// The service's own changelog read by Flink SQL (integration/jvm
// flink-read, from Maven Central jars) with debezium-json and
// upsert-kafka: every reading gives exactly MariaDB's rows (the last image
// of every key, every sealed window, every entry), with no chain broken.
// JVM_TESTS=1 runs it (testenv.JVM).
func TestFlinkReadsTheServicesChangelog(t *testing.T) {
	jvm := testenv.JVM(t)
	e := newTestEnv(t, 3)
	prefix := "cl-" + e.topic
	cleanupChangelogTopics(t, e.brokers, prefix)
	w := newWorkload("fl", 2000)
	testenv.Produce(t, e.brokers, e.topic, w.records...)
	p := e.start(t, "one", map[string]string{"CHANGELOG_TOPIC_PREFIX": prefix, "CHANGELOG_TOPIC_PARTITIONS": "3",
		"CHANGELOG_TOPIC_REPLICATION": "1", "LEDGER_ENTRIES": "true", "WINDOW_CLOSE_AFTER": "30m"})
	waitCounted(t, e, w, 120*time.Second)
	waitSealed(t, e, 60*time.Second)
	waitPublished(t, e.dsn, 60*time.Second)
	p.Signal(syscall.SIGTERM)
	if err := p.Wait(t, 30*time.Second); err != nil {
		t.Fatalf("exit: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	d, err := mysqldriver.Open(ctx, []string{e.dsn}, mysqldriver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	want, err := changelogtest.TableRows(ctx, []changelogtest.Scanner{d.Server(0)})
	if err != nil {
		t.Fatal(err)
	}
	topics := map[string]string{}
	for _, tb := range changelog.Tables() {
		topics[tb.Name] = publisher.Topic(prefix, tb.Name)
		if len(want[tb.Name]) == 0 {
			t.Fatalf("%s: no row: the run exercised nothing", tb.Name)
		}
	}
	flinkReads(ctx, t, jvm, e.brokers, topics, want)
}

// kill -9 at every step of publishing and at the protocol's steps (after
// prepare: the Debezium problem; after the decision): a successor
// resolves what was left, resumes from what Kafka holds, and the
// changelog is every change once, as MariaDB holds it.
func TestChangelogKilledAtEveryStep(t *testing.T) {
	for _, fp := range []string{publisher.FailBeforeTxn, publisher.FailAfterProduce, publisher.FailAfterKafka, publisher.FailAfterBookkeep,
		"after-prepare", "after-decision"} {
		t.Run(fp, func(t *testing.T) {
			e := newTestEnv(t, 4)
			prefix := "cl-" + e.topic
			cleanupChangelogTopics(t, e.brokers, prefix)
			w := newWorkload("k", 2000)
			testenv.Produce(t, e.brokers, e.topic, w.records...)
			env := func(fps string) map[string]string {
				return map[string]string{"CHANGELOG_TOPIC_PREFIX": prefix, "CHANGELOG_LEASE": "2s", "CHANGELOG_TOPIC_PARTITIONS": "3",
					"CHANGELOG_TOPIC_REPLICATION": "1", "CHANGELOG_TRANSACTION_MAX_EVENTS": "100", "LEDGER_ENTRIES": "true",
					"WINDOW_CLOSE_AFTER": "30m", "BILLING_FAILPOINTS": fps}
			}
			victim := e.start(t, "victim", env(fp+"=kill@3"))
			if err := victim.Wait(t, 120*time.Second); err == nil || !strings.Contains(err.Error(), "killed") ||
				!strings.Contains(victim.Output(), "failpoint "+fp+": SIGKILL") {
				t.Fatalf("ended with %v, want killed at %s:\n%s", err, fp, victim.Output())
			}
			next := e.start(t, "successor", env(""))
			waitCounted(t, e, w, 120*time.Second)
			waitSealed(t, e, 60*time.Second)
			waitPublished(t, e.dsn, 60*time.Second)
			next.Signal(syscall.SIGTERM)
			if err := next.Wait(t, 30*time.Second); err != nil {
				t.Fatalf("successor exit: %v", err)
			}
			checkChangelog(t, e.brokers, e.dsn, prefix)
		})
	}
}

// The changelog turned on for a ledger that already holds rows, on real
// Kafka and MariaDB: an instance without the changelog counts a first
// workload (balances, windows sealed, entries); then instances with it
// count a second one over the same accounts and windows while the
// snapshot is published ten rows a transaction, the first publisher
// killed after a Kafka commit in the middle of it. A read_committed
// consumer then finds every chain unbroken from its snapshot event (a
// pre-existing key whose first event were its next change would break
// it), nothing twice, and the last images equal to MariaDB's rows.
func TestChangelogSnapshotOfAnExistingLedger(t *testing.T) {
	e := newTestEnv(t, 6)
	prefix := "cl-snap-" + e.topic
	cleanupChangelogTopics(t, e.brokers, prefix)
	first, second := newWorkload("s1", 1500), newWorkload("s2", 1500)
	testenv.Produce(t, e.brokers, e.topic, first.records...)
	env := func(changelog bool, fps string) map[string]string {
		m := map[string]string{"LEDGER_ENTRIES": "true", "WINDOW_CLOSE_AFTER": "30m", "BILLING_FAILPOINTS": fps}
		if changelog {
			maps.Copy(m, map[string]string{"CHANGELOG_TOPIC_PREFIX": prefix, "CHANGELOG_LEASE": "2s", "CHANGELOG_TOPIC_PARTITIONS": "3",
				"CHANGELOG_TOPIC_REPLICATION": "1", "CHANGELOG_TRANSACTION_MAX_EVENTS": "20"})
		}
		return m
	}
	old := e.start(t, "old", env(false, ""))
	waitCounted(t, e, first, 120*time.Second)
	old.Signal(syscall.SIGTERM)
	if err := old.Wait(t, 30*time.Second); err != nil {
		t.Fatalf("exit: %v", err)
	}

	p0 := e.start(t, "p0", env(true, "changelog-after-kafka=kill@5"))
	if !p0.WaitOutput(context.Background(), "publishing the snapshot", 60*time.Second) {
		t.Fatalf("p0 never published the snapshot:\n%s", p0.Output())
	}
	testenv.Produce(t, e.brokers, e.topic, second.records...)
	if err := p0.Wait(t, 120*time.Second); err == nil || !strings.Contains(p0.Output(), "failpoint changelog-after-kafka: SIGKILL") {
		t.Fatalf("ended with %v, want killed at changelog-after-kafka:\n%s", err, p0.Output())
	}
	p1 := e.start(t, "p1", env(true, ""))
	all := &workload{want: maps.Clone(first.want), events: first.events + second.events}
	for k, v := range second.want {
		s := all.want[k]
		s.amount, s.count = s.amount+v.amount, s.count+v.count
		all.want[k] = s
	}
	waitCounted(t, e, all, 120*time.Second)
	waitSealed(t, e, 60*time.Second)
	waitPublished(t, e.dsn, 60*time.Second)
	if !strings.Contains(p1.Output(), "the snapshot of the ledger's rows is published") {
		t.Errorf("the second instance did not finish the snapshot:\n%s", p1.Output())
	}
	p1.Signal(syscall.SIGTERM)
	if err := p1.Wait(t, 30*time.Second); err != nil {
		t.Errorf("exit: %v", err)
	}
	checkChangelog(t, e.brokers, e.dsn, prefix)
}
