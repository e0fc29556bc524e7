package memdriver

import (
	"bytes"
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

// LookupKeys reads the committed keys of ids.
func (s *Server) LookupKeys(ctx context.Context, ids []string) ([]driver.DedupKey, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []driver.DedupKey
	err := c.statementsLocked(len(ids), 80, func(i int) int { return stmt.ArgBytes(ids[i]) }, func(start, end int) error {
		for _, id := range ids[start:end] {
			if r, ok := c.rows[tKeys][id]; ok {
				out = append(out, r.(driver.DedupKey))
			}
		}
		return nil
	})
	return out, err
}

// CleanupKeys deletes the keys of due journal rows, one journal row per
// local transaction: the row is taken unless another transaction holds it
// (SKIP LOCKED), its keys are deleted by primary key while still expired,
// then the row.
func (s *Server) CleanupKeys(ctx context.Context, now time.Time, batch, max int) (int64, error) {
	var total int64
	for total < int64(max) {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, more, err := s.cleanupRow(ctx, now, batch)
		total += n
		if err != nil || !more {
			return total, err
		}
	}
	return total, nil
}

func (s *Server) cleanupRow(ctx context.Context, now time.Time, batch int) (int64, bool, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	now = datetime(now)
	var due []driver.JournalRow
	for k, r := range c.rows[tJournal] {
		j := r.(driver.JournalRow)
		if !j.ExpiresAt.After(now) && c.locks[rowID{tJournal, k}] == nil {
			due = append(due, j)
		}
	}
	if len(due) == 0 {
		return 0, false, nil
	}
	j := slices.MinFunc(due, func(a, b driver.JournalRow) int {
		return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), cmp.Compare(a.Seq, b.Seq))
	})
	tx := c.newTxnLocked(fmt.Sprintf("cleanup of dedup_expiry seq %d", j.Seq))
	jid := rowID{tJournal, intKey(j.Seq)}
	c.locks[jid], tx.locks[jid] = tx, struct{}{}
	ids := slices.SortedFunc(slices.Values(j.IDs), func(a, b string) int { return bytes.Compare([]byte(a), []byte(b)) })
	before := len(tx.writes)
	expired := func(k driver.DedupKey) bool { return !k.ExpiresAt.After(now) }
	for start := 0; start < len(ids); start += batch {
		if err := c.deleteKeysLocked(ctx, tx, ids[start:min(start+batch, len(ids))], expired); err != nil {
			c.endTxnLocked(tx, false)
			return 0, false, fmt.Errorf("dedup cleanup: %w", err)
		}
	}
	deleted := int64(len(tx.writes) - before)
	c.deleteLocked(tx, jid)
	c.endTxnLocked(tx, true)
	return deleted, true, nil
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
	for _, r := range c.rows[tKeys] {
		t.Keys = append(t.Keys, r.(driver.DedupKey))
	}
	slices.SortFunc(t.Keys, func(a, b driver.DedupKey) int { return strings.Compare(a.ID, b.ID) })
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
	slices.SortFunc(t.Entries, func(a, b driver.EntryRow) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	for _, r := range c.rows[tDeadLetters] {
		t.DeadLetters = append(t.DeadLetters, r.(driver.DeadLetterRow))
	}
	slices.SortFunc(t.DeadLetters, func(a, b driver.DeadLetterRow) int { return cmp.Compare(a.ID, b.ID) })
	return t
}
