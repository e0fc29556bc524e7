package mysqldriver

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The result tables' SQL: account_balances, billing_windows,
// window_adjustments, ledger_entries. Every statement is portable between
// MySQL 8.4 and MariaDB 10.11: upserts use VALUES() in ON DUPLICATE KEY
// UPDATE (MySQL 8.4 warns 1287 and accepts it; its row alias does not
// exist on MariaDB).

// branchQuerier reads and writes inside a branch (Conn).
type branchQuerier interface {
	querier
	stmt.Execer
}

// upsertSQL returns the ON DUPLICATE KEY UPDATE clause that adds a delta to
// the given columns or, for absolute values read under a row lock, sets
// them.
func upsertSQL(absolute bool, cols ...string) string {
	var b strings.Builder
	b.WriteString(" ON DUPLICATE KEY UPDATE ")
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		if absolute {
			fmt.Fprintf(&b, "%s = VALUES(%s)", c, c)
		} else {
			fmt.Fprintf(&b, "%s = %s + VALUES(%s)", c, c, c)
		}
	}
	b.WriteString(", updated_at = VALUES(updated_at)")
	return b.String()
}

// Worst-case bytes of a result row besides its account id: the currency,
// two BIGINTs, one or two DATETIMEs and the tuple's text.
const resultRowBytes = 6*32 + 16

// The three ways a checkpoint writes a sums row (driver.Balance): adding
// its delta (an upsert), setting the absolute value read under a row lock
// (an upsert that sets), or inserting a row a locking read found absent (a
// plain INSERT, which fails as a duplicate if the row was created since).
type writeMode int

const (
	modeDelta writeMode = iota
	modeAbsolute
	modeNew
)

func (m writeMode) tail(cols ...string) string {
	if m == modeNew {
		return ""
	}
	return upsertSQL(m == modeAbsolute, cols...)
}

func modeOf(absolute, isNew bool) writeMode {
	switch {
	case isNew:
		return modeNew
	case absolute:
		return modeAbsolute
	}
	return modeDelta
}

var writeModes = []writeMode{modeDelta, modeAbsolute, modeNew}

// writeBalances writes delta rows with an adding upsert, absolute rows
// (seeded under a row lock) with a setting one, and new rows with a plain
// insert.
func writeBalances(ctx context.Context, ex stmt.Execer, rows []driver.Balance, now time.Time) error {
	for _, mode := range writeModes {
		var part []driver.Balance
		for _, r := range rows {
			if modeOf(r.Absolute, r.New) == mode {
				part = append(part, r)
			}
		}
		err := stmt.Insert(ctx, ex, len(part),
			`INSERT INTO account_balances (account_id, currency, balance_minor, event_count, updated_at) VALUES `,
			"(?,?,?,?,?)", mode.tail("balance_minor", "event_count"),
			func(i int) int { return stmt.ArgBytes(part[i].Account) + resultRowBytes },
			func(i int) []any {
				r := part[i]
				return []any{r.Account, r.Currency, r.Amount, r.Count, now}
			})
		if err != nil {
			return err
		}
	}
	return nil
}

