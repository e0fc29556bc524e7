package mysqldriver

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The SQL of dedup_keys and its expiry journal, dedup_expiry (see package
// dedup for the model).
//
// Claims rest on affected rows counting changed rows only: OpenDB turns
// CLIENT_FOUND_ROWS off, so that an existing key "updated" to itself
// counts 0 and a statement that inserted all its rows proves all its ids
// new.

// querier runs a read-only query (a server's pool, or a branch's
// connection) within its server's statement budget.
type querier interface {
	Select(ctx context.Context, dest any, query string, args ...any) error
	MaxStatementBytes() int
}

// preparer is an execer that can also run a statement through a
// server-side prepared statement it keeps (Conn.ExecPrepared): claims run
// their full chunks, whose text never changes, that way.
type preparer interface {
	ExecPrepared(ctx context.Context, query string, args ...any) (sql.Result, error)
}

type keyRow struct {
	ID          []byte    `db:"event_id"`
	Fingerprint []byte    `db:"fingerprint"`
	ExpiresAt   time.Time `db:"expires_at"`
}

// lookupKeys reads the stored rows of ids, expired ones included, with a
// consistent (non-locking) read of the committed rows. Run after a claim,
// on its contested ids: the claim's row locks keep every stored row it met
// as it was until the checkpoint ends, and the ids it inserted itself are
// not visible to the read (and so count as new).
func lookupKeys(ctx context.Context, q querier, ids []string) ([]driver.DedupKey, error) {
	const head = `SELECT event_id, fingerprint, expires_at FROM dedup_keys WHERE event_id IN ()`
	var out []driver.DedupKey
	err := stmt.Split(len(ids), len(head), q.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(ids[i]) }, func(start, end int) error {
		part := ids[start:end]
		args := make([]any, len(part))
		for i, id := range part {
			args[i] = id
		}
		var rows []keyRow
		if err := q.Select(ctx, &rows, `SELECT event_id, fingerprint, expires_at FROM dedup_keys WHERE event_id IN (`+placeholders(len(part))+`)`, args...); err != nil {
			return fmt.Errorf("dedup lookup: %w", err)
		}
		for _, r := range rows {
			k := driver.DedupKey{ID: string(r.ID), ExpiresAt: r.ExpiresAt}
			copy(k.Fingerprint[:], r.Fingerprint)
			out = append(out, k)
		}
		return nil
	})
	return out, err
}

// claimKeys inserts keys and leaves every row that already exists
// untouched, one statement per chunk; it returns the ids of every chunk
// that inserted fewer rows than it holds (driver.StoreTx.ClaimKeys). Keys
// are written in id order, as replaceKeys does.
func claimKeys(ctx context.Context, ex stmt.Execer, keys []driver.DedupKey) ([]string, error) {
	slices.SortFunc(keys, func(a, b driver.DedupKey) int { return strings.Compare(a.ID, b.ID) })
	// An existing row is "updated" to itself: 0 affected rows (no
	// CLIENT_FOUND_ROWS); unlike INSERT IGNORE, no error is downgraded.
	const onDup = ` ON DUPLICATE KEY UPDATE event_id = event_id`
	var suspects []string
	err := splitKeys(ex, keys, onDup, func(part []driver.DedupKey) error {
		query, args := insertKeys(part, onDup)
		exec := ex.Exec
		if p, ok := ex.(preparer); ok && len(part) == stmt.MaxRows {
			exec = p.ExecPrepared
		}
		r, err := exec(ctx, query, args...)
		if err != nil {
			return fmt.Errorf("dedup claim: %w", err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return fmt.Errorf("dedup claim: %w", err)
		}
		if n != int64(len(part)) {
			for _, in := range part {
				suspects = append(suspects, in.ID)
			}
		}
		return nil
	})
	return suspects, err
}

// unclaimKeys deletes keys that this checkpoint claimed but does not keep
// (the event became a dead letter).
func unclaimKeys(ctx context.Context, ex stmt.Execer, ids []string) error {
	slices.Sort(ids)
	const head = `DELETE d FROM dedup_keys AS d FORCE INDEX (PRIMARY) WHERE d.event_id IN ()`
	return stmt.Split(len(ids), len(head), ex.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(ids[i]) }, func(start, end int) error {
		part := ids[start:end]
		args := make([]any, len(part))
		for i, id := range part {
			args[i] = id
		}
		if _, err := ex.Exec(ctx, `DELETE d FROM dedup_keys AS d FORCE INDEX (PRIMARY) WHERE d.event_id IN (`+placeholders(len(part))+`)`, args...); err != nil {
			return fmt.Errorf("dedup unclaim: %w", err)
		}
		return nil
	})
}

