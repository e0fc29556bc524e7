package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/changelogtest"
	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/publisher"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// publishLedger is a ledger of two in-memory servers with the changelog
// on, its source and changelog topics on kfake.
type publishLedger struct {
	kc      *kfake.Cluster
	servers []*memdriver.Cluster
	control *memdriver.Server
	outbox  []publisher.Server
	stores  []driver.Store
	ds      []driver.Server
}

func newPublishLedger(t *testing.T) *publishLedger {
	t.Helper()
	l := newLedgerWithoutChangelog(t)
	if _, err := l.enable(); err != nil {
		t.Fatal(err)
	}
	return l
}

// newLedgerWithoutChangelog is a publishLedger whose changelog is still
// off (enable turns it on).
func newLedgerWithoutChangelog(t *testing.T) *publishLedger {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "billing"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	l := &publishLedger{kc: kc}
	for range 2 {
		c := memdriver.New(memdriver.Options{AttachPrepared: true, LockWait: 500 * time.Millisecond})
		s := c.As("billing")
		l.servers, l.ds, l.stores, l.outbox = append(l.servers, c), append(l.ds, s), append(l.stores, s), append(l.outbox, s)
	}
	l.control = l.ds[0].(*memdriver.Server)
	return l
}

// enable turns the ledger's changelog on with prefix "cl", as an
// instance's start does.
func (l *publishLedger) enable() (driver.ChangelogState, error) {
	tables := []publisher.Tables{l.ds[0].(*memdriver.Server), l.ds[1].(*memdriver.Server)}
	return publisher.Enable(context.Background(), l.control, tables, "cl", time.Now(), nil)
}

// pipeline starts an instance with the changelog on (checkpoints held by
// the backlog; nil: the changelog off), the sink's failpoints armed with
// fps; it runs until the test ends.
func (l *publishLedger) pipeline(t *testing.T, name, fps string, backlog *publisher.Backlog) (stop func()) {
	t.Helper()
	on := backlog != nil
	set, err := failpoint.Parse(fps)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sink, err := txsink.New(ctx, txsink.Config{Branches: 2, Group: "g", Topic: "billing", StepTimeout: 5 * time.Second,
		Logger: testenv.Logger(), Changelog: on, Failpoints: set, Instance: name}, l.control, l.ds)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{brokers: l.kc.ListenAddrs(), topic: "billing"}
	cfg := testConfig(e)
	cfg.Group, cfg.Changelog, cfg.LedgerEntries, cfg.WindowCloseAfter = "g", on, true, 30*time.Minute
	if on {
		cfg.Hold = backlog.Hold
	}
	p, err := New(cfg, sink, l.stores)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: Run: %v", name, err)
			}
			sink.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

// publisher runs a publisher as instance name with fps armed, until stop.
func (l *publishLedger) publisher(t *testing.T, name, fps string) (p *publisher.Publisher, stop func()) {
	t.Helper()
	return l.publisherOf(t, name, fps, 40)
}

// publisherOf is publisher with transactions of at most maxEvents.
func (l *publishLedger) publisherOf(t *testing.T, name, fps string, maxEvents int) (p *publisher.Publisher, stop func()) {
	t.Helper()
	set, err := failpoint.Parse(fps)
	if err != nil {
		t.Fatal(err)
	}
	p = publisher.New(publisher.Config{Prefix: "cl", Ledger: "ledger-1", Instance: name, Version: "test",
		KafkaOpts: []kgo.Opt{kgo.SeedBrokers(l.kc.ListenAddrs()...)}, Partitions: 3, Replication: 1, MaxEvents: maxEvents,
		TxnTimeout: 10 * time.Second, Lease: 600 * time.Millisecond, Poll: 20 * time.Millisecond, Batch: 16, SnapshotIndexBytes: 1,
		Failpoints: set, Logger: testenv.Logger()}, l.control, l.outbox)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != context.Canceled {
				t.Errorf("publisher %s: %v", name, err)
			}
		})
	}
	t.Cleanup(stop)
	return p, stop
}

