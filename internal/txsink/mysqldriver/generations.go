package mysqldriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The SQL of dedup_generations (migration 00008), the state of the dedup
// keys' generations on the control server (driver.KeyGenerations): one
// row, read by every checkpoint that claims keys, read under a shared lock
// by their commit decisions (Commit) and by the upkeep while it empties a
// table (HoldKeyGenerations), and changed, rarely, by a rotation, the
// record of an emptied table and the registration of a longer lifetime.
//
// The upkeep's transactions (rotations, records, the hold) run on the
// control server's cleanup pool, never on the one checkpoints use.
// Rotations and records never wait for the row: FOR UPDATE NOWAIT (MySQL
// 8.0+ and MariaDB 10.3+) fails at once while a decision or an emptying
// holds it shared, so no decision ever queues behind one of them; they are
// tried again at the upkeep's next pass.

const generationColumns = `current_gen, current_since, previous_since, emptied_gen, lifetime_us`

type generationRow struct {
	Current  int64        `db:"current_gen"`
	Since    time.Time    `db:"current_since"`
	Previous sql.NullTime `db:"previous_since"`
	Emptied  int64        `db:"emptied_gen"`
	Lifetime int64        `db:"lifetime_us"`
	Now      time.Time    `db:"now"`
}

func (r generationRow) state() driver.KeyGenerations {
	return driver.KeyGenerations{Current: driver.Generation(r.Current), Since: r.Since.UTC(), PreviousSince: utcOrZero(r.Previous),
		Emptied: driver.Generation(r.Emptied), Lifetime: time.Duration(r.Lifetime) * time.Microsecond, Now: r.Now.UTC()}
}

type getter interface {
	GetContext(ctx context.Context, dest any, query string, args ...any) error
}

// readGenerations reads the state with the server's clock, suffix after
// the query (a locking clause, or nothing).
func readGenerations(ctx context.Context, q getter, suffix string) (driver.KeyGenerations, error) {
	var r generationRow
	err := q.GetContext(ctx, &r, `SELECT `+generationColumns+`, UTC_TIMESTAMP(6) AS now FROM dedup_generations WHERE singleton = 1`+suffix)
	if errors.Is(err, sql.ErrNoRows) {
		return driver.KeyGenerations{}, errors.New("dedup_generations has no row (migration 00008)")
	}
	if err != nil {
		return driver.KeyGenerations{}, fmt.Errorf("read dedup_generations: %w", err)
	}
	return r.state(), nil
}

// KeyGenerations reads the generations' state as committed.
func (c *Control) KeyGenerations(ctx context.Context) (driver.KeyGenerations, error) {
	return readGenerations(ctx, c.sv.db, "")
}

// RegisterKeyLifetime raises the registered lifetime to d.
func (c *Control) RegisterKeyLifetime(ctx context.Context, d time.Duration) error {
	us := d.Microseconds() + 1 // rounded up: the bound must not fall short
	_, err := c.sv.db.ExecContext(ctx, `UPDATE dedup_generations SET lifetime_us = GREATEST(lifetime_us, ?), updated_at = UTC_TIMESTAMP(6) WHERE singleton = 1`, us)
	if err != nil {
		return fmt.Errorf("register the dedup keys' lifetime: %w", err)
	}
	return nil
}

// changeGenerations runs change on the state locked exclusively, without
// waiting for the lock (false, nil when another transaction holds it);
// change returns whether it changed something.
func (c *Control) changeGenerations(ctx context.Context, change func(tx *sqlx.Tx, s driver.KeyGenerations) (bool, error)) (bool, error) {
	tx, err := c.sv.cleanup.BeginTxx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback() }()
	s, err := readGenerations(ctx, tx, ` FOR UPDATE NOWAIT`)
	if Code(err) == driver.Transient {
		return false, nil // held by a decision or an emptying
	}
	if err != nil {
		return false, err
	}
	changed, err := change(tx, s)
	if err != nil || !changed {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, err
	}
	return true, nil
}

// RotateKeys makes from+1 current (driver.Control.RotateKeys). The new
// Since is the server's clock at the UPDATE, which runs once the row is
// locked exclusively: every decision that read from as current under its
// shared lock has committed by then.
func (c *Control) RotateKeys(ctx context.Context, from driver.Generation) (bool, error) {
	return c.changeGenerations(ctx, func(tx *sqlx.Tx, s driver.KeyGenerations) (bool, error) {
		if s.Current != from || s.Emptied < from+1-driver.KeyTables {
			return false, nil
		}
		_, err := tx.ExecContext(ctx, `UPDATE dedup_generations SET current_gen = current_gen + 1, previous_since = current_since,
			current_since = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6) WHERE singleton = 1`)
		return err == nil, err
	})
}

// MarkKeysEmptied records that generation g's table was emptied.
func (c *Control) MarkKeysEmptied(ctx context.Context, g driver.Generation) (bool, error) {
	return c.changeGenerations(ctx, func(tx *sqlx.Tx, s driver.KeyGenerations) (bool, error) {
		if s.Emptied != g-1 || g >= s.Current {
			return false, nil
		}
		_, err := tx.ExecContext(ctx, `UPDATE dedup_generations SET emptied_gen = ?, updated_at = UTC_TIMESTAMP(6) WHERE singleton = 1`, int64(g))
		return err == nil, err
	})
}

// HoldKeyGenerations runs fn on the state read under a shared lock, held
// by a transaction of the control server's cleanup pool until fn returns.
func (c *Control) HoldKeyGenerations(ctx context.Context, fn func(driver.KeyGenerations) error) error {
	tx, err := c.sv.cleanup.BeginTxx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	s, err := readGenerations(ctx, tx, ` LOCK IN SHARE MODE`)
	if err != nil {
		return err
	}
	if err := fn(s); err != nil {
		return err
	}
	return tx.Commit()
}

// checkGenerations is the decision's guard (driver.Control.Commit, keys):
// the current generation, read under a shared lock that the decision's
// transaction holds until it commits, must be want.
func checkGenerations(ctx context.Context, tx *sqlx.Tx, want driver.Generation) error {
	var cur int64
	if err := tx.GetContext(ctx, &cur, `SELECT current_gen FROM dedup_generations WHERE singleton = 1 LOCK IN SHARE MODE`); err != nil {
		return fmt.Errorf("read dedup_generations: %w", err)
	}
	if driver.Generation(cur) != want {
		return fmt.Errorf("%w (claimed under %d, now %d)", driver.ErrKeysMoved, want, cur)
	}
	return nil
}
