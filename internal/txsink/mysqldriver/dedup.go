package mysqldriver

import (
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

// The SQL of the dedup key tables: one per generation in rotation
// (KeyTableNames; package dedup for the model, driver.Generation for the
// rotation), and the expiry journal of the version before generations
// (dedup_expiry), only ever checked and emptied now.
//
// Claims rest on affected rows counting changed rows only: OpenDB turns
// CLIENT_FOUND_ROWS off, so that an existing key "updated" to itself
// counts 0 and a statement that inserted all its rows proves all its ids
// new.

// KeyTableNames are the dedup key tables by driver.Generation.Table:
// dedup_keys is generation 0's, the table of the version before
// generations (its keys drain by age with generation 0's).
var KeyTableNames = [driver.KeyTables]string{"dedup_keys", "dedup_keys_g1", "dedup_keys_g2"}

// JournalTable is the expiry journal of the version before generations.
const JournalTable = "dedup_expiry"

func keyTable(g driver.Generation) string { return KeyTableNames[g.Table()] }

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

// selectPreparer is a querier that can run a query through a server-side
// prepared statement it keeps (Conn.SelectPrepared).
type selectPreparer interface {
	SelectPrepared(ctx context.Context, dest any, query string, args ...any) error
}

type keyRow struct {
	ID          []byte    `db:"event_id"`
	Fingerprint []byte    `db:"fingerprint"`
	ExpiresAt   time.Time `db:"expires_at"`
	Version     []byte    `db:"version"` // NULL: a key stored before versions
}

func (r keyRow) key() driver.DedupKey {
	k := driver.DedupKey{ID: string(r.ID), ExpiresAt: r.ExpiresAt, Version: string(r.Version)}
	copy(k.Fingerprint[:], r.Fingerprint)
	return k
}

// selectKeys reads the rows of ids in table, in statements within q's
// budget, suffix after each (a locking clause, or nothing); full
// statements run prepared where q can.
func selectKeys(ctx context.Context, q querier, table string, ids []string, suffix string) ([]driver.DedupKey, error) {
	head := `SELECT event_id, fingerprint, expires_at, version FROM ` + table + ` WHERE event_id IN ()`
	var out []driver.DedupKey
	err := stmt.Split(len(ids), len(head)+len(suffix), q.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(ids[i]) }, func(start, end int) error {
		part := ids[start:end]
		args := make([]any, len(part))
		for i, id := range part {
			args[i] = id
		}
		query := `SELECT event_id, fingerprint, expires_at, version FROM ` + table + ` WHERE event_id IN (` + placeholders(len(part)) + `)` + suffix
		got, err := readKeyRows(ctx, q, query, args)
		out = append(out, got...)
		return err
	})
	return out, err
}

// readKeyRows runs one SELECT of key rows; a statement of stmt.MaxRows
// ids (the shape every full one has) runs prepared where q can.
func readKeyRows(ctx context.Context, q querier, query string, args []any) ([]driver.DedupKey, error) {
	sel := q.Select
	if p, ok := q.(selectPreparer); ok && len(args) == stmt.MaxRows {
		sel = p.SelectPrepared
	}
	var rows []keyRow
	if err := sel(ctx, &rows, query, args...); err != nil {
		return nil, err
	}
	out := make([]driver.DedupKey, len(rows))
	for i, r := range rows {
		out[i] = r.key()
	}
	return out, nil
}

// lookupKeys reads the stored rows of ids in generation g's table,
// expired ones included, with a consistent (non-locking) read of the
// committed rows. Run after a claim, on its contested ids: the claim's row
// locks keep every stored row it met as it was until the checkpoint ends,
// and the ids it inserted itself are not visible to the read (and so
// count as new).
func lookupKeys(ctx context.Context, q querier, g driver.Generation, ids []string) ([]driver.DedupKey, error) {
	out, err := selectKeys(ctx, q, keyTable(g), ids, "")
	if err != nil {
		return nil, fmt.Errorf("dedup lookup: %w", err)
	}
	return out, nil
}

