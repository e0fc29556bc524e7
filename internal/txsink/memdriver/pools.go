package memdriver

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The ledger's tables on the pools (driver.Store): reads of committed rows
// without locks, and the cleanup, each statement or journal row a short
// local transaction of its own.

// LookupKeys reads the committed keys of ids in generation g's table.
func (s *Server) LookupKeys(ctx context.Context, g driver.Generation, ids []string) ([]driver.DedupKey, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []driver.DedupKey
	err := c.statementsLocked(len(ids), 80, func(i int) int { return stmt.ArgBytes(ids[i]) }, func(start, end int) error {
		for _, id := range ids[start:end] {
			if r, ok := c.rows[keysOf(g)][id]; ok {
				out = append(out, r.(driver.DedupKey))
			}
		}
		return nil
	})
	return out, err
}

// metadataLockWait is how long EmptyKeys waits for the transactions that
// touched the table to end (mysqldriver's lock_wait_timeout for TRUNCATE).
const metadataLockWait = time.Second

// EmptyKeys empties generation g's table as TRUNCATE TABLE does: once no
// transaction that touched it is open (it holds the table's metadata lock
// until it ends, prepared or not), waiting for that at most
// metadataLockWait (then Transient, as error 1205); generation 0's table
// only when no journal row expires after journalDue, and the journal with
// it.
func (s *Server) EmptyKeys(ctx context.Context, g driver.Generation, journalDue time.Time) error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	tables := []table{keysOf(g)}
	if g.Table() == 0 {
		tables = append(tables, tJournal)
	}
	deadline := time.Now().Add(metadataLockWait)
	for {
		h := c.touchingLocked(tables)
		if h == nil {
			break
		}
		c.mu.Unlock()
		t := time.NewTimer(time.Until(deadline))
		var err error
		select {
		case <-h.done:
		case <-t.C:
			err = coded(driver.Transient, "Lock wait timeout exceeded; try restarting transaction (%s holds %s)", h.name, tableNames[tables[0]])
		case <-ctx.Done():
			err = ctx.Err()
		}
		t.Stop()
		c.mu.Lock()
		if err != nil {
			return fmt.Errorf("empty %s: %w", tableNames[tables[0]], err)
		}
	}
	if g.Table() == 0 {
		for _, r := range c.rows[tJournal] {
			if r.(driver.JournalRow).ExpiresAt.After(journalDue) {
				return fmt.Errorf("empty %s: %w", tableNames[tables[0]], driver.ErrKeysLive)
			}
		}
	}
	for _, t := range tables {
		clear(c.rows[t])
	}
	return nil
}

// touchingLocked is an open transaction that touched one of tables, if
// any.
func (c *Cluster) touchingLocked(tables []table) *txn {
	for tx := range c.live {
		for _, t := range tables {
			if _, ok := tx.tables[t]; ok {
				return tx
			}
		}
	}
	return nil
}

// DeleteEntries deletes the entries created before before, the oldest
// first, batch per statement (each its own transaction), up to max.
func (s *Server) DeleteEntries(ctx context.Context, before time.Time, batch, max int) (int64, error) {
	var total int64
	for total < int64(max) {
		n, err := s.deleteEntries(ctx, before, min(batch, max-int(total)))
		total += n
		if err != nil {
			return total, fmt.Errorf("ledger entries retention: %w", err)
		}
		if n < int64(batch) {
			break
		}
	}
	return total, nil
}

// deleteEntries is one DELETE ... WHERE created_at < ? ORDER BY created_at
// LIMIT n: rows another transaction holds are waited for.
func (s *Server) deleteEntries(ctx context.Context, before time.Time, n int) (int64, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	tx := c.newTxnLocked("ledger entries retention")
	for {
		var due []rowID
		for k, r := range c.rows[tEntries] {
			if r.(driver.EntryRow).CreatedAt.Before(before) {
				due = append(due, rowID{tEntries, k})
			}
		}
		slices.SortFunc(due, func(a, b rowID) int {
			x, y := c.rows[tEntries][a.key].(driver.EntryRow), c.rows[tEntries][b.key].(driver.EntryRow)
			return cmp.Or(x.CreatedAt.Compare(y.CreatedAt), strings.Compare(a.key, b.key))
		})
		due = due[:min(n, len(due))]
		var waited bool
		for _, id := range due {
			if h := c.lockedByOther(tx, id); h != nil {
				if err := c.waitLocked(ctx, tx, h, id); err != nil {
					c.endTxnLocked(tx, false)
					return 0, err
				}
				waited = true
				break
			}
		}
		if waited {
			continue
		}
		for _, id := range due {
			c.locks[id], tx.locks[id] = tx, struct{}{}
			c.deleteLocked(tx, id)
		}
		c.endTxnLocked(tx, true)
		return int64(len(due)), nil
	}
}

// RefreshLimits rereads the server's max_allowed_packet; one below the
// service's minimum is refused, as mysqldriver refuses it.
func (s *Server) RefreshLimits(ctx context.Context) error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.packet < stmt.MinPacket {
		return fmt.Errorf("max_allowed_packet is %d bytes: the service needs at least %d", c.packet, stmt.MinPacket)
	}
	c.budget = stmt.Budget(c.packet)
	return nil
}

// Tables returns what the ledger's tables hold, as committed.
func (c *Cluster) Tables() driver.Tables {
	c.mu.Lock()
	defer c.mu.Unlock()
	var t driver.Tables
	for g := range driver.Generation(driver.KeyTables) {
		for _, r := range c.rows[keysOf(g)] {
			t.Keys[g] = append(t.Keys[g], r.(driver.DedupKey))
		}
		slices.SortFunc(t.Keys[g], func(a, b driver.DedupKey) int { return strings.Compare(a.ID, b.ID) })
	}
	for _, r := range c.rows[tJournal] {
		j := r.(driver.JournalRow)
		j.IDs = slices.Clone(j.IDs)
		t.Journal = append(t.Journal, j)
	}
	slices.SortFunc(t.Journal, func(a, b driver.JournalRow) int { return cmp.Compare(a.Seq, b.Seq) })
	for _, r := range c.rows[tBalances] {
		t.Balances = append(t.Balances, r.(driver.BalanceRow))
	}
	slices.SortFunc(t.Balances, func(a, b driver.BalanceRow) int {
		return cmp.Or(strings.Compare(a.Account, b.Account), strings.Compare(a.Currency, b.Currency))
	})
	for _, r := range c.rows[tWindows] {
		t.Windows = append(t.Windows, r.(driver.WindowRow))
	}
	slices.SortFunc(t.Windows, func(a, b driver.WindowRow) int { return compareWindowKeys(a.WindowKey, b.WindowKey) })
	for _, r := range c.rows[tAdjustments] {
		t.Adjustments = append(t.Adjustments, r.(driver.AdjustmentRow))
	}
	slices.SortFunc(t.Adjustments, func(a, b driver.AdjustmentRow) int { return compareWindowKeys(a.WindowKey, b.WindowKey) })
	for _, r := range c.rows[tEntries] {
		t.Entries = append(t.Entries, r.(driver.EntryRow))
	}
	slices.SortFunc(t.Entries, func(a, b driver.EntryRow) int { return compareEntryKeys(entryKey(a), entryKey(b)) })
	for _, r := range c.rows[tDeadLetters] {
		t.DeadLetters = append(t.DeadLetters, r.(driver.DeadLetterRow))
	}
	slices.SortFunc(t.DeadLetters, func(a, b driver.DeadLetterRow) int { return cmp.Compare(a.ID, b.ID) })
	return t
}
