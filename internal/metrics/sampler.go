package metrics

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// startOffset is txsink.StartOffset: the stored position of a partition
// never checkpointed (consumed from the start of the log).
const startOffset = -2

// Sampler refreshes the values that need Kafka or MySQL round trips
// (consumer lag, dedup table size) every Interval, each round bounded by
// Timeout, so that scrapes never wait on a remote system.
type Sampler struct {
	// Kafka lists the topic's offsets (kadm over the pipeline's client).
	Kafka *kadm.Client
	// Control is the control server, holding partition_offsets.
	Control *sql.DB
	// Servers are every server (control first), for dedup_keys estimates.
	Servers      []*sql.DB
	Topic, Group string
	// Owner is this instance's id (txsink.Sink.Instance): lag is reported
	// for the partitions it owns, so that the instances of a group never
	// report a partition twice.
	Owner    string
	Interval time.Duration
	Timeout  time.Duration
	Logger   *slog.Logger
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
	if s.Kafka != nil && s.Control != nil {
		lag, err := s.Lag(ctx)
		if err != nil {
			m.SampleFailed("lag")
			s.log().Debug("sampling consumer lag failed", "err", err)
		} else {
			m.SetLag(lag)
		}
	}
	for i, db := range s.Servers {
		n, err := DedupRows(ctx, db)
		if err != nil {
			m.SampleFailed("dedup_keys")
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

// Lag computes, for each partition this instance owns in MySQL, the last
// stable offset (what a read_committed consumer can reach) minus the next
// offset stored in partition_offsets. A partition never checkpointed counts
// from the start of the log.
func (s *Sampler) Lag(ctx context.Context) (map[int32]int64, error) {
	pos, err := Positions(ctx, s.Control, s.Group, s.Topic, s.Owner)
	if err != nil {
		return nil, err
	}
	if len(pos) == 0 {
		return map[int32]int64{}, nil
	}
	ends, err := s.Kafka.ListCommittedOffsets(ctx, s.Topic)
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	var starts kadm.ListedOffsets
	for _, next := range pos {
		if next == startOffset {
			if starts, err = s.Kafka.ListStartOffsets(ctx, s.Topic); err != nil {
				return nil, fmt.Errorf("list start offsets: %w", err)
			}
			break
		}
	}
	return computeLag(s.Topic, pos, ends, starts)
}

// computeLag is Lag's arithmetic: end - next, or end - log start for a
// partition never checkpointed; never negative.
func computeLag(topic string, pos map[int32]int64, ends, starts kadm.ListedOffsets) (map[int32]int64, error) {
	lag := make(map[int32]int64, len(pos))
	var errs []error
	for p, next := range pos {
		end, ok := ends.Lookup(topic, p)
		if !ok || end.Err != nil {
			errs = append(errs, fmt.Errorf("partition %d: no end offset (%v)", p, end.Err))
			continue
		}
		if next == startOffset {
			st, ok := starts.Lookup(topic, p)
			if !ok || st.Err != nil {
				errs = append(errs, fmt.Errorf("partition %d: no start offset (%v)", p, st.Err))
				continue
			}
			next = st.Offset
		}
		lag[p] = max(end.Offset-next, 0)
	}
	return lag, errors.Join(errs...)
}

// Positions reads the next offsets stored in partition_offsets for the
// partitions owned by owner (all partitions when owner is empty).
func Positions(ctx context.Context, db *sql.DB, group, topic, owner string) (map[int32]int64, error) {
	q := `SELECT kafka_partition, next_offset FROM partition_offsets WHERE consumer_group = ? AND kafka_topic = ?`
	args := []any{group, topic}
	if owner != "" {
		q += ` AND owner = ?`
		args = append(args, owner)
	}
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("read partition_offsets: %w", err)
	}
	defer rows.Close()
	pos := map[int32]int64{}
	for rows.Next() {
		var p int32
		var next int64
		if err := rows.Scan(&p, &next); err != nil {
			return nil, fmt.Errorf("read partition_offsets: %w", err)
		}
		pos[p] = next
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read partition_offsets: %w", err)
	}
	return pos, nil
}

// DedupRows returns InnoDB's estimate of the rows in dedup_keys of the
// connection's database (information_schema.TABLES.TABLE_ROWS: cheap, no
// scan, approximate).
func DedupRows(ctx context.Context, db *sql.DB) (int64, error) {
	var n sql.NullInt64
	err := db.QueryRowContext(ctx, `SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'dedup_keys'`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("dedup_keys size: %w", err)
	}
	return n.Int64, nil
}
