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

// The SQL of growing the ledger (migration 00012, package shards decides):
// a layout version's slots (ledger_placement), the state of the move to it
// (ledger_moves), and the move of rows between servers.

// PlacementRun is a run of slots of one owner in a layout version.
type PlacementRun struct {
	First, Last, Ordinal int
}

// ReadPlacement reads the slots of a layout version as runs, by first
// slot (none: the version places by modulo; a schema before migration
// 00012 has none).
func ReadPlacement(ctx context.Context, q sqlx.QueryerContext, version int) ([]PlacementRun, error) {
	var rows []struct {
		First   int `db:"first_slot"`
		Last    int `db:"last_slot"`
		Ordinal int `db:"ordinal"`
	}
	err := sqlx.SelectContext(ctx, q, &rows, `SELECT first_slot, last_slot, ordinal FROM ledger_placement WHERE version = ? ORDER BY first_slot`, version)
	if NoSuchTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read ledger_placement: %w", err)
	}
	out := make([]PlacementRun, len(rows))
	for i, r := range rows {
		out[i] = PlacementRun{First: r.First, Last: r.Last, Ordinal: r.Ordinal}
	}
	return out, nil
}

// MoveState is a row of ledger_moves.
type MoveState struct {
	Version    int          `db:"version"`
	State      string       `db:"state"`
	StartedAt  time.Time    `db:"started_at"`
	StartedBy  string       `db:"started_by"`
	FinishedAt sql.NullTime `db:"finished_at"`
	RowsMoved  int64        `db:"rows_moved"`
}

// The states of a move.
const (
	MoveMoving = "moving"
	MoveDone   = "done"
)

// ReadMove reads the state of the move to a layout version; found is
// false when the version was never moved to (or the schema predates
// migration 00012).
func ReadMove(ctx context.Context, q sqlx.QueryerContext, version int) (MoveState, bool, error) {
	var m MoveState
	err := sqlx.GetContext(ctx, q, &m, `SELECT version, state, started_at, started_by, finished_at, rows_moved FROM ledger_moves WHERE version = ?`, version)
	if NoSuchTable(err) || errors.Is(err, sql.ErrNoRows) {
		return MoveState{}, false, nil
	}
	if err != nil {
		return MoveState{}, false, fmt.Errorf("read ledger_moves: %w", err)
	}
	m.StartedAt = m.StartedAt.UTC()
	return m, true, nil
}

