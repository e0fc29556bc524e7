package publisher

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/driver"
)

// oneCheckpoint is a ledger whose commit log holds one applied checkpoint
// with rows×perRow changes (new balances, generated as they are read).
type oneCheckpoint struct {
	rows, perRow int
	mu           sync.Mutex
	published    int64
	deleted      bool
	at           time.Time
	noRows
}

// noRows is a server whose tables hold no row (no snapshot to read).
type noRows struct{}

func (noRows) ScanBalances(context.Context, *driver.BalanceKey, int) ([]driver.BalanceRow, error) {
	return nil, nil
}
func (noRows) ScanWindows(context.Context, *driver.WindowKey, int) ([]driver.WindowRow, error) {
	return nil, nil
}
func (noRows) ScanAdjustments(context.Context, *driver.WindowKey, int) ([]driver.AdjustmentRow, error) {
	return nil, nil
}
func (noRows) ScanEntries(context.Context, *driver.EntryKey, int) ([]driver.EntryRow, error) {
	return nil, nil
}
func (noRows) SkipChangelogSnapshot(context.Context, int64) error { return nil }

func (o *oneCheckpoint) Changelog(context.Context) (driver.ChangelogState, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return driver.ChangelogState{On: true, Prefix: "", From: 1, Published: o.published}, nil
}
func (o *oneCheckpoint) LeaseChangelog(context.Context, string, time.Duration) (bool, error) {
	return true, nil
}
func (o *oneCheckpoint) ChangelogPublished(_ context.Context, seq int64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.published = max(o.published, seq)
	return nil
}
func (o *oneCheckpoint) Commits(_ context.Context, from int64, _ bool, _ int) ([]driver.CommitRecord, error) {
	if from > 1 {
		return nil, nil
	}
	return []driver.CommitRecord{{Seq: 1, Gtrid: "g1", CommittedAt: o.at, Applied: true}}, nil
}
func (o *oneCheckpoint) CommitPosition(context.Context) (driver.CommitPosition, error) {
	return driver.CommitPosition{Visible: 1, Decided: 1, RetainedFrom: 1}, nil
}
func (o *oneCheckpoint) OutboxIndex(_ context.Context, gtrids []string) ([]driver.OutboxChunk, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.deleted || len(gtrids) == 0 || gtrids[0] != "g1" {
		return nil, nil
	}
	out := make([]driver.OutboxChunk, o.rows)
	for i := range out {
		out[i] = driver.OutboxChunk{Checkpoint: "g1", Chunk: i, Events: o.perRow}
	}
	return out, nil
}
func (o *oneCheckpoint) ReadOutbox(_ context.Context, chunks []driver.OutboxChunk) ([][]byte, error) {
	out := make([][]byte, len(chunks))
	for i, c := range chunks {
		b := changelog.NewBlob(nil)
		for j := range o.perRow {
			row := changelog.BalanceRow(nil, driver.BalanceRow{BalanceKey: driver.BalanceKey{Account: fmt.Sprintf("a-%d", c.Chunk*o.perRow+j),
				Currency: "EUR"}, Amount: 1, Count: 1, UpdatedAt: o.at})
			b = changelog.AppendRecord(b, changelog.Change{Table: changelog.TBalances, Op: changelog.OpCreate, After: row})
		}
		out[i] = b
	}
	return out, nil
}
func (o *oneCheckpoint) DeleteOutbox(context.Context, []string) (int64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.deleted = true
	return int64(o.rows), nil
}

// A checkpoint of 1,000,000 changes publishes, on the real broker: split
// at its outbox rows into transactions of CHANGELOG_TRANSACTION_MAX_EVENTS
// (10 here), each within the producer's transaction timeout, with the
// heap bounded by the producer's buffer (not by the checkpoint); a
// read_committed consumer gets every change once, and the progress record
// says the checkpoint is published whole.
func TestAMillionChangesPublish(t *testing.T) {
	brokers := testenv.Kafka(t)
	const rows, perRow, maxEvents = 1000, 1000, 100_000
	prefix := testenv.RandomName("t-cl-million-")
	o := &oneCheckpoint{rows: rows, perRow: perRow, at: time.Date(2026, 11, 29, 13, 5, 1, 123456000, time.UTC)}
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	t.Cleanup(func() { deleteTopics(opts, prefix) })
	p := New(Config{Prefix: prefix, Ledger: "L", Instance: "i", Version: "test", KafkaOpts: opts, Partitions: 3, Replication: 1,
		MaxEvents: maxEvents, TxnTimeout: time.Minute, Lease: time.Minute, Logger: testenv.Logger()}, o, []Server{o})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var peak atomic.Uint64
	go func() { done <- p.Run(ctx) }()
	started := time.Now()
	testenv.Eventually(t, 10*time.Minute, "the checkpoint published", func() (bool, string) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		peak.Store(max(peak.Load(), ms.HeapInuse))
		st, _ := o.Changelog(ctx)
		return st.Published == 1, fmt.Sprintf("%d transactions", p.Transactions())
	})
	took := time.Since(started)
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatal(err)
	}
	if got := p.Transactions(); got != rows*perRow/maxEvents {
		t.Errorf("%d transactions, want %d", got, rows*perRow/maxEvents)
	}
	if h := peak.Load(); h > 256<<20 {
		t.Errorf("heap in use peaked at %d MiB publishing one checkpoint", h>>20)
	}
	seen := countOnce(t, opts, prefix, rows*perRow)
	t.Logf("%d changes in %d transactions in %s, heap peak %d MiB; read back once each", seen, p.Transactions(), took.Round(time.Second), peak.Load()>>20)
}

// countOnce reads the account_balances topic read_committed and checks
// that it holds each of the n accounts once, and that the progress says
// checkpoint 1 is published whole.
func countOnce(t *testing.T, opts []kgo.Opt, prefix string, n int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	topic := Topic(prefix, changelog.AccountBalances)
	cl, err := kgo.NewClient(append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	seen := make([]bool, n)
	count := 0
	for count < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("%d of %d read: %v", count, n, ctx.Err())
		}
		for _, r := range fs.Records() {
			k := string(r.Key) // {"account_id":"a-N","currency":"EUR"}
			i, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(k, `{"account_id":"a-`), `","currency":"EUR"}`))
			if err != nil || i < 0 || i >= n {
				t.Fatalf("unexpected key %s", k)
			}
			if seen[i] {
				t.Fatalf("key %s twice", k)
			}
			seen[i] = true
			count++
		}
	}
	pr, err := readProgress(ctx, Config{Prefix: prefix, KafkaOpts: opts})
	if err != nil || pr == nil || pr.Seq != 1 || pr.Parts != 0 {
		t.Errorf("progress %+v (%v), want checkpoint 1 whole", pr, err)
	}
	return count
}

func deleteTopics(opts []kgo.Opt, prefix string) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return
	}
	defer cl.Close()
	topics := []string{ProgressTopic(prefix)}
	for _, tb := range changelog.Tables() {
		topics = append(topics, Topic(prefix, tb.Name))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = kadm.NewClient(cl).DeleteTopics(ctx, topics...)
}
