package mysqldriver

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The ledger's tables (driver.Store, driver.StoreTx): the statements of
// dedup.go, ledger.go and deadletters.go, on a server's pools or in a
// branch's connection.

var (
	_ driver.Store   = (*Server)(nil)
	_ driver.StoreTx = tables{}
)

// Stores are the servers' ledger tables for the pipeline, in the order of
// Servers.
func (d *Driver) Stores() []driver.Store {
	out := make([]driver.Store, len(d.servers))
	for i, s := range d.servers {
		out[i] = s
	}
	return out
}

// LookupKeys reads the stored dedup keys of ids in generation g on the
// pool.
func (s *Server) LookupKeys(ctx context.Context, g driver.Generation, ids []string) ([]driver.DedupKey, error) {
	return lookupKeys(ctx, s, g, ids)
}

// EmptyKeys empties generation g's table on the cleanup pool.
func (s *Server) EmptyKeys(ctx context.Context, g driver.Generation, journalDue time.Time) error {
	return emptyKeys(ctx, s.cleanup, g, journalDue)
}

// DeleteEntries deletes old ledger entries on the cleanup pool.
func (s *Server) DeleteEntries(ctx context.Context, before time.Time, batch, max int) (int64, error) {
	return deleteOldEntries(ctx, s.cleanup, before, batch, max)
}

// Store is the ledger's tables in the branch c holds.
func (c *Conn) Store() driver.StoreTx { return tables{c} }

// MaxStatementBytes is the budget of the connection's server.
func (c *Conn) MaxStatementBytes() int { return c.sv.MaxStatementBytes() }

// tables runs the ledger's statements on a branch's connection.
type tables struct{ c *Conn }

func (t tables) ClaimKeys(ctx context.Context, g driver.Generation, keys []driver.DedupKey) ([]driver.Contested, error) {
	return claimKeys(ctx, t.c, g, keys)
}

func (t tables) LockKeys(ctx context.Context, g driver.Generation, ids []string) ([]driver.DedupKey, error) {
	return lockKeys(ctx, t.c, g, ids)
}

// SetLockWait sets the session's innodb_lock_wait_timeout. A connection
// closed before it is set back is dropped, not pooled (Conn.Close), so no
// later branch inherits it.
func (t tables) SetLockWait(ctx context.Context, d time.Duration) error {
	secs := lockWaitSeconds(d)
	if d == 0 {
		secs = lockWaitSeconds(t.c.sv.lockWait)
	}
	if _, err := t.c.Exec(ctx, `SET SESSION innodb_lock_wait_timeout = `+strconv.Itoa(secs)); err != nil {
		return fmt.Errorf("set lock wait: %w", err)
	}
	t.c.lockWait = d != 0
	return nil
}

func (t tables) UnclaimKeys(ctx context.Context, g driver.Generation, ids []string) error {
	return unclaimKeys(ctx, t.c, g, ids)
}

func (t tables) ReplaceKeys(ctx context.Context, g driver.Generation, keys []driver.DedupKey, now time.Time) error {
	return replaceKeys(ctx, t.c, g, keys, now)
}

func (t tables) UpdateKeys(ctx context.Context, g driver.Generation, keys []driver.DedupKey) error {
	return updateKeys(ctx, t.c, g, keys)
}

func (t tables) LockBalances(ctx context.Context, keys []driver.BalanceKey) ([]driver.BalanceRow, error) {
	return lockBalances(ctx, t.c, keys, t.c.sv.images)
}

func (t tables) LockWindows(ctx context.Context, keys []driver.WindowKey) ([]driver.WindowRow, error) {
	return lockWindows(ctx, t.c, keys, t.c.sv.images)
}

func (t tables) LockAdjustments(ctx context.Context, keys []driver.WindowKey) ([]driver.AdjustmentRow, error) {
	return lockAdjustments(ctx, t.c, keys, t.c.sv.images)
}

func (t tables) CreateBalances(ctx context.Context, keys []driver.BalanceKey) ([]driver.BalanceRow, []driver.BalanceKey, error) {
	return createBalances(ctx, t.c, keys, t.c.sv.images)
}

func (t tables) CreateWindows(ctx context.Context, keys []driver.WindowKey) ([]driver.WindowRow, []driver.WindowKey, error) {
	return createWindows(ctx, t.c, keys, t.c.sv.images)
}

func (t tables) CreateAdjustments(ctx context.Context, keys []driver.WindowKey) ([]driver.AdjustmentRow, []driver.WindowKey, error) {
	return createAdjustments(ctx, t.c, keys, t.c.sv.images)
}

func (t tables) WriteBalances(ctx context.Context, rows []driver.Balance, now time.Time) error {
	return writeBalances(ctx, t.c, rows, now)
}

func (t tables) WriteWindows(ctx context.Context, rows []driver.WindowSum, now time.Time) error {
	return writeWindows(ctx, t.c, tableWindows, rows, "", now)
}

func (t tables) WriteAdjustments(ctx context.Context, rows []driver.WindowSum, checkpoint string, now time.Time) error {
	return writeWindows(ctx, t.c, tableAdjustments, rows, checkpoint, now)
}

func (t tables) WriteEntries(ctx context.Context, topic, checkpoint string, entries []driver.Entry, now time.Time) ([]driver.EntryKey, error) {
	return writeEntries(ctx, t.c, topic, checkpoint, entries, now)
}

func (t tables) WriteDeadLetters(ctx context.Context, topic, checkpoint string, letters []driver.DeadLetter, now time.Time) error {
	return writeDeadLetters(ctx, t.c, topic, checkpoint, letters, now)
}

func (t tables) SealWindows(ctx context.Context, from, to time.Time, max int, now time.Time) ([]driver.WindowRow, bool, error) {
	return sealWindows(ctx, t.c, from, to, max, now, t.c.sv.images)
}

func (t tables) WriteOutbox(ctx context.Context, checkpoint string, participant int, blobs [][]byte, counts []int, now time.Time) error {
	return writeOutbox(ctx, t.c, checkpoint, participant, blobs, counts, now)
}

// LookupKeys reads the stored dedup keys of ids on db, a pool of one of a
// ledger's servers opened apart from a Driver (the operator's tools), in
// every generation's table, with the smallest statement budget the
// service accepts: per id the row that expires last (an id can be stored
// in two generations only when one of its rows expired).
func LookupKeys(ctx context.Context, db *sqlx.DB, ids []string) ([]driver.DedupKey, error) {
	latest := map[string]driver.DedupKey{}
	for g := range driver.Generation(driver.KeyTables) {
		found, err := lookupKeys(ctx, minimalPool{db}, g, ids)
		if err != nil {
			return nil, err
		}
		for _, k := range found {
			if old, ok := latest[k.ID]; !ok || k.ExpiresAt.After(old.ExpiresAt) {
				latest[k.ID] = k
			}
		}
	}
	out := make([]driver.DedupKey, 0, len(latest))
	for _, id := range ids {
		if k, ok := latest[id]; ok {
			out = append(out, k)
			delete(latest, id)
		}
	}
	return out, nil
}

type minimalPool struct{ db *sqlx.DB }

func (p minimalPool) Select(ctx context.Context, dest any, query string, args ...any) error {
	return p.db.SelectContext(ctx, dest, query, args...)
}

func (minimalPool) MaxStatementBytes() int { return stmt.Budget(stmt.MinPacket) }