// StartMove records, in tx (the quiescing transaction on the control
// server), the placement of version and its move as started.
func StartMove(ctx context.Context, tx *sqlx.Tx, version int, runs []PlacementRun, at time.Time, by string) error {
	for len(runs) > 0 {
		n := min(len(runs), 500)
		query := `INSERT INTO ledger_placement (version, first_slot, last_slot, ordinal) VALUES ` + strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?), ", n), ", ")
		args := make([]any, 0, 4*n)
		for _, r := range runs[:n] {
			args = append(args, version, r.First, r.Last, r.Ordinal)
		}
		if _, err := tx.ExecContext(ctx, query, args...); err != nil {
			return fmt.Errorf("store ledger_placement: %w", err)
		}
		runs = runs[n:]
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO ledger_moves (version, state, started_at, started_by, rows_moved) VALUES (?, ?, ?, ?, 0)`,
		version, MoveMoving, at.UTC(), by); err != nil {
		return fmt.Errorf("store ledger_moves: %w", err)
	}
	return nil
}

// AddMoved adds n to the rows the move to version moved.
func AddMoved(ctx context.Context, ex sqlx.ExecerContext, version int, n int64) error {
	if _, err := ex.ExecContext(ctx, `UPDATE ledger_moves SET rows_moved = rows_moved + ? WHERE version = ?`, n, version); err != nil {
		return fmt.Errorf("update ledger_moves: %w", err)
	}
	return nil
}

// FinishMove records the move to version as done.
func FinishMove(ctx context.Context, ex sqlx.ExecerContext, version int, at time.Time) error {
	if _, err := ex.ExecContext(ctx, `UPDATE ledger_moves SET state = ?, finished_at = ? WHERE version = ? AND state = ?`,
		MoveDone, at.UTC(), version, MoveMoving); err != nil {
		return fmt.Errorf("update ledger_moves: %w", err)
	}
	return nil
}

// LegacyKeysLive says whether the server still holds the expiry journal of
// the dedup keys written before generations (dedup_expiry): their expiry
// is in the journal, not in their rows' table alone, so they cannot move.
func LegacyKeysLive(ctx context.Context, db *sqlx.DB) (bool, error) {
	var n int
	err := db.GetContext(ctx, &n, `SELECT COUNT(*) FROM (SELECT 1 FROM dedup_expiry LIMIT 1) AS t`)
	if NoSuchTable(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read dedup_expiry: %w", err)
	}
	return n > 0, nil
}

// MovedTables are the tables whose rows are placed by a key (account or
// event id) and so move with their slot, and the column of that key.
// Every other table stays where it is: the control server's bookkeeping,
// the dead letters and the outbox (keyed by Kafka position and checkpoint,
// read on every server).
var MovedTables = []struct{ Table, Key string }{
	{"account_balances", "account_id"},
	{"billing_windows", "account_id"},
	{"window_adjustments", "account_id"},
	{"ledger_entries", "account_id"},
	{"dedup_keys", "event_id"},
	{"dedup_keys_g1", "event_id"},
	{"dedup_keys_g2", "event_id"},
}

// KeyRange is the keys from From up to, not including, Below, in byte
// order (driver.KeysEnd: every key from From on).
type KeyRange struct{ From, Below string }

// MoveRows moves the rows of table, of keys in the range, whose key moves (moves says so of the
// key's bytes) from server from to server to: it reads from's rows in
// primary key order, batch rows at a time, and for each batch writes the
// moving rows to to (as they are; a row already there is left as it is)
// and then deletes them from from, each its own transaction. Nothing else
// writes these rows on from meanwhile (the move's cursor freezes them): then a
// move interrupted at any point and run again ends with every row on to,
// once. A row already on to was written there by this move (run before)
// with the same values, or, when this run is a paused one that another
// finished meanwhile, is newer than what this run read: never overwritten.
// before is called before each batch's write, done with the rows each
// batch moved (either may be nil). It returns the rows moved.
func MoveRows(ctx context.Context, from, to *Server, table, key string, keys KeyRange, moves func([]byte) bool, batch int, before func() error, done func(int64) error) (int64, error) {
	cols, pk, err := tableColumns(ctx, from.db, table)
	if err != nil {
		return 0, err
	}
	keyAt := indexOf(cols, key)
	if keyAt < 0 || len(pk) == 0 {
		return 0, fmt.Errorf("move %s: no column %s or no primary key", table, key)
	}
	pkAt := make([]int, len(pk))
	for i, c := range pk {
		pkAt[i] = indexOf(cols, c)
	}
	colList := "`" + strings.Join(cols, "`, `") + "`"
	pkList := "`" + strings.Join(pk, "`, `") + "`"
	var after []any // the last primary key read
	var total int64
	for {
		// The range first, the page's start after it, each in its own
		// parentheses: afterKey's condition is a disjunction.
		where := fmt.Sprintf(" WHERE `%s` >= ? AND `%s` < ?", key, key)
		args := []any{[]byte(keys.From), []byte(keys.Below)}
		if page, pargs := afterKey(pk, after); page != "" {
			where += " AND (" + strings.TrimPrefix(page, " WHERE ") + ")"
			args = append(args, pargs...)
		}
		rows, err := from.db.QueryContext(ctx, fmt.Sprintf("SELECT %s FROM `%s`%s ORDER BY %s LIMIT %d", colList, table, where, pkList, batch), args...)
		if err != nil {
			return total, fmt.Errorf("move %s: read: %w", table, err)
		}
		var read int
		var moving [][]any
		for rows.Next() {
			// The driver's own values ([]byte, int64, time.Time in the
			// DSN's location, nil) go back as they came: written to a
			// column of the same type, each is the value read.
			vals := make([]any, len(cols))
			dest := make([]any, len(cols))
			for i := range vals {
				dest[i] = &vals[i]
			}
			if err := rows.Scan(dest...); err != nil {
				_ = rows.Close()
				return total, fmt.Errorf("move %s: read: %w", table, err)
			}
			read++
			after = make([]any, len(pk))
			for i, at := range pkAt {
				after[i] = vals[at]
			}
			k, ok := vals[keyAt].([]byte)
			if !ok {
				_ = rows.Close()
				return total, fmt.Errorf("move %s: key %s read as %T", table, key, vals[keyAt])
			}
			if moves(k) {
				moving = append(moving, vals)
			}
		}
		if err := rows.Close(); err != nil {
			return total, fmt.Errorf("move %s: read: %w", table, err)
		}
		if err := rows.Err(); err != nil {
			return total, fmt.Errorf("move %s: read: %w", table, err)
		}
		if len(moving) > 0 {
			if before != nil {
				if err := before(); err != nil {
					return total, err
				}
			}
			if err := copyRows(ctx, to, table, cols, pk, moving); err != nil {
				return total, err
			}
			if err := deleteRows(ctx, from, table, pk, pkAt, moving); err != nil {
				return total, err
			}
			total += int64(len(moving))
			if done != nil {
				if err := done(int64(len(moving))); err != nil {
					return total, err
				}
			}
		}
		if read < batch {
			return total, nil
		}
	}
}

// copyRows writes rows to table on sv, leaving a stored row of the same
// primary key as it is (an update of nothing: not INSERT IGNORE, which
// would turn a value the column cannot hold into a warning), in
// statements within sv's budget.
func copyRows(ctx context.Context, sv *Server, table string, cols, pk []string, rows [][]any) error {
	colList := "`" + strings.Join(cols, "`, `") + "`"
	tuple := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ") + ")"
	head := fmt.Sprintf("INSERT INTO `%s` (%s) VALUES ", table, colList)
	tail := fmt.Sprintf(" ON DUPLICATE KEY UPDATE `%s` = `%s`", pk[0], pk[0])
	return inBudget(sv, len(head)+len(tail), rows, func(part [][]any) error {
		args := make([]any, 0, len(part)*len(cols))
		for _, r := range part {
			args = append(args, r...)
		}
		if _, err := sv.db.ExecContext(ctx, head+strings.TrimSuffix(strings.Repeat(tuple+", ", len(part)), ", ")+tail, args...); err != nil {
			return fmt.Errorf("move %s: write: %w", table, err)
		}
		return nil
	})
}

// deleteRows deletes rows from table on sv by primary key.
func deleteRows(ctx context.Context, sv *Server, table string, pk []string, pkAt []int, rows [][]any) error {
	cond := "(" + strings.Join(mapStrings(pk, func(c string) string { return "`" + c + "` = ?" }), " AND ") + ")"
	head := fmt.Sprintf("DELETE FROM `%s` WHERE ", table)
	return inBudget(sv, len(head), rows, func(part [][]any) error {
		args := make([]any, 0, len(part)*len(pk))
		for _, r := range part {
			for _, at := range pkAt {
				args = append(args, r[at])
			}
		}
		if _, err := sv.db.ExecContext(ctx, head+strings.TrimSuffix(strings.Repeat(cond+" OR ", len(part)), " OR "), args...); err != nil {
			return fmt.Errorf("move %s: delete: %w", table, err)
		}
		return nil
	})
}

// inBudget calls fn with consecutive parts of rows whose statement (fixed
// bytes plus the rows' values, with room for each value's quoting) stays
// within sv's statement budget.
func inBudget(sv *Server, fixed int, rows [][]any, fn func([][]any) error) error {
	budget := sv.MaxStatementBytes()
	start, size := 0, fixed
	for i, r := range rows {
		n := 0
		for _, v := range r {
			if b, ok := v.([]byte); ok {
				n += 2*len(b) + 8
			} else {
				n += 8
			}
		}
		if i > start && size+n > budget {
			if err := fn(rows[start:i]); err != nil {
				return err
			}
			start, size = i, fixed
		}
		size += n
	}
	if start < len(rows) {
		return fn(rows[start:])
	}
	return nil
}

// afterKey is the condition of the rows after a primary key (none: every
// row), spelt out column by column so that every server uses the primary
// key's range for it.
func afterKey(pk []string, after []any) (string, []any) {
	if after == nil {
		return "", nil
	}
	var ors []string
	var args []any
	for i := range pk {
		var ands []string
		for j := 0; j < i; j++ {
			ands = append(ands, "`"+pk[j]+"` = ?")
			args = append(args, after[j])
		}
		ands = append(ands, "`"+pk[i]+"` > ?")
		args = append(args, after[i])
		ors = append(ors, "("+strings.Join(ands, " AND ")+")")
	}
	return " WHERE " + strings.Join(ors, " OR "), args
}

// tableColumns reads a table's columns in order and its primary key's.
func tableColumns(ctx context.Context, db *sqlx.DB, table string) (cols, pk []string, err error) {
	if err := db.SelectContext(ctx, &cols, `SELECT COLUMN_NAME FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, table); err != nil {
		return nil, nil, fmt.Errorf("move %s: columns: %w", table, err)
	}
	if err := db.SelectContext(ctx, &pk, `SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION`, table); err != nil {
		return nil, nil, fmt.Errorf("move %s: primary key: %w", table, err)
	}
	if len(cols) == 0 {
		return nil, nil, fmt.Errorf("move %s: no such table", table)
	}
	return cols, pk, nil
}