// writeWindows is writeBalances for billing_windows, or for
// window_adjustments (the same columns). An adjustment row also records
// the checkpoint that last wrote it (checkpoint_id, set by every upsert),
// which readers join with the commit log (checkpoint_commits) to find the
// adjustments changed since a position; window rows do not (see migration
// 00006).
func writeWindows(ctx context.Context, ex stmt.Execer, table string, rows []driver.WindowSum, checkpoint string, now time.Time) error {
	cols, tuple := "", "(?,?,?,?,?,?)"
	onDup := func(m writeMode, c ...string) string { return m.tail(c...) }
	if table == tableAdjustments {
		cols, tuple = ", checkpoint_id", "(?,?,?,?,?,?,?)"
		onDup = func(m writeMode, c ...string) string {
			if m == modeNew {
				return ""
			}
			return m.tail(c...) + ", checkpoint_id = VALUES(checkpoint_id)"
		}
	}
	for _, mode := range writeModes {
		var part []driver.WindowSum
		for _, r := range rows {
			if modeOf(r.Absolute, r.New) == mode {
				part = append(part, r)
			}
		}
		err := stmt.Insert(ctx, ex, len(part),
			`INSERT INTO `+table+` (account_id, currency, window_start, amount_minor, event_count, updated_at`+cols+`) VALUES `,
			tuple, onDup(mode, "amount_minor", "event_count"),
			func(i int) int {
				if cols != "" {
					return stmt.ArgBytes(part[i].Account) + stmt.ArgBytes(checkpoint) + resultRowBytes
				}
				return stmt.ArgBytes(part[i].Account) + resultRowBytes
			},
			func(i int) []any {
				r := part[i]
				args := []any{r.Account, r.Currency, r.Start.UTC(), r.Amount, r.Count, now}
				if cols != "" {
					args = append(args, checkpoint)
				}
				return args
			})
		if err != nil {
			return err
		}
	}
	return nil
}

// The tables of window sums.
const (
	tableWindows     = "billing_windows"
	tableAdjustments = "window_adjustments"
)

const entryHead = `INSERT INTO ledger_entries (kafka_topic, kafka_partition, kafka_offset, entry, event_id, account_id, currency, amount_minor, occurred_at, window_start, late, revision, checkpoint_id, created_at) VALUES `

// A replay that meets an entry already stored (a group allowed to start
// over the ledger's topic) keeps the stored row: its offset names the same
// record.
const entryTail = ` ON DUPLICATE KEY UPDATE kafka_offset = kafka_offset`

// writeEntries writes one ledger_entries row per counted event and
// returns the keys of the rows another checkpoint had stored, which it
// kept. occurred_at is a DATETIME(6): the instant is sent truncated to the
// microsecond, as the column keeps it.
//
// A kept row counts 0 in the statement's affected rows (the connection
// does not ask for found rows, and the update sets a column to itself), an
// inserted one 1: only a write that affected fewer rows than it sent reads
// which ones were kept, by primary key under the lock the insert took.
func writeEntries(ctx context.Context, q branchQuerier, topic, checkpoint string, entries []driver.Entry, now time.Time) ([]driver.EntryKey, error) {
	fixed := stmt.ArgBytes(topic) + stmt.ArgBytes(checkpoint) + 4*stmt.ArgBytes(now) + 6*stmt.ArgBytes(int64(0)) + stmt.ArgBytes(true) + 36
	ex := &affected{Execer: q}
	err := stmt.Insert(ctx, ex, len(entries), entryHead, "(?,?,?,?,?,?,?,?,?,?,?,?,?,?)", entryTail,
		func(i int) int {
			return fixed + stmt.ArgBytes(entries[i].EventID) + stmt.ArgBytes(entries[i].Account)
		},
		func(i int) []any {
			e := &entries[i]
			return []any{topic, e.Partition, e.Offset, int8(e.Kind), e.EventID, e.Account, e.Currency, e.Amount,
				e.OccurredAt.Truncate(time.Microsecond), e.WindowStart, e.Late, e.Revision, checkpoint, now}
		})
	if err != nil || ex.rows == int64(len(entries)) {
		return nil, err
	}
	var kept []driver.EntryKey
	keptFixed := len(keptHead) + stmt.ArgBytes(topic) + stmt.ArgBytes(checkpoint) + 8
	err = stmt.Split(len(entries), keptFixed, q.MaxStatementBytes(), func(int) int { return len("(?,?,?),") + 3*stmt.ArgBytes(int64(0)) }, func(start, end int) error {
		part := entries[start:end]
		args := make([]any, 0, 2+3*len(part))
		args = append(args, topic, checkpoint)
		for _, e := range part {
			args = append(args, e.Partition, e.Offset, int8(e.Kind))
		}
		var rows []struct {
			Partition int32 `db:"kafka_partition"`
			Offset    int64 `db:"kafka_offset"`
			Kind      int8  `db:"entry"`
		}
		if err := q.Select(ctx, &rows, keptHead+strings.Repeat("(?,?,?),", len(part)-1)+`(?,?,?))`, args...); err != nil {
			return err
		}
		for _, r := range rows {
			kept = append(kept, driver.EntryKey{Topic: topic, Partition: r.Partition, Offset: r.Offset, Kind: driver.EntryKind(r.Kind)})
		}
		return nil
	})
	return kept, err
}