// replaceKeys writes keys that replace expired rows (claims write the new
// ones), deleting the expired rows first, in id order so that concurrent
// checkpoints lock in one order.
func replaceKeys(ctx context.Context, ex stmt.Execer, keys []driver.DedupKey, now time.Time) error {
	slices.SortFunc(keys, func(a, b driver.DedupKey) int { return strings.Compare(a.ID, b.ID) })
	replace := make([]any, len(keys))
	for i, k := range keys {
		replace[i] = k.ID
	}
	err := stmt.Split(len(replace), len(deleteExpired(1))+stmt.ArgBytes(now), ex.MaxStatementBytes(),
		func(i int) int { return stmt.ArgBytes(replace[i]) }, func(start, end int) error {
			part := replace[start:end]
			args := append(part[:len(part):len(part)], now)
			if _, err := ex.Exec(ctx, deleteExpired(len(part)), args...); err != nil {
				return fmt.Errorf("dedup replace expired: %w", err)
			}
			return nil
		})
	if err != nil {
		return err
	}
	return splitKeys(ex, keys, "", func(part []driver.DedupKey) error {
		query, args := insertKeys(part, "")
		if _, err := ex.Exec(ctx, query, args...); err != nil {
			return fmt.Errorf("dedup insert: %w", err)
		}
		return nil
	})
}

// splitKeys cuts keys into statements of insertKeys within ex's budget.
func splitKeys(ex stmt.Execer, keys []driver.DedupKey, suffix string, fn func(part []driver.DedupKey) error) error {
	return stmt.Split(len(keys), len(insertHead)+len(suffix), ex.MaxStatementBytes(),
		func(i int) int {
			return stmt.RowBytes(insertTuple, keys[i].ID, keys[i].Fingerprint[:], keys[i].ExpiresAt)
		},
		func(start, end int) error { return fn(keys[start:end]) })
}

// JournalIDs bounds the ids of one journal row, and so the keys one cleanup
// transaction deletes.
const JournalIDs = 8192

// maxIDBytes is the longest event id a journal row can list (its length is
// one byte); the decoder refuses longer ids before they reach here.
const maxIDBytes = 255

// journalRowOverhead bounds a journal row's text besides its blob.
const journalRowOverhead = 64

// journalKeys records that the keys ids, written by this checkpoint,
// expire at expires: rows of dedup_expiry in the same branch as the keys,
// so that a key and its journal entry commit or roll back together.
// Cleanup reads the journal instead of an index on dedup_keys.expires_at,
// which cost a secondary index entry per key. Usually one statement per
// branch; a row's blob and a statement stay within the branch's statement
// budget.
func journalKeys(ctx context.Context, ex stmt.Execer, expires time.Time, ids []string) error {
	const head = `INSERT INTO dedup_expiry (expires_at, event_ids) VALUES `
	budget := ex.MaxStatementBytes()
	// A blob is sent escaped (up to twice its size): half of what is left
	// of the budget after the statement's text.
	maxBlob := (budget - len(head) - journalRowOverhead) / 2
	var (
		args  []any  // (expires_at, event_ids) per row of the statement
		blob  []byte // the row being filled
		count int    // ids in blob
		size  int    // worst-case bytes of the statement, blob included
	)
	endRow := func() {
		if count > 0 {
			args = append(args, expires, blob)
			size += journalRowOverhead
			blob, count = nil, 0
		}
	}
	flush := func() error {
		endRow()
		if len(args) == 0 {
			return nil
		}
		rows := strings.Repeat("(?,?),", len(args)/2)
		_, err := ex.Exec(ctx, head+rows[:len(rows)-1], args...)
		args, size = args[:0], len(head)
		if err != nil {
			return fmt.Errorf("dedup journal: %w", err)
		}
		return nil
	}
	size = len(head)
	for _, id := range ids {
		if len(id) == 0 || len(id) > maxIDBytes {
			return fmt.Errorf("dedup journal: event id of %d bytes", len(id))
		}
		entry := 1 + len(id)
		if len(blob)+entry > maxBlob {
			endRow()
		}
		if size+2*entry+journalRowOverhead > budget {
			if err := flush(); err != nil {
				return err
			}
		}
		blob = append(append(blob, byte(len(id))), id...)
		count++
		size += 2 * entry
		if count == JournalIDs {
			endRow()
		}
	}
	return flush()
}

