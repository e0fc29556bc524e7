package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/publisher"
)

// visibility measures, for the changelog variant, the time from a
// checkpoint's commit in MySQL (its events' ts_ms, the control server's
// clock at the decision: the same host here) to its changes being visible
// to a read_committed consumer of the account_balances topic: one sample
// per checkpoint (its first event read).
type visibility struct {
	stop func()
	mu   sync.Mutex
	ms   []float64
	seen map[int64]bool // commit_seq
}

// watchVisibility starts the consumer (nil without the changelog).
func watchVisibility(cfg config.Config) (*visibility, error) {
	if cfg.ChangelogTopicPrefix == "" {
		return nil, nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.KafkaBrokers...), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeTopics(publisher.Topic(cfg.ChangelogTopicPrefix, changelog.AccountBalances)),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AllowAutoTopicCreation(), kgo.MetadataMinAge(250*time.Millisecond))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	v := &visibility{seen: map[int64]bool{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var env struct {
			Source struct {
				CommitSeq int64 `json:"commit_seq"`
				TsMs      int64 `json:"ts_ms"`
			}
		}
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				// One sample per checkpoint: decode only its first record
				// (this consumer runs in the measured process; decoding
				// every record cost about 7 % of its CPU).
				if seq, ok := commitSeq(r.Value); ok && v.saw(seq) {
					return
				}
				if json.Unmarshal(r.Value, &env) != nil {
					return
				}
				v.mu.Lock()
				if !v.seen[env.Source.CommitSeq] {
					v.seen[env.Source.CommitSeq] = true
					v.ms = append(v.ms, float64(now.UnixMilli()-env.Source.TsMs))
				}
				v.mu.Unlock()
			})
		}
	}()
	v.stop = func() {
		cancel()
		<-done
		cl.Close()
	}
	return v, nil
}

// saw says whether a sample of checkpoint seq was taken.
func (v *visibility) saw(seq int64) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.seen[seq]
}

// commitSeq finds source.commit_seq in an event's JSON without decoding
// it (the encoder writes it once, as a plain integer).
func commitSeq(value []byte) (int64, bool) {
	const field = `"commit_seq":`
	i := bytes.LastIndex(value, []byte(field))
	if i < 0 {
		return 0, false
	}
	rest := value[i+len(field):]
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	seq, err := strconv.ParseInt(string(rest[:n]), 10, 64)
	return seq, err == nil
}

// take returns the p50 and p99 in ms and the checkpoints seen since the
// last take, and forgets them.
func (v *visibility) take() (p50, p99 float64, n int) {
	if v == nil {
		return 0, 0, 0
	}
	v.mu.Lock()
	s := v.ms
	v.ms = nil
	v.mu.Unlock()
	slices.Sort(s)
	if len(s) == 0 {
		return 0, 0, 0
	}
	at := func(q float64) float64 { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return at(0.5), at(0.99), len(s)
}

// close stops the consumer.
func (v *visibility) close() {
	if v != nil {
		v.stop()
	}
}
