package changelogtest

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
)

// Writer writes events to the changelog's topics in Kafka transactions, as
// the service's publisher will: one transactional id, each batch of events
// visible to read_committed consumers together or not at all. Records are
// keyed by the row's primary key and partitioned by Kafka's default
// partitioner (murmur2 of the key), so one key's events stay in order on one
// partition.
type Writer struct {
	cl     *kgo.Client
	topics map[string]string
}

// NewWriter connects a transactional producer. topics maps a table name
// (Tables) to its topic.
func NewWriter(brokers []string, transactionalID string, topics map[string]string) (*Writer, error) {
	for table := range topics {
		if _, ok := changelog.Lookup(table); !ok {
			return nil, fmt.Errorf("changelog writer: no table %q", table)
		}
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.TransactionalID(transactionalID),
		// Java's default partitioner for keyed records: murmur2 of the key
		// bytes, what any Kafka client computes for the same key.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.ProducerBatchMaxBytes(8<<20),
	)
	if err != nil {
		return nil, fmt.Errorf("changelog writer: %w", err)
	}
	return &Writer{cl: cl, topics: topics}, nil
}

// Close closes the producer.
func (w *Writer) Close() { w.cl.Close() }

// Transaction writes events in one Kafka transaction and commits it, or
// aborts it when commit is false (the events were written, and a
// read_committed consumer must never see them).
func (w *Writer) Transaction(ctx context.Context, events []changelog.Event, commit bool) error {
	recs := make([]*kgo.Record, 0, len(events))
	for _, ev := range events {
		topic, ok := w.topics[ev.Table]
		if !ok {
			return fmt.Errorf("changelog writer: no topic for table %s", ev.Table)
		}
		k, v, err := changelog.Encode(ev)
		if err != nil {
			return err
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: k, Value: v})
	}
	if err := w.cl.BeginTransaction(); err != nil {
		return fmt.Errorf("changelog writer: begin: %w", err)
	}
	if err := w.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		abortErr := w.cl.EndTransaction(ctx, kgo.TryAbort)
		return errors.Join(fmt.Errorf("changelog writer: produce: %w", err), abortErr)
	}
	if err := w.cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		return fmt.Errorf("changelog writer: end transaction (commit %v): %w", commit, err)
	}
	return nil
}
