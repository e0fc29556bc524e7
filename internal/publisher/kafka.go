package publisher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/waits"
)

// progressPartition is the progress topic's one partition: the progress
// record is written to it and read from it.
const progressPartition = 0

// ErrProgressTopic: the progress topic exists with more than one
// partition. The publisher writes and reads its progress on one partition
// only; it refuses such a topic instead of guessing where its records
// went (a record written elsewhere by another client would be missed, and
// the changelog published twice).
var ErrProgressTopic = errors.New("publisher: the progress topic must have exactly one partition")

// producerOpts are the options of a publisher's transactional client. It
// also reads, read_committed with control records, what its transactions
// wrote (committedAt).
func producerOpts(cfg Config) []kgo.Opt {
	return append(append([]kgo.Opt(nil), cfg.KafkaOpts...),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(),
		kgo.TransactionalID(TransactionalID(cfg.Ledger, cfg.Prefix)),
		kgo.TransactionTimeout(cfg.TxnTimeout),
		kgo.RecordPartitioner(partitioner{progress: ProgressTopic(cfg.Prefix),
			keys: kgo.StickyKeyPartitioner(nil), manual: kgo.ManualPartitioner()}),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.MaxBufferedBytes(64<<20),
		kgo.ProducerBatchMaxBytes(1<<20),
	)
}

// partitioner puts a change event where Java's default partitioner puts
// its key (murmur2 of the key: any client puts a key's events on the
// same partition), and the progress record on the partition it names
// (progressPartition): a hashing partitioner ignores Record.Partition.
type partitioner struct {
	progress     string
	keys, manual kgo.Partitioner
}

func (p partitioner) ForTopic(topic string) kgo.TopicPartitioner {
	if topic == p.progress {
		return p.manual.ForTopic(topic)
	}
	return p.keys.ForTopic(topic)
}

// EnsureTopics creates the changelog's topics that do not exist and
// checks the progress topic (an instance's start, and every publishing
// session): see ensureTopics.
func EnsureTopics(ctx context.Context, cfg Config) error {
	cl, err := kgo.NewClient(cfg.KafkaOpts...)
	if err != nil {
		return fmt.Errorf("publisher: client: %w", err)
	}
	defer cl.Close()
	return ensureTopics(ctx, cl, cfg)
}

// ensureTopics creates the changelog's topics that do not exist: the
// table topics compacted (a key's latest row is the table's), the
// append-only ones not, the progress topic compacted with one partition.
// Existing topics are left as they are, except that a progress topic of
// more than one partition is refused (ErrProgressTopic).
func ensureTopics(ctx context.Context, cl *kgo.Client, cfg Config) error {
	adm := kadm.NewClient(cl)
	compact, deleted := "compact", "delete"
	for _, t := range changelog.Tables() {
		policy := &compact
		if t.Append {
			policy = &deleted
		}
		if err := createTopic(ctx, adm, cfg.Partitions, cfg.Replication, Topic(cfg.Prefix, t.Name), policy); err != nil {
			return err
		}
	}
	topic := ProgressTopic(cfg.Prefix)
	if err := createTopic(ctx, adm, 1, cfg.Replication, topic, &compact); err != nil {
		return err
	}
	d, err := describeTopic(ctx, adm, topic)
	if err != nil {
		return err
	}
	if n := len(d.Partitions); n != 1 {
		return fmt.Errorf("%w: %s has %d partitions; delete it, then run `billing changelog recover-progress`, which creates it with one partition and rebuilds the progress from the changelog's topics (docs/production.md, \"The changelog's topics\")",
			ErrProgressTopic, topic, n)
	}
	return nil
}

// describeTopic describes a topic that exists or was just created: the
// brokers' metadata may not know a new topic for a moment (a bounded
// wait).
func describeTopic(ctx context.Context, adm *kadm.Client, topic string) (kadm.TopicDetail, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		details, err := adm.ListTopics(ctx, topic)
		d, ok := details[topic]
		switch {
		case err != nil:
		case !ok:
			err = kerr.UnknownTopicOrPartition
		case d.Err != nil:
			err = d.Err
		case len(d.Partitions) == 0:
			err = errors.New("no partition known yet")
		default:
			return d, nil
		}
		if time.Now().After(deadline) {
			return d, fmt.Errorf("publisher: describing topic %s: %w", topic, err)
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return d, ctx.Err()
		}
	}
}