// lockKeys reads the stored rows of ids in generation g's table under
// shared locks (driver.StoreTx.LockKeys), in id order. Under READ
// COMMITTED a locking read of an id another transaction has inserted and
// not committed waits for it (the record carries that transaction's
// implicit lock), and one of an id nobody holds locks nothing (no gap
// locks): a claim that runs it after inserting its own keys sees every key
// that a concurrent claim inserted first. LOCK IN SHARE MODE is accepted
// by MySQL 8.4 (a synonym of FOR SHARE) and is MariaDB 10.11's only
// spelling.
func lockKeys(ctx context.Context, q querier, g driver.Generation, ids []string) ([]driver.DedupKey, error) {
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	table := keyTable(g)
	var out []driver.DedupKey
	err := splitPoints(q, len(`SELECT d.event_id, d.fingerprint, d.expires_at, d.version FROM `+pointsOf(table, 0)+` LOCK IN SHARE MODE`), ids, func(part []any) error {
		query := `SELECT d.event_id, d.fingerprint, d.expires_at, d.version FROM ` + pointsOf(table, len(part)) + ` LOCK IN SHARE MODE`
		got, err := readKeyRows(ctx, q, query, part)
		out = append(out, got...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dedup read of generation %d: %w", g, err)
	}
	return out, nil
}

// pointsOf is the join that visits the rows of n ids in table (alias d)
// one by one, by primary key (eq_ref from a derived table of the ids, the
// ids first: STRAIGHT_JOIN), so that a locking statement locks exactly the
// rows of its ids. With WHERE event_id IN (...) the server may scan a
// range or the whole index instead (it does on a small table, as a
// generation's is just after its table was emptied) and lock rows of
// other ids in passing, there the uncommitted inserts of other branches:
// two branches of one checkpoint that unclaim interleaved ids then
// deadlock (seen on MariaDB 10.11 with 50 rows and 25 ids each).
func pointsOf(table string, n int) string {
	var b strings.Builder
	b.WriteString(`(SELECT ? AS id`)
	for range n - 1 {
		b.WriteString(pointTuple)
	}
	b.WriteString(`) AS k STRAIGHT_JOIN ` + table + ` AS d FORCE INDEX (PRIMARY) ON d.event_id = k.id`)
	return b.String()
}

const pointTuple = ` UNION ALL SELECT ?`

// splitPoints cuts ids into statements of pointsOf within q's budget,
// fixed bytes besides the ids.
func splitPoints(q interface{ MaxStatementBytes() int }, fixed int, ids []string, fn func(part []any) error) error {
	return stmt.Split(len(ids), fixed, q.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(ids[i]) + len(pointTuple) },
		func(start, end int) error {
			part := make([]any, end-start)
			for i, id := range ids[start:end] {
				part[i] = id
			}
			return fn(part)
		})
}

// claimKeys inserts keys into generation g's table and leaves every row
// that already exists untouched, one statement per chunk; it returns the
// ids of every chunk that inserted fewer rows than it holds
// (driver.StoreTx.ClaimKeys). Keys are written in id order, as
// replaceKeys does.
func claimKeys(ctx context.Context, ex stmt.Execer, g driver.Generation, keys []driver.DedupKey) ([]driver.Contested, error) {
	slices.SortFunc(keys, func(a, b driver.DedupKey) int { return strings.Compare(a.ID, b.ID) })
	// An existing row is "updated" to itself: 0 affected rows (no
	// CLIENT_FOUND_ROWS); unlike INSERT IGNORE, no error is downgraded.
	const onDup = ` ON DUPLICATE KEY UPDATE event_id = event_id`
	table := keyTable(g)
	var suspects []driver.Contested
	err := splitKeys(ex, table, keys, onDup, func(part []driver.DedupKey) error {
		query, args := insertKeys(table, part, onDup)
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
			c := driver.Contested{IDs: make([]string, len(part)), Stored: len(part) - int(n)}
			for i, in := range part {
				c.IDs[i] = in.ID
			}
			suspects = append(suspects, c)
		}
		return nil
	})
	return suspects, err
}

