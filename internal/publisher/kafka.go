package publisher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
)

// ensureTopics creates the changelog's topics that do not exist: the
// table topics compacted (a key's latest row is the table's), the
// append-only ones not, the progress topic compacted with one partition.
// Existing topics are left as they are.
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
	return createTopic(ctx, adm, 1, cfg.Replication, ProgressTopic(cfg.Prefix), &compact)
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
	adm := kadm.NewClient(cl)
	topic := ProgressTopic(cfg.Prefix)
	var end int64
	for {
		hw, err := adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = hw.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("publisher: progress topic end: %w", err)
		}
		ls, err := adm.ListCommittedOffsets(ctx, topic)
		if err == nil {
			err = ls.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("publisher: progress topic stable end: %w", err)
		}
		h, _ := hw.Lookup(topic, 0)
		l, _ := ls.Lookup(topic, 0)
		if h.Offset == l.Offset {
			end = h.Offset
			break
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return nil, ctx.Err()
		}
	}
	for back := int64(64); ; back *= 8 {
		start := max(0, end-back)
		p, err := readProgressFrom(ctx, cl, topic, start, end)
		if err != nil || p != nil || start == 0 {
			return p, err
		}
	}
}

// readProgressFrom reads [start, end) of the progress partition
// read_committed, control records included (so that the end is seen even
// when the last records are aborted ones), and returns the last progress
// record.
func readProgressFrom(ctx context.Context, cl *kgo.Client, topic string, start, end int64) (*Progress, error) {
	if end <= start {
		return nil, nil
	}
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(start)}})
	defer cl.RemoveConsumePartitions(map[string][]int32{topic: {0}})
	var last *Progress
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return nil, fmt.Errorf("publisher: reading the progress topic: %w", ferr)
		}
		reached := false
		for _, r := range fs.Records() {
			if !r.Attrs.IsControl() {
				p, err := decodeProgress(r.Value)
				if err != nil {
					return nil, err
				}
				last = &p
			}
			reached = reached || r.Offset >= end-1
		}
		if reached {
			return last, nil
		}
	}
}
