package txsink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/stmt"
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
	type storedRow struct {
		Partition int32  `db:"kafka_partition"`
		Epoch     int64  `db:"epoch"`
		Owner     string `db:"owner"`
	}
	var rows []storedRow
	err := s.controlChunks(len(cuts), s.partitionArgBytes(), func(int) int { return stmt.ArgBytes(int32(0)) }, func(start, end int) error {
		args := []any{s.cfg.Group, s.cfg.Topic}
		for _, c := range cuts[start:end] {
			args = append(args, c.Partition)
		}
		q := `SELECT kafka_partition, epoch, owner FROM partition_offsets FORCE INDEX (PRIMARY)
		WHERE consumer_group = ? AND kafka_topic = ? AND kafka_partition IN (` + placeholders(end-start) + `) FOR UPDATE`
		var part []storedRow
		if err := tx.SelectContext(ctx, &part, q, args...); err != nil {
			return err
		}
		rows = append(rows, part...)
		return nil
	})
	if err != nil {
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
	return s.upsertOffsets(ctx, tx, len(cuts), func(i int) []any {
		c := cuts[i]
		return []any{s.cfg.Group, s.cfg.Topic, c.Partition, c.NextOffset, s.instance, c.Epoch, now}
	}, ` ON DUPLICATE KEY UPDATE next_offset = VALUES(next_offset), updated_at = VALUES(updated_at)`)
}

// upsertOffsets writes n partition_offsets rows, args(i) giving each row's
// values in column order, with the given ON DUPLICATE KEY clause; in as
// many statements as the control server's budget needs.
func (s *Sink) upsertOffsets(ctx context.Context, tx *sqlx.Tx, n int, args func(i int) []any, onDup string) error {
	const head = `INSERT INTO partition_offsets (consumer_group, kafka_topic, kafka_partition, next_offset, owner, epoch, updated_at) VALUES `
	const tuple = "(?,?,?,?,?,?,?)"
	return s.controlChunks(n, len(head)+len(onDup), func(i int) int { return stmt.RowBytes(tuple, args(i)...) }, func(start, end int) error {
		var b strings.Builder
		b.WriteString(head)
		all := make([]any, 0, 7*(end-start))
		for i := start; i < end; i++ {
			if i > start {
				b.WriteByte(',')
			}
			b.WriteString(tuple)
			all = append(all, args(i)...)
		}
		b.WriteString(onDup)
		_, err := tx.ExecContext(ctx, b.String(), all...)
		return err
	})
}

// controlChunks is stmt.Split on the control server's budget.
func (s *Sink) controlChunks(n, fixed int, rowBytes func(int) int, fn func(start, end int) error) error {
	return stmt.Split(n, fixed, int(s.servers[0].budget.Load()), rowBytes, fn)
}

// partitionArgBytes bounds the text of a statement on partition_offsets
// besides its rows: the query and the group and topic arguments.
func (s *Sink) partitionArgBytes() int {
	return 512 + stmt.ArgBytes(s.cfg.Group) + stmt.ArgBytes(s.cfg.Topic)
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
