package mysqldriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The changelog's SQL (migration 00007): the outbox, written in a
// checkpoint's branches and read and deleted by the publisher on the
// pools, the snapshot's scans of the result tables, and the control
// server's changelog_state.

const outboxHead = `INSERT INTO changelog_outbox (checkpoint_id, participant, chunk, events, body, created_at) VALUES `

// writeOutbox writes one outbox row per blob, as few statements as the
// budget allows (a blob of MaxOutboxBlob fits alone).
func writeOutbox(ctx context.Context, ex stmt.Execer, checkpoint string, participant int, blobs [][]byte, counts []int, now time.Time) error {
	if len(blobs) != len(counts) {
		return fmt.Errorf("outbox: %d blobs, %d counts", len(blobs), len(counts))
	}
	fixed := stmt.ArgBytes(checkpoint) + 3*stmt.ArgBytes(int64(0)) + stmt.ArgBytes(now) + len("(?,?,?,?,?,?)") + 1
	return stmt.Insert(ctx, ex, len(blobs), outboxHead, "(?,?,?,?,?,?)", "",
		func(i int) int { return fixed + stmt.TextBytes(len(blobs[i])) },
		func(i int) []any { return []any{checkpoint, participant, i, counts[i], blobs[i], now} })
}

// OutboxIndex lists the outbox rows of checkpoints, without bodies.
func (s *Server) OutboxIndex(ctx context.Context, checkpoints []string) ([]driver.OutboxChunk, error) {
	var out []driver.OutboxChunk
	err := stmt.Split(len(checkpoints), 256, s.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(checkpoints[i]) }, func(start, end int) error {
		var rows []struct {
			Checkpoint  []byte `db:"checkpoint_id"`
			Participant int    `db:"participant"`
			Chunk       int    `db:"chunk"`
			Events      int    `db:"events"`
			Bytes       int    `db:"bytes"`
		}
		err := s.db.SelectContext(ctx, &rows, `SELECT checkpoint_id, participant, chunk, events, LENGTH(body) AS bytes FROM changelog_outbox
			WHERE checkpoint_id IN (`+placeholders(end-start)+`) ORDER BY checkpoint_id, participant, chunk`, anys(checkpoints[start:end])...)
		for _, r := range rows {
			out = append(out, driver.OutboxChunk{Checkpoint: string(r.Checkpoint), Participant: r.Participant, Chunk: r.Chunk, Events: r.Events, Bytes: r.Bytes})
		}
		return err
	})
	return out, err
}

type outboxID struct {
	checkpoint         string
	participant, chunk int
}

// ReadOutbox reads the bodies of chunks by primary key.
func (s *Server) ReadOutbox(ctx context.Context, chunks []driver.OutboxChunk) ([][]byte, error) {
	got := map[outboxID][]byte{}
	err := stmt.Split(len(chunks), 256, s.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(chunks[i].Checkpoint) + 80 }, func(start, end int) error {
		part := chunks[start:end]
		args := make([]any, 0, 3*len(part))
		for _, c := range part {
			args = append(args, c.Checkpoint, c.Participant, c.Chunk)
		}
		var rows []struct {
			Checkpoint  []byte `db:"checkpoint_id"`
			Participant int    `db:"participant"`
			Chunk       int    `db:"chunk"`
			Body        []byte `db:"body"`
		}
		err := s.db.SelectContext(ctx, &rows, `SELECT checkpoint_id, participant, chunk, body FROM changelog_outbox FORCE INDEX (PRIMARY)
			WHERE (checkpoint_id, participant, chunk) IN (`+strings.Repeat("(?,?,?),", len(part)-1)+`(?,?,?))`, args...)
		for _, r := range rows {
			got[outboxID{string(r.Checkpoint), r.Participant, r.Chunk}] = r.Body
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(chunks))
	for i, c := range chunks {
		b, ok := got[outboxID{c.Checkpoint, c.Participant, c.Chunk}]
		if !ok {
			return nil, fmt.Errorf("outbox row %s/%d/%d: gone", c.Checkpoint, c.Participant, c.Chunk)
		}
		out[i] = b
	}
	return out, nil
}

// DeleteOutbox deletes the outbox rows of checkpoints.
func (s *Server) DeleteOutbox(ctx context.Context, checkpoints []string) (int64, error) {
	var n int64
	err := stmt.Split(len(checkpoints), 128, s.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(checkpoints[i]) }, func(start, end int) error {
		r, err := s.db.ExecContext(ctx, `DELETE FROM changelog_outbox WHERE checkpoint_id IN (`+placeholders(end-start)+`)`, anys(checkpoints[start:end])...)
		if err != nil {
			return err
		}
		k, _ := r.RowsAffected()
		n += k
		return nil
	})
	return n, err
}

