package mysqldriver

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/txsink/driver"
)

// Quiesced is what a deliberate change of the ledger's settings is decided
// on (package periods), read under the locks that make it final.
type Quiesced struct {
	// Watermark is the latest watermark of any partition of the ledger,
	// every group and topic (zero: none): no counted event is later.
	Watermark time.Time
	// Frontier is the closing frontier.
	Frontier driver.Frontier
	// Fenced is the number of partition rows whose epoch was raised.
	Fenced int
}

// Quiesce runs fn in one local transaction on the control server in which
// every partition row of the ledger (every group and topic) is locked and
// its epoch raised, then the frontier row locked: the decisions' lock
// order. Raising the epochs fences every instance that still holds a
// claim, a paused one included: whatever it prepared, its decision fails
// the epoch check, so nothing of it commits after fn's change. Instances
// that start later claim their partitions again. fn runs the change's own
// statements in tx; the transaction commits if fn returns nil and rolls
// back otherwise (the epochs too).
func (c *Control) Quiesce(ctx context.Context, fn func(ctx context.Context, tx *sqlx.Tx, q Quiesced) error) error {
	return c.quiesce(ctx, "", fn)
}

// QuiesceUnfollowing is Quiesce that raises the epochs only of the
// partitions whose last claim was not by an instance that follows a live
// move's cursor (partition_offsets.follower_epoch, migration 00014): those
// of versions before, which place keys by the layout they started with.
// The instances that follow the cursor keep their claims and their
// checkpoints in flight: each decision reads the cursor under a shared
// lock (Commit's layout), so it sees fn's change, and one built before it
// commits only if that change moved none of its keys (txsink.layoutCheck).
// Every partition row is still locked: fn's change is ordered against
// every decision.
func (c *Control) QuiesceUnfollowing(ctx context.Context, fn func(ctx context.Context, tx *sqlx.Tx, q Quiesced) error) error {
	return c.quiesce(ctx, ` WHERE NOT (follower_epoch <=> epoch)`, fn)
}

// quiesce is Quiesce raising the epochs of the rows where fences.
func (c *Control) quiesce(ctx context.Context, where string, fn func(ctx context.Context, tx *sqlx.Tx, q Quiesced) error) (err error) {
	tx, err := c.sv.db.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var rows []struct {
		Watermark sql.NullTime `db:"watermark"`
	}
	if err := tx.SelectContext(ctx, &rows, `SELECT watermark FROM partition_offsets FOR UPDATE`); err != nil {
		return fmt.Errorf("lock the partitions: %w", err)
	}
	var q Quiesced
	for _, r := range rows {
		q.Watermark = later(q.Watermark, r.Watermark.Time)
	}
	res, err := tx.ExecContext(ctx, `UPDATE partition_offsets SET epoch = epoch + 1`+where)
	if err != nil {
		return fmt.Errorf("fence the partitions: %w", err)
	}
	n, _ := res.RowsAffected()
	q.Fenced = int(n)
	var f []frontierRow
	if err := tx.SelectContext(ctx, &f, `SELECT closed_before, sealed_before FROM window_frontier WHERE singleton = 1 FOR UPDATE`); err != nil {
		return fmt.Errorf("lock the frontier: %w", err)
	}
	if len(f) > 0 {
		q.Frontier = f[0].frontier()
	}
	if err := fn(ctx, tx, q); err != nil {
		return err
	}
	return tx.Commit()
}
