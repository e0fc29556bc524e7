package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// baseOpts are the client options shared by every client of the run: only
// the given seed brokers (and the brokers they advertise) are contacted.
func baseOpts(brokers []string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ClientID("billing-gen"),
		kgo.DialTimeout(10 * time.Second),
		kgo.RetryTimeout(time.Minute),
		// A broker restarting closes a new connection at its first read;
		// franz-go takes that for missing TLS or SASL and fails the
		// records at once (a chaos run's generator failed so in a Kafka
		// restart). billing-gen connects without either: retry.
		kgo.AlwaysRetryEOF(),
	}
}

// ensureTopic returns the topic's partition count, creating the topic first
// if it is missing and create is set. After a creation it waits (at most a
// minute) until the metadata shows every partition with a leader.
func ensureTopic(ctx context.Context, adm *kadm.Client, topic string, create bool, partitions int32, rf int16, logw io.Writer) (int, error) {
	details, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return 0, fmt.Errorf("describe topic %q: %w", topic, err)
	}
	d, ok := details[topic]
	switch {
	case ok && d.Err == nil:
		if create && len(d.Partitions) != int(partitions) {
			fmt.Fprintf(logw, "billing-gen: topic %q exists with %d partitions (not %d); using it as is\n", topic, len(d.Partitions), partitions)
		}
		return len(d.Partitions), nil
	case ok && !errors.Is(d.Err, kerr.UnknownTopicOrPartition):
		return 0, fmt.Errorf("describe topic %q: %w", topic, d.Err)
	case !create:
		return 0, fmt.Errorf("topic %q does not exist (pass -create-topic to create it)", topic)
	}
	if _, err := adm.CreateTopic(ctx, partitions, rf, nil, topic); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return 0, fmt.Errorf("create topic %q: %w", topic, err)
	}
	fmt.Fprintf(logw, "billing-gen: created topic %q with %d partitions\n", topic, partitions)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		details, err := adm.ListTopics(ctx, topic)
		if err == nil {
			if d, ok := details[topic]; ok && d.Err == nil && len(d.Partitions) > 0 {
				ready := true
				for _, p := range d.Partitions {
					ready = ready && p.Err == nil && p.Leader >= 0
				}
				if ready {
					return len(d.Partitions), nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("wait for topic %q to be ready: %w", topic, context.Cause(ctx))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// aborter produces records inside transactions that it then aborts, on its
// own transactional client (separate from the idempotent producer).
type aborter struct {
	opts  []kgo.Opt
	cl    *kgo.Client
	batch []*kgo.Record
	txns  int64
	recs  int64
}

// add buffers r and runs an aborted transaction every abortBatch records.
func (a *aborter) add(ctx context.Context, r *kgo.Record) error {
	a.batch = append(a.batch, r)
	if len(a.batch) < abortBatch {
		return nil
	}
	return a.flush(ctx)
}

// flush produces the buffered records in one transaction, waits until the
// broker has them, and aborts the transaction. Any failure is an error: the
// records might otherwise have been committed.
func (a *aborter) flush(ctx context.Context) error {
	if len(a.batch) == 0 {
		return nil
	}
	if a.cl == nil {
		cl, err := kgo.NewClient(a.opts...)
		if err != nil {
			return fmt.Errorf("transactional client: %w", err)
		}
		a.cl = cl
	}
	if err := a.cl.BeginTransaction(); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	// A produce error is not fatal: once the abort is confirmed, none of
	// the batch is visible whatever reached the log (a broker restart
	// fails produces and EndTxn alike).
	_ = a.cl.ProduceSync(ctx, a.batch...).FirstErr()
	// Abort even after a produce error; do not let a cancelled ctx cut the
	// abort short (that could leave the outcome unknown). EndTxn fails
	// while the coordinator is unreachable (a broker restart): retrying
	// with TryAbort is franz-go's documented recovery.
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	for {
		err := a.cl.EndTransaction(endCtx, kgo.TryAbort)
		if err == nil {
			break
		}
		select {
		case <-endCtx.Done():
			return fmt.Errorf("abort transaction: %w", err)
		case <-time.After(500 * time.Millisecond):
		}
	}
	a.txns++
	a.recs += int64(len(a.batch))
	a.batch = a.batch[:0]
	return nil
}

func (a *aborter) close() {
	if a.cl != nil {
		a.cl.Close()
	}
}

// produceRun connects, makes sure the topic exists, produces the whole
// stream and writes the expected ledger if, and only if, everything was
// acknowledged. It returns the number of records handed to a producer.
func produceRun(ctx context.Context, o *options, stdout, stderr io.Writer) (sent int64, err error) {
	started := time.Now()
	admCl, err := kgo.NewClient(baseOpts(o.brokers)...)
	if err != nil {
		return 0, fmt.Errorf("kafka client: %w", err)
	}
	adm := kadm.NewClient(admCl)
	parts, err := ensureTopic(ctx, adm, o.gen.Topic, o.createTopic, int32(o.partitions), int16(o.replication), stderr)
	admCl.Close()
	if err != nil {
		return 0, err
	}
	cfg := o.gen
	cfg.Partitions = parts
	gen, err := newGenerator(cfg)
	if err != nil {
		return 0, err
	}
	enc, err := format.NewEncoder(ctx, cfg.Format, cfg.CloudEvents, o.registryURL, cfg.Topic+"-value", cfg.MaxPayload)
	if err != nil {
		return 0, err
	}

	popts := append(baseOpts(o.brokers),
		kgo.DefaultProduceTopic(cfg.Topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), // idempotence stays on (the default)
		kgo.ProducerLinger(5*time.Millisecond),
		kgo.MaxBufferedRecords(o.maxInFlight),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), // murmur2 on the key, as Kafka
		kgo.RecordDeliveryTimeout(2*time.Minute),
	)
	cl, err := kgo.NewClient(popts...)
	if err != nil {
		return 0, fmt.Errorf("producer: %w", err)
	}
	defer cl.Close()
	ab := &aborter{opts: append(baseOpts(o.brokers),
		kgo.DefaultProduceTopic(cfg.Topic),
		kgo.TransactionalID(fmt.Sprintf("billing-gen-%016x-%d", cfg.Seed, time.Now().UnixNano())),
		kgo.TransactionTimeout(time.Minute),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
	)}
	defer ab.close()

	pctx, stopProducing := context.WithCancelCause(ctx)
	defer stopProducing(nil)
	var (
		acked      atomic.Int64
		misplaced  atomic.Int64
		mu         sync.Mutex
		firstErr   error
		perPart    = make([]atomic.Int64, parts)
		failedOnce sync.Once
	)
	fail := func(err error) {
		failedOnce.Do(func() {
			mu.Lock()
			firstErr = err
			mu.Unlock()
			stopProducing(err)
		})
	}
	prog := newProgress(o.progress, stderr, cfg.Events)
	defer prog.finish()

	var n int64
	t0 := time.Now()
	for {
		r, ok, err := gen.next()
		if err != nil {
			fail(err)
			break
		}
		if !ok {
			break
		}
		if o.rate > 0 {
			due := t0.Add(time.Duration(float64(n) / o.rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				select {
				case <-pctx.Done():
				case <-time.After(d):
				}
			}
		}
		if pctx.Err() != nil {
			break
		}
		n++
		prog.valid.Store(gen.stats.Valid)
		prog.sent.Store(n)
		value, headers, err := enc.Record(r.value)
		if err != nil {
			fail(fmt.Errorf("encoding a record as %s: %w", cfg.Format, err))
			break
		}
		kr := &kgo.Record{Topic: cfg.Topic, Key: r.key, Value: value, Headers: headers}
		if r.kind == kindAborted {
			if err := ab.add(pctx, kr); err != nil {
				fail(err)
				break
			}
			continue
		}
		want := int32(r.partition)
		cl.Produce(pctx, kr, func(rec *kgo.Record, err error) {
			if err != nil {
				fail(fmt.Errorf("produce to %s: %w", cfg.Topic, err))
				return
			}
			acked.Add(1)
			prog.acked.Add(1)
			if rec.Partition != want {
				misplaced.Add(1)
			}
			if int(rec.Partition) < len(perPart) {
				perPart[rec.Partition].Add(1)
			}
		})
	}
	// Wait for every outstanding record, whatever happened: a record is
	// either acknowledged or failed when Flush returns.
	if err := cl.Flush(context.WithoutCancel(ctx)); err != nil {
		fail(fmt.Errorf("flush: %w", err))
	}
	if pctx.Err() == nil {
		if err := ab.flush(pctx); err != nil {
			fail(err)
		}
	}
	prog.finish()
	if err := context.Cause(pctx); err != nil {
		fail(err) // no-op if an earlier failure cancelled pctx
	}
	mu.Lock()
	err = firstErr
	mu.Unlock()
	if err != nil {
		return n, err
	}
	exp := gen.expected(o.params)
	if acked.Load() != exp.Produced.Records || ab.recs != exp.Produced.Aborted || ab.txns != exp.Produced.AbortedTransactions {
		return n, fmt.Errorf("internal error: %d records acknowledged of %d, %d aborted records in %d transactions of %d in %d",
			acked.Load(), exp.Produced.Records, ab.recs, ab.txns, exp.Produced.Aborted, exp.Produced.AbortedTransactions)
	}
	if m := misplaced.Load(); m > 0 {
		// Only the cross-partition duplicate count depends on this.
		fmt.Fprintf(stderr, "billing-gen: warning: %d records landed on another partition than computed\n", m)
	}
	if err := exp.Validate(); err != nil {
		return n, fmt.Errorf("internal error: %w", err)
	}
	if err := ledgercheck.WriteFile(o.expectedPath, exp); err != nil {
		return n, err
	}

	p := exp.Produced
	counts := make([]string, parts)
	for i := range perPart {
		counts[i] = fmt.Sprint(perPart[i].Load())
	}
	fmt.Fprintf(stdout, "billing-gen: produced %d committed records to %q (%d partitions: %s) in %v\n",
		p.Records, cfg.Topic, parts, strings.Join(counts, "/"), time.Since(started).Round(time.Millisecond))
	fmt.Fprintf(stdout, "billing-gen:   %d valid events (%d late), %d duplicates (%d cross-partition), %d conflicts, %d malformed, %d overflow-case events, %d dated in the far future (each corrected); %d records in %d aborted transactions\n",
		p.Valid, p.Late, p.Duplicates, p.CrossPartitionDuplicates, p.Conflicts, p.Malformed, p.OverflowEvents, p.Future, p.Aborted, p.AbortedTransactions)
	var dl []string
	for _, r := range slices.Sorted(maps.Keys(exp.DeadLetters)) {
		dl = append(dl, fmt.Sprintf("%s=%d", r, exp.DeadLetters[r]))
	}
	fmt.Fprintf(stdout, "billing-gen: expected %d events in %d balances and %d windows; %d dead letters (%s)\n",
		exp.EventsValid, len(exp.Balances), len(exp.Windows), exp.DeadLetterTotal(), strings.Join(dl, " "))
	fmt.Fprintf(stdout, "billing-gen: wrote %s\n", o.expectedPath)
	return n, nil
}
