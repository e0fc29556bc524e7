package metrics

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/billing/ledger/internal/ledgerstatus"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Sampler refreshes the values that need Kafka or MySQL round trips
// (consumer lag, dead letters waiting, branches in doubt, dedup table
// size) every Interval, each round bounded by Timeout, so that scrapes
// never wait on a remote system. The quantities are computed by
// internal/ledgerstatus, as `billing status` computes them.
type Sampler struct {
	// Kafka lists the topic's offsets (kadm over the pipeline's client).
	Kafka *kadm.Client
	// View reads the ledger's control tables and prepared branches, and
	// Letters the dead letters waiting on each server, as `billing status`
	// reads them.
	View    driver.View
	Letters ledgerstatus.Letters
	// Servers are the servers' own counters, the control server first
	// (the purge history, the dedup_keys estimate); nil samples neither.
	Servers      []Stats
	Topic, Group string
	// Owner is this instance's id (txsink.Sink.Instance): lag and dead
	// letters are reported for the partitions it owns, so that the
	// instances of a group never report a partition twice.
	Owner    string
	Interval time.Duration
	Timeout  time.Duration
	Logger   *slog.Logger
	// Now is the clock (tests); time.Now by default.
	Now func() time.Time

	noPurge map[int]bool // servers where the account may not read the purge history
}

// Run samples until ctx ends.
func (s *Sampler) Run(ctx context.Context, m *Metrics) {
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		s.Sample(ctx, m)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sample takes one round of samples into m.
func (s *Sampler) Sample(ctx context.Context, m *Metrics) {
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	if s.View == nil || s.View.Servers() == 0 {
		return
	}
	owned, err := s.owned(ctx)
	if err != nil {
		m.SampleFailed(SampleLag)
		m.SampleFailed(SampleDeadLetters)
		s.log().Debug("sampling the owned partitions failed", "err", err)
	} else {
		if s.Kafka != nil {
			if lag, err := s.lag(ctx, owned); err != nil {
				m.SampleFailed(SampleLag)
				s.log().Debug("sampling consumer lag failed", "err", err)
			} else {
				m.SetLag(lag)
			}
		}
		// Non-nil even when empty: a standby counts nothing (nil would
		// mean every partition).
		parts := append([]int32{}, slices.Sorted(maps.Keys(owned))...)
		if counts, err := s.deadLetters(ctx, parts); err != nil {
			m.SampleFailed(SampleDeadLetters)
			s.log().Debug("sampling dead letters failed", "err", err)
		} else {
			m.SetDeadLettersWaiting(counts)
		}
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	switch cl, err := ledgerstatus.CommitLogOf(ctx, s.View); {
	case err != nil:
		m.SampleFailed(SampleCommitLog)
		s.log().Debug("sampling the commit log failed", "err", err)
	case cl != nil:
		m.SetCommitLog(cl.Unapplied, time.Duration(cl.OldestUnappliedSeconds*float64(time.Second)))
	}
	ledger, err := ledgerstatus.Identity(ctx, s.View)
	if err != nil {
		m.SampleFailed(SampleInDoubt)
		s.log().Debug("reading the ledger's identity failed", "err", err)
	}
	for i := range s.View.Servers() {
		branches, err := ledgerstatus.InDoubt(ctx, s.View, i, ledger)
		if err != nil {
			m.SampleFailed(SampleInDoubt)
			s.log().Debug("sampling branches in doubt failed", "server", i, "err", err)
		} else {
			var oldest time.Duration
			n, foreign := 0, 0
			for _, b := range branches {
				if !b.Mine() {
					foreign++ // another ledger's, on a shared server
					continue
				}
				n++
				if !b.Created.IsZero() {
					oldest = max(oldest, now().Sub(b.Created))
				}
			}
			m.SetInDoubt(i, n, oldest)
			m.SetForeignInDoubt(i, foreign)
		}
	}
	for i, srv := range s.Servers {
		if !s.noPurge[i] {
			switch h, err := srv.PurgeHistory(ctx); {
			case mysqldriver.NeedsProcess(err):
				// Optional: said once, not counted as a failure.
				if s.noPurge == nil {
					s.noPurge = map[int]bool{}
				}
				s.noPurge[i] = true
				s.log().Info("the account lacks PROCESS: billing_mysql_purge_history_length is not sampled", "server", i)
			case err != nil:
				m.SampleFailed(SamplePurge)
				s.log().Debug("sampling the purge history failed", "server", i, "err", err)
			default:
				m.SetPurgeHistory(i, h)
			}
		}
		n, err := srv.DedupRows(ctx)
		if err != nil {
			m.SampleFailed(SampleDedupKeys)
			s.log().Debug("sampling dedup_keys size failed", "server", i, "err", err)
			continue
		}
		m.SetDedupRows(i, n)
	}
}

func (s *Sampler) log() *slog.Logger {
	if s.Logger == nil {
		return slog.Default()
	}
	return s.Logger
}

// owned returns the stored next offsets of the partitions this instance
// owns in MySQL.
func (s *Sampler) owned(ctx context.Context) (map[int32]int64, error) {
	stored, err := ledgerstatus.Positions(ctx, s.View, s.Group, s.Topic)
	if err != nil {
		return nil, err
	}
	pos := map[int32]int64{}
	for p, st := range stored {
		if st.Owner == s.Owner {
			pos[p] = st.NextOffset
		}
	}
	return pos, nil
}

// lag is ledgerstatus.Lag of each owned partition.
func (s *Sampler) lag(ctx context.Context, pos map[int32]int64) (map[int32]int64, error) {
	if len(pos) == 0 {
		return map[int32]int64{}, nil
	}
	ends, err := s.Kafka.ListCommittedOffsets(ctx, s.Topic)
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	var starts kadm.ListedOffsets
	for _, next := range pos {
		if next == txsink.StartOffset {
			if starts, err = s.Kafka.ListStartOffsets(ctx, s.Topic); err != nil {
				return nil, fmt.Errorf("list start offsets: %w", err)
			}
			break
		}
	}
	return ledgerstatus.LagOf(s.Topic, pos, ends, starts)
}

// deadLetters counts the dead letters not re-injected of the owned
// partitions on every server (each server holds those of the accounts it
// hosts), by reason.
func (s *Sampler) deadLetters(ctx context.Context, partitions []int32) (map[string]int64, error) {
	counts := map[string]int64{}
	for i := range s.View.Servers() {
		w, err := s.Letters.Waiting(ctx, i, s.Topic, partitions)
		if err != nil {
			return nil, fmt.Errorf("server %d: %w", i, err)
		}
		for _, r := range w {
			counts[r.Reason] += r.Count
		}
	}
	return counts, nil
}

// Stats is what the sampler reads of one server besides the ledger's
// view: its own counters (mysqldriver's and memdriver's Server).
type Stats interface {
	// PurgeHistory is the undo history not yet purged (needing PROCESS:
	// mysqldriver.NeedsProcess).
	PurgeHistory(ctx context.Context) (int64, error)
	// DedupRows estimates the rows of every generation's key table.
	DedupRows(ctx context.Context) (int64, error)
}

// PurgeHistory returns the undo history not yet purged of the server db
// is a pool of (mysqldriver.PurgeHistory), for the tools that hold a pool
// rather than a driver's server.
func PurgeHistory(ctx context.Context, db *sql.DB) (int64, error) {
	return mysqldriver.PurgeHistory(ctx, db)
}