func indexOf(ss []string, s string) int {
	for i, x := range ss {
		if strings.EqualFold(x, s) {
			return i
		}
	}
	return -1
}

func mapStrings(ss []string, f func(string) string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = f(s)
	}
	return out
}

// LockLayoutVersion reads the highest layout version under an exclusive
// lock, in tx: two moves do not both begin from it.
func LockLayoutVersion(ctx context.Context, tx *sqlx.Tx) (int, error) {
	var top int
	if err := tx.GetContext(ctx, &top, `SELECT COALESCE(MAX(version), 0) FROM ledger_layout FOR UPDATE`); err != nil {
		return 0, fmt.Errorf("lock ledger_layout: %w", err)
	}
	return top, nil
}

// TableEmpty says whether table holds no row on db.
func TableEmpty(ctx context.Context, db *sqlx.DB, table string) (bool, error) {
	var n int
	if err := db.GetContext(ctx, &n, "SELECT COUNT(*) FROM (SELECT 1 FROM `"+table+"` LIMIT 1) AS t"); err != nil {
		return false, fmt.Errorf("read %s: %w", table, err)
	}
	return n == 0, nil
}

// The live move's cursor (migration 00013, driver.MoveCursor): one row on
// the control server, read by every decision under a shared lock and
// changed by the mover's steps under an exclusive one.

