package mysqldriver

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Control is the control server's bookkeeping (driver.Control): the SQL of
// ledger_identity, partition_offsets, checkpoint_decisions,
// window_frontier and the commit log (commit_sequence, checkpoint_commits)
// lives here and nowhere else; that of dedup_generations, in
// generations.go.
type Control struct {
	sv *Server
}

var _ driver.Control = (*Control)(nil)

// DB is the control server's pool.
func (c *Control) DB() *sqlx.DB { return c.sv.db }

// Identity reads the ledger's identity, inserting the one new makes if
// there is none: of instances starting together, the first insert wins and
// everyone reads it.
func (c *Control) Identity(ctx context.Context, new func() (string, []byte)) (string, []byte, error) {
	id, secret := new()
	if _, err := c.sv.db.ExecContext(ctx, `INSERT IGNORE INTO ledger_identity (singleton, ledger_id, secret, created_at) VALUES (1, ?, ?, ?)`,
		id, secret, time.Now().UTC()); err != nil {
		return "", nil, err
	}
	var row struct {
		ID     string `db:"ledger_id"`
		Secret []byte `db:"secret"`
	}
	if err := c.sv.db.GetContext(ctx, &row, `SELECT ledger_id, secret FROM ledger_identity WHERE singleton = 1`); err != nil {
		return "", nil, err
	}
	return row.ID, row.Secret, nil
}

const insertDecision = `INSERT INTO checkpoint_decisions (gtrid, outcome, decided_by, decided_at) VALUES (?, ?, ?, ?)`

// Decide inserts d unless a decision exists (the primary key is the
// compare-and-set) and returns the one that holds. A concurrent insert of
// the same gtrid makes it wait for that transaction, then report a
// duplicate: the winner is then read.
func (c *Control) Decide(ctx context.Context, d driver.Decision) (driver.Outcome, error) {
	for {
		_, err := c.sv.db.ExecContext(ctx, insertDecision, d.Gtrid, string(d.Outcome), d.By, d.At)
		if err == nil {
			return d.Outcome, nil
		}
		if Code(err) != driver.Duplicate {
			return "", err
		}
		o, found, err := c.Lookup(ctx, d.Gtrid)
		if err != nil {
			return "", err
		}
		if found {
			return o, nil
		}
		// Deleted in between by housekeeping: insert again.
	}
}

// Lookup reads the decision of gtrid.
func (c *Control) Lookup(ctx context.Context, gtrid string) (driver.Outcome, bool, error) {
	var o []string
	if err := c.sv.db.SelectContext(ctx, &o, `SELECT outcome FROM checkpoint_decisions WHERE gtrid = ?`, gtrid); err != nil {
		return "", false, err
	}
	if len(o) == 0 {
		return "", false, nil
	}
	return driver.Outcome(o[0]), true, nil
}