func anys[T any](v []T) []any {
	out := make([]any, len(v))
	for i, x := range v {
		out[i] = x
	}
	return out
}

// The snapshot's scans: the rows after a key, in primary key order, on the
// primary key. `a > ? OR (a = ? AND b > ?)` rather than a row constructor
// comparison, which neither server turns into a range of the index.

// ScanBalances reads balances after after (nil: from the first).
func (s *Server) ScanBalances(ctx context.Context, after *driver.BalanceKey, limit int) ([]driver.BalanceRow, error) {
	where, args := "", []any{}
	if after != nil {
		where = `WHERE account_id > ? OR (account_id = ? AND currency > ?)`
		args = []any{after.Account, after.Account, after.Currency}
	}
	var rows []balanceRowSQL
	err := s.db.SelectContext(ctx, &rows, `SELECT `+balanceColumns+` FROM account_balances FORCE INDEX (PRIMARY) `+where+
		` ORDER BY account_id, currency LIMIT ?`, append(args, limit)...)
	out := make([]driver.BalanceRow, len(rows))
	for i, r := range rows {
		out[i] = r.row()
	}
	return out, err
}

func windowAfter(after *driver.WindowKey) (string, []any) {
	if after == nil {
		return "", nil
	}
	return `WHERE account_id > ? OR (account_id = ? AND (currency > ? OR (currency = ? AND window_start > ?)))`,
		[]any{after.Account, after.Account, after.Currency, after.Currency, after.Start.UTC()}
}

// ScanWindows reads billing_windows rows after after.
func (s *Server) ScanWindows(ctx context.Context, after *driver.WindowKey, limit int) ([]driver.WindowRow, error) {
	where, args := windowAfter(after)
	var rows []windowRowSQL
	err := s.db.SelectContext(ctx, &rows, `SELECT `+windowColumns+` FROM billing_windows FORCE INDEX (PRIMARY) `+where+
		` ORDER BY account_id, currency, window_start LIMIT ?`, append(args, limit)...)
	out := make([]driver.WindowRow, len(rows))
	for i, r := range rows {
		out[i] = r.row()
	}
	return out, err
}

// ScanAdjustments reads window_adjustments rows after after.
func (s *Server) ScanAdjustments(ctx context.Context, after *driver.WindowKey, limit int) ([]driver.AdjustmentRow, error) {
	where, args := windowAfter(after)
	var rows []adjustmentRowSQL
	err := s.db.SelectContext(ctx, &rows, `SELECT `+adjustmentColumns+` FROM window_adjustments FORCE INDEX (PRIMARY) `+where+
		` ORDER BY account_id, currency, window_start LIMIT ?`, append(args, limit)...)
	out := make([]driver.AdjustmentRow, len(rows))
	for i, r := range rows {
		out[i] = r.row()
	}
	return out, err
}

