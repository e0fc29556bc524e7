package bench

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/service"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// burn keeps this process's goroutines busy until it is killed: the
// background load of -load.
func burn() {
	n := 1
	if v, err := fmt.Sscan(os.Getenv("BENCH_BURN"), &n); v != 1 || err != nil {
		n = 1
	}
	for range n - 1 {
		go spin()
	}
	spin()
}

func spin() {
	var b [32]byte
	for {
		b = sha256.Sum256(b[:])
	}
}

// backgroundLoad starts a process spinning n goroutines and returns the
// function that stops it.
func backgroundLoad(n int) (func(), error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-"+ChildFlag, childBurn)
	cmd.Env = append(os.Environ(), fmt.Sprintf("BENCH_BURN=%d", n), fmt.Sprintf("GOMAXPROCS=%d", n))
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}, nil
}

// produceHostile produces the hostile variant's workload: padded valid
// events of just under MAX_PAYLOAD_BYTES and junk of 1 MiB, n records in
// all, and writes its expected ledger.
func produceHostile(ctx context.Context, o *options, adm *kadm.Client, topic, expected string) (time.Duration, error) {
	if _, err := adm.CreateTopic(ctx, int32(o.Partitions), -1, map[string]*string{"max.message.bytes": ptr("8388608")}, topic); err != nil {
		return 0, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(o.Brokers...), kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(8<<20),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	period, err := ledgercheck.NewPeriod(o.svc.BillingWindow, o.svc.BillingTimezone)
	if err != nil {
		return 0, err
	}
	l, err := ledgercheck.NewModelWith(ledgercheck.Options{Period: period, CloseAfter: time.Duration(o.svc.WindowCloseAfter), Entries: o.svc.LedgerEntries})
	if err != nil {
		return 0, err
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x686f7374))
	at := time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)
	pad := strings.Repeat("p", o.svc.MaxPayloadBytes-300)
	junk := make([]byte, 1<<20)
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var perr error
	produce := func(r *kgo.Record) {
		wg.Add(1)
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				mu.Lock()
				perr = err
				mu.Unlock()
			}
		})
	}
	for i := range o.HostileEvents {
		if i%o.HostileJunkEvery == 0 {
			for j := range junk {
				junk[j] = byte(rng.IntN(256))
			}
			produce(&kgo.Record{Key: []byte("junk"), Value: slices.Clone(junk)})
			l.DeadLetter("payload_too_large")
		}
		ev := ledgercheck.Event{EventID: fmt.Sprintf("h-%d", i), AccountID: fmt.Sprintf("acct-%d", rng.IntN(1000)),
			AmountMinor: int64(1 + rng.IntN(10000)), Currency: "EUR", OccurredAt: at.Add(time.Duration(i) * time.Second)}
		v, err := json.Marshal(map[string]any{"event_id": ev.EventID, "account_id": ev.AccountID, "amount_minor": ev.AmountMinor,
			"currency": ev.Currency, "occurred_at": ev.OccurredAt.Format(time.RFC3339), "padding": pad})
		if err != nil {
			return 0, err
		}
		produce(&kgo.Record{Key: []byte(ev.AccountID), Value: v})
		l.Add(ev)
	}
	wg.Wait()
	if perr != nil {
		return 0, perr
	}
	return time.Since(start), ledgercheck.WriteFile(expected, l.Expected())
}

func ptr[T any](v T) *T { return &v }

// decisionRates measures what the control server sustains in checkpoint
// decisions, alone: for each count of concurrent coordinators, each its own
// instance holding its own partition, every coordinator decides empty
// checkpoints back to back (the fenced decision transaction: lock the
// partition row, check the epoch, write the offset, insert the decision)
// for -decisions-duration.
func decisionRates(ctx context.Context, o *options) error {
	fmt.Printf("decision rate of the control server (%s each):\n", o.DecisionsDuration)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "coordinators\tdecisions/s\tp50\tp99\tmysql cores\t")
	for _, k := range o.Decisions {
		name := fmt.Sprintf("bench_decisions_%d_%x", k, time.Now().UnixNano()&0xffffff)
		if err := createDatabase(ctx, o.Admin, name); err != nil {
			return err
		}
		rate, p50, p99, cores, err := decisionRate(ctx, o, name, k)
		dropDatabase(o.Admin, name)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%.1f ms\t%.1f ms\t%.2f\t\n", k, rate, p50, p99, cores)
	}
	return tw.Flush()
}

func decisionRate(ctx context.Context, o *options, db string, k int) (rate, p50, p99, cores float64, err error) {
	dsn, err := databaseDSN(o.Admin, db, false)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	var sinks []*txsink.Sink
	for i := range k {
		s, d, err := mysqldriver.OpenSink(ctx, []string{dsn}, service.MySQLOptions(o.svc), service.SinkConfig(o.svc, quietLogger()))
		if err != nil {
			return 0, 0, 0, 0, err
		}
		defer d.Close()
		defer s.Close()
		if _, err := s.Claim(ctx, []int32{int32(i)}); err != nil {
			return 0, 0, 0, 0, err
		}
		sinks = append(sinks, s)
	}
	cpu := newCPUMeter(o.watch)
	deadline := time.Now().Add(o.DecisionsDuration)
	lat := make([][]float64, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i, s := range sinks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := uint64(1); time.Now().Before(deadline); n++ {
				t := time.Now()
				tx := s.Begin(n)
				if err := tx.Decide(ctx, []txsink.PartitionCut{{Partition: int32(i), Epoch: 1, NextOffset: int64(n)}}, nil, nil); err != nil {
					errs[i] = err
					return
				}
				lat[i] = append(lat[i], ms(time.Since(t)))
			}
		}()
	}
	wg.Wait()
	var all []float64
	for i := range sinks {
		if errs[i] != nil {
			return 0, 0, 0, 0, errs[i]
		}
		all = append(all, lat[i]...)
	}
	slices.Sort(all)
	return float64(len(all)) / o.DecisionsDuration.Seconds(), quantile(all, 0.5), quantile(all, 0.99), cpu.cores()["mysql"], nil
}