// DecodeJournal splits a journal row's event_ids (each id preceded by its
// length in one byte) into the ids.
func DecodeJournal(b []byte) ([][]byte, error) {
	var ids [][]byte
	for len(b) > 0 {
		n := int(b[0])
		if n == 0 || len(b) < 1+n {
			return nil, fmt.Errorf("malformed journal row: id of %d bytes with %d left", n, len(b)-1)
		}
		ids = append(ids, b[1:1+n])
		b = b[1+n:]
	}
	return ids, nil
}

// cleanupKeys deletes, on one server, the keys listed by journal rows
// expired at now, until no such row is left, max keys were deleted, or ctx
// ends. Each journal row is its own short transaction: the row is taken
// FOR UPDATE SKIP LOCKED (instances cleaning the same server share the
// work instead of waiting on each other), its keys are deleted by primary
// key, batch per statement, but only while still expired (an id
// re-inserted later has a later expiry and a journal row of its own), then
// the journal row is deleted. A crash in between leaves the journal row to
// the next pass; deleting an absent key is harmless.
//
// A journal row that does not parse stops the cleanup of that server with
// an error naming it (it can only come from a manual edit); its keys stay
// until it is repaired or deleted by hand.
func cleanupKeys(ctx context.Context, db *sqlx.DB, now time.Time, batch, max, budget int) (int64, error) {
	var total int64
	for total < int64(max) {
		n, more, err := cleanupRow(ctx, db, now, batch, budget)
		total += n
		if err != nil || !more {
			return total, err
		}
	}
	return total, nil
}

// cleanupRow resolves one expired journal row; more is false when none was
// left.
func cleanupRow(ctx context.Context, db *sqlx.DB, now time.Time, batch, budget int) (deleted int64, more bool, err error) {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return 0, false, fmt.Errorf("dedup cleanup: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var j struct {
		Seq int64  `db:"seq"`
		IDs []byte `db:"event_ids"`
	}
	err = tx.GetContext(ctx, &j, `SELECT seq, event_ids FROM dedup_expiry WHERE expires_at <= ? ORDER BY expires_at LIMIT 1 FOR UPDATE SKIP LOCKED`, now)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("dedup cleanup: %w", err)
	}
	decoded, err := DecodeJournal(j.IDs)
	if err != nil {
		return 0, false, fmt.Errorf("dedup cleanup: dedup_expiry seq %d: %w", j.Seq, err)
	}
	// In key order: each statement then walks the primary key's leaves
	// forwards instead of jumping between pages, and concurrent cleanups
	// lock in one order.
	slices.SortFunc(decoded, bytes.Compare)
	ids := make([]any, len(decoded))
	for i, id := range decoded {
		ids[i] = id
	}
	for start := 0; start < len(ids); start += batch {
		err := stmt.Split(min(batch, len(ids)-start), len(deleteExpired(1))+stmt.ArgBytes(now), budget,
			func(i int) int { return stmt.ArgBytes(ids[start+i]) }, func(from, to int) error {
				part := ids[start+from : start+to]
				args := append(part[:len(part):len(part)], now)
				r, err := tx.ExecContext(ctx, deleteExpired(len(part)), args...)
				if err != nil {
					return err
				}
				n, _ := r.RowsAffected()
				deleted += n
				return nil
			})
		if err != nil {
			return 0, false, fmt.Errorf("dedup cleanup: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM dedup_expiry WHERE seq = ?`, j.Seq); err != nil {
		return 0, false, fmt.Errorf("dedup cleanup: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, false, fmt.Errorf("dedup cleanup: %w", err)
	}
	return deleted, true, nil
}

// The statement that inserts keys: insertHead, one insertTuple per key.
const (
	insertHead  = `INSERT INTO dedup_keys (event_id, fingerprint, expires_at) VALUES `
	insertTuple = "(?,?,?)"
)

// insertKeys is the statement that inserts keys, one row each, followed by
// suffix, and its arguments.
func insertKeys(keys []driver.DedupKey, suffix string) (string, []any) {
	var b strings.Builder
	b.WriteString(insertHead)
	args := make([]any, 0, 3*len(keys))
	for i, in := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(insertTuple)
		args = append(args, in.ID, in.Fingerprint[:], in.ExpiresAt)
	}
	b.WriteString(suffix)
	return b.String(), args
}

// deleteExpired deletes n keys (the arguments, then the time) if they are
// expired at that time. It names the primary key (multi-table form:
// single-table DELETE takes no index hint): a scan would wait on rows that
// other branches hold.
func deleteExpired(n int) string {
	return `DELETE d FROM dedup_keys AS d FORCE INDEX (PRIMARY) WHERE d.event_id IN (` + placeholders(n) + `) AND d.expires_at <= ?`
}