// Commit is the commit point (driver.Control.Commit), one local
// transaction: the partition rows are locked by primary key in one
// statement (or as few as the budget allows), checked by fence, updated,
// then the frontier row is locked, checked and raised, the decision
// inserted, with keys the generations' row is read under a shared lock
// and checked, and last the commit log's counter is locked and the
// decision appended to the commit log. Every decision locks partition rows
// before the frontier row, then the generations' row, and the counter
// after all: one lock order (the generations' row is only ever taken
// exclusively without waiting, so no decision waits for it long). The
// counter is held from its increment to the COMMIT, so decisions commit
// in the order of their numbers (see appendCommit).
func (c *Control) Commit(ctx context.Context, d driver.Decision, s driver.Scope, cuts []driver.Cut, fence func([]driver.Stored) error, f *driver.FrontierChange, keys *driver.Generation, layout func(driver.MoveCursor) error, applied bool) (seq int64, err error) {
	tx, err := c.sv.db.BeginTxx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if len(cuts) > 0 {
		parts := make([]int32, len(cuts))
		for i, cut := range cuts {
			parts[i] = cut.Partition
		}
		stored, err := c.read(ctx, tx, s, parts, " FOR UPDATE")
		if err != nil {
			return 0, err
		}
		rows := make([]driver.Stored, 0, len(stored))
		for _, r := range stored {
			rows = append(rows, r)
		}
		if err := fence(rows); err != nil {
			return 0, err
		}
		now := d.At
		err = c.upsert(ctx, tx, len(cuts), func(i int) []any {
			r := stored[cuts[i].Partition]
			// follower_epoch NULL: a decision does not create rows (its
			// fence found them), and one it did would be fenced by a move.
			return []any{s.Group, s.Topic, cuts[i].Partition, cuts[i].NextOffset, nullTime(cuts[i].Watermark), cuts[i].CaughtUp, r.Owner, r.Epoch, nil, now}
		}, ` ON DUPLICATE KEY UPDATE next_offset = VALUES(next_offset), `+
			// The watermark never goes back; a cut without one keeps it.
			`watermark = CASE WHEN VALUES(watermark) IS NULL THEN watermark WHEN watermark IS NULL OR VALUES(watermark) > watermark THEN VALUES(watermark) ELSE watermark END, `+
			`caught_up = VALUES(caught_up), updated_at = VALUES(updated_at)`)
		if err != nil {
			return 0, err
		}
	}
	var sealed time.Time
	if f != nil {
		fr, err := c.raiseFrontier(ctx, tx, f, d.At)
		if err != nil {
			return 0, err
		}
		sealed = fr.Sealed
	}
	if keys != nil {
		if err := checkGenerations(ctx, tx, *keys); err != nil {
			return 0, err
		}
	}
	if layout != nil {
		cur, err := readMoveCursor(ctx, tx, ` LOCK IN SHARE MODE`)
		if err != nil {
			return 0, err
		}
		if err := layout(cur); err != nil {
			return 0, err
		}
	}
	_, err = tx.ExecContext(ctx, insertDecision, d.Gtrid, string(d.Outcome), d.By, d.At)
	if Code(err) == driver.Duplicate {
		return 0, driver.ErrDecided
	}
	if err != nil {
		return 0, err
	}
	if seq, err = appendCommit(ctx, tx, d.Gtrid, applied, sealed, d.Changelog); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("%w: %w", driver.ErrAmbiguous, err)
	}
	return seq, nil
}