const keptHead = `SELECT kafka_partition, kafka_offset, entry FROM ledger_entries FORCE INDEX (PRIMARY) WHERE kafka_topic = ? AND checkpoint_id <> ? AND (kafka_partition, kafka_offset, entry) IN (`

// affected is an execer that adds up the rows its statements affected.
type affected struct {
	stmt.Execer
	rows int64
}

func (a *affected) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return a.count(a.Execer.Exec(ctx, query, args...))
}

// ExecPrepared keeps the prepared statements of full chunks (see
// stmt.Insert) when the execer has them.
func (a *affected) ExecPrepared(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if p, ok := a.Execer.(preparer); ok {
		return a.count(p.ExecPrepared(ctx, query, args...))
	}
	return a.count(a.Execer.Exec(ctx, query, args...))
}

func (a *affected) count(r sql.Result, err error) (sql.Result, error) {
	if err != nil {
		return r, err
	}
	n, err := r.RowsAffected()
	a.rows += n
	return r, err
}

// sealWindows sets closed_at on the open rows of the windows starting in
// [from, to) (from zero: every window before to), at most about max rows;
// it returns the rows it sealed, as they were, and whether none is left.
//
// The rows are found with locking reads by the index on (window_start,
// closed_at), never by an UPDATE with that condition: under READ
// COMMITTED an UPDATE skips rows that another transaction inserted and has
// not committed (semi-consistent read), while a locking read waits for
// them. Every write to these windows that can still commit was prepared
// before the frontier closed them (see package pipeline, eventtime.go), so
// after the wait the read sees it. The rows are then updated by primary
// key.
//
// The reads run backwards, window by window from the latest: a locking
// range scan also locks the record that ends it, and a forward scan below
// to would end on a row of the earliest open window, which the other
// branch of the same checkpoint may hold (a wait no server sees as a
// deadlock: the branches are separate transactions). A probe finds the
// latest window below the bound with an open row; its open rows are then
// exactly the index range (window_start, NULL), read backwards, which skips
// the rows already sealed and ends on a row of an earlier window.
func sealWindows(ctx context.Context, q branchQuerier, from, to time.Time, max int, now time.Time, images bool) ([]driver.WindowRow, bool, error) {
	cols := windowColumns
	if !images {
		cols = windowKeyColumns
	}
	var sealed []driver.WindowRow
	upper := to
	lower, args := "", []any{}
	if !from.IsZero() {
		lower, args = "window_start >= ? AND ", []any{from}
	}
	for len(sealed) < max {
		var w []time.Time
		err := q.Select(ctx, &w, `SELECT window_start FROM billing_windows FORCE INDEX (billing_windows_period)
			WHERE `+lower+`window_start < ? AND closed_at IS NULL ORDER BY window_start DESC LIMIT 1 FOR UPDATE`, append(slices.Clip(args), upper)...)
		if err != nil {
			return sealed, false, err
		}
		if len(w) == 0 {
			return sealed, true, nil
		}
		for len(sealed) < max {
			limit := min(stmt.MaxRows, max-len(sealed))
			var keys []windowRowSQL
			err := q.Select(ctx, &keys, `SELECT `+cols+` FROM billing_windows FORCE INDEX (billing_windows_period)
				WHERE window_start = ? AND closed_at IS NULL ORDER BY window_start DESC, closed_at DESC LIMIT `+fmt.Sprint(limit)+` FOR UPDATE`, w[0])
			if err != nil {
				return sealed, false, err
			}
			err = stmt.Split(len(keys), 256, q.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(keys[i].Account) + 80 }, func(start, end int) error {
				part := keys[start:end]
				args := []any{now, now}
				for _, k := range part {
					args = append(args, k.Account, k.Currency, k.Start)
				}
				_, err := q.Exec(ctx, `UPDATE billing_windows FORCE INDEX (PRIMARY) SET closed_at = ?, updated_at = ? WHERE (account_id, currency, window_start) IN (`+
					strings.Repeat("(?,?,?),", len(part)-1)+`(?,?,?))`, args...)
				return err
			})
			if err != nil {
				return sealed, false, err
			}
			for _, k := range keys {
				sealed = append(sealed, k.row())
			}
			if len(keys) < limit {
				break
			}
		}
		upper = w[0]
	}
	return sealed, false, nil
}

