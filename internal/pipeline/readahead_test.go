package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// lookupRecorder is a store whose lookups are recorded and, when hang is
// set, do not answer before release is closed, whatever their context
// says (a server that stopped answering, a connection that hangs).
type lookupRecorder struct {
	driver.Store
	hang    bool
	release chan struct{}

	mu        sync.Mutex
	looked    map[string][]driver.Generation
	unbounded int // lookups whose context had no deadline within readAheadTimeout
}

func (r *lookupRecorder) LookupKeys(ctx context.Context, g driver.Generation, ids []string) ([]driver.DedupKey, error) {
	r.mu.Lock()
	for _, id := range ids {
		r.looked[id] = append(r.looked[id], g)
	}
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > readAheadTimeout {
		r.unbounded++
	}
	r.mu.Unlock()
	if r.hang {
		<-r.release
		return nil, context.DeadlineExceeded
	}
	return r.Store.LookupKeys(ctx, g, ids)
}

func (r *lookupRecorder) lookedUp(id string) []driver.Generation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.looked[id])
}

// aheadWorld is a pipeline on kfake and the in-memory drivers whose pool
// lookups go through a lookupRecorder.
type aheadWorld struct {
	server *memdriver.Cluster
	store  *lookupRecorder
	p      *Pipeline
	prod   *kgo.Client
	next   int
}

func startAheadWorld(t *testing.T, hang bool, mod func(*Config)) *aheadWorld {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "billing"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	server := memdriver.New(memdriver.Options{AttachPrepared: true, LockWait: time.Second})
	s := server.As("billing")
	ctx := context.Background()
	sink, err := txsink.New(ctx, txsink.Config{Branches: 2, Group: "g", Topic: "billing", StepTimeout: 5 * time.Second, Logger: testenv.Logger()},
		s, []driver.Server{s})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sink.Close)
	cfg := testConfig(&env{brokers: kc.ListenAddrs(), topic: "billing"})
	cfg.Group = "g"
	cfg.DedupReadAheadConns = 2
	if mod != nil {
		mod(&cfg)
	}
	w := &aheadWorld{server: server, store: &lookupRecorder{Store: s, hang: hang, release: make(chan struct{}), looked: map[string][]driver.Generation{}}}
	if w.p, err = New(cfg, sink, []driver.Store{w.store}); err != nil {
		t.Fatal(err)
	}
	if w.prod, err = kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.DefaultProduceTopic("billing"), kgo.RecordPartitioner(kgo.ManualPartitioner())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.prod.Close)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.p.Run(rctx) }()
	t.Cleanup(func() {
		close(w.store.release) // the hung lookups return, so that Run can end
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return w
}

// produce produces n new events, on partitions 0 and 1 in turn (2 stays
// empty: a partition without records must not keep the read-ahead off),
// and returns their ids.
func (w *aheadWorld) produce(t *testing.T, n int) []string {
	t.Helper()
	var recs []*kgo.Record
	var ids []string
	for range n {
		id := fmt.Sprintf("e-%05d", w.next)
		b, _ := json.Marshal(ev{id, fmt.Sprintf("acct-%d", w.next%4), 1, "EUR", t0})
		recs = append(recs, &kgo.Record{Key: []byte("k"), Value: b, Partition: int32(w.next % 2)})
		ids = append(ids, id)
		w.next++
	}
	if err := w.prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// waitCounted waits until n events are in the ledger.
func (w *aheadWorld) waitCounted(t *testing.T, n int64) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%d events counted", n), func() (bool, string) {
		var got int64
		for _, b := range w.server.Tables().Balances {
			got += b.Count
		}
		return got == n, fmt.Sprintf("%d counted", got)
	})
}

// Property: while the source is caught up, every polled id is looked up in
// the table its claim writes before that claim, or dropped unread and
// counted as such; in a catch-up, none is.
func TestReadAheadLooksUpLiveIDsOnlyWhileCaughtUp(t *testing.T) {
	w := startAheadWorld(t, false, func(c *Config) { c.MaxPollRecords = 10 })
	w.produce(t, 2)
	w.waitCounted(t, 2)          // a checkpoint read the generations
	backlog := w.produce(t, 300) // 150 a partition: many polls of 10 behind the end of the log
	w.waitCounted(t, 302)
	// The last poll of each partition may reach the end of the log (its
	// last 10 ids, the backlog's last 20); all before were polled behind.
	for _, id := range backlog[:280] {
		if g := w.store.lookedUp(id); len(g) != 0 {
			t.Fatalf("%s of the backlog was read ahead (generations %v): read-ahead in a catch-up", id, g)
		}
	}
	st := w.p.Stats()
	before := st.ReadAhead.Load() + st.ReadAheadDropped.Load()
	var live []string
	for i := range 20 {
		live = append(live, w.produce(t, 3)...)
		w.waitCounted(t, int64(302+3*(i+1)))
	}
	after := st.ReadAhead.Load() + st.ReadAheadDropped.Load()
	if after-before != int64(len(live)) {
		t.Fatalf("%d live ids read ahead or dropped, want each of the %d once", after-before, len(live))
	}
	var read int
	for _, id := range live {
		if g := w.store.lookedUp(id); len(g) > 0 {
			read++
			if !slices.Equal(g, []driver.Generation{0}) {
				t.Fatalf("%s looked up in generations %v, want the current one, 0, once", id, g)
			}
		}
	}
	if read < len(live)/2 {
		t.Fatalf("%d of %d live ids looked up ahead (stats: %d read, %d dropped)", read, len(live), st.ReadAhead.Load(), st.ReadAheadDropped.Load())
	}
}