// appendCommit takes the next sequence number and appends the decision of
// gtrid to the commit log, inside the decision's transaction. The UPDATE
// locks the counter row until the transaction ends: a concurrent decision
// waits there, then reads the committed counter, so the numbers are
// allocated in the order in which the decisions commit, and a decision
// that rolls back gives its number back. LAST_INSERT_ID(expr) returns the
// new value with the UPDATE's answer (one round trip under the lock
// instead of two), on MySQL and MariaDB alike. The same UPDATE refuses a
// checkpoint built without the changelog while the ledger's is on (the
// flag the enabling set under this lock, migration 00007): no round trip
// of its own.
func appendCommit(ctx context.Context, tx *sqlx.Tx, gtrid string, applied bool, sealed time.Time, changelog bool) (int64, error) {
	r, err := tx.ExecContext(ctx, `UPDATE commit_sequence SET last_seq = LAST_INSERT_ID(last_seq + 1) WHERE singleton = 1 AND (changelog = FALSE OR ?)`, changelog)
	if err != nil {
		return 0, err
	}
	if n, err := r.RowsAffected(); err != nil {
		return 0, err
	} else if n != 1 {
		return 0, counterRefusal(ctx, tx)
	}
	seq, err := r.LastInsertId()
	if err != nil {
		return 0, err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO checkpoint_commits (commit_seq, checkpoint_id, committed_at, applied_at, sealed_before)
		VALUES (?, ?, UTC_TIMESTAMP(6), IF(?, UTC_TIMESTAMP(6), NULL), ?)`, seq, gtrid, applied, nullTime(sealed))
	return seq, err
}

// MarkApplied sets applied_at on the commit log rows of gtrids not applied
// yet. It reaches them by checkpoint_id's unique index, forced: left to
// itself, the optimizer picks the index on applied_at when it estimates
// one unapplied row, and that range scan locks every unapplied row and
// the gap after them. That blocked every decision's append meanwhile
// (its unapplied entry goes into that gap), and two markings by the two
// paths (unique index then row, or applied_at entry then row) took the
// same row's two locks in opposite orders: a deadlock, seen on MariaDB
// 10.11 with eight concurrent coordinators.
func (c *Control) MarkApplied(ctx context.Context, gtrids []string) (int64, error) {
	var n int64
	err := c.chunks(len(gtrids), 128, func(i int) int { return stmt.ArgBytes(gtrids[i]) }, func(start, end int) error {
		args := make([]any, end-start)
		for i, g := range gtrids[start:end] {
			args[i] = g
		}
		r, err := c.sv.db.ExecContext(ctx, markAppliedQuery(end-start), args...)
		if err != nil {
			return err
		}
		k, _ := r.RowsAffected()
		n += k
		return nil
	})
	return n, err
}

// markAppliedQuery marks n gtrids applied (MarkApplied).
func markAppliedQuery(n int) string {
	return `UPDATE checkpoint_commits FORCE INDEX (checkpoint_commits_checkpoint) SET applied_at = UTC_TIMESTAMP(6)
		WHERE checkpoint_id IN (` + placeholders(n) + `) AND applied_at IS NULL`
}

// Commits lists commit log rows from sequence number from on, in order;
// the unapplied ones are found by the index on applied_at. Ages are by the
// control server's clock.
func (c *Control) Commits(ctx context.Context, from int64, unapplied bool, limit int) ([]driver.CommitRecord, error) {
	cond := ""
	if unapplied {
		cond = " AND applied_at IS NULL"
	}
	var rows []struct {
		Seq     int64        `db:"commit_seq"`
		Gtrid   string       `db:"checkpoint_id"`
		At      time.Time    `db:"committed_at"`
		AgeUS   int64        `db:"age_us"`
		Applied bool         `db:"applied"`
		Sealed  sql.NullTime `db:"sealed_before"`
	}
	err := c.sv.db.SelectContext(ctx, &rows, `SELECT commit_seq, checkpoint_id, committed_at,
		TIMESTAMPDIFF(MICROSECOND, committed_at, UTC_TIMESTAMP(6)) AS age_us, applied_at IS NOT NULL AS applied, sealed_before
		FROM checkpoint_commits WHERE commit_seq >= ?`+cond+` ORDER BY commit_seq LIMIT ?`, from, limit)
	out := make([]driver.CommitRecord, len(rows))
	for i, r := range rows {
		out[i] = driver.CommitRecord{Seq: r.Seq, Gtrid: r.Gtrid, CommittedAt: r.At, Age: time.Duration(r.AgeUS) * time.Microsecond,
			Applied: r.Applied, SealedBefore: r.Sealed.Time}
	}
	return out, err
}

// CommitPositionQuery reads the commit log's position (driver.CommitPosition)
// in one statement, hence one read view on MySQL and MariaDB (InnoDB takes
// one snapshot per statement under READ COMMITTED, subqueries included):
// visible_seq is one less than the lowest unapplied sequence number, or the
// last one allocated when every decision is applied. The README gives this
// very text to readers (a test holds the two equal), so that no reader
// depends on a view or on a privilege the service account lacks.
const CommitPositionQuery = `SELECT p.visible_seq, p.decided_seq, p.retained_from,
  (SELECT c.sealed_before FROM checkpoint_commits c WHERE c.commit_seq = p.visible_seq) AS sealed_before
FROM (SELECT COALESCE((SELECT MIN(u.commit_seq) FROM checkpoint_commits u WHERE u.applied_at IS NULL) - 1, s.last_seq) AS visible_seq,
        s.last_seq AS decided_seq,
        COALESCE((SELECT MIN(r.commit_seq) FROM checkpoint_commits r), s.last_seq + 1) AS retained_from
      FROM commit_sequence s WHERE s.singleton = 1) p`

// Queryer runs a query; *sql.DB, *sqlx.DB and their transactions are
// ones.
type Queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// ReadCommitPosition runs CommitPositionQuery on the control server q.
func ReadCommitPosition(ctx context.Context, q Queryer) (driver.CommitPosition, error) {
	var p driver.CommitPosition
	var sealed sql.NullTime
	err := q.QueryRowContext(ctx, CommitPositionQuery).Scan(&p.Visible, &p.Decided, &p.RetainedFrom, &sealed)
	if err != nil {
		return driver.CommitPosition{}, fmt.Errorf("read the commit position: %w", err)
	}
	p.SealedBefore = sealed.Time
	return p, nil
}

// CommitPosition reads the commit log's position (CommitPositionQuery).
func (c *Control) CommitPosition(ctx context.Context) (driver.CommitPosition, error) {
	return ReadCommitPosition(ctx, c.sv.db)
}

// ForgetCommits deletes the commit log rows numbered through and below (a
// range of the primary key: the caller bounds it).
func (c *Control) ForgetCommits(ctx context.Context, through int64) (int64, error) {
	r, err := c.sv.db.ExecContext(ctx, `DELETE FROM checkpoint_commits WHERE commit_seq <= ?`, through)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

// frontierRow is the one row of window_frontier.
type frontierRow struct {
	Closed sql.NullTime `db:"closed_before"`
	Sealed sql.NullTime `db:"sealed_before"`
}

func (r frontierRow) frontier() driver.Frontier {
	return driver.Frontier{Closed: r.Closed.Time, Sealed: r.Sealed.Time}
}

// raiseFrontier locks the frontier row, checks it, and raises it; it
// returns the frontier as the decision leaves it.
func (c *Control) raiseFrontier(ctx context.Context, tx *sqlx.Tx, f *driver.FrontierChange, now time.Time) (driver.Frontier, error) {
	var rows []frontierRow
	if err := tx.SelectContext(ctx, &rows, `SELECT closed_before, sealed_before FROM window_frontier WHERE singleton = 1 FOR UPDATE`); err != nil {
		return driver.Frontier{}, err
	}
	var cur driver.Frontier
	if len(rows) > 0 {
		cur = rows[0].frontier()
	}
	if f.Check != nil {
		if err := f.Check(cur); err != nil {
			return driver.Frontier{}, err
		}
	}
	next := driver.Frontier{Closed: later(cur.Closed, f.Raise.Closed), Sealed: later(cur.Sealed, f.Raise.Sealed)}
	if len(rows) > 0 && next == cur {
		return next, nil
	}
	// The migration creates the row; should it be missing, the first
	// decision creates it (a concurrent one then fails on the key and is
	// retried by its checkpoint).
	_, err := tx.ExecContext(ctx, `INSERT INTO window_frontier (singleton, closed_before, sealed_before, updated_at) VALUES (1, ?, ?, ?)
		ON DUPLICATE KEY UPDATE closed_before = VALUES(closed_before), sealed_before = VALUES(sealed_before), updated_at = VALUES(updated_at)`,
		nullTime(next.Closed), nullTime(next.Sealed), now)
	return next, err
}

// EventTime reads the frontier and the scope's partition rows, each as
// committed.
func (c *Control) EventTime(ctx context.Context, s driver.Scope) (driver.Frontier, []driver.Stored, error) {
	var rows []frontierRow
	if err := c.sv.db.SelectContext(ctx, &rows, `SELECT closed_before, sealed_before FROM window_frontier WHERE singleton = 1`); err != nil {
		return driver.Frontier{}, nil, err
	}
	var f driver.Frontier
	if len(rows) > 0 {
		f = rows[0].frontier()
	}
	var parts []storedRow
	err := c.sv.db.SelectContext(ctx, &parts, `SELECT `+storedColumns+` FROM partition_offsets WHERE consumer_group = ? AND kafka_topic = ? ORDER BY kafka_partition`, s.Group, s.Topic)
	if err != nil {
		return driver.Frontier{}, nil, err
	}
	out := make([]driver.Stored, len(parts))
	for i, r := range parts {
		out[i] = r.stored()
	}
	return f, out, nil
}

// later is the later of two instants, a zero one counting as none.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// nullTime stores a zero instant as NULL.
func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC()
}

// Claim raises the partitions' epochs and records owner, then reads them,
// in one transaction.
func (c *Control) Claim(ctx context.Context, s driver.Scope, owner string, partitions []int32, at time.Time) (map[int32]driver.Stored, error) {
	tx, err := c.sv.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	err = c.upsert(ctx, tx, len(partitions), func(i int) []any {
		return []any{s.Group, s.Topic, partitions[i], driver.StartOffset, nil, false, owner, 1, 1, at}
	},
		// This instance follows a live move's cursor: the claim says so
		// with its epoch (migration 00014, QuiesceUnfollowing). Named
		// first and computed from epoch, so that the result is the same
		// whether the server assigns left to right (MySQL) or all at once
		// (MariaDB's SIMULTANEOUS_ASSIGNMENT).
		` ON DUPLICATE KEY UPDATE follower_epoch = epoch + 1, epoch = epoch + 1, owner = VALUES(owner), updated_at = VALUES(updated_at)`)
	if err != nil {
		return nil, err
	}
	stored, err := c.read(ctx, tx, s, partitions, "")
	if err != nil {
		return nil, err
	}
	return stored, tx.Commit()
}

// Positions reads the rows with a shared lock, which waits for a commit
// decision in progress on them.
func (c *Control) Positions(ctx context.Context, s driver.Scope, partitions []int32) (map[int32]driver.Stored, error) {
	tx, err := c.sv.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	return c.read(ctx, tx, s, partitions, " LOCK IN SHARE MODE")
}

// Groups lists the groups with positions for topic.
func (c *Control) Groups(ctx context.Context, topic string) ([]string, error) {
	var groups []string
	err := c.sv.db.SelectContext(ctx, &groups, `SELECT DISTINCT consumer_group FROM partition_offsets WHERE kafka_topic = ? ORDER BY consumer_group`, topic)
	return groups, err
}

// Decided lists up to limit gtrids decided before, oldest first.
func (c *Control) Decided(ctx context.Context, before time.Time, limit int) ([]string, error) {
	var out []string
	err := c.sv.db.SelectContext(ctx, &out, `SELECT gtrid FROM checkpoint_decisions WHERE decided_at < ? ORDER BY decided_at LIMIT ?`, before, limit)
	return out, err
}

// Forget deletes the decisions of gtrids.
func (c *Control) Forget(ctx context.Context, gtrids []string) (int64, error) {
	var n int64
	err := c.chunks(len(gtrids), 64, func(i int) int { return stmt.ArgBytes(gtrids[i]) }, func(start, end int) error {
		args := make([]any, end-start)
		for i, g := range gtrids[start:end] {
			args[i] = g
		}
		r, err := c.sv.db.ExecContext(ctx, `DELETE FROM checkpoint_decisions WHERE gtrid IN (`+placeholders(end-start)+`)`, args...)
		if err != nil {
			return err
		}
		k, _ := r.RowsAffected()
		n += k
		return nil
	})
	return n, err
}

// read reads the partition rows of s, by primary key, with the given
// locking clause.
func (c *Control) read(ctx context.Context, tx *sqlx.Tx, s driver.Scope, partitions []int32, lock string) (map[int32]driver.Stored, error) {
	out := make(map[int32]driver.Stored, len(partitions))
	fixed := 512 + stmt.ArgBytes(s.Group) + stmt.ArgBytes(s.Topic)
	err := c.chunks(len(partitions), fixed, func(int) int { return stmt.ArgBytes(int32(0)) }, func(start, end int) error {
		args := []any{s.Group, s.Topic}
		for _, p := range partitions[start:end] {
			args = append(args, p)
		}
		var rows []storedRow
		err := tx.SelectContext(ctx, &rows, `SELECT `+storedColumns+` FROM partition_offsets FORCE INDEX (PRIMARY)
		WHERE consumer_group = ? AND kafka_topic = ? AND kafka_partition IN (`+placeholders(end-start)+`)`+lock, args...)
		for _, r := range rows {
			out[r.Partition] = r.stored()
		}
		return err
	})
	return out, err
}

const storedColumns = `kafka_partition, next_offset, epoch, owner, watermark, caught_up`

// storedRow is a partition_offsets row as read.
type storedRow struct {
	Partition  int32        `db:"kafka_partition"`
	NextOffset int64        `db:"next_offset"`
	Epoch      int64        `db:"epoch"`
	Owner      string       `db:"owner"`
	Watermark  sql.NullTime `db:"watermark"`
	CaughtUp   bool         `db:"caught_up"`
}

func (r storedRow) stored() driver.Stored {
	return driver.Stored{Partition: r.Partition, NextOffset: r.NextOffset, Epoch: r.Epoch, Owner: r.Owner, Watermark: r.Watermark.Time, CaughtUp: r.CaughtUp}
}

// upsert writes n partition_offsets rows, args(i) giving each row's values
// in column order, with the given ON DUPLICATE KEY clause, in as many
// statements as the budget needs.
func (c *Control) upsert(ctx context.Context, tx *sqlx.Tx, n int, args func(i int) []any, onDup string) error {
	const head = `INSERT INTO partition_offsets (consumer_group, kafka_topic, kafka_partition, next_offset, watermark, caught_up, owner, epoch, follower_epoch, updated_at) VALUES `
	const tuple = "(?,?,?,?,?,?,?,?,?,?)"
	return c.chunks(n, len(head)+len(onDup), func(i int) int { return stmt.RowBytes(tuple, args(i)...) }, func(start, end int) error {
		var b strings.Builder
		b.WriteString(head)
		all := make([]any, 0, 10*(end-start))
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

func (c *Control) chunks(n, fixed int, rowBytes func(int) int, fn func(start, end int) error) error {
	return stmt.Split(n, fixed, c.sv.MaxStatementBytes(), rowBytes, fn)
}

func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?,", n-1) + "?"
}
