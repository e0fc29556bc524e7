package txsink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

type outcome string

const (
	outcomeCommit outcome = "commit"
	outcomeAbort  outcome = "abort"
)

// PartitionCut is where a checkpoint cuts one partition: every record below
// NextOffset is covered, and the cut is only valid while the partition is
// still held at Epoch.
type PartitionCut struct {
	Partition  int32
	Epoch      int64
	NextOffset int64
}

// Decide is the commit point. In one local transaction on the control
// server it locks the checkpoint's partition rows, checks that this
// instance still owns every one at the epoch the checkpoint was built under
// (fencing), writes the new next offsets, and inserts the commit decision.
// The decision row's primary key makes it a compare-and-set: if a recoverer
// inserted an abort first, Decide fails with ErrAborted.
//
// Decide returns nil only once the decision is durable. It returns an error
// wrapping ErrFenced or ErrAborted when the checkpoint must abort, and one
// wrapping ErrOutcomeUnknown when the commit of the local transaction was
// ambiguous and the outcome could not be settled in time.
func (t *Txn) Decide(ctx context.Context, cuts []PartitionCut) error {
	if err := t.s.cfg.Failpoints.Inject(FailAfterPrepare); err != nil {
		return &PhaseError{"decide", err}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.s.cfg.StepTimeout)
	defer cancel()
	err := t.decideCommit(ctx, cuts)
	var amb *ambiguousError
	if errors.As(err, &amb) {
		// The COMMIT may or may not have landed. Compare-and-set an
		// abort: it waits for the first transaction's locks, then tells
		// which one won.
		t.s.log.Warn("ambiguous decision, settling it", "gtrid", t.gtrid, "err", err)
		o, err2 := t.s.decide(ctx, t.gtrid, outcomeAbort)
		switch {
		case err2 != nil:
			return &PhaseError{"decide", fmt.Errorf("%w: %w (then %w)", ErrOutcomeUnknown, amb.err, err2)}
		case o == outcomeCommit:
			err = nil
		default:
			return &PhaseError{"decide", fmt.Errorf("%w: decided abort after ambiguous commit", ErrAborted)}
		}
	}
	if err != nil {
		return &PhaseError{"decide", err}
	}
	t.decided = true
	return t.s.cfg.Failpoints.Inject(FailAfterDecision)
}

type ambiguousError struct{ err error }

func (e *ambiguousError) Error() string {
	return "commit of the decision is ambiguous: " + e.err.Error()
}

func (t *Txn) decideCommit(ctx context.Context, cuts []PartitionCut) (err error) {
	s := t.s
	tx, err := s.Control().BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if len(cuts) > 0 {
		if err := s.checkFence(ctx, tx, cuts); err != nil {
			return err
		}
		if err := s.writeOffsets(ctx, tx, cuts); err != nil {
			return err
		}
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO checkpoint_decisions (gtrid, outcome, decided_by, decided_at) VALUES (?, ?, ?, ?)`,
		t.gtrid, string(outcomeCommit), s.instance, time.Now().UTC())
	if IsDuplicateKey(err) {
		return fmt.Errorf("%w: a recoverer decided first", ErrAborted)
	}
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return &ambiguousError{err}
	}
	return nil
}

func (s *Sink) checkFence(ctx context.Context, tx *sqlx.Tx, cuts []PartitionCut) error {
	args := []any{s.cfg.Group, s.cfg.Topic}
	for _, c := range cuts {
		args = append(args, c.Partition)
	}
	q := `SELECT kafka_partition, epoch, owner FROM partition_offsets FORCE INDEX (PRIMARY)
		WHERE consumer_group = ? AND kafka_topic = ? AND kafka_partition IN (` + placeholders(len(cuts)) + `) FOR UPDATE`
	var rows []struct {
		Partition int32  `db:"kafka_partition"`
		Epoch     int64  `db:"epoch"`
		Owner     string `db:"owner"`
	}
	if err := tx.SelectContext(ctx, &rows, q, args...); err != nil {
		return err
	}
	stored := make(map[int32]int, len(rows))
	for i, r := range rows {
		stored[r.Partition] = i
	}
	for _, c := range cuts {
		i, ok := stored[c.Partition]
		if !ok {
			return &FencedError{Partition: c.Partition, HeldEpoch: c.Epoch}
		}
		if r := rows[i]; r.Epoch != c.Epoch || r.Owner != s.instance {
			return &FencedError{Partition: c.Partition, HeldEpoch: c.Epoch, StoredEpoch: r.Epoch, StoredOwner: r.Owner}
		}
	}
	return nil
}

func (s *Sink) writeOffsets(ctx context.Context, tx *sqlx.Tx, cuts []PartitionCut) error {
	now := time.Now().UTC()
	var b strings.Builder
	b.WriteString(`INSERT INTO partition_offsets (consumer_group, kafka_topic, kafka_partition, next_offset, owner, epoch, updated_at) VALUES `)
	args := make([]any, 0, 7*len(cuts))
	for i, c := range cuts {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,?,?)")
		args = append(args, s.cfg.Group, s.cfg.Topic, c.Partition, c.NextOffset, s.instance, c.Epoch, now)
	}
	b.WriteString(` ON DUPLICATE KEY UPDATE next_offset = VALUES(next_offset), updated_at = VALUES(updated_at)`)
	_, err := tx.ExecContext(ctx, b.String(), args...)
	return err
}

// decide inserts a decision for gtrid unless one exists, and returns the
// decision that holds: its own if the insert won, the existing one
// otherwise. Lock waits (another transaction deciding the same gtrid) are
// retried until ctx ends.
func (s *Sink) decide(ctx context.Context, gtrid string, want outcome) (outcome, error) {
	for {
		_, err := s.Control().ExecContext(ctx, `INSERT INTO checkpoint_decisions (gtrid, outcome, decided_by, decided_at) VALUES (?, ?, ?, ?)`,
			gtrid, string(want), s.instance, time.Now().UTC())
		if err == nil {
			return want, nil
		}
		if IsDuplicateKey(err) {
			o, found, err := s.lookupDecision(ctx, gtrid)
			if err != nil {
				return "", err
			}
			if found {
				return o, nil
			}
			continue // deleted in between by housekeeping: insert again
		}
		if !IsLockConflict(err) || ctx.Err() != nil {
			return "", fmt.Errorf("decide %s %s: %w", want, gtrid, err)
		}
	}
}

func (s *Sink) lookupDecision(ctx context.Context, gtrid string) (outcome, bool, error) {
	var o []string
	if err := s.Control().SelectContext(ctx, &o, `SELECT outcome FROM checkpoint_decisions WHERE gtrid = ?`, gtrid); err != nil {
		return "", false, fmt.Errorf("look up decision %s: %w", gtrid, err)
	}
	if len(o) == 0 {
		return "", false, nil
	}
	return outcome(o[0]), true, nil
}

func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?,", n-1) + "?"
}