// Property: a server whose lookups never answer holds up neither the
// source nor a checkpoint: with every read-ahead connection stuck and its
// queue full, every event still counts (the ids are dropped), and each
// statement was bounded by readAheadTimeout.
func TestReadAheadNeverHoldsUpCheckpoints(t *testing.T) {
	w := startAheadWorld(t, true, func(c *Config) { c.MaxPollRecords = 500 })
	w.produce(t, 2)
	w.waitCounted(t, 2)
	st := w.p.Stats()
	const polls, size = 12, 500 // more ids than the connections and the queue hold
	for i := range polls {
		w.produce(t, size)
		w.waitCounted(t, int64(2+(i+1)*size))
	}
	if st.ReadAhead.Load() != 0 || st.ReadAheadDropped.Load() == 0 {
		t.Fatalf("%d ids read ahead, %d dropped on a server that never answers; want none read, some dropped", st.ReadAhead.Load(), st.ReadAheadDropped.Load())
	}
	w.store.mu.Lock()
	defer w.store.mu.Unlock()
	if w.store.unbounded != 0 {
		t.Fatalf("%d lookups without a deadline within %s", w.store.unbounded, readAheadTimeout)
	}
}

// The read-ahead's connections are bounded: more than MaxReadAheadConns,
// or fewer than none, is refused.
func TestReadAheadConnsBounded(t *testing.T) {
	for _, n := range []int{-1, MaxReadAheadConns + 1} {
		cfg := testConfig(&env{brokers: []string{"127.0.0.1:1"}, topic: "t"})
		cfg.DedupReadAheadConns = n
		if err := cfg.validate(); err == nil {
			t.Errorf("DedupReadAheadConns %d accepted", n)
		}
	}
	cfg := testConfig(&env{brokers: []string{"127.0.0.1:1"}, topic: "t"})
	cfg.DedupReadAheadConns = MaxReadAheadConns
	if err := cfg.validate(); err != nil {
		t.Errorf("DedupReadAheadConns %d refused: %v", MaxReadAheadConns, err)
	}
}

// onePlace puts every key on participant 0 of server 0, whose generations
// are the initial ones.
type onePlace struct{}

func (onePlace) KeyGenerations(context.Context) (driver.KeyGenerations, error) {
	return driver.KeyGenerations{Emptied: -1}, nil
}

func (onePlace) Route(string) int  { return 0 }
func (onePlace) Participants() int { return 1 }
func (onePlace) ServerOf(int) int  { return 0 }

// Property: a poll's ids are shared by the connections (in chunks of at
// least readAheadMinChunk), and a chunk polled before the last barrier is
// still read, for the claim under way; one polled before the barrier
// before that is dropped unread, its checkpoint being over.
func TestReadAheadReadsForTheClaimUnderWay(t *testing.T) {
	cfg := testConfig(&env{brokers: []string{"127.0.0.1:1"}, topic: "t"})
	cfg.DedupReadAheadConns = 4
	cfg.Clock = time.Now
	rec := &lookupRecorder{Store: memdriver.New(memdriver.Options{}).As("billing"), looked: map[string][]driver.Generation{}}
	var st Stats
	a := newReadAhead(cfg, []driver.Store{rec}, onePlace{}, func() *driver.KeyGenerations { return &driver.KeyGenerations{Emptied: -1} }, &st)
	ids := func(prefix string, n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s-%03d", prefix, i))
		}
		return out
	}
	a.offer(ids("over", 10)) // claimed by the checkpoint sealed at barrier 1
	a.barrier()
	a.barrier()
	under := ids("under", 64) // claimed by the one sealed at barrier 3, under way
	a.offer(under)
	a.barrier()
	if got := len(a.chunks); got != 1+4 {
		t.Fatalf("%d chunks queued, want 1 of 10 ids and the 64 ids spread over the 4 connections", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.run(ctx) }()
	testenv.Eventually(t, 10*time.Second, "every chunk read or dropped", func() (bool, string) {
		n := st.ReadAhead.Load() + st.ReadAheadDropped.Load()
		return n == 74, fmt.Sprintf("%d of 74 ids read or dropped", n)
	})
	cancel()
	<-done
	for _, id := range under {
		if len(rec.lookedUp(id)) == 0 {
			t.Fatalf("%s, polled before the last barrier, was not read for the claim under way", id)
		}
	}
	for _, id := range ids("over", 10) {
		if g := rec.lookedUp(id); len(g) != 0 {
			t.Fatalf("%s of a checkpoint that is over was read (generations %v)", id, g)
		}
	}
	if st.ReadAhead.Load() != 64 || st.ReadAheadDropped.Load() != 10 {
		t.Fatalf("%d read, %d dropped; want 64 and 10", st.ReadAhead.Load(), st.ReadAheadDropped.Load())
	}
}

// Property: an instance that starts on a log it is caught up with reads
// ahead the ids of its first checkpoint too, before any checkpoint has
// read the generations (it reads them itself).
func TestReadAheadBeforeTheFirstCheckpoint(t *testing.T) {
	w := startAheadWorld(t, false, func(c *Config) { c.CheckpointInterval = time.Hour })
	w.p.DeferCheckpoint()
	first := w.produce(t, 3)
	testenv.Eventually(t, 10*time.Second, "the first ids read ahead", func() (bool, string) {
		var read []string
		for _, id := range first {
			if g := w.store.lookedUp(id); slices.Equal(g, []driver.Generation{0}) {
				read = append(read, id)
			}
		}
		st := w.p.Stats()
		return len(read) == len(first), fmt.Sprintf("read ahead in generation 0: %v (stats: %d read, %d dropped)", read, st.ReadAhead.Load(), st.ReadAheadDropped.Load())
	})
	w.p.ForceCheckpoint()
	w.waitCounted(t, 3)
}
