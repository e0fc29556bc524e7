package publisher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The way back from a lost progress record (ErrProgressLost: the progress
// topic deleted, truncated, or its records written where the publisher
// does not read them). What a consumer already has is what the table
// topics hold: every change event names the checkpoint it belongs to
// (source.checkpoint, source.commit_seq), and the publisher publishes
// checkpoints in commit_seq order, each Kafka transaction ending with the
// progress it reached. So the last change events of the topics say how far
// the changelog is published:
//
//   - S, the highest commit_seq of a change event (snapshot reads aside),
//     is the last checkpoint published, in whole or in part;
//   - it is whole when MySQL's hint reached it, or its outbox rows are
//     deleted (they are only once Kafka holds it in whole); otherwise the
//     events of S Kafka holds (counted at the partitions' tails, where S's
//     are the last) are the events of its first rows, in the publisher's
//     order, and tell how many rows are published;
//   - checkpoints after S published without any event, and everything up
//     to the hint, are published too: republishing an event-less
//     checkpoint publishes nothing.
//
// RecoverProgress writes the rebuilt record in a transaction of the
// ledger's transactional id (which fences every publisher first, and is
// refused if one initialises after it), so that no change is published
// twice; the publisher then goes on from it.

// Recovery is what RecoverProgress found and did.
type Recovery struct {
	// Found is the progress record the topic held (nil: none).
	Found *Progress `json:"found,omitempty"`
	// Lost says whether the progress was lost (the publisher refused
	// it): when false nothing is rebuilt.
	Lost bool `json:"lost"`
	// LastCommitSeq is the highest commit_seq of a change event in the
	// topics (0: none), LastEvents how many events of it they hold.
	LastCommitSeq int64 `json:"last_commit_seq"`
	LastEvents    int64 `json:"last_events,omitempty"`
	// Hint is MySQL's published hint.
	Hint int64 `json:"hint"`
	// Rebuilt is the progress rebuilt (when Lost), Written whether it was
	// written to the progress topic.
	Rebuilt *Progress `json:"rebuilt,omitempty"`
	Written bool      `json:"written"`
}

// RecoverProgress checks the ledger's progress record and, when it is
// lost, rebuilds it from the changelog's topics and MySQL (see above) and,
// when write is set, writes it. It creates the topics that are missing
// (a deleted progress topic with one partition) and refuses a progress
// topic of several partitions (delete it first). Running instances are
// fenced for a moment: their publisher starts again from the record
// written.
func RecoverProgress(ctx context.Context, cfg Config, control Control, servers []Server, write bool) (Recovery, error) {
	var rec Recovery
	p := New(cfg, control, servers)
	cfg = p.cfg
	st, err := control.Changelog(ctx)
	if err != nil {
		return rec, err
	}
	rec.Hint = st.Published
	if !st.On {
		return rec, fmt.Errorf("publisher: the ledger's changelog is off")
	}
	if st.Prefix != cfg.Prefix {
		return rec, fmt.Errorf("publisher: the ledger's changelog is on with CHANGELOG_TOPIC_PREFIX %q, not %q", st.Prefix, cfg.Prefix)
	}
	cl, err := kgo.NewClient(producerOpts(cfg)...)
	if err != nil {
		return rec, fmt.Errorf("publisher: client: %w", err)
	}
	defer cl.Close()
	if err := ensureTopics(ctx, cl, cfg); err != nil {
		return rec, err
	}
	// Fences every publisher and settles their open transactions: what
	// is read below is all Kafka will ever hold of them.
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return rec, fmt.Errorf("publisher: initialising the producer: %w", err)
	}
	if rec.Found, err = readProgress(ctx, cfg); err != nil {
		return rec, err
	}
	if _, err := resume(rec.Found, st, cfg.Ledger); !errors.Is(err, ErrProgressLost) {
		return rec, err // nil: nothing lost
	}
	rec.Lost = true
	if st.Snapshot {
		// The hint is raised only by changes, which follow the snapshot.
		return rec, fmt.Errorf("publisher: the snapshot of the ledger's rows is pending and the hint is %d: the changelog state is inconsistent", st.Published)
	}
	rd, err := kgo.NewClient(append(append([]kgo.Opt(nil), cfg.KafkaOpts...), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords())...)
	if err != nil {
		return rec, fmt.Errorf("publisher: client: %w", err)
	}
	defer rd.Close()
	last, err := lastCheckpoint(ctx, rd, cfg)
	if err != nil {
		return rec, err
	}
	rec.LastCommitSeq = last.Seq
	next := Progress{Seq: max(st.From-1, st.Published), From: st.From, Ledger: cfg.Ledger, Prefix: cfg.Prefix}
	if last.Seq > next.Seq {
		var rows []driver.OutboxChunk
		for _, s := range servers {
			idx, err := s.OutboxIndex(ctx, []string{last.Gtrid})
			if err != nil {
				return rec, err
			}
			rows = append(rows, idx...)
		}
		if len(rows) > 0 {
			if rec.LastEvents, err = countEvents(ctx, rd, cfg, last); err != nil {
				return rec, err
			}
		}
		if next, err = rebuilt(next, last, rows, rec.LastEvents); err != nil {
			return rec, err
		}
	}
	rec.Rebuilt = &next
	if !write {
		return rec, nil
	}
	if err := p.transaction(ctx, cl, next, func(func(*kgo.Record)) error { return nil }); err != nil {
		return rec, fmt.Errorf("publisher: writing the progress record (a publisher initialised meanwhile? run it again): %w", err)
	}
	rec.Written = true
	return rec, nil
}