// ScanEntries reads ledger_entries rows after after.
func (s *Server) ScanEntries(ctx context.Context, after *driver.EntryKey, limit int) ([]driver.EntryRow, error) {
	where, args := "", []any{}
	if after != nil {
		where = `WHERE kafka_topic > ? OR (kafka_topic = ? AND (kafka_partition > ? OR (kafka_partition = ? AND (kafka_offset > ? OR (kafka_offset = ? AND entry > ?)))))`
		args = []any{after.Topic, after.Topic, after.Partition, after.Partition, after.Offset, after.Offset, int8(after.Kind)}
	}
	var rows []struct {
		Topic      string    `db:"kafka_topic"`
		Partition  int32     `db:"kafka_partition"`
		Offset     int64     `db:"kafka_offset"`
		Kind       int8      `db:"entry"`
		EventID    []byte    `db:"event_id"`
		Account    []byte    `db:"account_id"`
		Currency   string    `db:"currency"`
		Amount     int64     `db:"amount_minor"`
		OccurredAt time.Time `db:"occurred_at"`
		Start      time.Time `db:"window_start"`
		Late       bool      `db:"late"`
		Revision   int64     `db:"revision"`
		Checkpoint []byte    `db:"checkpoint_id"`
		CreatedAt  time.Time `db:"created_at"`
	}
	err := s.db.SelectContext(ctx, &rows, `SELECT kafka_topic, kafka_partition, kafka_offset, entry, event_id, account_id, currency, amount_minor,
		occurred_at, window_start, late, revision, checkpoint_id, created_at FROM ledger_entries FORCE INDEX (PRIMARY) `+where+
		` ORDER BY kafka_topic, kafka_partition, kafka_offset, entry LIMIT ?`, append(args, limit)...)
	out := make([]driver.EntryRow, len(rows))
	for i, r := range rows {
		out[i] = driver.EntryRow{Topic: r.Topic, Checkpoint: string(r.Checkpoint), CreatedAt: r.CreatedAt.UTC(), Entry: driver.Entry{
			Partition: r.Partition, Offset: r.Offset, Kind: driver.EntryKind(r.Kind), EventID: string(r.EventID), Account: string(r.Account), Currency: r.Currency,
			Amount: r.Amount, OccurredAt: r.OccurredAt.UTC(), WindowStart: r.Start.UTC(), Late: r.Late, Revision: r.Revision}}
	}
	return out, err
}

// The control server's changelog_state.

// Changelog reads the ledger's changelog state.
func (c *Control) Changelog(ctx context.Context) (driver.ChangelogState, error) {
	return readChangelog(ctx, c.sv.db)
}

func readChangelog(ctx context.Context, q sqlx.QueryerContext) (driver.ChangelogState, error) {
	var rows []struct {
		Prefix      string         `db:"topic_prefix"`
		From        int64          `db:"from_seq"`
		Snapshot    bool           `db:"snapshot"`
		Published   int64          `db:"published_seq"`
		PublishedAt sql.NullTime   `db:"published_at"`
		Publisher   sql.NullString `db:"publisher"`
		LeaseLeftUS sql.NullInt64  `db:"lease_left_us"`
		EnabledAt   time.Time      `db:"enabled_at"`
	}
	err := sqlx.SelectContext(ctx, q, &rows, `SELECT topic_prefix, from_seq, snapshot, published_seq, published_at, publisher,
		TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until) AS lease_left_us, enabled_at FROM changelog_state WHERE singleton = 1`)
	if err != nil || len(rows) == 0 {
		return driver.ChangelogState{}, err
	}
	r := rows[0]
	return driver.ChangelogState{On: true, Prefix: r.Prefix, From: r.From, Snapshot: r.Snapshot, Published: r.Published,
		PublishedAt: utcOrZero(r.PublishedAt), Publisher: r.Publisher.String, LeaseLeft: time.Duration(r.LeaseLeftUS.Int64) * time.Microsecond,
		EnabledAt: r.EnabledAt.UTC()}, nil
}