// unclaimKeys deletes keys of generation g that this checkpoint claimed
// but does not keep (the event became a dead letter, or is a repeat of a
// key of an earlier generation).
func unclaimKeys(ctx context.Context, ex stmt.Execer, g driver.Generation, ids []string) error {
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	table := keyTable(g)
	return splitPoints(ex, len(`DELETE d FROM `+pointsOf(table, 0)), ids, func(part []any) error {
		if _, err := ex.Exec(ctx, `DELETE d FROM `+pointsOf(table, len(part)), part...); err != nil {
			return fmt.Errorf("dedup unclaim: %w", err)
		}
		return nil
	})
}

// replaceKeys writes keys that replace expired rows of generation g's
// table (claims write the new ones), deleting the expired rows first, in
// id order so that concurrent checkpoints lock in one order.
func replaceKeys(ctx context.Context, ex stmt.Execer, g driver.Generation, keys []driver.DedupKey, now time.Time) error {
	slices.SortFunc(keys, func(a, b driver.DedupKey) int { return strings.Compare(a.ID, b.ID) })
	table := keyTable(g)
	replace := make([]any, len(keys))
	for i, k := range keys {
		replace[i] = k.ID
	}
	err := stmt.Split(len(replace), len(deleteExpired(table, 1))+stmt.ArgBytes(now), ex.MaxStatementBytes(),
		func(i int) int { return stmt.ArgBytes(replace[i]) }, func(start, end int) error {
			part := replace[start:end]
			args := append(part[:len(part):len(part)], now)
			if _, err := ex.Exec(ctx, deleteExpired(table, len(part)), args...); err != nil {
				return fmt.Errorf("dedup replace expired: %w", err)
			}
			return nil
		})
	if err != nil {
		return err
	}
	return splitKeys(ex, table, keys, "", func(part []driver.DedupKey) error {
		query, args := insertKeys(table, part, "")
		if _, err := ex.Exec(ctx, query, args...); err != nil {
			return fmt.Errorf("dedup insert: %w", err)
		}
		return nil
	})
}

// updateKeys sets the fingerprint, expiry and version of keys stored in
// generation g's table (driver.StoreTx.UpdateKeys), in id order, as an
// upsert of many keys per statement.
func updateKeys(ctx context.Context, ex stmt.Execer, g driver.Generation, keys []driver.DedupKey) error {
	slices.SortFunc(keys, func(a, b driver.DedupKey) int { return strings.Compare(a.ID, b.ID) })
	const onDup = ` ON DUPLICATE KEY UPDATE fingerprint = VALUES(fingerprint), expires_at = VALUES(expires_at), version = VALUES(version)`
	table := keyTable(g)
	return splitKeys(ex, table, keys, onDup, func(part []driver.DedupKey) error {
		query, args := insertKeys(table, part, onDup)
		if _, err := ex.Exec(ctx, query, args...); err != nil {
			return fmt.Errorf("dedup update: %w", err)
		}
		return nil
	})
}

// splitKeys cuts keys into statements of insertKeys within ex's budget.
func splitKeys(ex stmt.Execer, table string, keys []driver.DedupKey, suffix string, fn func(part []driver.DedupKey) error) error {
	return stmt.Split(len(keys), len(insertHead(table))+len(suffix), ex.MaxStatementBytes(),
		func(i int) int {
			return stmt.RowBytes(insertTuple, keys[i].ID, keys[i].Fingerprint[:], keys[i].ExpiresAt, versionArg(keys[i].Version))
		},
		func(start, end int) error { return fn(keys[start:end]) })
}