// MoveCursor reads the cursor as committed (driver.Control.MoveCursor).
func (c *Control) MoveCursor(ctx context.Context) (driver.MoveCursor, error) {
	return readMoveCursor(ctx, c.sv.db, "")
}

func readMoveCursor(ctx context.Context, q sqlx.QueryerContext, lock string) (driver.MoveCursor, error) {
	var r struct {
		Version int    `db:"version"`
		Moving  bool   `db:"moving"`
		Moved   []byte `db:"moved_below"`
		Frozen  []byte `db:"frozen_below"`
		Next    []byte `db:"announced_below"`
		Mover   string `db:"mover"`
	}
	err := sqlx.GetContext(ctx, q, &r, `SELECT version, moving, moved_below, frozen_below, announced_below, mover FROM ledger_move_cursor WHERE singleton = 1`+lock)
	if NoSuchTable(err) {
		// A schema before migration 00013: no move since.
		return driver.MoveCursor{}, nil
	}
	if err != nil {
		return driver.MoveCursor{}, fmt.Errorf("read ledger_move_cursor: %w", err)
	}
	return driver.MoveCursor{Version: r.Version, Moving: r.Moving, MovedBelow: string(r.Moved), FrozenBelow: string(r.Frozen), AnnouncedBelow: string(r.Next), Mover: r.Mover}, nil
}

// AwaitStep records that instance waits for the step cur announces, with
// no checkpoint in flight (driver.Control.AwaitStep): one row per
// instance, the latest.
func (c *Control) AwaitStep(ctx context.Context, instance string, cur driver.MoveCursor) error {
	_, err := c.sv.db.ExecContext(ctx, `INSERT INTO ledger_move_waits (instance, version, moved_below, announced_below, waiting_since) VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6))
		ON DUPLICATE KEY UPDATE version = VALUES(version), moved_below = VALUES(moved_below), announced_below = VALUES(announced_below), waiting_since = VALUES(waiting_since)`,
		instance, cur.Version, []byte(cur.MovedBelow), []byte(cur.AnnouncedBelow))
	if err != nil {
		return fmt.Errorf("record the wait for the move's step: %w", err)
	}
	return nil
}

// StepWaiters lists the instances that wait for the step cur announces
// (AwaitStep), those that stopped among them.
func StepWaiters(ctx context.Context, db *sqlx.DB, cur driver.MoveCursor) ([]string, error) {
	var out []string
	err := db.SelectContext(ctx, &out, `SELECT instance FROM ledger_move_waits WHERE (version = ? AND moved_below = ? AND announced_below = ?) OR announced_below = '' ORDER BY instance`,
		cur.Version, []byte(cur.MovedBelow), []byte(cur.AnnouncedBelow))
	if err != nil {
		return nil, fmt.Errorf("read ledger_move_waits: %w", err)
	}
	return out, nil
}

