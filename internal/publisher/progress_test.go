package publisher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/waits"
)

// fakeKafka is an in-process Kafka whose topics are created with
// partitions partitions, and a Config of prefix "cl" on it.
func fakeKafka(t *testing.T) (*kfake.Cluster, Config) {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	return kc, Config{Prefix: "cl", Ledger: "L", Instance: "i", Version: "test", KafkaOpts: []kgo.Opt{kgo.SeedBrokers(kc.ListenAddrs()...)},
		Partitions: 3, Replication: 1, MaxEvents: 10, TxnTimeout: 10 * time.Second, Logger: testenv.Logger()}
}

func preCreate(t *testing.T, cfg Config, topic string, partitions int32) {
	t.Helper()
	cl, err := kgo.NewClient(cfg.KafkaOpts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r, err := kadm.NewClient(cl).CreateTopic(context.Background(), partitions, 1, nil, topic)
	if err == nil {
		err = r.Err
	}
	if err != nil {
		t.Fatal(err)
	}
}

// A progress topic created beforehand with several partitions (an
// operator who gave every <prefix>.* topic one count) is refused, the
// error naming the topic and the way out; one of one partition is
// accepted, and one missing is created with one.
func TestProgressTopicOfSeveralPartitionsRefused(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int32{2, 3, 12} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			_, cfg := fakeKafka(t)
			preCreate(t, cfg, ProgressTopic(cfg.Prefix), n)
			err := EnsureTopics(ctx, cfg)
			if !errors.Is(err, ErrProgressTopic) {
				t.Fatalf("a progress topic of %d partitions: %v, want ErrProgressTopic", n, err)
			}
			for _, want := range []string{"cl._progress", fmt.Sprintf("%d partitions", n), "billing changelog recover-progress"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
	_, cfg := fakeKafka(t)
	preCreate(t, cfg, ProgressTopic(cfg.Prefix), 1)
	if err := EnsureTopics(ctx, cfg); err != nil {
		t.Fatalf("a progress topic of one partition: %v", err)
	}
	_, cfg = fakeKafka(t)
	if err := EnsureTopics(ctx, cfg); err != nil {
		t.Fatalf("no progress topic: %v", err)
	}
}

// The progress record goes to the partition the publisher reads, whatever
// the topic's partition count: a hashing partitioner would put it where
// the key hashes (elsewhere than 0 for every count from 2 to 12), and the
// next publisher would find no progress. (ensureTopics refuses such a
// topic; this holds even for one created after the check.)
func TestProgressRecordOnTheProgressPartition(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for n := int32(2); n <= 12; n++ {
		_, cfg := fakeKafka(t)
		preCreate(t, cfg, ProgressTopic(cfg.Prefix), n)
		p := New(cfg, nil, nil)
		want := Progress{Seq: 41, From: 1, Ledger: "L", Prefix: "cl", Checkpoint: "g41"}
		// A transaction the client ended by an abort is refused
		// (ErrTxnNotCommitted), and a session starts again with a new
		// client, as here.
		for attempt := 1; ; attempt++ {
			cl, err := kgo.NewClient(producerOpts(p.cfg)...)
			if err != nil {
				t.Fatal(err)
			}
			err = p.transaction(ctx, cl, want, func(func(*kgo.Record)) error { return nil })
			cl.Close()
			if errors.Is(err, ErrTxnNotCommitted) && attempt < 3 {
				t.Logf("%d partitions, attempt %d: %v", n, attempt, err)
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			break
		}
		got, err := readProgress(ctx, p.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got == nil || *got != want {
			t.Errorf("%d partitions: progress read %+v, want %+v; the topic's ends: %s", n, got, want, topicEnds(ctx, cfg, ProgressTopic(cfg.Prefix)))
		}
	}
}

// A record of an aborted transaction is not committed, one of a committed
// transaction is: what the publisher checks after every commit, since
// the client may end a transaction it was asked to commit by an abort and
// report success.
func TestCommittedAtTellsCommitFromAbort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, cfg := fakeKafka(t)
	topic := ProgressTopic(cfg.Prefix)
	preCreate(t, cfg, topic, 1)
	cl, err := kgo.NewClient(producerOpts(cfg)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	write := func(end kgo.TransactionEndTry) int64 {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		r := &kgo.Record{Topic: topic, Partition: progressPartition, Value: []byte("x")}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, end); err != nil {
			t.Fatal(err)
		}
		return r.Offset
	}
	aborted := write(kgo.TryAbort)
	committed := write(kgo.TryCommit)
	if err := committedAt(ctx, cl, topic, progressPartition, aborted); !errors.Is(err, ErrTxnNotCommitted) {
		t.Errorf("record of an aborted transaction (offset %d): %v, want ErrTxnNotCommitted", aborted, err)
	}
	if err := committedAt(ctx, cl, topic, progressPartition, committed); err != nil {
		t.Errorf("record of a committed transaction (offset %d): %v", committed, err)
	}
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// stuck is a commit log whose visible position stays behind the decided
// one (a decided branch on a server that does not answer).
type stuck struct{}

func (stuck) CommitPosition(context.Context) (driver.CommitPosition, error) {
	return driver.CommitPosition{Visible: 4, Decided: 6}, nil
}

// waiting runs fn until ctx ends and returns the waits listed meanwhile
// and the log.
func waiting(t *testing.T, fn func(ctx context.Context, ws *waits.Set)) (waits.Info, string) {
	t.Helper()
	var log syncBuffer
	ws := waits.NewWith(slog.New(slog.NewTextHandler(&log, nil)), 0, time.Hour, time.Now)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); fn(ctx, ws) }()
	var got waits.Info
	testenv.Eventually(t, 10*time.Second, "the wait listed", func() (bool, string) {
		cur := ws.Current()
		if len(cur) == 1 && cur[0].Detail != "" {
			got = cur[0]
		}
		return got.What != "", fmt.Sprint(cur)
	})
	cancel()
	<-done
	if cur := ws.Current(); len(cur) != 0 {
		t.Errorf("waits still listed once over: %+v", cur)
	}
	return got, log.String()
}

// Waiting for the commit log's visible position (a start, a snapshot) is
// listed and logged with what it waits for and since when.
func TestSettledReportsItsWait(t *testing.T) {
	w, log := waiting(t, func(ctx context.Context, ws *waits.Set) { _, _ = settled(ctx, stuck{}, 6, ws) })
	if !strings.Contains(w.What, "visible position to reach 6") || !strings.Contains(w.Detail, "visible 4, decided 6") || w.Since.IsZero() {
		t.Errorf("wait listed %+v", w)
	}
	if !strings.Contains(log, "still waiting") || !strings.Contains(log, "since=") || !strings.Contains(log, "reach 6") {
		t.Errorf("log %q", log)
	}
}

// Waiting for an open transaction on the progress topic to end is listed
// and logged, and ends once it does.
func TestProgressReadReportsAnOpenTransaction(t *testing.T) {
	_, cfg := fakeKafka(t)
	ctx := context.Background()
	if err := EnsureTopics(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// Another producer's transaction left open on the progress topic.
	other, err := kgo.NewClient(append(append([]kgo.Opt(nil), cfg.KafkaOpts...), kgo.TransactionalID("other"),
		kgo.TransactionTimeout(time.Minute), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := other.ProduceSync(ctx, &kgo.Record{Topic: ProgressTopic(cfg.Prefix), Key: []byte(ProgressKey), Value: []byte("{}")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	w, log := waiting(t, func(ctx context.Context, ws *waits.Set) {
		c := cfg
		c.Waits = ws
		_, _ = readProgress(ctx, c)
	})
	if !strings.Contains(w.What, "open transaction on topic cl._progress") || !strings.Contains(w.Detail, "partition 0") {
		t.Errorf("wait listed %+v", w)
	}
	if !strings.Contains(log, "still waiting") {
		t.Errorf("log %q", log)
	}
}

// behindControl is a commit log decided through 10 whose changelog is
// published through published.
type behindControl struct {
	Control
	published int64
}

func (c *behindControl) Changelog(context.Context) (driver.ChangelogState, error) {
	return driver.ChangelogState{On: true, Prefix: "cl", From: 1, Published: c.published}, nil
}

func (c *behindControl) CommitPosition(context.Context) (driver.CommitPosition, error) {
	return driver.CommitPosition{Visible: 10, Decided: 10}, nil
}

func (c *behindControl) Commits(context.Context, int64, bool, int) ([]driver.CommitRecord, error) {
	return []driver.CommitRecord{{Seq: c.published + 1, Age: time.Minute}}, nil
}

// Checkpoints held by a full backlog are a wait, listed with the reason
// from the measure that found it full to the one that found it drained.
func TestBacklogHoldIsAWait(t *testing.T) {
	ws := waits.New(testenv.Logger())
	c := &behindControl{}
	b := NewBacklog(c, 5, time.Second, testenv.Logger(), ws)
	ctx := context.Background()
	if err := b.Measure(ctx); err != nil {
		t.Fatal(err)
	}
	if cur := ws.Current(); len(cur) != 1 || !strings.Contains(cur[0].What, "backlog") || !strings.Contains(cur[0].Detail, "10 checkpoints not published") {
		t.Fatalf("a full backlog: waits %+v", cur)
	}
	c.published = 9
	if err := b.Measure(ctx); err != nil {
		t.Fatal(err)
	}
	if cur := ws.Current(); len(cur) != 0 {
		t.Errorf("the backlog drained: waits %+v", cur)
	}
}

// topicEnds says where a topic's records are (each partition's end), for
// a failure's message.
func topicEnds(ctx context.Context, cfg Config, topic string) string {
	cl, err := kgo.NewClient(cfg.KafkaOpts...)
	if err != nil {
		return err.Error()
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	ends.Each(func(o kadm.ListedOffset) { fmt.Fprintf(&b, "[%d: %d %v]", o.Partition, o.Offset, o.Err) })
	return b.String()
}
