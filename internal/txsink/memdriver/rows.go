package memdriver

import (
	"cmp"
	"context"
	"crypto/sha256"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Ledger entries, dead letters and the sealing of windows, in a branch.

func positionID(t table, topic string, partition int32, offset int64) rowID {
	return rowID{t, key(topic, strconv.Itoa(int(partition)), intKey(offset))}
}

// entryID is the row of a ledger entry: its position and its kind.
func entryID(topic string, partition int32, offset int64, kind driver.EntryKind) rowID {
	return rowID{tEntries, key(topic, strconv.Itoa(int(partition)), intKey(offset), strconv.Itoa(int(kind)))}
}

func (t storeTx) WriteEntries(ctx context.Context, topic, checkpoint string, entries []driver.Entry, now time.Time) ([]driver.EntryKey, error) {
	c, tx, err := t.begin()
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	var kept []driver.EntryKey
	fixed := stmt.ArgBytes(topic) + stmt.ArgBytes(checkpoint) + 4*stmt.ArgBytes(now) + 6*stmt.ArgBytes(int64(0)) + stmt.ArgBytes(true) + 36
	err = c.statementsLocked(len(entries), entryText, func(i int) int {
		return fixed + stmt.ArgBytes(entries[i].EventID) + stmt.ArgBytes(entries[i].Account)
	}, func(start, end int) error {
		part := entries[start:end]
		for _, e := range part {
			if err := cmp.Or(checkASCII("kafka_topic", topic, 249), checkBytes("event_id", e.EventID, 128), checkBytes("account_id", e.Account, 64),
				checkASCII("currency", e.Currency, 3), checkBytes("checkpoint_id", checkpoint, 64)); err != nil {
				return err
			}
		}
		id := func(i int) rowID { return entryID(topic, part[i].Partition, part[i].Offset, part[i].Kind) }
		if err := c.insertNewLocked(ctx, tx, tEntries, len(part), id, func(i int) any {
			e := part[i]
			e.OccurredAt, e.WindowStart = datetime(e.OccurredAt), datetime(e.WindowStart)
			return driver.EntryRow{Topic: topic, Entry: e, Checkpoint: checkpoint, CreatedAt: datetime(now)}
		}); err != nil {
			return err
		}
		// The rows another checkpoint stored were kept (the statement's
		// affected rows count them as 0, as mysqldriver reads them).
		for i := range part {
			if r, ok := c.getLocked(tx, id(i)); ok && r.(driver.EntryRow).Checkpoint != checkpoint {
				kept = append(kept, driver.EntryKey{Topic: topic, Partition: part[i].Partition, Offset: part[i].Offset, Kind: part[i].Kind})
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return kept, nil
}

// insertNewLocked inserts n rows unless a row with the same key is stored
// (INSERT ... ON DUPLICATE KEY UPDATE of a column to itself): id(i) is row
// i's key, row(i) the row.
func (c *Cluster) insertNewLocked(ctx context.Context, tx *txn, tb table, n int, id func(i int) rowID, row func(i int) any) error {
	for i := range n {
		if err := c.lockLocked(ctx, tx, id(i)); err != nil {
			return err
		}
	}
	// The new rows in the order given: auto-increment ids are numbered in
	// the order of a multi-row INSERT's rows, as InnoDB numbers them.
	type newRow struct {
		id  rowID
		row any
	}
	var next []newRow
	seen := map[rowID]bool{}
	for i := range n {
		if _, ok := c.getLocked(tx, id(i)); ok {
			continue
		}
		if seen[id(i)] {
			continue
		}
		r := row(i)
		if err := c.fireLocked(tb, r); err != nil {
			return err
		}
		seen[id(i)] = true
		next = append(next, newRow{id(i), r})
	}
	for _, nr := range next {
		r := nr.row
		if l, ok := r.(driver.DeadLetterRow); ok {
			c.autoInc[tDeadLetters]++
			l.ID = c.autoInc[tDeadLetters]
			r = l
		}
		c.putLocked(tx, nr.id, r)
	}
	return nil
}

// The size of a dead letter's row besides its payload, as mysqldriver
// bounds it: every other argument at the bound of its column.
func letterBase(topic, checkpoint string) int {
	return len("(?,?,?,?,?,?,?,?,?,?,?,?)") + 1 + stmt.ArgBytes(topic) + stmt.ArgBytes(checkpoint) + 3*stmt.ArgBytes(int64(0)) +
		stmt.TextBytes(driver.DeadLetterReasonBytes) + stmt.TextBytes(driver.DeadLetterDetailBytes) +
		stmt.TextBytes(driver.DeadLetterEventIDBytes) + stmt.TextBytes(driver.DeadLetterKeyBytes) +
		stmt.TextBytes(sha256.Size) + stmt.ArgBytes(time.Time{})
}

func (t storeTx) WriteDeadLetters(ctx context.Context, topic, checkpoint string, letters []driver.DeadLetter, now time.Time) error {
	c, tx, err := t.begin()
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	base := letterBase(topic, checkpoint)
	prefix := stmt.FitText(c.budget - letterText - base)
	return c.statementsLocked(len(letters), letterText, func(i int) int {
		return base + stmt.TextBytes(min(len(letters[i].Payload), prefix))
	}, func(start, end int) error {
		part := letters[start:end]
		for _, d := range part {
			if err := cmp.Or(checkASCII("kafka_topic", topic, 249), checkASCII("reason", d.Reason, 64), checkBytes("checkpoint_id", checkpoint, 64)); err != nil {
				return err
			}
		}
		return c.insertNewLocked(ctx, tx, tDeadLetters, len(part), func(i int) rowID {
			return positionID(tDeadLetters, topic, part[i].Partition, part[i].Offset)
		}, func(i int) any {
			d := part[i].Columns(prefix)
			d.Key, d.Payload = slices.Clone(d.Key), slices.Clone(d.Payload)
			return driver.DeadLetterRow{Topic: topic, DeadLetter: d, Checkpoint: checkpoint, CreatedAt: datetime(now)}
		})
	})
}

// SealWindows follows mysqldriver's statements: a probe for the latest
// window below the bound with an open row, then that window's open rows,
// each a locking read on the index of (window_start, closed_at), then an
// UPDATE by primary key.
func (t storeTx) SealWindows(ctx context.Context, from, to time.Time, max int, now time.Time) ([]driver.WindowRow, bool, error) {
	c, tx, err := t.begin()
	if err != nil {
		return nil, false, err
	}
	defer c.mu.Unlock()
	var sealed []driver.WindowRow
	upper := to
	for len(sealed) < max {
		w, ok, err := c.probeLocked(ctx, tx, from, upper)
		if err != nil {
			return sealed, false, err
		}
		if !ok {
			return sealed, true, nil
		}
		for len(sealed) < max {
			limit := min(stmt.MaxRows, max-len(sealed))
			ids, err := c.openRowsLocked(ctx, tx, w, limit)
			if err != nil {
				return sealed, false, err
			}
			err = c.statementsLocked(len(ids), lockText, func(i int) int { return len(ids[i].key)*2 + 80 }, func(start, end int) error {
				old, err := c.sealRowsLocked(tx, ids[start:end], now)
				sealed = append(sealed, old...)
				return err
			})
			if err != nil {
				return sealed, false, err
			}
			if len(ids) < limit {
				break
			}
		}
		upper = w
	}
	return sealed, false, nil
}

// sealRowsLocked seals the rows ids and returns them as they were.
func (c *Cluster) sealRowsLocked(tx *txn, ids []rowID, now time.Time) ([]driver.WindowRow, error) {
	old := make([]driver.WindowRow, len(ids))
	next := make([]driver.WindowRow, len(ids))
	for i, id := range ids {
		r, _ := c.getLocked(tx, id)
		w := r.(driver.WindowRow)
		old[i] = w
		w.ClosedAt, w.UpdatedAt = datetime(now), datetime(now)
		if err := c.fireLocked(tWindows, w); err != nil {
			return nil, err
		}
		next[i] = w
	}
	for i, id := range ids {
		c.putLocked(tx, id, next[i])
	}
	return old, nil
}

// indexed is a row of billing_windows as the index of (window_start,
// closed_at) orders it, with the primary key after.
type indexed struct {
	id     rowID
	row    driver.WindowRow
	locked *txn // another transaction's lock on it
}

// periodIndexLocked lists, in the index's descending order, the rows of
// billing_windows whose window starts in [from, to) as a locking scan meets
// them: the committed rows and every version another live transaction
// wrote (its rows are locked by it), and tx's own.
func (c *Cluster) periodIndexLocked(tx *txn, from, to time.Time) []indexed {
	in := func(w driver.WindowRow) bool { return w.Start.Before(to) && (from.IsZero() || !w.Start.Before(from)) }
	seen := map[rowID]bool{}
	var out []indexed
	add := func(id rowID, r any) {
		w := r.(driver.WindowRow)
		if !in(w) || seen[id] {
			return
		}
		seen[id] = true
		if v, ok := tx.writes[id]; ok && !v.deleted {
			w = v.row.(driver.WindowRow)
		}
		out = append(out, indexed{id: id, row: w, locked: c.lockedByOther(tx, id)})
	}
	for k, r := range c.rows[tWindows] {
		add(rowID{tWindows, k}, r)
	}
	for other := range c.live {
		for id, v := range other.writes {
			if id.t == tWindows && !v.deleted {
				add(id, v.row)
			}
		}
	}
	slices.SortFunc(out, func(a, b indexed) int {
		return cmp.Or(b.row.Start.Compare(a.row.Start), b.row.ClosedAt.Compare(a.row.ClosedAt),
			strings.Compare(b.row.Account, a.row.Account), strings.Compare(b.row.Currency, a.row.Currency))
	})
	return out
}

// probeLocked is the first statement of sealing: the latest window in
// [from, to) with an open row, locking it; every row the scan meets before
// it that another transaction holds is waited for.
func (c *Cluster) probeLocked(ctx context.Context, tx *txn, from, to time.Time) (time.Time, bool, error) {
scan:
	for {
		for _, r := range c.periodIndexLocked(tx, from, to) {
			if r.locked != nil {
				if err := c.waitLocked(ctx, tx, r.locked, r.id); err != nil {
					return time.Time{}, false, err
				}
				continue scan
			}
			if cur, ok := c.getLocked(tx, r.id); ok && cur.(driver.WindowRow).ClosedAt.IsZero() {
				c.locks[r.id], tx.locks[r.id] = tx, struct{}{}
				return r.row.Start, true, nil
			}
		}
		return time.Time{}, false, nil
	}
}

// openRowsLocked is the second: up to limit open rows of window w, locked,
// in the index's descending order.
func (c *Cluster) openRowsLocked(ctx context.Context, tx *txn, w time.Time, limit int) ([]rowID, error) {
	var out []rowID
	taken := map[rowID]bool{}
scan:
	for len(out) < limit {
		for _, r := range c.periodIndexLocked(tx, w, w.Add(time.Microsecond)) {
			if taken[r.id] {
				continue
			}
			// A row another transaction holds is waited for whatever it
			// made of the row: its old index entry is in the range.
			if r.locked != nil {
				if err := c.waitLocked(ctx, tx, r.locked, r.id); err != nil {
					return nil, err
				}
				continue scan
			}
			if cur, ok := c.getLocked(tx, r.id); ok && cur.(driver.WindowRow).ClosedAt.IsZero() {
				c.locks[r.id], tx.locks[r.id] = tx, struct{}{}
				taken[r.id] = true
				out = append(out, r.id)
				if len(out) == limit {
					break scan
				}
			}
		}
		break
	}
	return out, nil
}