// rebuilt is the progress once checkpoint last is published as far as
// Kafka holds it: in whole when its outbox rows are gone, else its first
// rows whose events add up to the events Kafka holds of it (the fewest
// such rows: a row of no event is published again, which publishes
// nothing). from is the progress up to the hint.
func rebuilt(from Progress, last lastEvent, rows []driver.OutboxChunk, events int64) (Progress, error) {
	next := from
	next.Seq, next.Parts, next.Checkpoint = last.Seq, 0, last.Gtrid
	if len(rows) == 0 {
		return next, nil
	}
	var sum int64
	for k, r := range rows {
		if sum == events && k > 0 {
			next.Seq, next.Parts = last.Seq-1, k
			return next, nil
		}
		sum += int64(r.Events)
	}
	if sum == events {
		return next, nil
	}
	return from, fmt.Errorf("publisher: Kafka holds %d events of checkpoint %d (%s), which are not the events of its first outbox rows (%d rows, %d events): cannot tell how far it is published",
		events, last.Seq, last.Gtrid, len(rows), sum)
}

// lastEvent is the checkpoint of a change event.
type lastEvent struct {
	Seq   int64
	Gtrid string
}

// eventSource is what a change event's value says of where it comes
// from.
type eventSource struct {
	Source struct {
		Ledger     string `json:"ledger"`
		Name       string `json:"name"`
		Checkpoint string `json:"checkpoint"`
		CommitSeq  int64  `json:"commit_seq"`
		Snapshot   string `json:"snapshot"`
	} `json:"source"`
}

func decodeSource(cfg Config, r *kgo.Record) (eventSource, error) {
	var ev eventSource
	if err := json.Unmarshal(r.Value, &ev); err != nil {
		return ev, fmt.Errorf("publisher: %s/%d@%d: not a change event: %w", r.Topic, r.Partition, r.Offset, err)
	}
	if ev.Source.Ledger != cfg.Ledger || ev.Source.Name != cfg.Prefix {
		return ev, fmt.Errorf("publisher: %s/%d@%d is an event of ledger %q prefix %q, not %q %q", r.Topic, r.Partition, r.Offset,
			ev.Source.Ledger, ev.Source.Name, cfg.Ledger, cfg.Prefix)
	}
	return ev, nil
}

func (ev eventSource) change() bool { return ev.Source.Snapshot == "" || ev.Source.Snapshot == "false" }

// eachPartition calls fn with every partition of every table topic and
// its stable end.
func eachPartition(ctx context.Context, cl *kgo.Client, cfg Config, fn func(topic string, partition int32, end int64) error) error {
	adm := kadm.NewClient(cl)
	for _, t := range changelog.Tables() {
		topic := Topic(cfg.Prefix, t.Name)
		ends, err := stableEnds(ctx, adm, topic, cfg.Waits)
		if err != nil {
			return err
		}
		for part, end := range ends {
			if err := fn(topic, part, end); err != nil {
				return err
			}
		}
	}
	return nil
}

// lastCheckpoint is the checkpoint of the change event of the highest
// commit_seq in the table topics (zero: none): each partition's last
// change event (a partition holds its events in commit order).
func lastCheckpoint(ctx context.Context, cl *kgo.Client, cfg Config) (lastEvent, error) {
	var last lastEvent
	err := eachPartition(ctx, cl, cfg, func(topic string, part int32, end int64) error {
		return readTail(ctx, cl, topic, part, end, func(r *kgo.Record) (bool, error) {
			ev, err := decodeSource(cfg, r)
			if err != nil {
				return false, err
			}
			if !ev.change() {
				return true, nil // the snapshot: every change of the enabling follows it
			}
			if ev.Source.CommitSeq > last.Seq {
				last = lastEvent{Seq: ev.Source.CommitSeq, Gtrid: ev.Source.Checkpoint}
			}
			return true, nil
		})
	})
	return last, err
}

// countEvents counts the change events of checkpoint last in the table
// topics: at each partition's tail, back to an event of an earlier
// checkpoint.
func countEvents(ctx context.Context, cl *kgo.Client, cfg Config, last lastEvent) (int64, error) {
	var n int64
	err := eachPartition(ctx, cl, cfg, func(topic string, part int32, end int64) error {
		return readTail(ctx, cl, topic, part, end, func(r *kgo.Record) (bool, error) {
			ev, err := decodeSource(cfg, r)
			if err != nil {
				return false, err
			}
			if ev.change() && ev.Source.CommitSeq == last.Seq && ev.Source.Checkpoint == last.Gtrid {
				n++
				return false, nil
			}
			return true, nil // an earlier checkpoint, or the snapshot before every change
		})
	})
	return n, err
}
