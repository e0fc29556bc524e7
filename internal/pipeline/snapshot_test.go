package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/changelogtest"
	"github.com/billing/ledger/internal/publisher"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// The changelog turned on for a ledger that already holds rows (issue 20
// item 4): an instance without the changelog counts events of 40
// accounts over several hours (balances, windows sealed and adjusted,
// entries); then the changelog is enabled and two instances with it go
// on counting while the publisher publishes the snapshot, three rows a
// transaction, failing at each of its steps and handing over to another
// publisher half-way. A read_committed consumer then finds every key's
// chain starting with the snapshot's r event (or a c for a key created
// since), every before the previous after, nothing twice, and the last
// images, every sealed window and every entry equal to the tables: the
// snapshot is the rows as they stood just before the enabling, corrected
// for the checkpoints that committed while it was read.
func TestSnapshotOfAnExistingLedger(t *testing.T) {
	l := newLedgerWithoutChangelog(t)
	prod, err := kgo.NewClient(kgo.SeedBrokers(l.kc.ListenAddrs()...), kgo.DefaultProduceTopic("billing"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	rng := rand.New(rand.NewPCG(7, 8))
	base := time.Now().UTC().Add(-24 * time.Hour).Truncate(time.Hour)
	const perBatch = 40
	produce := func(b int) {
		var recs []*kgo.Record
		for i := range perBatch {
			n := b*perBatch + i
			at := base.Add(time.Duration(n) * 2 * time.Minute)
			if rng.IntN(6) == 0 {
				at = at.Add(-3 * time.Hour) // late: its window sealed
			}
			acct := fmt.Sprintf("acct-%d", rng.IntN(40))
			v, _ := json.Marshal(ev{fmt.Sprintf("e-%d", n), acct, rng.Int64N(1000) - 200, "EUR", at.Format(time.RFC3339Nano)})
			recs = append(recs, &kgo.Record{Key: []byte(acct), Value: v, Partition: int32(rng.IntN(2))})
		}
		if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	const before, after = 6, 8 // batches
	stopOld := l.pipeline(t, "old", "", nil)
	for b := range before {
		produce(b)
	}
	testenv.Eventually(t, 60*time.Second, "the ledger's first events counted and windows sealed", func() (bool, string) {
		sealed := 0
		for _, c := range l.servers {
			for _, w := range c.Tables().Windows {
				if !w.ClosedAt.IsZero() {
					sealed++
				}
			}
		}
		return l.counted() == before*perBatch && sealed > 0, fmt.Sprintf("%d counted, %d windows sealed", l.counted(), sealed)
	})
	stopOld()

	st, err := l.enable()
	if err != nil {
		t.Fatal(err)
	}
	if !st.Snapshot {
		t.Fatalf("the changelog enabled on a ledger with rows without a snapshot pending: %+v", st)
	}
	backlog := l.backlog(t, 1000, 20*time.Millisecond)
	stop1 := l.pipeline(t, "i1", "after-prepare=error@3", backlog)
	stop2 := l.pipeline(t, "i2", "", backlog)
	a, stopA := l.publisherOf(t, "a",
		"changelog-before-txn=error@2,changelog-after-produce=error@4,changelog-after-kafka=error@6,changelog-after-bookkeep=error@8", 6)
	var duringSnapshot int64 // checkpoints decided since the enabling while the snapshot was pending
	for b := before; b < before+after; b++ {
		produce(b)
		time.Sleep(40 * time.Millisecond)
		if b == before+1 {
			testenv.Eventually(t, 30*time.Second, "the first publisher published through its failpoints", func() (bool, string) {
				return a.Transactions() >= 10, fmt.Sprintf("%d transactions", a.Transactions())
			})
			stopA()
			l.publisherOf(t, "b", "changelog-after-kafka=error@3", 6)
		}
		if s, _ := l.control.Changelog(context.Background()); s.Snapshot {
			pos, _ := l.control.CommitPosition(context.Background())
			duringSnapshot = pos.Decided - st.From + 1
		}
	}
	testenv.Eventually(t, 60*time.Second, "every event counted", func() (bool, string) {
		return l.counted() == (before+after)*perBatch, fmt.Sprintf("%d counted", l.counted())
	})
	stop1()
	stop2()
	l.waitPublished(t)
	c, _ := l.checkChangelog(t)
	reads := snapshotReads(t, l)
	for _, table := range []string{changelog.AccountBalances, changelog.BillingWindows, changelog.WindowAdjustments,
		changelog.ClosedWindows, changelog.LedgerEntries} {
		if reads[table] == 0 {
			t.Errorf("%s: no snapshot event: the ledger's rows before the enabling were not exercised", table)
		}
	}
	if duringSnapshot <= 0 {
		t.Errorf("no checkpoint committed while the snapshot was pending: the test did not exercise counting during it")
	}
	t.Logf("%d events read, snapshot reads %v, %d checkpoints decided while the snapshot was pending", c.Events, reads, duringSnapshot)
}

// snapshotReads counts the op r events of each table, reading the
// changelog again, and checks that they all come first in their
// partitions, as of the checkpoint just before the enabling.
func snapshotReads(t *testing.T, l *publishLedger) map[string]int {
	t.Helper()
	st, err := l.control.Changelog(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(l.kc.ListenAddrs()...), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeTopics("cl.account_balances", "cl.billing_windows", "cl.window_adjustments", "cl.closed_windows", "cl.ledger_entries"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	reads := map[string]int{}
	changed := map[string]bool{} // topic/partition: a change came
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		if fs.NumRecords() == 0 {
			return reads // everything committed was read (checkChangelog read it all before)
		}
		fs.EachRecord(func(r *kgo.Record) {
			table := r.Topic[len("cl."):]
			ev, err := changelogtest.DecodeEvent(table, r.Key, r.Value)
			if err != nil {
				t.Fatal(err)
			}
			p := fmt.Sprintf("%s/%d", r.Topic, r.Partition)
			if ev.Op != changelog.OpRead {
				changed[p] = true
				return
			}
			reads[table]++
			if changed[p] {
				t.Errorf("%s: a snapshot event after a change", p)
			}
			if ev.Source.CommitSeq != st.From-1 || ev.Source.Snapshot != "true" {
				t.Errorf("%s: snapshot event with commit_seq %d snapshot %q, want %d \"true\"", p, ev.Source.CommitSeq, ev.Source.Snapshot, st.From-1)
			}
		})
	}
}

// slowScans is a server whose table scans take delay each (a large
// ledger's chunk, a slow server), and which counts the reads of each
// outbox row while the snapshot is pending.
type slowScans struct {
	publisher.Server
	delay   time.Duration
	control *memdriver.Server
	mu      sync.Mutex
	reads   map[driver.OutboxChunk]int
}

func (s *slowScans) ScanBalances(ctx context.Context, after *driver.BalanceKey, limit int) ([]driver.BalanceRow, error) {
	time.Sleep(s.delay)
	return s.Server.ScanBalances(ctx, after, limit)
}
func (s *slowScans) ScanWindows(ctx context.Context, after *driver.WindowKey, limit int) ([]driver.WindowRow, error) {
	time.Sleep(s.delay)
	return s.Server.ScanWindows(ctx, after, limit)
}
func (s *slowScans) ScanAdjustments(ctx context.Context, after *driver.WindowKey, limit int) ([]driver.AdjustmentRow, error) {
	time.Sleep(s.delay)
	return s.Server.ScanAdjustments(ctx, after, limit)
}
func (s *slowScans) ScanEntries(ctx context.Context, after *driver.EntryKey, limit int) ([]driver.EntryRow, error) {
	time.Sleep(s.delay)
	return s.Server.ScanEntries(ctx, after, limit)
}
func (s *slowScans) ReadOutbox(ctx context.Context, chunks []driver.OutboxChunk) ([][]byte, error) {
	if st, err := s.control.Changelog(ctx); err == nil && st.Snapshot {
		s.mu.Lock()
		for _, c := range chunks {
			s.reads[c]++
		}
		s.mu.Unlock()
	}
	return s.Server.ReadOutbox(ctx, chunks)
}

// leases records who was granted the publisher's lease.
type leases struct {
	*memdriver.Server
	mu      sync.Mutex
	holders []string
}

func (l *leases) LeaseChangelog(ctx context.Context, owner string, ttl time.Duration) (bool, error) {
	held, err := l.Server.LeaseChangelog(ctx, owner, ttl)
	if held {
		l.mu.Lock()
		if n := len(l.holders); n == 0 || l.holders[n-1] != owner {
			l.holders = append(l.holders, owner)
		}
		l.mu.Unlock()
	}
	return held, err
}

// A snapshot whose every chunk takes longer than the publisher's lease
// (each table scan 1.5 leases): the publisher renews the lease while it
// works, so the second instance never takes it over and nothing is
// fenced; the outbox is read once for the whole snapshot (not once per
// server and table); the changelog is still every change once.
func TestSnapshotChunksLongerThanTheLease(t *testing.T) {
	l := newLedgerWithoutChangelog(t)
	prod, err := kgo.NewClient(kgo.SeedBrokers(l.kc.ListenAddrs()...), kgo.DefaultProduceTopic("billing"))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	base := time.Now().UTC().Add(-24 * time.Hour).Truncate(time.Hour)
	n := 0
	produce := func(count int) {
		var recs []*kgo.Record
		for range count {
			acct := fmt.Sprintf("acct-%d", n%20)
			v, _ := json.Marshal(ev{fmt.Sprintf("e-%d", n), acct, int64(n%50 + 1), "EUR", base.Add(time.Duration(n) * time.Minute).Format(time.RFC3339Nano)})
			recs = append(recs, &kgo.Record{Key: []byte(acct), Value: v, Partition: int32(n % 2)})
			n++
		}
		if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	stopOld := l.pipeline(t, "old", "", nil)
	produce(100)
	testenv.Eventually(t, 60*time.Second, "the ledger's first events counted", func() (bool, string) {
		return l.counted() == 100, fmt.Sprintf("%d counted", l.counted())
	})
	stopOld()
	if st, err := l.enable(); err != nil || !st.Snapshot {
		t.Fatalf("enabled %+v (%v), want a snapshot pending", st, err)
	}
	backlog := l.backlog(t, 1000, 20*time.Millisecond)
	stop := l.pipeline(t, "i1", "", backlog)
	produce(100) // changes since the enabling, for the snapshot to correct
	testenv.Eventually(t, 60*time.Second, "the events since the enabling counted", func() (bool, string) {
		return l.counted() == 200, fmt.Sprintf("%d counted", l.counted())
	})
	stop()

	const lease = 300 * time.Millisecond
	control := &leases{Server: l.control}
	var servers []publisher.Server
	var slow []*slowScans
	for _, s := range l.outbox {
		sl := &slowScans{Server: s, delay: lease * 3 / 2, control: l.control, reads: map[driver.OutboxChunk]int{}}
		slow, servers = append(slow, sl), append(servers, sl)
	}
	run := func(name string) *publisher.Publisher {
		p := publisher.New(publisher.Config{Prefix: "cl", Ledger: "ledger-1", Instance: name, Version: "test",
			KafkaOpts: []kgo.Opt{kgo.SeedBrokers(l.kc.ListenAddrs()...)}, Partitions: 3, Replication: 1, MaxEvents: 100_000,
			TxnTimeout: 10 * time.Second, Lease: lease, Poll: 20 * time.Millisecond, Batch: 16, Logger: testenv.Logger()}, control, servers)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != context.Canceled {
				t.Errorf("publisher %s: %v", name, err)
			}
		})
		return p
	}
	a := run("a")
	testenv.Eventually(t, 10*time.Second, "the first publisher holds the lease", func() (bool, string) { return a.Active(), "" })
	b := run("b")
	started := time.Now()
	l.waitPublished(t)
	took := time.Since(started)
	l.checkChangelog(t)
	control.mu.Lock()
	holders := slices.Clone(control.holders)
	control.mu.Unlock()
	if !slices.Equal(holders, []string{"a"}) || b.Transactions() != 0 {
		t.Errorf("the lease went to %v, the second publisher committed %d transactions: the snapshot's publisher lost its lease", holders, b.Transactions())
	}
	rows, most := 0, 0
	for _, s := range slow {
		s.mu.Lock()
		for _, c := range s.reads {
			rows, most = rows+1, max(most, c)
		}
		s.mu.Unlock()
	}
	if rows == 0 || most != 1 {
		t.Errorf("%d outbox rows read during the snapshot, one of them %d times: want every one once", rows, most)
	}
	t.Logf("snapshot and changes published in %s by %v (%d transactions); %d outbox rows read during the snapshot, each at most %d times", took.Round(time.Millisecond), holders, a.Transactions(), rows, most)
}