// deleteOldEntries deletes ledger_entries rows created before before, in
// statements of at most batch rows (short transactions, like the dedup
// cleanup), up to max rows; it returns how many it deleted.
func deleteOldEntries(ctx context.Context, db *sqlx.DB, before time.Time, batch, max int) (int64, error) {
	var total int64
	for total < int64(max) {
		r, err := db.ExecContext(ctx, `DELETE FROM ledger_entries WHERE created_at < ? ORDER BY created_at LIMIT ?`, before, min(batch, max-int(total)))
		if err != nil {
			return total, fmt.Errorf("ledger entries retention: %w", err)
		}
		n, _ := r.RowsAffected()
		total += n
		if n < int64(batch) {
			break
		}
	}
	return total, nil
}

// lockBalances locks and reads the stored balances of keys, whole
// (seeding, and the changelog's before images).
//
// Every locking statement here names the primary key: when the list covers
// much of a small table the optimizer prefers a full scan, and a locking
// scan waits on every row another branch of the same checkpoint has locked,
// a wait InnoDB cannot see as a deadlock (the branches are separate
// transactions): the checkpoint then hangs until the lock wait times out.
func lockBalances(ctx context.Context, q querier, keys []driver.BalanceKey, images bool) ([]driver.BalanceRow, error) {
	cols := balanceColumns
	if !images {
		cols = balanceSumColumns
	}
	if len(keys) == 0 {
		return nil, nil
	}
	var out []driver.BalanceRow
	err := stmt.Split(len(keys), 256, q.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(keys[i].Account) + 32 }, func(start, end int) error {
		part := keys[start:end]
		args := make([]any, 0, 2*len(part))
		for _, k := range part {
			args = append(args, k.Account, k.Currency)
		}
		var rows []balanceRowSQL
		q2 := `SELECT ` + cols + ` FROM account_balances FORCE INDEX (PRIMARY) WHERE (account_id, currency) IN (` +
			strings.Repeat("(?,?),", len(part)-1) + `(?,?)) FOR UPDATE`
		if err := q.Select(ctx, &rows, q2, args...); err != nil {
			return err
		}
		for _, r := range rows {
			out = append(out, r.row())
		}
		return nil
	})
	return out, err
}

// lockWindows locks and reads the stored rows of window keys, whole, in
// billing_windows; lockAdjustments in window_adjustments.
func lockWindows(ctx context.Context, q querier, keys []driver.WindowKey, images bool) ([]driver.WindowRow, error) {
	var out []driver.WindowRow
	cols := windowColumns
	if !images {
		cols = windowSumColumns
	}
	err := lockWindowKeys(ctx, q, tableWindows, cols, keys, func(sel func(dest any) error) error {
		var rows []windowRowSQL
		if err := sel(&rows); err != nil {
			return err
		}
		for _, r := range rows {
			out = append(out, r.row())
		}
		return nil
	})
	return out, err
}

func lockAdjustments(ctx context.Context, q querier, keys []driver.WindowKey, images bool) ([]driver.AdjustmentRow, error) {
	var out []driver.AdjustmentRow
	cols := adjustmentColumns
	if !images {
		cols = windowSumColumns
	}
	err := lockWindowKeys(ctx, q, tableAdjustments, cols, keys, func(sel func(dest any) error) error {
		var rows []adjustmentRowSQL
		if err := sel(&rows); err != nil {
			return err
		}
		for _, r := range rows {
			out = append(out, r.row())
		}
		return nil
	})
	return out, err
}

