package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/changelogtest"
	"github.com/billing/ledger/internal/testenv"
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
