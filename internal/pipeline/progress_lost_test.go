package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/publisher"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/waits"
)

var errFrozen = errors.New("bookkeeping frozen")

// frozenControl refuses to raise the published hint while frozen.
type frozenControl struct {
	publisher.Control
	frozen *atomic.Bool
}

func (c frozenControl) ChangelogPublished(ctx context.Context, seq int64) error {
	if c.frozen.Load() {
		return errFrozen
	}
	return c.Control.ChangelogPublished(ctx, seq)
}

// frozenOutbox refuses to delete outbox rows while frozen.
type frozenOutbox struct {
	publisher.Server
	frozen *atomic.Bool
}

func (o frozenOutbox) DeleteOutbox(ctx context.Context, gtrids []string) (int64, error) {
	if o.frozen.Load() {
		return 0, errFrozen
	}
	return o.Server.DeleteOutbox(ctx, gtrids)
}

// The progress record lost after a publisher died between its Kafka
// commit and its bookkeeping (Kafka holds more than MySQL's hint, the
// outbox rows still there), the progress topic deleted: the next
// publisher refuses to publish (ErrProgressLost) and says it waits for a
// repair; RecoverProgress rebuilds the record from the events the topics
// hold, and the publisher goes on from it without restarting. A
// read_committed consumer then finds every change once: nothing a
// consumer already had is published again (a record rebuilt from the hint
// alone would republish the last transaction's events and break their
// chains). With transactions of at most 3 events, the last transaction
// can be part of a checkpoint.
func TestLostProgressRebuiltFromTheTopics(t *testing.T) {
	for _, maxEvents := range []int{40, 3} {
		t.Run(fmt.Sprint(maxEvents), func(t *testing.T) { lostProgress(t, maxEvents) })
	}
}

func lostProgress(t *testing.T, maxEvents int) {
	l := newPublishLedger(t)
	backlog := l.backlog(t, 1000, 20*time.Millisecond)
	stopPipeline := l.pipeline(t, "i1", "", backlog)
	var frozen atomic.Bool
	servers := []publisher.Server{frozenOutbox{l.outbox[0], &frozen}, frozenOutbox{l.outbox[1], &frozen}}
	cfg := func(name string, ws *waits.Set) publisher.Config {
		return publisher.Config{Prefix: "cl", Ledger: "ledger-1", Instance: name, Version: "test",
			KafkaOpts: []kgo.Opt{kgo.SeedBrokers(l.kc.ListenAddrs()...)}, Partitions: 3, Replication: 1, MaxEvents: maxEvents,
			TxnTimeout: 10 * time.Second, Lease: 600 * time.Millisecond, Poll: 20 * time.Millisecond, Batch: 16,
			Logger: testenv.Logger(), Waits: ws}
	}
	a := publisher.New(cfg("a", nil), frozenControl{l.control, &frozen}, servers)
	stopA := runPublisher(t, a)

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
			if i%20 == 0 {
				time.Sleep(20 * time.Millisecond) // several checkpoints
			}
		}
	}
	ctx := context.Background()
	produce(0, 100)
	testenv.Eventually(t, 30*time.Second, "some checkpoints published", func() (bool, string) {
		st, _ := l.control.Changelog(ctx)
		return st.Published > st.From, fmt.Sprint(st.Published)
	})
	// The publisher dies between a Kafka commit and its bookkeeping.
	frozen.Store(true)
	before := a.Transactions()
	produce(100, 200)
	testenv.Eventually(t, 30*time.Second, "a transaction committed without its bookkeeping", func() (bool, string) {
		return a.Transactions() > before, fmt.Sprint(a.Transactions())
	})
	stopA()
	testenv.Eventually(t, 30*time.Second, "every event counted", func() (bool, string) {
		return l.counted() == 200, fmt.Sprintf("%d counted", l.counted())
	})
	stopPipeline()
	frozen.Store(false)

	// The progress topic is lost.
	cl, err := kgo.NewClient(kgo.SeedBrokers(l.kc.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).DeleteTopic(ctx, publisher.ProgressTopic("cl")); err != nil {
		t.Fatal(err)
	}

	ws := waits.NewWith(testenv.Logger(), 0, time.Second, time.Now)
	b := publisher.New(cfg("b", ws), l.control, l.outbox)
	runPublisher(t, b)
	testenv.Eventually(t, 30*time.Second, "the publisher refuses and waits for a repair", func() (bool, string) {
		cur := ws.Current()
		return len(cur) == 1 && strings.Contains(cur[0].What, "repair") && strings.Contains(cur[0].Detail, "progress"), fmt.Sprint(cur)
	})
	if b.Transactions() != 0 {
		t.Fatalf("the publisher published %d transactions without its progress", b.Transactions())
	}
	rec, err := publisher.RecoverProgress(ctx, cfg("recover", nil), l.control, l.outbox, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("recovery: %+v, rebuilt %+v", rec, *rec.Rebuilt)
	if !rec.Lost || !rec.Written || rec.LastCommitSeq <= rec.Hint {
		t.Errorf("recovery %+v: want the progress lost, Kafka ahead of the hint, the record written", rec)
	}
	l.waitPublished(t)
	if cur := ws.Current(); len(cur) != 0 {
		t.Errorf("still waiting: %+v", cur)
	}
	c, _ := l.checkChangelog(t)
	t.Logf("%d events read", c.Events)
	// A second run finds nothing lost.
	if rec, err := publisher.RecoverProgress(ctx, cfg("recover", nil), l.control, l.outbox, true); err != nil || rec.Lost || rec.Written {
		t.Errorf("second recovery: %+v %v", rec, err)
	}
}

// runPublisher runs p until the returned stop (or the test's end).
func runPublisher(t *testing.T, p *publisher.Publisher) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}