// lockWindowKeys runs the locking reads of window keys in table, as many
// statements as the budget needs, each read by scan.
func lockWindowKeys(ctx context.Context, q querier, table, columns string, keys []driver.WindowKey, scan func(sel func(dest any) error) error) error {
	if len(keys) == 0 {
		return nil
	}
	return stmt.Split(len(keys), 256, q.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(keys[i].Account) + 80 }, func(start, end int) error {
		part := keys[start:end]
		args := make([]any, 0, 3*len(part))
		for _, k := range part {
			args = append(args, k.Account, k.Currency, k.Start.UTC())
		}
		q2 := `SELECT ` + columns + ` FROM ` + table + ` FORCE INDEX (PRIMARY) WHERE (account_id, currency, window_start) IN (` +
			strings.Repeat("(?,?,?),", len(part)-1) + `(?,?,?)) FOR UPDATE`
		return scan(func(dest any) error { return q.Select(ctx, dest, q2, args...) })
	})
}

// The columns of each sums table, as read whole, and their rows as the
// driver scans them.
const (
	balanceColumns    = `account_id, currency, balance_minor, event_count, updated_at`
	windowColumns     = `account_id, currency, window_start, amount_minor, event_count, updated_at, closed_at`
	adjustmentColumns = `account_id, currency, window_start, amount_minor, event_count, updated_at, checkpoint_id`
	// Without images (Options.Images), what the checkpoint needs: the
	// sums, and the keys of the rows sealed.
	balanceSumColumns = `account_id, currency, balance_minor, event_count`
	windowSumColumns  = `account_id, currency, window_start, amount_minor, event_count`
	windowKeyColumns  = `account_id, currency, window_start`
)

type balanceRowSQL struct {
	Account   []byte    `db:"account_id"`
	Currency  string    `db:"currency"`
	Amount    int64     `db:"balance_minor"`
	Count     int64     `db:"event_count"`
	UpdatedAt time.Time `db:"updated_at"`
}

func (r balanceRowSQL) row() driver.BalanceRow {
	return driver.BalanceRow{BalanceKey: driver.BalanceKey{Account: string(r.Account), Currency: r.Currency}, Amount: r.Amount, Count: r.Count,
		UpdatedAt: r.UpdatedAt.UTC()}
}

type windowRowSQL struct {
	Account   []byte       `db:"account_id"`
	Currency  string       `db:"currency"`
	Start     time.Time    `db:"window_start"`
	Amount    int64        `db:"amount_minor"`
	Count     int64        `db:"event_count"`
	UpdatedAt time.Time    `db:"updated_at"`
	ClosedAt  sql.NullTime `db:"closed_at"`
}

func (r windowRowSQL) row() driver.WindowRow {
	return driver.WindowRow{WindowKey: driver.WindowKey{Account: string(r.Account), Currency: r.Currency, Start: r.Start.UTC()},
		Amount: r.Amount, Count: r.Count, UpdatedAt: r.UpdatedAt.UTC(), ClosedAt: utcOrZero(r.ClosedAt)}
}

type adjustmentRowSQL struct {
	Account    []byte    `db:"account_id"`
	Currency   string    `db:"currency"`
	Start      time.Time `db:"window_start"`
	Amount     int64     `db:"amount_minor"`
	Count      int64     `db:"event_count"`
	UpdatedAt  time.Time `db:"updated_at"`
	Checkpoint []byte    `db:"checkpoint_id"`
}

func (r adjustmentRowSQL) row() driver.AdjustmentRow {
	return driver.AdjustmentRow{WindowKey: driver.WindowKey{Account: string(r.Account), Currency: r.Currency, Start: r.Start.UTC()},
		Amount: r.Amount, Count: r.Count, UpdatedAt: r.UpdatedAt.UTC(), Checkpoint: string(r.Checkpoint)}
}