// ForgetStepWaits deletes every instance's record of the step it waited
// for (at the end of a move).
func ForgetStepWaits(ctx context.Context, db *sqlx.DB) error {
	if _, err := db.ExecContext(ctx, `DELETE FROM ledger_move_waits`); err != nil {
		return fmt.Errorf("delete ledger_move_waits: %w", err)
	}
	return nil
}

// CountingInstances lists the instances that claimed a partition of the
// ledger (any group and topic) or committed a checkpoint of one within
// the last within (partition_offsets.updated_at, by the instances' clocks,
// which they keep near the control server's), but those that said they
// stopped (AwaitStep with no step: Sink.LeaveMove). An instance just
// started counts from its claim, before its first checkpoint.
func CountingInstances(ctx context.Context, db *sqlx.DB, within time.Duration) ([]string, error) {
	var out []string
	err := db.SelectContext(ctx, &out, `SELECT DISTINCT owner FROM partition_offsets
		WHERE updated_at > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AND owner <> ''
		AND owner NOT IN (SELECT instance FROM ledger_move_waits WHERE announced_below = '')
		ORDER BY owner`, within.Microseconds())
	if err != nil {
		return nil, fmt.Errorf("read the partitions' owners: %w", err)
	}
	return out, nil
}

// ChangeMoveCursor changes the cursor from was to next, in one transaction
// that takes the row's exclusive lock (waiting for the decisions that read
// it), and returns the commit log's last decided number as of its commit:
// every decision numbered up to it was taken under was (or before), every
// later one under next. It fails with driver.ErrMoveCursorMoved, changing
// nothing, when the stored cursor is not was.
func ChangeMoveCursor(ctx context.Context, db *sqlx.DB, was, next driver.MoveCursor) (decided int64, err error) {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }()
	if err := ChangeMoveCursorTx(ctx, tx, was, next); err != nil {
		return 0, err
	}
	// Under the row's lock every decision that read the old cursor has
	// committed (it held the shared lock to its COMMIT): the counter read
	// now, in this transaction's locking read, covers them all.
	if err := tx.GetContext(ctx, &decided, `SELECT last_seq FROM commit_sequence WHERE singleton = 1 FOR UPDATE`); err != nil {
		return 0, fmt.Errorf("read commit_sequence: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	return decided, nil
}

// ChangeMoveCursorTx changes the cursor from was to next in tx (see
// ChangeMoveCursor), holding its exclusive lock to tx's end.
func ChangeMoveCursorTx(ctx context.Context, tx *sqlx.Tx, was, next driver.MoveCursor) error {
	cur, err := readMoveCursor(ctx, tx, ` FOR UPDATE`)
	if err != nil {
		return err
	}
	if cur != was {
		return fmt.Errorf("%w: it is %+v", driver.ErrMoveCursorMoved, cur)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE ledger_move_cursor SET version = ?, moving = ?, moved_below = ?, frozen_below = ?, announced_below = ?, mover = ?, updated_at = UTC_TIMESTAMP(6) WHERE singleton = 1`,
		next.Version, next.Moving, []byte(next.MovedBelow), []byte(next.FrozenBelow), []byte(next.AnnouncedBelow), next.Mover); err != nil {
		return fmt.Errorf("update ledger_move_cursor: %w", err)
	}
	return nil
}

// NextKeyBound is the key rows places after from in table on db, ordered
// by key: the one that rows rows of table's keys from from on go before;
// found is false when fewer rows follow from.
func NextKeyBound(ctx context.Context, db *sqlx.DB, table, key, from string, rows int) (bound string, found bool, err error) {
	var b []byte
	err = db.GetContext(ctx, &b, fmt.Sprintf("SELECT `%s` FROM `%s` WHERE `%s` >= ? ORDER BY `%s` LIMIT 1 OFFSET %d", key, table, key, key, rows), []byte(from))
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read %s: %w", table, err)
	}
	return string(b), true, nil
}

// CommitSequence reads the commit log's last decided number.
func CommitSequence(ctx context.Context, db *sqlx.DB) (int64, error) {
	var n int64
	if err := db.GetContext(ctx, &n, `SELECT last_seq FROM commit_sequence WHERE singleton = 1`); err != nil {
		return 0, fmt.Errorf("read commit_sequence: %w", err)
	}
	return n, nil
}