func createTopic(ctx context.Context, adm *kadm.Client, partitions int32, replication int16, topic string, policy *string) error {
	r, err := adm.CreateTopic(ctx, partitions, replication, map[string]*string{"cleanup.policy": policy}, topic)
	if err == nil {
		err = r.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("publisher: creating topic %s: %w", topic, err)
	}
	return nil
}

// readProgress reads the last committed progress record (nil: none), once
// the progress partition's last stable offset has reached its high
// watermark (no transaction open on it: the caller initialised the
// producer, which settled its predecessor's).
func readProgress(ctx context.Context, cfg Config) (*Progress, error) {
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), cfg.KafkaOpts...), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords())...)
	if err != nil {
		return nil, fmt.Errorf("publisher: client: %w", err)
	}
	defer cl.Close()
	topic := ProgressTopic(cfg.Prefix)
	ends, err := stableEnds(ctx, kadm.NewClient(cl), topic, cfg.Waits)
	if err != nil {
		return nil, err
	}
	var last *Progress
	err = readTail(ctx, cl, topic, progressPartition, ends[progressPartition], func(r *kgo.Record) (bool, error) {
		p, err := decodeProgress(r.Value)
		if err != nil {
			return false, err
		}
		last = &p
		return true, nil
	})
	return last, err
}

// stableEnds waits until no transaction is open on topic (every
// partition's last stable offset at its high watermark) and returns each
// partition's end. A transaction is open there only until the producer
// that opened it is fenced or its timeout runs out: the wait is
// reported (ws), not bounded.
func stableEnds(ctx context.Context, adm *kadm.Client, topic string, ws *waits.Set) (map[int32]int64, error) {
	var w *waits.Wait
	defer func() {
		if w != nil {
			w.End()
		}
	}()
	for {
		hw, err := adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = hw.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("publisher: topic %s end: %w", topic, err)
		}
		ls, err := adm.ListCommittedOffsets(ctx, topic)
		if err == nil {
			err = ls.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("publisher: topic %s stable end: %w", topic, err)
		}
		ends := map[int32]int64{}
		var open []string
		hw.Each(func(h kadm.ListedOffset) {
			ends[h.Partition] = h.Offset
			if l, _ := ls.Lookup(topic, h.Partition); l.Offset != h.Offset {
				open = append(open, fmt.Sprintf("partition %d: stable end %d, end %d", h.Partition, l.Offset, h.Offset))
			}
		})
		if len(open) == 0 {
			return ends, nil
		}
		if w == nil {
			w = ws.Begin(fmt.Sprintf("the open transaction on topic %s to end (committed or aborted)", topic))
		}
		w.Still(strings.Join(open, "; "))
		if !sleep(ctx, 50*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
}

// readTail reads one partition read_committed, control records included
// (so that its end is seen even when its last records are aborted ones),
// backwards from end (its stable end): windows of 64, 512, … records
// before it, each read in order, fn called with each data record of the
// window; a window where fn returned true for a record is the last read.
// So fn sees the partition's last records first window by window, and
// within a window in order.
func readTail(ctx context.Context, cl *kgo.Client, topic string, partition int32, end int64, fn func(*kgo.Record) (bool, error)) error {
	for back, prev := int64(64), end; prev > 0; back *= 8 {
		start := max(0, end-back)
		found, err := readRange(ctx, cl, topic, partition, start, prev, fn)
		if err != nil || found {
			return err
		}
		prev = start
	}
	return nil
}

// readRange reads [start, end) of a partition and calls fn with each data
// record; it says whether fn returned true for one.
func readRange(ctx context.Context, cl *kgo.Client, topic string, partition int32, start, end int64, fn func(*kgo.Record) (bool, error)) (bool, error) {
	if end <= start {
		return false, nil
	}
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: {partition: kgo.NewOffset().At(start)}})
	defer cl.RemoveConsumePartitions(map[string][]int32{topic: {partition}})
	found := false
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return false, err
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return false, fmt.Errorf("publisher: reading topic %s: %w", topic, ferr)
		}
		reached := false
		for _, r := range fs.Records() {
			if r.Topic != topic || r.Partition != partition {
				continue
			}
			// Compaction can leave no record at end-1: any record at
			// or after it ends the range.
			reached = reached || r.Offset >= end-1
			if r.Offset < end && !r.Attrs.IsControl() {
				ok, err := fn(r)
				if err != nil {
					return false, err
				}
				found = found || ok
			}
		}
		if reached {
			return found, nil
		}
	}
}
