package txsink

import (
	"context"
	"fmt"
)

// Position is a partition's authoritative input position and the epoch at
// which this instance holds it.
type Position struct {
	Epoch      int64
	NextOffset int64 // StartOffset when the partition was never checkpointed
	Owner      string
}

// Claim takes ownership of partitions newly assigned to this instance: in
// one local transaction on the control server, each partition's epoch is
// raised and this instance recorded as owner, and the next offsets are
// read. Once Claim returns, no checkpoint built under an earlier epoch (by
// a previous owner, a zombie, or an earlier incarnation of this process)
// can commit anything for these partitions (see fence).
func (s *Sink) Claim(ctx context.Context, partitions []int32) (map[int32]Position, error) {
	if len(partitions) == 0 {
		return map[int32]Position{}, nil
	}
	stored, err := s.control.Claim(ctx, s.scope(), s.instance, partitions, s.now().UTC())
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	return positions(stored), nil
}

// Positions reads the stored positions of partitions, waiting for any
// decision still being committed on those rows, so that it never returns a
// position that is about to change under a checkpoint already decided.
func (s *Sink) Positions(ctx context.Context, partitions []int32) (map[int32]Position, error) {
	if len(partitions) == 0 {
		return map[int32]Position{}, nil
	}
	stored, err := s.control.Positions(ctx, s.scope(), partitions)
	if err != nil {
		return nil, fmt.Errorf("positions: %w", err)
	}
	return positions(stored), nil
}

// Groups lists the consumer groups that have positions stored for the
// sink's topic.
func (s *Sink) Groups(ctx context.Context) ([]string, error) {
	g, err := s.control.Groups(ctx, s.cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("stored groups: %w", err)
	}
	return g, nil
}
