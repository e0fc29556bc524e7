package integration_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// aborter produces records inside Kafka transactions that it always aborts,
// interleaved with the generator's committed records, for the whole
// production. A read_committed consumer must never see them: their events
// carry huge amounts and ids of their own, so one counted event shows in the
// verifier as an extra event and a wildly wrong balance, and an aborted
// malformed record would show as an extra dead letter.
//
// The suite runs billing-gen with -aborted-ratio 0 and produces the aborted
// transactions here instead: billing-gen treats a failed EndTxn as fatal
// (its run has no expected ledger then), and a broker restart at the wrong
// moment makes EndTxn fail. Here an abort is simply retried, and since
// nothing here ever commits, a transaction whose end is uncertain is
// aborted by the broker's transaction timeout at the latest: whatever
// happens, none of these records can become visible.
type aborter struct {
	brokers  []string
	topic    string
	every    time.Duration
	rng      *rand.Rand
	txns     atomic.Int64 // transactions ended by an abort
	records  atomic.Int64 // records produced in them
	retries  atomic.Int64 // failed produce or abort attempts, retried
	restarts atomic.Int64 // transactional clients replaced
}

const abortBatch = 5

func newAborter(brokers []string, topic string, every time.Duration, seed uint64) *aborter {
	return &aborter{brokers: brokers, topic: topic, every: every, rng: rand.New(rand.NewPCG(seed, 0xab0)) /* own stream */}
}

func (a *aborter) client() (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers(a.brokers...),
		kgo.DefaultProduceTopic(a.topic),
		kgo.TransactionalID("chaos-aborter-"+a.topic),
		kgo.TransactionTimeout(time.Minute),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.RecordDeliveryTimeout(20*time.Second),
		kgo.RetryTimeout(20*time.Second))
}

// run produces an aborted transaction every a.every until ctx ends, then
// makes sure the last one is aborted (bounded by a minute).
func (a *aborter) run(ctx context.Context) error {
	cl, err := a.client()
	if err != nil {
		return fmt.Errorf("aborter: %w", err)
	}
	defer func() { cl.Close() }() // the last client, whichever it is
	n := 0
	tick := time.NewTicker(a.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		recs := make([]*kgo.Record, abortBatch)
		for i := range recs {
			n++
			acct := fmt.Sprintf("acct-%06d", a.rng.IntN(1000))
			value := fmt.Appendf(nil, `{"event_id":"aborted-%s-%d","account_id":%q,"amount_minor":1000000000000000,"currency":"EUR","occurred_at":"2026-11-28T12:00:00Z"}`, a.topic, n, acct)
			if n%4 == 0 {
				value = []byte(`{"event_id":"aborted-malformed`) // never dead-lettered either
			}
			recs[i] = &kgo.Record{Key: []byte(acct), Value: value}
		}
		if err := cl.BeginTransaction(); err != nil {
			// The previous end is uncertain: replace the client, whose
			// InitProducerID fences (and aborts) what is left of it.
			a.retries.Add(1)
			cl = a.replace(cl)
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		perr := cl.ProduceSync(pctx, recs...).FirstErr()
		cancel()
		if perr != nil {
			a.retries.Add(1)
		}
		if a.abort(ctx, cl) {
			a.txns.Add(1)
			if perr == nil {
				a.records.Add(abortBatch)
			}
		} else {
			cl = a.replace(cl)
		}
	}
}

// abort ends the transaction with an abort, retrying through broker
// restarts for up to a minute (detached from ctx, so that the last
// transaction is ended too).
func (a *aborter) abort(ctx context.Context, cl *kgo.Client) bool {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for {
		if err := cl.EndTransaction(actx, kgo.TryAbort); err == nil {
			return true
		}
		a.retries.Add(1)
		select {
		case <-actx.Done():
			return false
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// replace closes cl and opens a new transactional client with the same
// id, whose InitProducerID fences (and aborts) whatever the old one left.
// The options are those that already built a client, so building one
// again cannot fail.
func (a *aborter) replace(cl *kgo.Client) *kgo.Client {
	cl.Close()
	a.restarts.Add(1)
	next, err := a.client()
	if err != nil {
		panic(fmt.Sprintf("aborter: options that worked before fail: %v", err))
	}
	return next
}
