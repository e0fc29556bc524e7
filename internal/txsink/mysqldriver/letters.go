package mysqldriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The operator's statements on dead_letters (see driver/letters.go): the
// tools' list, show and re-injection audit, and the count of the letters
// waiting. Each runs alone on the server's pool.

// Letters is dead_letters on one server's pool.
type Letters struct{ db *sqlx.DB }

// Letters is the server's dead_letters, on its pool.
func (s *Server) Letters() Letters { return Letters{s.db} }

// NewLetters returns the dead letters of the server db is a pool of.
func NewLetters(db *sqlx.DB) Letters { return Letters{db} }

const letterColumns = `id, kafka_topic, kafka_partition, kafka_offset, reason, detail, event_id, record_key,
	payload, payload_size, payload_sha256, checkpoint_id, created_at, reinjected_at, reinjected_by, reinjected_forced,
	reinjected_partition, reinjected_offset, reinjected_sha256`

// letterSummaryColumns are List's: everything but the payload and the key.
const letterSummaryColumns = `id, kafka_topic, kafka_partition, kafka_offset, reason, detail, event_id, payload_size, payload_sha256,
	checkpoint_id, created_at, reinjected_at, reinjected_by, reinjected_forced, reinjected_partition, reinjected_offset, reinjected_sha256`

// List returns the server's dead letters, newest first (by created_at,
// then id), without their payloads and keys.
func (l Letters) List(ctx context.Context, f driver.LetterFilter) ([]driver.DeadLetterRecord, error) {
	q := `SELECT ` + letterSummaryColumns + ` FROM dead_letters WHERE 1=1`
	var args []any
	if f.Reason != "" {
		q += ` AND reason = ?`
		args = append(args, f.Reason)
	}
	if f.Pending {
		q += ` AND reinjected_at IS NULL`
	}
	q += ` ORDER BY created_at DESC, id DESC LIMIT ?`
	args = append(args, f.Limit)
	var rows []driver.DeadLetterRecord
	if err := l.db.SelectContext(ctx, &rows, q, args...); err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	for i := range rows {
		rows[i].CreatedAt = rows[i].CreatedAt.UTC()
	}
	return rows, nil
}

// Get reads one dead letter by its id (driver.ErrNoDeadLetter when there
// is none).
func (l Letters) Get(ctx context.Context, id int64) (*driver.DeadLetterRecord, error) {
	var r driver.DeadLetterRecord
	err := l.db.GetContext(ctx, &r, `SELECT `+letterColumns+` FROM dead_letters WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, driver.ErrNoDeadLetter
	}
	if err != nil {
		return nil, fmt.Errorf("read dead letter %d: %w", id, err)
	}
	r.CreatedAt = r.CreatedAt.UTC()
	return &r, nil
}

// Mark records a re-injection about to happen, atomically: only if the row
// is still as the caller read it (its last re-injection, or none), so that
// of two concurrent re-injections only one proceeds. It reports whether it
// marked the row.
func (l Letters) Mark(ctx context.Context, r *driver.DeadLetterRecord, a driver.LetterAudit) (bool, error) {
	q := `UPDATE dead_letters SET reinjected_at = ?, reinjected_by = ?, reinjected_forced = ?, reinjected_sha256 = ?,
		reinjected_partition = NULL, reinjected_offset = NULL WHERE id = ? AND `
	args := []any{a.At, a.By, a.Forced, a.SHA256, r.ID}
	if r.ReinjectedAt.Valid {
		q += `reinjected_at = ?`
		args = append(args, r.ReinjectedAt.Time)
	} else {
		q += `reinjected_at IS NULL`
	}
	res, err := l.db.ExecContext(ctx, q, args...)
	if err != nil {
		return false, fmt.Errorf("mark dead letter %d: %w", r.ID, err)
	}
	n, err := res.RowsAffected()
	return err == nil && n == 1, err
}

// Restore puts back the re-injection columns of r as they were read, if
// the row still holds the mark made at: the produce after Mark failed.
func (l Letters) Restore(ctx context.Context, r *driver.DeadLetterRecord, at time.Time) error {
	_, err := l.db.ExecContext(ctx, `UPDATE dead_letters SET reinjected_at = ?, reinjected_by = ?, reinjected_forced = ?, reinjected_sha256 = ?,
		reinjected_partition = ?, reinjected_offset = ? WHERE id = ? AND reinjected_at = ?`,
		r.ReinjectedAt, r.ReinjectedBy, r.ReinjectedForced, r.ReinjectedSHA256, r.ReinjectedPartition, r.ReinjectedOffset, r.ID, at)
	if err != nil {
		return fmt.Errorf("restore dead letter %d: %w", r.ID, err)
	}
	return nil
}

// Landed records where the re-injected record was written, if the row
// still holds the mark made at.
func (l Letters) Landed(ctx context.Context, id int64, at time.Time, partition int32, offset int64) error {
	_, err := l.db.ExecContext(ctx, `UPDATE dead_letters SET reinjected_partition = ?, reinjected_offset = ? WHERE id = ? AND reinjected_at = ?`,
		partition, offset, id, at)
	if err != nil {
		return fmt.Errorf("record where dead letter %d landed: %w", id, err)
	}
	return nil
}

// Waiting counts the dead letters of topic not re-injected, by reason in
// reason order. With partitions non-nil only those partitions count (the
// metrics sampler counts the partitions its instance owns, so that the
// instances of a group never count a dead letter twice).
func (l Letters) Waiting(ctx context.Context, topic string, partitions []int32) ([]driver.LettersWaiting, error) {
	q := `SELECT reason, COUNT(*), MIN(created_at) FROM dead_letters WHERE kafka_topic = ? AND reinjected_at IS NULL`
	args := []any{topic}
	if partitions != nil {
		if len(partitions) == 0 {
			return nil, nil
		}
		q += ` AND kafka_partition IN (?` + strings.Repeat(`,?`, len(partitions)-1) + `)`
		for _, p := range partitions {
			args = append(args, p)
		}
	}
	rows, err := l.db.QueryContext(ctx, q+` GROUP BY reason ORDER BY reason`, args...)
	if err != nil {
		return nil, fmt.Errorf("count dead letters: %w", err)
	}
	defer rows.Close()
	var out []driver.LettersWaiting
	for rows.Next() {
		var w driver.LettersWaiting
		if err := rows.Scan(&w.Reason, &w.Count, &w.Oldest); err != nil {
			return nil, fmt.Errorf("count dead letters: %w", err)
		}
		w.Oldest = w.Oldest.UTC()
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count dead letters: %w", err)
	}
	return out, nil
}
