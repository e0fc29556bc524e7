// Package deadletters is the pipeline's dead letters and the operator's
// view of the dead_letters table: what a dead letter keeps of a record
// (New), and what the operator's tools, the status report, the metrics
// and the verifier read and update. The checkpoints write letters through
// the ledger store (driver.StoreTx.WriteDeadLetters, whose statement is
// mysqldriver's); the statements that read and update the table for
// operators live here.
//
// A dead letter is a record that was not counted, with the reason, committed
// in the same checkpoint as the offsets that passed it. It keeps a bounded
// prefix of the record's value, the whole value's size and its SHA-256
// (which finds the record again in Kafka), never the whole value: a flood of
// large junk costs the prefix per record, not the record. Its unique key is
// the record's position (topic, partition, offset): a replay that meets a
// stored dead letter keeps the stored row.
package deadletters

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/txsink/driver"
)

// Bounds of what a dead letter keeps of its record (the columns' sizes;
// the store cuts every field to its bound: driver.DeadLetter.Columns).
const (
	MaxKey    = driver.DeadLetterKeyBytes    // bytes of the record's key
	MaxDetail = driver.DeadLetterDetailBytes // bytes of the detail (the column holds 512 characters)
)

// Letter is a dead letter to write: the store's row.
type Letter = driver.DeadLetter

// New copies what a dead letter keeps of a record: its key and a prefix of
// its value of at most maxPayload bytes, so that the record's buffers can be
// freed.
func New(partition int32, offset int64, key, value []byte, maxPayload int, reason, detail, eventID string) Letter {
	d := Letter{Partition: partition, Offset: offset, Reason: reason, Detail: detail, EventID: eventID,
		Size: len(value), SHA256: sha256.Sum256(value), Payload: bytes.Clone(truncate(value, maxPayload))}
	if d.Payload == nil {
		d.Payload = []byte{}
	}
	if key != nil {
		d.Key = bytes.Clone(truncate(key, MaxKey))
	}
	return d
}

// overhead approximates a Letter's fixed memory.
const overhead = 160

// Bytes is the memory the letter holds.
func Bytes(d *Letter) int {
	return len(d.Payload) + len(d.Key) + len(d.Detail) + len(d.EventID) + overhead
}

// MaxBytes bounds Bytes for a letter of a value prefix of at most
// maxPayload bytes (its event id is at most 128 bytes).
func MaxBytes(maxPayload int) int { return maxPayload + MaxKey + MaxDetail + 128 + overhead }

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// Row is a stored dead letter.
type Row struct {
	ID           int64        `db:"id"`
	Topic        string       `db:"kafka_topic"`
	Partition    int32        `db:"kafka_partition"`
	Offset       int64        `db:"kafka_offset"`
	Reason       string       `db:"reason"`
	Detail       string       `db:"detail"`
	EventID      []byte       `db:"event_id"`
	Key          []byte       `db:"record_key"`
	Payload      []byte       `db:"payload"`
	PayloadSize  int64        `db:"payload_size"`
	PayloadSHA   []byte       `db:"payload_sha256"`
	Checkpoint   string       `db:"checkpoint_id"`
	CreatedAt    time.Time    `db:"created_at"`
	ReinjectedAt sql.NullTime `db:"reinjected_at"`
	// The audit of the last re-injection (the log keeps every one).
	ReinjectedBy        sql.NullString `db:"reinjected_by"`
	ReinjectedForced    sql.NullBool   `db:"reinjected_forced"`
	ReinjectedPartition sql.NullInt32  `db:"reinjected_partition"`
	ReinjectedOffset    sql.NullInt64  `db:"reinjected_offset"`
	ReinjectedSHA256    []byte         `db:"reinjected_sha256"`
}

const rowColumns = `id, kafka_topic, kafka_partition, kafka_offset, reason, detail, event_id, record_key,
	payload, payload_size, payload_sha256, checkpoint_id, created_at, reinjected_at, reinjected_by, reinjected_forced,
	reinjected_partition, reinjected_offset, reinjected_sha256`

// summaryColumns are List's: everything but the payload and the key.
const summaryColumns = `id, kafka_topic, kafka_partition, kafka_offset, reason, detail, event_id, payload_size, payload_sha256,
	checkpoint_id, created_at, reinjected_at, reinjected_by, reinjected_forced, reinjected_partition, reinjected_offset, reinjected_sha256`

// Filter selects dead letters for List.
type Filter struct {
	Reason  string // only this reason, if set
	Pending bool   // only those not re-injected
	Limit   int    // at most this many, newest first
}

// List returns dead letters of one server, newest first, without their
// payloads.
func List(ctx context.Context, db sqlx.QueryerContext, f Filter) ([]Row, error) {
	q := `SELECT ` + summaryColumns + ` FROM dead_letters WHERE 1=1`
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
	var rows []Row
	if err := sqlx.SelectContext(ctx, db, &rows, q, args...); err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return rows, nil
}