func utcOrZero(t sql.NullTime) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC()
}

// createdAt is the updated_at of a row a create inserted: an instant no
// checkpoint writes (a row created is written, with the checkpoint's
// time, before its branch is prepared, or the branch rolls back), by
// which a read tells the rows a create inserted from stored ones.
var createdAt = time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)

// sumsKey is a key of a sums table as a map key (a balance's without a
// start).
type sumsKey struct {
	account, currency string
	start             int64 // Unix microseconds
}

// sumsTable is one sums table as a create sees it: its key columns, and
// the keys to create, sorted.
type sumsTable struct {
	name, keyCols, tuple string
	n                    int
	key                  func(i int) sumsKey
	args                 func(i int) []any // the key's columns
	bytes                func(i int) int   // the key's bytes in a statement
	// scan reads the keys a select of keyCols found.
	scan func(sel func(dest any) error) ([]sumsKey, error)
}

// create locks the rows of t's keys in key order and inserts the missing
// ones at zero; it returns the indexes of the keys it inserted. A plain
// read first finds the keys without a row: with none (a row is never
// deleted) nothing is written, and the locking read that follows takes
// every lock in order. Otherwise one upsert whose update changes nothing
// goes over every key in order (a stored row is locked and counts 0 in
// the affected rows, an inserted one 1): when it inserted as many rows as
// the read found missing it inserted exactly those (the others existed
// already); else (another branch inserted one meanwhile) the rows it
// inserted are read back by their mark.
func create(ctx context.Context, q branchQuerier, t sumsTable) ([]int, error) {
	stored := map[sumsKey]bool{}
	if err := selectSumsKeys(ctx, q, t, "", nil, stored); err != nil {
		return nil, err
	}
	var missing []int
	for i := range t.n {
		if !stored[t.key(i)] {
			missing = append(missing, i)
		}
	}
	if len(missing) == 0 {
		return nil, nil
	}
	zero := strings.TrimSuffix(t.tuple, ")") + ",0,0,?)"
	amount := "amount_minor"
	if t.name == "account_balances" {
		amount = "balance_minor"
	}
	ex := &affected{Execer: q}
	err := stmt.Insert(ctx, ex, t.n, `INSERT INTO `+t.name+` (`+t.keyCols+`, `+amount+`, event_count, updated_at) VALUES `,
		zero, ` ON DUPLICATE KEY UPDATE `+amount+` = `+amount,
		func(i int) int { return t.bytes(i) + resultRowBytes },
		func(i int) []any { return append(t.args(i), createdAt) })
	switch {
	case err != nil || ex.rows == 0:
		return nil, err
	case ex.rows == int64(len(missing)):
		return missing, nil
	}
	mine := map[sumsKey]bool{}
	if err := selectSumsKeys(ctx, q, t, ` AND updated_at = ?`, []any{createdAt}, mine); err != nil {
		return nil, err
	}
	var created []int
	for _, i := range missing {
		if mine[t.key(i)] {
			created = append(created, i)
		}
	}
	return created, nil
}

// selectSumsKeys adds to found the keys of t with a row, as this branch sees
// them (a plain read, no lock), that meet the condition where.
func selectSumsKeys(ctx context.Context, q branchQuerier, t sumsTable, where string, args []any, found map[sumsKey]bool) error {
	return stmt.Split(t.n, 256, q.MaxStatementBytes(), func(i int) int { return t.bytes(i) + 32 }, func(start, end int) error {
		var all []any
		for i := start; i < end; i++ {
			all = append(all, t.args(i)...)
		}
		keys, err := t.scan(func(dest any) error {
			return q.Select(ctx, dest, `SELECT `+t.keyCols+` FROM `+t.name+` FORCE INDEX (PRIMARY) WHERE (`+t.keyCols+`) IN (`+
				strings.Repeat(t.tuple+",", end-start-1)+t.tuple+`)`+where, append(all, args...)...)
		})
		for _, k := range keys {
			found[k] = true
		}
		return err
	})
}

