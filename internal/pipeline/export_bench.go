package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink"
)

// This file exists for cmd/billing-bench only. It runs the checkpoint
// protocol (dedup lookups and inserts, aggregation, upserts, XA prepare,
// fenced decision, XA commit: exactly what runCheckpoint does) on events
// that are already decoded, without Kafka, so that the benchmark can
// measure what MySQL sustains for the very statements the service sends.
// The service itself never uses it.

// BenchRecord is one decoded event and the Kafka position it came from.
type BenchRecord struct {
	Event     event.Event
	Partition int32
	Offset    int64
	Timestamp time.Time
}

// BenchCheckpointer runs checkpoints over given records. Like the
// pipeline's checkpoint coordinator it is used by one goroutine at a time.
type BenchCheckpointer struct{ p *Pipeline }

// NewBenchCheckpointer is New without the Kafka client: cfg is validated as
// by New, cfg.KafkaOpts is ignored, and cfg.OnCheckpoint reports every
// attempt.
func NewBenchCheckpointer(cfg Config, sink *txsink.Sink) (*BenchCheckpointer, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &BenchCheckpointer{p: &Pipeline{
		cfg:   cfg,
		log:   cfg.Logger,
		sink:  sink,
		parts: map[int32]*partition{},
		cache: dedup.NewCache(cfg.DedupCacheKeys),
	}}, nil
}

// Checkpoint commits recs as one checkpoint cut at cuts (the partitions
// must have been claimed with sink.Claim at the epochs the cuts name). It
// returns whether the commit decision was taken and the error, if any.
func (b *BenchCheckpointer) Checkpoint(ctx context.Context, recs []BenchRecord, cuts []txsink.PartitionCut) (bool, error) {
	s := &snapshot{cuts: cuts, records: make([]record, len(recs))}
	for i, r := range recs {
		s.records[i] = record{ev: r.Event, partition: r.Partition, offset: r.Offset, ts: r.Timestamp}
	}
	out := b.p.runCheckpoint(ctx, s)
	return out.decided, out.err
}
