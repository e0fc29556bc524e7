package mysqldriver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Control is the control server's bookkeeping (driver.Control): the SQL of
// ledger_identity, partition_offsets and checkpoint_decisions lives here
// and nowhere else.
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
// and the decision inserted.
func (c *Control) Commit(ctx context.Context, d driver.Decision, s driver.Scope, cuts []driver.Cut, fence func([]driver.Stored) error) (err error) {
	tx, err := c.sv.db.BeginTxx(ctx, nil)
	if err != nil {
		return err
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
			return err
		}
		rows := make([]driver.Stored, 0, len(stored))
		for _, r := range stored {
			rows = append(rows, r)
		}
		if err := fence(rows); err != nil {
			return err
		}
		now := d.At
		err = c.upsert(ctx, tx, len(cuts), func(i int) []any {
			r := stored[cuts[i].Partition]
			return []any{s.Group, s.Topic, cuts[i].Partition, cuts[i].NextOffset, r.Owner, r.Epoch, now}
		}, ` ON DUPLICATE KEY UPDATE next_offset = VALUES(next_offset), updated_at = VALUES(updated_at)`)
		if err != nil {
			return err
		}
	}
	_, err = tx.ExecContext(ctx, insertDecision, d.Gtrid, string(d.Outcome), d.By, d.At)
	if Code(err) == driver.Duplicate {
		return driver.ErrDecided
	}
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%w: %w", driver.ErrAmbiguous, err)
	}
	return nil
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
		return []any{s.Group, s.Topic, partitions[i], driver.StartOffset, owner, 1, at}
	}, ` ON DUPLICATE KEY UPDATE epoch = epoch + 1, owner = VALUES(owner), updated_at = VALUES(updated_at)`)
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
		var rows []struct {
			Partition  int32  `db:"kafka_partition"`
			NextOffset int64  `db:"next_offset"`
			Epoch      int64  `db:"epoch"`
			Owner      string `db:"owner"`
		}
		err := tx.SelectContext(ctx, &rows, `SELECT kafka_partition, next_offset, epoch, owner FROM partition_offsets FORCE INDEX (PRIMARY)
		WHERE consumer_group = ? AND kafka_topic = ? AND kafka_partition IN (`+placeholders(end-start)+`)`+lock, args...)
		for _, r := range rows {
			out[r.Partition] = driver.Stored{Partition: r.Partition, NextOffset: r.NextOffset, Epoch: r.Epoch, Owner: r.Owner}
		}
		return err
	})
	return out, err
}

// upsert writes n partition_offsets rows, args(i) giving each row's values
// in column order, with the given ON DUPLICATE KEY clause, in as many
// statements as the budget needs.
func (c *Control) upsert(ctx context.Context, tx *sqlx.Tx, n int, args func(i int) []any, onDup string) error {
	const head = `INSERT INTO partition_offsets (consumer_group, kafka_topic, kafka_partition, next_offset, owner, epoch, updated_at) VALUES `
	const tuple = "(?,?,?,?,?,?,?)"
	return c.chunks(n, len(head)+len(onDup), func(i int) int { return stmt.RowBytes(tuple, args(i)...) }, func(start, end int) error {
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

func (c *Control) chunks(n, fixed int, rowBytes func(int) int, fn func(start, end int) error) error {
	return stmt.Split(n, fixed, c.sv.MaxStatementBytes(), rowBytes, fn)
}

func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?,", n-1) + "?"
}