// createBalances locks the balances of keys in key order, inserting the
// missing ones at zero (create), and reads them all under the locks it
// holds; it returns the rows and the keys it inserted.
func createBalances(ctx context.Context, q branchQuerier, keys []driver.BalanceKey, images bool) ([]driver.BalanceRow, []driver.BalanceKey, error) {
	keys = slices.SortedFunc(slices.Values(keys), func(a, b driver.BalanceKey) int {
		return cmp.Or(strings.Compare(a.Account, b.Account), strings.Compare(a.Currency, b.Currency))
	})
	idx, err := create(ctx, q, sumsTable{name: "account_balances", keyCols: "account_id, currency", tuple: "(?,?)", n: len(keys),
		key:   func(i int) sumsKey { return sumsKey{keys[i].Account, keys[i].Currency, 0} },
		args:  func(i int) []any { return []any{keys[i].Account, keys[i].Currency} },
		bytes: func(i int) int { return stmt.ArgBytes(keys[i].Account) },
		scan: func(sel func(dest any) error) ([]sumsKey, error) {
			var rows []balanceRowSQL
			err := sel(&rows)
			out := make([]sumsKey, len(rows))
			for i, r := range rows {
				out[i] = sumsKey{string(r.Account), r.Currency, 0}
			}
			return out, err
		}})
	if err != nil {
		return nil, nil, err
	}
	var created []driver.BalanceKey
	for _, i := range idx {
		created = append(created, keys[i])
	}
	rows, err := lockBalances(ctx, q, keys, images)
	return rows, created, err
}

// createWindowKeys is create for billing_windows or window_adjustments
// (a created adjustment's checkpoint_id is NULL until it is written).
func createWindowKeys(ctx context.Context, q branchQuerier, table string, keys []driver.WindowKey) ([]driver.WindowKey, []driver.WindowKey, error) {
	keys = slices.SortedFunc(slices.Values(keys), func(a, b driver.WindowKey) int {
		return cmp.Or(strings.Compare(a.Account, b.Account), strings.Compare(a.Currency, b.Currency), a.Start.Compare(b.Start))
	})
	idx, err := create(ctx, q, sumsTable{name: table, keyCols: windowKeyColumns, tuple: "(?,?,?)", n: len(keys),
		key:   func(i int) sumsKey { return sumsKey{keys[i].Account, keys[i].Currency, keys[i].Start.UnixMicro()} },
		args:  func(i int) []any { return []any{keys[i].Account, keys[i].Currency, keys[i].Start.UTC()} },
		bytes: func(i int) int { return stmt.ArgBytes(keys[i].Account) + 48 },
		scan: func(sel func(dest any) error) ([]sumsKey, error) {
			var rows []windowRowSQL
			err := sel(&rows)
			out := make([]sumsKey, len(rows))
			for i, r := range rows {
				out[i] = sumsKey{string(r.Account), r.Currency, r.Start.UnixMicro()}
			}
			return out, err
		}})
	var created []driver.WindowKey
	for _, i := range idx {
		created = append(created, keys[i])
	}
	return keys, created, err
}

// createWindows and createAdjustments are createBalances for
// billing_windows and window_adjustments.
func createWindows(ctx context.Context, q branchQuerier, keys []driver.WindowKey, images bool) ([]driver.WindowRow, []driver.WindowKey, error) {
	keys, created, err := createWindowKeys(ctx, q, tableWindows, keys)
	if err != nil {
		return nil, nil, err
	}
	rows, err := lockWindows(ctx, q, keys, images)
	return rows, created, err
}

func createAdjustments(ctx context.Context, q branchQuerier, keys []driver.WindowKey, images bool) ([]driver.AdjustmentRow, []driver.WindowKey, error) {
	keys, created, err := createWindowKeys(ctx, q, tableAdjustments, keys)
	if err != nil {
		return nil, nil, err
	}
	rows, err := lockAdjustments(ctx, q, keys, images)
	return rows, created, err
}