// ErrNotFound: no dead letter by that id.
var ErrNotFound = errors.New("no such dead letter")

// Get reads one dead letter of a server, by its id there.
func Get(ctx context.Context, db sqlx.QueryerContext, id int64) (*Row, error) {
	var r Row
	err := sqlx.GetContext(ctx, db, &r, `SELECT `+rowColumns+` FROM dead_letters WHERE id = ?`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("read dead letter %d: %w", id, err)
	}
	return &r, nil
}

// Audit is who re-injects a dead letter, what, and whether the checks were
// overridden.
type Audit struct {
	At     time.Time
	By     string
	Forced bool
	SHA256 []byte // of the value produced
}

// Mark records a re-injection about to happen, atomically: only if the row
// is still as the caller read it (its last re-injection, or none), so that of
// two concurrent re-injections only one proceeds. It reports whether it
// marked the row.
func Mark(ctx context.Context, db sqlx.ExecerContext, r *Row, a Audit) (bool, error) {
	q := `UPDATE dead_letters SET reinjected_at = ?, reinjected_by = ?, reinjected_forced = ?, reinjected_sha256 = ?,
		reinjected_partition = NULL, reinjected_offset = NULL WHERE id = ? AND `
	args := []any{a.At, a.By, a.Forced, a.SHA256, r.ID}
	if r.ReinjectedAt.Valid {
		q += `reinjected_at = ?`
		args = append(args, r.ReinjectedAt.Time)
	} else {
		q += `reinjected_at IS NULL`
	}
	res, err := db.ExecContext(ctx, q, args...)
	if err != nil {
		return false, fmt.Errorf("mark dead letter %d: %w", r.ID, err)
	}
	n, err := res.RowsAffected()
	return err == nil && n == 1, err
}

// Restore puts back the re-injection columns of r as they were read, if the
// row still holds the mark made at: the produce after Mark failed.
func Restore(ctx context.Context, db sqlx.ExecerContext, r *Row, at time.Time) error {
	_, err := db.ExecContext(ctx, `UPDATE dead_letters SET reinjected_at = ?, reinjected_by = ?, reinjected_forced = ?, reinjected_sha256 = ?,
		reinjected_partition = ?, reinjected_offset = ? WHERE id = ? AND reinjected_at = ?`,
		r.ReinjectedAt, r.ReinjectedBy, r.ReinjectedForced, r.ReinjectedSHA256, r.ReinjectedPartition, r.ReinjectedOffset, r.ID, at)
	return err
}

// Landed records where the re-injected record was written.
func Landed(ctx context.Context, db sqlx.ExecerContext, id int64, at time.Time, partition int32, offset int64) error {
	_, err := db.ExecContext(ctx, `UPDATE dead_letters SET reinjected_partition = ?, reinjected_offset = ? WHERE id = ? AND reinjected_at = ?`,
		partition, offset, id, at)
	return err
}

// Waiting is the dead letters of one reason not re-injected.
type Waiting struct {
	Reason string    `json:"reason"`
	Count  int64     `json:"count"`
	Oldest time.Time `json:"oldest"`
}

// CountWaiting counts the dead letters of topic not re-injected on one
// server, by reason. With partitions non-nil only those partitions count
// (the metrics sampler counts the partitions its instance owns, so that the
// instances of a group never count a dead letter twice).
func CountWaiting(ctx context.Context, db interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}, topic string, partitions []int32) ([]Waiting, error) {
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
	rows, err := db.QueryContext(ctx, q+` GROUP BY reason ORDER BY reason`, args...)
	if err != nil {
		return nil, fmt.Errorf("count dead letters: %w", err)
	}
	defer rows.Close()
	var out []Waiting
	for rows.Next() {
		var w Waiting
		if err := rows.Scan(&w.Reason, &w.Count, &w.Oldest); err != nil {
			return nil, fmt.Errorf("count dead letters: %w", err)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count dead letters: %w", err)
	}
	return out, nil
}

// Position is where a dead letter's record was, and why it was not
// counted.
type Position struct {
	Topic     string `db:"kafka_topic"`
	Partition int32  `db:"kafka_partition"`
	Offset    int64  `db:"kafka_offset"`
	Reason    string `db:"reason"`
}

// Positions lists every dead letter of topic (every topic when empty) on
// one server, by position.
func Positions(ctx context.Context, db sqlx.QueryerContext, topic string) ([]Position, error) {
	q := `SELECT kafka_topic, kafka_partition, kafka_offset, reason FROM dead_letters`
	var args []any
	if topic != "" {
		q += ` WHERE kafka_topic = ?`
		args = append(args, topic)
	}
	var out []Position
	if err := sqlx.SelectContext(ctx, db, &out, q+` ORDER BY kafka_topic, kafka_partition, kafka_offset`, args...); err != nil {
		return nil, fmt.Errorf("read dead_letters: %w", err)
	}
	return out, nil
}
