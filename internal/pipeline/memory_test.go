package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// The whole pipeline runs without a server: the source on an in-process
// Kafka (kfake), the sink, the Checkpointer and the housekeeping on the
// in-memory drivers. Events of two partitions, repeats within and across
// partitions, a conflicting repeat and junk, count once; the positions
// stored follow the log; a clean shutdown.
func TestPipelineRunsOnKfakeAndTheInMemoryDrivers(t *testing.T) {
	p, server, sink, prod := memPipeline(t, 2, 2, nil)
	ctx := context.Background()
	var recs []*kgo.Record
	for i := range 50 {
		b, _ := json.Marshal(ev{fmt.Sprintf("e-%d", i), fmt.Sprintf("acct-%d", i%4), int64(i + 1), "EUR", t0})
		recs = append(recs, &kgo.Record{Key: []byte("k"), Value: b, Partition: int32(i % 2)}, &kgo.Record{Key: []byte("k"), Value: b, Partition: int32((i + 1) % 2)})
	}
	conflict, _ := json.Marshal(ev{"e-0", "acct-0", 999, "EUR", t0})
	recs = append(recs, &kgo.Record{Value: conflict}, &kgo.Record{Value: []byte("not json")})
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	testenv.Eventually(t, 30*time.Second, "every event counted once", func() (bool, string) {
		tb := server.Tables()
		var n, sum int64
		for _, b := range tb.Balances {
			n, sum = n+b.Count, sum+b.Amount
		}
		return n == 50 && sum == 50*51/2 && len(tb.DeadLetters) == 2, fmt.Sprintf("%d events summing to %d, %d dead letters", n, sum, len(tb.DeadLetters))
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	pos, err := sink.Positions(ctx, []int32{0, 1})
	if err != nil || pos[0].NextOffset+pos[1].NextOffset != int64(len(recs)) {
		t.Fatalf("positions %+v (%v), want the %d records covered", pos, err, len(recs))
	}
	if st := p.Stats(); st.Duplicates.Load() != 50 || st.DeadLetters.Load() != 2 {
		t.Errorf("%d duplicates, %d dead letters; want 50 and 2", st.Duplicates.Load(), st.DeadLetters.Load())
	}
}

// memPipeline is a pipeline on kfake (topic "billing" of partitions
// partitions, group "g") and one in-memory server whose sink has branches
// branches, its Config changed by set; with its server, its sink and a
// producer to the topic, all closed at the test's end.
func memPipeline(t *testing.T, partitions int32, branches int, set func(*Config)) (*Pipeline, *memdriver.Cluster, *txsink.Sink, *kgo.Client) {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, "billing"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	server := memdriver.New(memdriver.Options{AttachPrepared: true, LockWait: time.Second})
	s := server.As("billing")
	sink, err := txsink.New(context.Background(), txsink.Config{Branches: branches, Group: "g", Topic: "billing", StepTimeout: 5 * time.Second, Logger: testenv.Logger()},
		s, []driver.Server{s})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	cfg := testConfig(&env{brokers: kc.ListenAddrs(), topic: "billing"})
	cfg.Group = "g"
	if set != nil {
		set(&cfg)
	}
	p, err := New(cfg, sink, []driver.Store{s})
	if err != nil {
		t.Fatal(err)
	}
	prod, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.DefaultProduceTopic("billing"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prod.Close)
	return p, server, sink, prod
}
