package pipeline

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// BenchmarkLockOrder is what the one lock order costs a checkpoint beside
// other instances (seeds participant after participant, the sums of the
// participants from the last seeded one's on in turn) against the same
// checkpoint alone (seeds and writes of every participant at once), on the
// two MariaDB servers (MYSQL_DSN, MYSQL2_DSN) with two branches each: four
// participants. Alone and beside others alternate checkpoint by
// checkpoint on one ledger, so that both meet the same load of the shared
// machine. "careful": amounts in [-5, 10], most accounts' running sums go
// down and up (risky, seeded); "plain": positive amounts, nothing seeded.
// It reports the median of each mode's checkpoints, and of their
// aggregate (seed) and write phases.
//
//	MYSQL_DSN=… MYSQL2_DSN=… go test -run '^$' -bench BenchmarkLockOrder -benchtime 8x ./internal/pipeline/
func BenchmarkLockOrder(b *testing.B) {
	for _, v := range []struct {
		name     string
		min, max int64
	}{{"careful", -5, 10}, {"plain", 1, 10}} {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			var dsns []string
			for _, admin := range []string{testenv.MySQL(b), testenv.MySQL2(b)} {
				dsn, _ := testenv.LedgerDBOn(b, admin, testenv.RandomName("t_"))
				dsns = append(dsns, dsn)
			}
			sink, d, err := mysqldriver.OpenSink(ctx, dsns, mysqldriver.Options{LockWaitTimeout: 5 * time.Second},
				txsink.Config{Branches: 2, Group: "g", Topic: "billing", StepTimeout: time.Minute, Logger: testenv.Logger()})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { sink.Close(); d.Close() })
			m := &memLedger{sink: sink}
			cfg := memConfig(m)
			cfg.CheckpointTimeout, cfg.CheckpointMaxRecords = time.Minute, 1<<20
			if m.ck, err = NewCheckpointer(cfg, sink, d.Stores()); err != nil {
				b.Fatal(err)
			}
			pos, err := sink.Claim(ctx, []int32{0})
			if err != nil {
				b.Fatal(err)
			}
			const events, accounts = 20000, 4000
			rnd := rand.New(rand.NewPCG(4, 5))
			var offset int64
			run := func(shared bool, amount func() int64) CheckpointInfo {
				m.ck.alone.Store(!shared)
				recs := make([]Record, events)
				for i := range recs {
					recs[i] = event1(fmt.Sprintf("e-%d", offset), fmt.Sprintf("acct-%05d", rnd.IntN(accounts)), amount(), 0, rnd.IntN(120))
					recs[i].Offset = offset
					offset++
				}
				n := len(m.attempts())
				ok, err := m.ck.Checkpoint(ctx, recs, []txsink.PartitionCut{{Partition: 0, Epoch: pos[0].Epoch, NextOffset: offset}})
				if !ok || err != nil {
					b.Fatalf("checkpoint: decided %v, %v", ok, err)
				}
				infos := m.attempts()[n:]
				for _, info := range infos {
					if info.Err != nil {
						b.Fatalf("an attempt failed in %s: %v", info.FailedPhase, info.Err)
					}
				}
				return infos[len(infos)-1]
			}
			// Every account's rows exist (their windows too), as in a
			// ledger that runs.
			run(false, func() int64 { return 1 })
			var took [2][3][]time.Duration // alone, shared; checkpoint, aggregate, write
			b.ResetTimer()
			for i := range b.N {
				for j := range 2 {
					shared := (i+j)%2 == 1 // alternate which runs first
					info := run(shared, func() int64 { return v.min + rnd.Int64N(v.max-v.min+1) })
					k := b2i(shared)
					took[k][0] = append(took[k][0], info.Duration)
					took[k][1] = append(took[k][1], info.Phases["aggregate"])
					took[k][2] = append(took[k][2], info.Phases["write"])
				}
			}
			b.StopTimer()
			median := func(ds []time.Duration) float64 {
				slices.Sort(ds)
				return float64(ds[len(ds)/2]) / float64(time.Millisecond)
			}
			for k, mode := range []string{"alone", "shared"} {
				b.ReportMetric(median(took[k][0]), "ms/ckpt-"+mode)
				b.ReportMetric(median(took[k][1]), "ms/aggregate-"+mode)
				b.ReportMetric(median(took[k][2]), "ms/write-"+mode)
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}