// EnableChangelog turns the changelog on unless it is: under the commit
// log's counter (locked first, as decisions lock it, before the state
// row), so that From is the number the next decision takes and that
// decision already sees the flag.
func (c *Control) EnableChangelog(ctx context.Context, prefix string, at time.Time) (driver.ChangelogState, error) {
	tx, err := c.sv.db.BeginTxx(ctx, nil)
	if err != nil {
		return driver.ChangelogState{}, err
	}
	defer func() { _ = tx.Rollback() }()
	var last int64
	if err := tx.GetContext(ctx, &last, `SELECT last_seq FROM commit_sequence WHERE singleton = 1 FOR UPDATE`); err != nil {
		return driver.ChangelogState{}, fmt.Errorf("commit_sequence: %w", err)
	}
	st, err := readChangelog(ctx, tx)
	if err != nil {
		return st, err
	}
	if !st.On {
		if _, err := tx.ExecContext(ctx, `INSERT INTO changelog_state (singleton, topic_prefix, from_seq, snapshot, published_seq, enabled_at)
			VALUES (1, ?, ?, TRUE, ?, ?)`, prefix, last+1, last, at.UTC()); err != nil {
			return driver.ChangelogState{}, err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE commit_sequence SET changelog = TRUE WHERE singleton = 1`); err != nil {
			return driver.ChangelogState{}, err
		}
		if st, err = readChangelog(ctx, tx); err != nil {
			return st, err
		}
	}
	return st, tx.Commit()
}

// SkipChangelogSnapshot records that no snapshot is needed.
func (c *Control) SkipChangelogSnapshot(ctx context.Context, from int64) error {
	_, err := c.sv.db.ExecContext(ctx, `UPDATE changelog_state SET snapshot = FALSE WHERE singleton = 1 AND from_seq = ?`, from)
	return err
}

// DisableChangelog turns the changelog off, under the counter's lock.
func (c *Control) DisableChangelog(ctx context.Context) error {
	tx, err := c.sv.db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `UPDATE commit_sequence SET changelog = FALSE WHERE singleton = 1`); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM changelog_state WHERE singleton = 1`); err != nil {
		return err
	}
	return tx.Commit()
}

// LeaseChangelog takes, renews or (ttl 0) releases the publisher's lease,
// on the control server's clock.
func (c *Control) LeaseChangelog(ctx context.Context, owner string, ttl time.Duration) (bool, error) {
	if ttl <= 0 {
		_, err := c.sv.db.ExecContext(ctx, `UPDATE changelog_state SET publisher = NULL, lease_until = NULL WHERE singleton = 1 AND publisher = ?`, owner)
		return false, err
	}
	r, err := c.sv.db.ExecContext(ctx, `UPDATE changelog_state SET publisher = ?, lease_until = TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6))
		WHERE singleton = 1 AND (publisher = ? OR publisher IS NULL OR lease_until IS NULL OR lease_until < UTC_TIMESTAMP(6))`,
		owner, ttl.Microseconds(), owner)
	if err != nil {
		return false, err
	}
	if n, _ := r.RowsAffected(); n == 1 {
		return true, nil
	}
	// No row changed: another holds the lease, or the row is missing, or
	// this very renewal changed nothing (the same microsecond).
	st, err := c.Changelog(ctx)
	return st.On && st.Publisher == owner && st.LeaseLeft > 0, err
}

// ChangelogPublished raises the published hint (assignments apply left to
// right on both servers: published_at compares with the old value).
func (c *Control) ChangelogPublished(ctx context.Context, seq int64) error {
	_, err := c.sv.db.ExecContext(ctx, `UPDATE changelog_state SET published_at = IF(? > published_seq, UTC_TIMESTAMP(6), published_at),
		published_seq = GREATEST(published_seq, ?) WHERE singleton = 1`, seq, seq)
	return err
}

// errChangelogRow: the counter refused a decision for want of the
// changelog; whether that is the flag or a missing row is told apart only
// then.
func counterRefusal(ctx context.Context, tx *sqlx.Tx) error {
	var on []bool
	if err := tx.SelectContext(ctx, &on, `SELECT changelog FROM commit_sequence WHERE singleton = 1`); err != nil {
		return err
	}
	if len(on) == 1 && on[0] {
		return driver.ErrChangelogOn
	}
	return errors.New("commit_sequence: no row updated, want its one row (migration 00006)")
}
