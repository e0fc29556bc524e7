package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// consumeAll reads the topic from the start with the given isolation level
// until want records arrived and no more arrive for a second (or ctx ends),
// grouped by partition in offset order.
func consumeAll(ctx context.Context, t *testing.T, brokers []string, topic string, level kgo.IsolationLevel, want int) map[int32][]*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(level),
		kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	out := map[int32][]*kgo.Record{}
	n := 0
	var quietSince time.Time
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		fs := cl.PollFetches(pctx)
		cancel()
		got := 0
		fs.EachRecord(func(r *kgo.Record) {
			out[r.Partition] = append(out[r.Partition], r)
			got++
		})
		for _, e := range fs.Errors() {
			if e.Err != context.DeadlineExceeded && e.Err != context.Canceled {
				t.Fatalf("fetch %s/%d: %v", e.Topic, e.Partition, e.Err)
			}
		}
		n += got
		switch {
		case got > 0 || n < want:
			quietSince = time.Time{}
		case quietSince.IsZero():
			quietSince = time.Now()
		case time.Since(quietSince) > time.Second:
			return out
		}
	}
	t.Fatalf("consumed %d records of %d before the deadline", n, want)
	return nil
}

// TestAgainstKafka runs the command against the broker of KAFKA_BROKERS on
// a fresh topic, reads the topic back and checks that read_committed sees
// exactly the committed records (no aborted ones), read_uncommitted sees the
// aborted ones too, and that replaying the committed records through an
// independent decoder and the model reproduces the expected file exactly.
// The topic is deleted afterwards.
func TestAgainstKafka(t *testing.T) {
	brokersEnv := os.Getenv("KAFKA_BROKERS")
	if brokersEnv == "" {
		t.Skip("KAFKA_BROKERS not set")
	}
	brokers := strings.Split(brokersEnv, ",")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	topic := fmt.Sprintf("billing-gen-test-%d", time.Now().UnixNano())
	adminCl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer adminCl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := kadm.NewClient(adminCl).DeleteTopic(ctx, topic); err != nil {
			t.Logf("delete topic %s: %v", topic, err)
		}
	})

	path := filepath.Join(t.TempDir(), "expected.json")
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-brokers", brokersEnv, "-topic", topic, "-create-topic", "-partitions", "6",
		"-events", "2000", "-seed", "20261129", "-aborted-ratio", "0.02", "-overflow-cases", "3",
		"-expected", path, "-progress", "log"}, &stdout, &stderr)
	t.Logf("stdout:\n%sstderr:\n%s", stdout.String(), stderr.String())
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	exp, err := ledgercheck.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := exp.Produced
	if p.Valid != 2000 || p.Aborted == 0 || p.Malformed == 0 || p.Duplicates == 0 || exp.Partitions != 6 {
		t.Fatalf("produced %+v", p)
	}

	committed := consumeAll(ctx, t, brokers, topic, kgo.ReadCommitted(), int(p.Records))
	all := consumeAll(ctx, t, brokers, topic, kgo.ReadUncommitted(), int(p.Records+p.Aborted))
	count := func(m map[int32][]*kgo.Record) (n int, aborted int) {
		for _, rs := range m {
			for _, r := range rs {
				n++
				if bytes.Contains(r.Value, []byte(`"a-`)) || bytes.Contains(r.Value, []byte(": a-")) {
					aborted++
				}
			}
		}
		return
	}
	nc, ac := count(committed)
	na, aa := count(all)
	t.Logf("read_committed: %d records (%d from aborted transactions); read_uncommitted: %d (%d)", nc, ac, na, aa)
	if int64(nc) != p.Records || ac != 0 {
		t.Errorf("read_committed saw %d records, %d aborted; want %d, 0", nc, ac, p.Records)
	}
	if int64(na) != p.Records+p.Aborted || int64(aa) != p.Aborted {
		t.Errorf("read_uncommitted saw %d records, %d aborted; want %d, %d", na, aa, p.Records+p.Aborted, p.Aborted)
	}

	// Replay partition by partition (the order within each is the log's).
	period, err := exp.Period()
	if err != nil {
		t.Fatal(err)
	}
	l, err := ledgercheck.NewModelWith(ledgercheck.Options{Period: period})
	if err != nil {
		t.Fatal(err)
	}
	maxPayload := 64 * 1024
	for part := int32(0); part < 6; part++ {
		for _, r := range committed[part] {
			e, reason := refDecode(r.Value, maxPayload)
			if reason != "" {
				l.DeadLetter(reason)
				continue
			}
			if string(r.Key) != e.AccountID && !strings.HasPrefix(string(r.Key), e.AccountID+"~dup") {
				t.Errorf("record key %q for account %q", r.Key, e.AccountID)
			}
			if ledgercheck.InFuture(e.OccurredAt, time.Now(), time.Hour) { // the service's MAX_EVENT_TIME_SKEW
				l.DeadLetter(ledgercheck.ReasonEventTimeInFuture)
				continue
			}
			l.Add(e)
		}
	}
	got := l.Expected()
	a, _ := ledgercheck.Marshal(&ledgercheck.Expected{Version: 1, Window: got.Window, EventsValid: got.EventsValid,
		DeadLetters: got.DeadLetters, Balances: got.Balances, Windows: got.Windows})
	b, _ := ledgercheck.Marshal(&ledgercheck.Expected{Version: 1, Window: exp.Window, EventsValid: exp.EventsValid,
		DeadLetters: exp.DeadLetters, Balances: exp.Balances, Windows: exp.Windows})
	if !bytes.Equal(a, b) {
		t.Errorf("replay of the topic differs from the expected file")
	}
	t.Logf("replayed topic: %d events in %d balances, %d windows, dead letters %v", got.EventsValid, len(got.Balances), len(got.Windows), got.DeadLetters)
}

// TestProduceErrorFailsRun checks that a record the broker refuses (the
// payload_too_large record exceeds the topic's max.message.bytes) fails the
// run with exit status 1 and leaves the expected file unwritten.
func TestProduceErrorFailsRun(t *testing.T) {
	brokersEnv := os.Getenv("KAFKA_BROKERS")
	if brokersEnv == "" {
		t.Skip("KAFKA_BROKERS not set")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	topic := fmt.Sprintf("billing-gen-test-small-%d", time.Now().UnixNano())
	adminCl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokersEnv, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(adminCl)
	t.Cleanup(func() {
		defer adminCl.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := adm.DeleteTopic(ctx, topic); err != nil {
			t.Logf("delete topic %s: %v", topic, err)
		}
	})
	if _, err := adm.CreateTopic(ctx, 2, -1, map[string]*string{"max.message.bytes": kadm.StringPtr("20000")}, topic); err != nil {
		t.Fatal(err)
	}
	// A new topic takes a moment to appear in every broker's metadata; the
	// generator would otherwise report it missing instead of the refusal.
	for {
		md, err := adm.Metadata(ctx, topic)
		if err == nil {
			if td, ok := md.Topics[topic]; ok && td.Err == nil && len(td.Partitions) == 2 {
				break
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topic %s never appeared: %v", topic, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	path := filepath.Join(t.TempDir(), "expected.json")
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{"-brokers", brokersEnv, "-topic", topic, "-events", "500", "-malformed-ratio", "0.2",
		"-seed", "1", "-expected", path, "-progress", "none"}, &stdout, &stderr)
	t.Logf("stdout:\n%sstderr:\n%s", stdout.String(), stderr.String())
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("expected file written despite the failure (%v)", err)
	}
	if !strings.Contains(stderr.String(), "MESSAGE_TOO_LARGE") {
		t.Errorf("error does not name the broker's refusal")
	}
}