// emptyLockWait bounds, in seconds, how long emptying a table waits for
// the metadata lock: every transaction that touched the table holds it
// until it ends (a prepared XA branch until it is resolved), and while
// TRUNCATE waits, new statements on that table queue behind it. One
// second is the least MySQL's lock_wait_timeout takes (MariaDB also has
// TRUNCATE ... WAIT n / NOWAIT; MySQL does not). The table emptied is one
// no claim reads any more (dedup.ClaimAt; but generation 0's, read until
// emptied, in the upgrade's first cycle), so what it waits for is a
// straggler: a checkpoint that claimed under the generation before, and
// whose decision will be refused (ErrKeysMoved), or one decided and
// committing; the upkeep tries again at its next pass.
const emptyLockWait = 1

// emptyKeys empties generation g's table with TRUNCATE TABLE (DDL: it
// needs DROP on the table; it is logged as one statement, not a row per
// key), on a connection of the cleanup pool whose lock_wait_timeout is
// set to emptyLockWait for the statement and set back after. Generation
// 0's table is dedup_keys, where the version before generations wrote its
// keys and their journal: it is emptied only when no journal row expires
// after journalDue, and the journal with it.
func emptyKeys(ctx context.Context, db *sqlx.DB, g driver.Generation, journalDue time.Time) error {
	conn, err := db.Connx(ctx)
	if err != nil {
		return fmt.Errorf("empty %s: %w", keyTable(g), err)
	}
	defer conn.Close()
	tables := []string{keyTable(g)}
	if g.Table() == 0 {
		var live []int
		if err := conn.SelectContext(ctx, &live, `SELECT 1 FROM `+JournalTable+` WHERE expires_at > ? LIMIT 1`, journalDue); err != nil {
			return fmt.Errorf("empty %s: read %s: %w", keyTable(g), JournalTable, err)
		}
		if len(live) > 0 {
			return fmt.Errorf("empty %s: %w", keyTable(g), driver.ErrKeysLive)
		}
		tables = append(tables, JournalTable)
	}
	if _, err := conn.ExecContext(ctx, fmt.Sprintf(`SET SESSION lock_wait_timeout = %d`, emptyLockWait)); err != nil {
		discard(conn)
		return fmt.Errorf("empty %s: %w", keyTable(g), err)
	}
	for _, t := range tables {
		if _, err := conn.ExecContext(ctx, `TRUNCATE TABLE `+t); err != nil {
			discard(conn)
			return fmt.Errorf("empty %s: %w", t, err)
		}
	}
	if _, err := conn.ExecContext(ctx, `SET SESSION lock_wait_timeout = DEFAULT`); err != nil {
		discard(conn)
	}
	return nil
}

// insertHead and insertTuple make the statement that inserts keys into a
// table: insertHead, one insertTuple per key.
func insertHead(table string) string {
	return `INSERT INTO ` + table + ` (event_id, fingerprint, expires_at, version) VALUES `
}

const insertTuple = "(?,?,?,?)"

// versionArg is a key's version as its column takes it: no version is
// NULL (a key stored before versions reads back the same).
func versionArg(v string) any {
	if v == "" {
		return nil
	}
	return []byte(v)
}

// insertKeys is the statement that inserts keys into table, one row each,
// followed by suffix, and its arguments.
func insertKeys(table string, keys []driver.DedupKey, suffix string) (string, []any) {
	var b strings.Builder
	b.WriteString(insertHead(table))
	args := make([]any, 0, 4*len(keys))
	for i, in := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(insertTuple)
		args = append(args, in.ID, in.Fingerprint[:], in.ExpiresAt, versionArg(in.Version))
	}
	b.WriteString(suffix)
	return b.String(), args
}

// deleteExpired deletes n keys of table (the arguments, then the time) if
// they are expired at that time. It names the primary key (multi-table
// form: single-table DELETE takes no index hint): a scan would wait on
// rows that other branches hold.
func deleteExpired(table string, n int) string {
	return `DELETE d FROM ` + table + ` AS d FORCE INDEX (PRIMARY) WHERE d.event_id IN (` + placeholders(n) + `) AND d.expires_at <= ?`
}

// DecodeJournal splits a journal row's event_ids (each id preceded by its
// length in one byte, as the version before generations wrote them) into
// the ids.
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
