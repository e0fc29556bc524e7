package txsink

import (
	"context"
	"fmt"
	"time"

	"github.com/billing/ledger/internal/stmt"
)

// StartOffset is the next_offset stored for a partition never checkpointed
// before: consume it from the start of the log, so that no event written
// before the service first ran is skipped.
const StartOffset = -2

// Position is a partition's authoritative input position and the epoch at
// which this instance holds it.
type Position struct {
	Epoch      int64
	NextOffset int64 // StartOffset when the partition was never checkpointed
	Owner      string
}

// Claim takes ownership of partitions newly assigned to this instance. In
// one local transaction on the control server it creates missing rows,
// raises each partition's epoch, records this instance as owner, and reads
// the next offsets. Once Claim returns, no checkpoint built under an
// earlier epoch (by a previous owner, a zombie, or an earlier incarnation
// of this process) can commit anything for these partitions.
func (s *Sink) Claim(ctx context.Context, partitions []int32) (map[int32]Position, error) {
	if len(partitions) == 0 {
		return map[int32]Position{}, nil
	}
	tx, err := s.Control().BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	now := time.Now().UTC()
	err = s.upsertOffsets(ctx, tx, len(partitions), func(i int) []any {
		return []any{s.cfg.Group, s.cfg.Topic, partitions[i], StartOffset, s.instance, 1, now}
	}, ` ON DUPLICATE KEY UPDATE epoch = epoch + 1, owner = VALUES(owner), updated_at = VALUES(updated_at)`)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	pos, err := s.positions(ctx, tx, partitions, "")
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("claim: commit: %w", err)
	}
	return pos, nil
}

// Positions reads the stored positions of partitions with a shared lock, so
// that it waits for any decision still being committed on those rows and
// never returns a position that is about to change under a checkpoint
// already decided.
func (s *Sink) Positions(ctx context.Context, partitions []int32) (map[int32]Position, error) {
	if len(partitions) == 0 {
		return map[int32]Position{}, nil
	}
	tx, err := s.Control().BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("positions: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	return s.positions(ctx, tx, partitions, " LOCK IN SHARE MODE")
}

type queryer interface {
	SelectContext(ctx context.Context, dest any, query string, args ...any) error
}

func (s *Sink) positions(ctx context.Context, q queryer, partitions []int32, lock string) (map[int32]Position, error) {
	pos := make(map[int32]Position, len(partitions))
	err := s.controlChunks(len(partitions), s.partitionArgBytes(), func(int) int { return stmt.ArgBytes(int32(0)) }, func(start, end int) error {
		args := []any{s.cfg.Group, s.cfg.Topic}
		for _, p := range partitions[start:end] {
			args = append(args, p)
		}
		var rows []struct {
			Partition  int32  `db:"kafka_partition"`
			NextOffset int64  `db:"next_offset"`
			Epoch      int64  `db:"epoch"`
			Owner      string `db:"owner"`
		}
		err := q.SelectContext(ctx, &rows, `SELECT kafka_partition, next_offset, epoch, owner FROM partition_offsets FORCE INDEX (PRIMARY)
		WHERE consumer_group = ? AND kafka_topic = ? AND kafka_partition IN (`+placeholders(end-start)+`)`+lock, args...)
		for _, r := range rows {
			pos[r.Partition] = Position{Epoch: r.Epoch, NextOffset: r.NextOffset, Owner: r.Owner}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return pos, nil
}

// Groups lists the consumer groups that have positions stored for the
// sink's topic.
func (s *Sink) Groups(ctx context.Context) ([]string, error) {
	var groups []string
	if err := s.Control().SelectContext(ctx, &groups,
		`SELECT DISTINCT consumer_group FROM partition_offsets WHERE kafka_topic = ? ORDER BY consumer_group`, s.cfg.Topic); err != nil {
		return nil, fmt.Errorf("stored groups: %w", err)
	}
	return groups, nil
}
