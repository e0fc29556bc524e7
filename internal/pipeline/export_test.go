package pipeline

import (
	"slices"
	"time"
)

// Test-only hooks of the scenario harness (harness_test.go, package
// pipeline_test), which runs the pipeline as the service does (Run, on
// kfake and the in-memory drivers) and needs only to tell it when to
// checkpoint and to see where it stands. They compile into the tests
// alone.

// PartitionState is where one partition the instance holds stands.
type PartitionState struct {
	ID       int32
	Epoch    int64 // of this instance's claim
	Position int64 // the next offset to process (txsink.StartOffset before the first record)
	Rewind   bool  // buffered state was discarded: the position is to be reread from the store
}

// State is what the harness waits on.
type State struct {
	Partitions []PartitionState // in partition order
	// InFlight: a checkpoint runs, or finished and waits to be collected
	// by the poll loop.
	InFlight bool
	// Sealed: the barrier ran since the last ForceCheckpoint (whether or
	// not it found anything to checkpoint).
	Sealed bool
}

// State returns where the pipeline stands, under its lock.
func (p *Pipeline) State() State {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := State{InFlight: p.inflight != nil, Sealed: !p.lastSeal.IsZero()}
	for _, pt := range p.parts {
		s.Partitions = append(s.Partitions, PartitionState{ID: pt.id, Epoch: pt.epoch, Position: pt.position, Rewind: pt.rewind})
	}
	slices.SortFunc(s.Partitions, func(a, b PartitionState) int { return int(a.ID - b.ID) })
	return s
}

// ForceCheckpoint makes the barrier due at the next turn of the poll
// loop, as CheckpointInterval would (the harness runs with an interval
// of an hour, so that checkpoints happen when a scenario says).
func (p *Pipeline) ForceCheckpoint() {
	p.mu.Lock()
	p.lastSeal = time.Time{}
	p.mu.Unlock()
	p.wakePoll()
}

// DeferCheckpoint starts the checkpoint interval now: without it the first
// turn of the poll loop checkpoints whatever its first fetch brought (the
// interval has not started), before a scenario says so.
func (p *Pipeline) DeferCheckpoint() {
	p.mu.Lock()
	p.lastSeal = time.Now()
	p.mu.Unlock()
}

// Nudge ends the poll in progress, as its timeout would: the poll loop
// collects a finished checkpoint and rewinds at its next turn.
func (p *Pipeline) Nudge() { p.wakePoll() }

// Kill stops the instance for err as a failed settings check does:
// polling ends and nothing more is checkpointed; Run returns err.
func (p *Pipeline) Kill(err error) { p.fail(err) }

// AbortAfter is the age after which the recovery aborts an undecided
// checkpoint (abortAfter).
func (c *Config) AbortAfter() time.Duration { return c.abortAfter() }