// backlog runs the ledger's backlog watch (max checkpoints not published,
// polled every interval) until the test ends, and waits for it to stop.
func (l *publishLedger) backlog(t *testing.T, max int64, interval time.Duration) *publisher.Backlog {
	t.Helper()
	b := publisher.NewBacklog(l.control, max, interval, testenv.Logger(), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return b
}

// The changelog out of the whole pipeline, without a server: two
// instances count events of shared accounts from kfake into two
// in-memory servers, checkpoints fail after their branches prepared
// (their outbox rows roll back with them) and before; the publisher fails
// at each of its steps (before the transaction, after producing, after
// the Kafka commit before the bookkeeping, after it) and starts again,
// then is stopped and another instance takes over. A read_committed
// consumer of the topics then finds every key's chain unbroken (the first
// event c, each before the previous after), nothing twice, nothing of an
// aborted checkpoint (it would break a chain or end elsewhere than the
// tables), and the last after of every key, every sealed window and every
// entry equal to the tables.
func TestPublishedChangelogIsTheTables(t *testing.T) {
	l := newPublishLedger(t)
	backlog := l.backlog(t, 1000, 20*time.Millisecond)
	stop1 := l.pipeline(t, "i1", "after-prepare=error@3,before-prepare=error@6", backlog)
	stop2 := l.pipeline(t, "i2", "after-prepare=error@4", backlog)
	a, stopA := l.publisher(t, "a",
		"changelog-before-txn=error@2,changelog-after-produce=error@4,changelog-after-kafka=error@6,changelog-after-bookkeep=error@8")

	prod, err := kgo.NewClient(kgo.SeedBrokers(l.kc.ListenAddrs()...), kgo.DefaultProduceTopic("billing"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	base := time.Now().UTC().Add(-24 * time.Hour).Truncate(time.Hour)
	const batches, perBatch = 12, 40
	produce := func(b int) {
		var recs []*kgo.Record
		for i := range perBatch {
			n := b*perBatch + i
			at := base.Add(time.Duration(n) * 20 * time.Second)
			if rng.IntN(6) == 0 {
				at = at.Add(-2 * time.Hour) // late: its window closed
			}
			acct := fmt.Sprintf("acct-%d", rng.IntN(7))
			v, _ := json.Marshal(ev{fmt.Sprintf("e-%d", n), acct, rng.Int64N(1000) - 200, "EUR", at.Format(time.RFC3339Nano)})
			recs = append(recs, &kgo.Record{Key: []byte(acct), Value: v, Partition: int32(rng.IntN(2))})
		}
		if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	for b := range batches {
		produce(b)
		time.Sleep(30 * time.Millisecond)
		if b == batches/2 {
			testenv.Eventually(t, 30*time.Second, "the first publisher published through its failpoints", func() (bool, string) {
				return a.Transactions() >= 8, fmt.Sprintf("%d transactions", a.Transactions())
			})
			stopA()
			l.publisher(t, "b", "changelog-after-kafka=error@2")
		}
	}
	testenv.Eventually(t, 60*time.Second, "every event counted", func() (bool, string) {
		return l.counted() == batches*perBatch, fmt.Sprintf("%d counted", l.counted())
	})
	stop1()
	stop2() // their last checkpoints included
	l.waitPublished(t)
	c, rows := l.checkChangelog(t)
	ctx := context.Background()
	for _, table := range []string{changelog.AccountBalances, changelog.BillingWindows, changelog.WindowAdjustments, changelog.ClosedWindows, changelog.LedgerEntries} {
		if len(rows[table]) == 0 {
			t.Errorf("%s: no row: the generation exercised nothing", table)
		}
	}
	recs, err := l.control.Commits(ctx, 1, false, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var gtrids []string
	for _, r := range recs {
		gtrids = append(gtrids, r.Gtrid)
	}
	for _, s := range l.outbox {
		idx, err := s.OutboxIndex(ctx, gtrids)
		if err != nil || len(idx) != 0 {
			t.Errorf("outbox rows left after publishing: %d (%v)", len(idx), err)
		}
	}
	t.Logf("%d events read", c.Events)
}

// Kafka unavailable (no publisher): counting goes on until
// CHANGELOG_MAX_BACKLOG checkpoints are committed and not published, then
// checkpoints are held (never dropped); once a publisher runs, the
// backlog drains in order and counting resumes to the end.
func TestBacklogHoldsCheckpointsUntilPublished(t *testing.T) {
	l := newPublishLedger(t)
	backlog := l.backlog(t, 3, 10*time.Millisecond)
	l.pipeline(t, "i1", "", backlog)
	prod, err := kgo.NewClient(kgo.SeedBrokers(l.kc.ListenAddrs()...), kgo.DefaultProduceTopic("billing"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	at := time.Now().UTC().Add(-time.Hour).Format(time.RFC3339)
	const events = 40
	for i := range events {
		v, _ := json.Marshal(ev{fmt.Sprintf("e-%d", i), "acct", 1, "EUR", at})
		if err := prod.ProduceSync(context.Background(), &kgo.Record{Value: v, Partition: 0}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(15 * time.Millisecond) // several checkpoints
	}
	ctx := context.Background()
	testenv.Eventually(t, 30*time.Second, "checkpoints held at the bound", func() (bool, string) {
		return backlog.Hold() != "", fmt.Sprintf("backlog %d", backlog.Behind())
	})
	time.Sleep(500 * time.Millisecond) // five checkpoint intervals: none may commit
	pos, err := l.control.CommitPosition(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pos.Decided > 4 { // the bound, and at most one in flight when it was reached
		t.Errorf("%d checkpoints committed with a backlog bound of 3", pos.Decided)
	}
	if n := l.counted(); n >= events {
		t.Fatalf("all %d events counted while the backlog held: nothing was held", n)
	}
	l.publisher(t, "a", "")
	testenv.Eventually(t, 30*time.Second, "the backlog drained and every event counted", func() (bool, string) {
		n := l.counted()
		return n == events && backlog.Hold() == "", fmt.Sprintf("%d counted, backlog %d", n, backlog.Behind())
	})
}

// counted is the events the balances count, on every server.
func (l *publishLedger) counted() int64 {
	var n int64
	for _, c := range l.servers {
		for _, b := range c.Tables().Balances {
			n += b.Count
		}
	}
	return n
}

// alwaysLeased grants the publisher's lease to everyone: only Kafka's
// fencing keeps publishers apart.
type alwaysLeased struct{ *memdriver.Server }

func (alwaysLeased) LeaseChangelog(context.Context, string, time.Duration) (bool, error) {
	return true, nil
}

// Two publishers at once (a paused instance that wakes up and still
// believes it holds the lease, here both all the time): each initialising
// the one transactional id fences the other, whose transaction then fails
// and who reads the position again from Kafka; the changelog is still
// every change once, in order.
func TestTwoPublishersAtOnceAreFenced(t *testing.T) {
	l := newPublishLedger(t)
	backlog := l.backlog(t, 1000, 20*time.Millisecond)
	stop := l.pipeline(t, "i1", "", backlog)
	var pubs []*publisher.Publisher
	for _, name := range []string{"a", "b"} {
		p := publisher.New(publisher.Config{Prefix: "cl", Ledger: "ledger-1", Instance: name, Version: "test",
			KafkaOpts: []kgo.Opt{kgo.SeedBrokers(l.kc.ListenAddrs()...)}, Partitions: 3, Replication: 1, MaxEvents: 30,
			TxnTimeout: 10 * time.Second, Lease: time.Minute, Poll: 5 * time.Millisecond, Batch: 4, Logger: testenv.Logger()},
			alwaysLeased{l.control}, l.outbox)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			<-done
		})
		pubs = append(pubs, p)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(l.kc.ListenAddrs()...), kgo.DefaultProduceTopic("billing"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	base := time.Now().UTC().Add(-24 * time.Hour).Truncate(time.Hour)
	const events = 400
	for i := range events {
		acct := fmt.Sprintf("acct-%d", rng.IntN(9))
		v, _ := json.Marshal(ev{fmt.Sprintf("e-%d", i), acct, rng.Int64N(100), "EUR", base.Add(time.Duration(i) * 30 * time.Second).Format(time.RFC3339)})
		if err := prod.ProduceSync(context.Background(), &kgo.Record{Key: []byte(acct), Value: v, Partition: int32(i % 2)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if i%40 == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	testenv.Eventually(t, 60*time.Second, "every event counted", func() (bool, string) {
		return l.counted() == events, fmt.Sprintf("%d counted", l.counted())
	})
	stop()
	l.waitPublished(t)
	if pubs[0].Transactions() == 0 || pubs[1].Transactions() == 0 {
		t.Logf("transactions committed: a %d, b %d (one publisher won every race)", pubs[0].Transactions(), pubs[1].Transactions())
	}
	c, _ := l.checkChangelog(t)
	t.Logf("%d events read; transactions committed: a %d, b %d", c.Events, pubs[0].Transactions(), pubs[1].Transactions())
}

// The broker refuses the publisher for a while (its produce requests,
// transaction ends and initialisations close the connection, as a broker
// that went down): counting goes on into the outbox, the publisher's
// sessions fail and start again, and once the broker answers the backlog
// drains in order: the changelog is every change once.
func TestPublisherThroughABrokerOutage(t *testing.T) {
	l := newPublishLedger(t)
	var down atomic.Bool
	var refused atomic.Int64
	transactional := func(req kmsg.Request) bool {
		switch r := req.(type) {
		case *kmsg.ProduceRequest:
			return r.TransactionID != nil
		case *kmsg.InitProducerIDRequest:
			return r.TransactionalID != nil
		case *kmsg.EndTxnRequest, *kmsg.AddPartitionsToTxnRequest:
			return true
		}
		return false
	}
	l.kc.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		l.kc.KeepControl()
		if down.Load() && transactional(req) {
			refused.Add(1)
			return nil, errors.New("broker down"), true
		}
		return nil, nil, false
	})
	backlog := l.backlog(t, 1000, 20*time.Millisecond)
	stop := l.pipeline(t, "i1", "", backlog)
	l.publisher(t, "a", "")
	prod, err := kgo.NewClient(kgo.SeedBrokers(l.kc.ListenAddrs()...), kgo.DefaultProduceTopic("billing"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	base := time.Now().UTC().Add(-24 * time.Hour).Truncate(time.Hour)
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			acct := fmt.Sprintf("acct-%d", i%7)
			v, _ := json.Marshal(ev{fmt.Sprintf("e-%d", i), acct, int64(i), "EUR", base.Add(time.Duration(i) * time.Minute).Format(time.RFC3339)})
			if err := prod.ProduceSync(context.Background(), &kgo.Record{Key: []byte(acct), Value: v, Partition: int32(i % 2)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	settled := func(what string) {
		testenv.Eventually(t, 60*time.Second, what, func() (bool, string) {
			st, _ := l.control.Changelog(context.Background())
			pos, _ := l.control.CommitPosition(context.Background())
			return pos.Decided > 0 && pos.Visible == pos.Decided && st.Published == pos.Decided, fmt.Sprintf("position %+v, published %d", pos, st.Published)
		})
	}
	produce(0, 100)
	testenv.Eventually(t, 30*time.Second, "the first events counted", func() (bool, string) { return l.counted() == 100, fmt.Sprint(l.counted()) })
	settled("the first events published")
	down.Store(true)
	produce(100, 300)
	testenv.Eventually(t, 30*time.Second, "counting goes on while the broker refuses the publisher", func() (bool, string) {
		return l.counted() == 300 && backlog.Behind() > 0 && refused.Load() > 0,
			fmt.Sprintf("%d counted, backlog %d, %d requests refused", l.counted(), backlog.Behind(), refused.Load())
	})
	time.Sleep(300 * time.Millisecond) // a few failed sessions
	down.Store(false)
	stop()
	settled("the backlog drained")
	c, _ := l.checkChangelog(t)
	t.Logf("%d events read; %d publisher requests refused during the outage", c.Events, refused.Load())
}

// checkChangelog reads the changelog as a read_committed consumer and
// fails the test unless every chain is unbroken and ends at the tables'
// rows; it returns the consumer.
func (l *publishLedger) checkChangelog(t *testing.T) (*changelogtest.Checker, map[string][]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := changelogtest.Consume(ctx, []kgo.Opt{kgo.SeedBrokers(l.kc.ListenAddrs()...)}, "cl")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := changelogtest.TableRows(ctx, []changelogtest.Scanner{l.ds[0].(*memdriver.Server), l.ds[1].(*memdriver.Server)})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Compare(rows); err != nil {
		t.Fatal(err)
	}
	return c, rows
}

// waitPublished waits until every checkpoint decided is applied and
// published.
func (l *publishLedger) waitPublished(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, "every checkpoint published", func() (bool, string) {
		ctx := context.Background()
		st, err1 := l.control.Changelog(ctx)
		pos, err2 := l.control.CommitPosition(ctx)
		return err1 == nil && err2 == nil && pos.Visible == pos.Decided && st.Published == pos.Decided && !st.Snapshot,
			fmt.Sprintf("position %+v, published %d, snapshot pending %v (%v %v)", pos, st.Published, st.Snapshot, err1, err2)
	})
}
