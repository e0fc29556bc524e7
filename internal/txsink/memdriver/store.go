package memdriver

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The ledger's tables in a branch (driver.StoreTx) and on the pools
// (driver.Store), over the model of ledger.go. Statements are cut as
// mysqldriver cuts them (statementsLocked, with the sizes its statements
// are estimated at); each runs in three steps, as one statement: its rows
// are checked against their columns, locked (waiting for other branches),
// then computed (overflow, the trigger) and applied, so that a statement
// that fails changes nothing.

var (
	_ driver.StoreTx = storeTx{}
	_ driver.Store   = (*Server)(nil)
)

// Text of mysqldriver's statements besides their rows, and of a row
// besides its arguments: the sizes statementsLocked cuts with.
const (
	keysText    = 110 // INSERT INTO dedup_keys ... ON DUPLICATE KEY UPDATE ...
	deleteText  = 120 // DELETE d FROM dedup_keys AS d FORCE INDEX (PRIMARY) WHERE ...
	lockText    = 256 // the locking reads of seeding and sealing
	resultBytes = 6*32 + 16
	letterText  = 260 // INSERT INTO dead_letters (...) VALUES ... ON DUPLICATE KEY UPDATE id = id
	entryText   = 240 // INSERT INTO ledger_entries (...) VALUES ... ON DUPLICATE KEY UPDATE ...
)

// Store is the ledger's tables in the branch the connection holds.
func (k *Conn) Store() driver.StoreTx { return storeTx{k} }

type storeTx struct{ k *Conn }

// begin locks the cluster and returns the transaction of the active branch
// the connection holds; the caller unlocks.
func (t storeTx) begin() (*Cluster, *txn, error) {
	c := t.k.s.c
	c.mu.Lock()
	if !t.k.cs.alive {
		c.mu.Unlock()
		return nil, nil, coded(driver.Transient, "connection %d was killed", t.k.cs.id)
	}
	b := t.k.cs.branch
	if b == nil || b.state != active {
		c.mu.Unlock()
		return nil, nil, coded(driver.Unknown, "no active branch on connection %d", t.k.cs.id)
	}
	return c, b.tx, nil
}

// keysOf is generation g's table.
func keysOf(g driver.Generation) table { return tKeys + table(g.Table()) }

func keyID(g driver.Generation, id string) rowID { return rowID{keysOf(g), id} }

func (t storeTx) SetLockWait(ctx context.Context, d time.Duration) error {
	c, tx, err := t.begin()
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	if d > 0 {
		d = max(time.Second, d.Truncate(time.Second)) // whole seconds, as the server's
	}
	tx.lockWait = d
	return nil
}

func (t storeTx) ClaimKeys(ctx context.Context, g driver.Generation, keys []driver.DedupKey) ([]driver.Contested, error) {
	c, tx, err := t.begin()
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	keys = slices.SortedFunc(slices.Values(keys), func(a, b driver.DedupKey) int { return strings.Compare(a.ID, b.ID) })
	var contested []driver.Contested
	err = c.statementsLocked(len(keys), keysText, func(i int) int {
		return stmt.RowBytes("(?,?,?,?)", keys[i].ID, keys[i].Fingerprint[:], keys[i].ExpiresAt, keys[i].Version)
	}, func(start, end int) error {
		part := keys[start:end]
		for _, k := range part {
			if err := checkBytes("event_id", k.ID, 128); err != nil {
				return err
			}
		}
		for _, k := range part {
			if err := c.lockLocked(ctx, tx, keyID(g, k.ID)); err != nil {
				return err
			}
		}
		var insert []driver.DedupKey
		for _, k := range part {
			if _, ok := c.getLocked(tx, keyID(g, k.ID)); !ok {
				k.ExpiresAt = datetime(k.ExpiresAt)
				if err := c.fireLocked(keysOf(g), k); err != nil {
					return err
				}
				insert = append(insert, k)
			}
		}
		for _, k := range insert {
			c.putLocked(tx, keyID(g, k.ID), k)
		}
		// The affected rows of the statement: a stored key counts 0.
		if len(insert) != len(part) {
			s := driver.Contested{Stored: len(part) - len(insert)}
			for _, k := range part {
				s.IDs = append(s.IDs, k.ID)
			}
			contested = append(contested, s)
		}
		return nil
	})
	return contested, err
}

func (t storeTx) LockKeys(ctx context.Context, g driver.Generation, ids []string) ([]driver.DedupKey, error) {
	c, tx, err := t.begin()
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	ids = slices.Sorted(slices.Values(ids))
	tx.tables[keysOf(g)] = struct{}{}
	var out []driver.DedupKey
	err = c.statementsLocked(len(ids), lockText, func(i int) int { return stmt.ArgBytes(ids[i]) }, func(start, end int) error {
		for _, id := range ids[start:end] {
			rid := keyID(g, id)
			for {
				h := c.lockedByOther(tx, rid)
				if h == nil {
					break
				}
				if err := c.waitLocked(ctx, tx, h, rid); err != nil {
					return err
				}
			}
			if r, ok := c.getLocked(tx, rid); ok {
				c.lockSharedLocked(tx, rid)
				out = append(out, r.(driver.DedupKey))
			}
		}
		return nil
	})
	return out, err
}

func (t storeTx) UnclaimKeys(ctx context.Context, g driver.Generation, ids []string) error {
	c, tx, err := t.begin()
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	return c.deleteKeysLocked(ctx, tx, g, slices.Sorted(slices.Values(ids)), func(driver.DedupKey) bool { return true })
}

// deleteKeysLocked deletes the keys of ids in generation g's table that if
// accepts, in statements of DELETE by primary key.
func (c *Cluster) deleteKeysLocked(ctx context.Context, tx *txn, g driver.Generation, ids []string, when func(driver.DedupKey) bool) error {
	return c.statementsLocked(len(ids), deleteText, func(i int) int { return stmt.ArgBytes(ids[i]) }, func(start, end int) error {
		for _, id := range ids[start:end] {
			if err := c.lockLocked(ctx, tx, keyID(g, id)); err != nil {
				return err
			}
		}
		for _, id := range ids[start:end] {
			if r, ok := c.getLocked(tx, keyID(g, id)); ok && when(r.(driver.DedupKey)) {
				c.deleteLocked(tx, keyID(g, id))
			}
		}
		return nil
	})
}

func (t storeTx) ReplaceKeys(ctx context.Context, g driver.Generation, keys []driver.DedupKey, now time.Time) error {
	c, tx, err := t.begin()
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	keys = slices.SortedFunc(slices.Values(keys), func(a, b driver.DedupKey) int { return strings.Compare(a.ID, b.ID) })
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = k.ID
	}
	expired := func(k driver.DedupKey) bool { return !k.ExpiresAt.After(datetime(now)) }
	if err := c.deleteKeysLocked(ctx, tx, g, ids, expired); err != nil {
		return err
	}
	return c.statementsLocked(len(keys), keysText, func(i int) int {
		return stmt.RowBytes("(?,?,?,?)", keys[i].ID, keys[i].Fingerprint[:], keys[i].ExpiresAt, keys[i].Version)
	}, func(start, end int) error {
		part := keys[start:end]
		for _, k := range part {
			if err := checkBytes("event_id", k.ID, 128); err != nil {
				return err
			}
			if err := c.lockLocked(ctx, tx, keyID(g, k.ID)); err != nil {
				return err
			}
		}
		for _, k := range part {
			if _, ok := c.getLocked(tx, keyID(g, k.ID)); ok {
				return coded(driver.Duplicate, "Duplicate entry '%s' for key 'PRIMARY'", k.ID)
			}
			if err := c.fireLocked(keysOf(g), k); err != nil {
				return err
			}
		}
		for _, k := range part {
			k.ExpiresAt = datetime(k.ExpiresAt)
			c.putLocked(tx, keyID(g, k.ID), k)
		}
		return nil
	})
}

func (t storeTx) UpdateKeys(ctx context.Context, g driver.Generation, keys []driver.DedupKey) error {
	c, tx, err := t.begin()
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	keys = slices.SortedFunc(slices.Values(keys), func(a, b driver.DedupKey) int { return strings.Compare(a.ID, b.ID) })
	return c.statementsLocked(len(keys), keysText, func(i int) int {
		return stmt.RowBytes("(?,?,?,?)", keys[i].ID, keys[i].Fingerprint[:], keys[i].ExpiresAt, keys[i].Version)
	}, func(start, end int) error {
		part := keys[start:end]
		for _, k := range part {
			if err := checkBytes("event_id", k.ID, 128); err != nil {
				return err
			}
			if err := checkBytes("version", k.Version, 103); err != nil {
				return err
			}
			if err := c.lockLocked(ctx, tx, keyID(g, k.ID)); err != nil {
				return err
			}
		}
		for _, k := range part {
			k.ExpiresAt = datetime(k.ExpiresAt)
			c.putLocked(tx, keyID(g, k.ID), k)
		}
		return nil
	})
}

// SeedJournal stores, committed, the keys ids in dedup_keys with a journal
// row of dedup_expiry listing them, expiring at expires, as the version
// before generations wrote them: for tests of a ledger migrated from it.
func (c *Cluster) SeedJournal(expires time.Time, ids []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		c.rows[tKeys][id] = driver.DedupKey{ID: id, ExpiresAt: datetime(expires)}
	}
	c.autoInc[tJournal]++
	r := driver.JournalRow{Seq: c.autoInc[tJournal], ExpiresAt: datetime(expires), IDs: slices.Clone(ids)}
	c.rows[tJournal][intKey(r.Seq)] = r
}

func balanceID(k driver.BalanceKey) rowID { return rowID{tBalances, key(k.Account, k.Currency)} }

func windowID(t table, k driver.WindowKey) rowID {
	return rowID{t, key(k.Account, k.Currency, intKey(k.Start.UnixMicro()))}
}

// lockReadLocked is a locking read by primary key of the row id: it waits
// for a lock another transaction holds (a row it writes, or inserts), then
// locks the row if it exists; a row that does not exist is not locked (no
// gap locks under READ COMMITTED).
func (c *Cluster) lockReadLocked(ctx context.Context, tx *txn, id rowID) (any, bool, error) {
	for {
		h := c.lockedByOther(tx, id)
		if h == nil {
			break
		}
		if err := c.waitLocked(ctx, tx, h, id); err != nil {
			return nil, false, err
		}
	}
	r, ok := c.getLocked(tx, id)
	if ok {
		c.locks[id], tx.locks[id] = tx, struct{}{}
	}
	return r, ok, nil
}

func (t storeTx) LockBalances(ctx context.Context, keys []driver.BalanceKey) ([]driver.BalanceRow, error) {
	c, tx, err := t.begin()
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	keys = slices.SortedFunc(slices.Values(keys), func(a, b driver.BalanceKey) int {
		return cmp.Or(strings.Compare(a.Account, b.Account), strings.Compare(a.Currency, b.Currency))
	})
	var out []driver.BalanceRow
	err = c.statementsLocked(len(keys), lockText, func(i int) int { return stmt.ArgBytes(keys[i].Account) + 32 }, func(start, end int) error {
		for _, k := range keys[start:end] {
			r, ok, err := c.lockReadLocked(ctx, tx, balanceID(k))
			if err != nil {
				return err
			}
			if ok {
				out = append(out, r.(driver.BalanceRow))
			}
		}
		return nil
	})
	return out, err
}

func (t storeTx) LockWindows(ctx context.Context, keys []driver.WindowKey) ([]driver.WindowRow, error) {
	rows, err := t.lockWindows(ctx, tWindows, keys)
	out := make([]driver.WindowRow, len(rows))
	for i, r := range rows {
		out[i] = r.(driver.WindowRow)
	}
	return out, err
}

func (t storeTx) LockAdjustments(ctx context.Context, keys []driver.WindowKey) ([]driver.AdjustmentRow, error) {
	rows, err := t.lockWindows(ctx, tAdjustments, keys)
	out := make([]driver.AdjustmentRow, len(rows))
	for i, r := range rows {
		out[i] = r.(driver.AdjustmentRow)
	}
	return out, err
}

func compareWindowKeys(a, b driver.WindowKey) int {
	return cmp.Or(strings.Compare(a.Account, b.Account), strings.Compare(a.Currency, b.Currency), a.Start.Compare(b.Start))
}

func (t storeTx) lockWindows(ctx context.Context, tb table, keys []driver.WindowKey) ([]any, error) {
	c, tx, err := t.begin()
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	keys = slices.SortedFunc(slices.Values(keys), compareWindowKeys)
	var out []any
	err = c.statementsLocked(len(keys), lockText, func(i int) int { return stmt.ArgBytes(keys[i].Account) + 80 }, func(start, end int) error {
		for _, k := range keys[start:end] {
			r, ok, err := c.lockReadLocked(ctx, tx, windowID(tb, k))
			if err != nil {
				return err
			}
			if ok {
				out = append(out, r)
			}
		}
		return nil
	})
	return out, err
}

// CreateBalances, CreateWindows and CreateAdjustments lock their keys'
// rows in key order, inserting each missing one at zero, as mysqldriver's
// upsert that changes nothing does, and read them all; they return the
// rows and the keys they inserted.
func (t storeTx) CreateBalances(ctx context.Context, keys []driver.BalanceKey) ([]driver.BalanceRow, []driver.BalanceKey, error) {
	keys = slices.SortedFunc(slices.Values(keys), func(a, b driver.BalanceKey) int {
		return cmp.Or(strings.Compare(a.Account, b.Account), strings.Compare(a.Currency, b.Currency))
	})
	ids := make([]rowID, len(keys))
	for i, k := range keys {
		ids[i] = balanceID(k)
	}
	rows, idx, err := t.create(ctx, ids, func(i int) int { return stmt.ArgBytes(keys[i].Account) + resultBytes }, func(i int) any {
		return driver.BalanceRow{BalanceKey: keys[i], UpdatedAt: createdAt}
	})
	out := make([]driver.BalanceRow, len(rows))
	for i, r := range rows {
		out[i] = r.(driver.BalanceRow)
	}
	created := make([]driver.BalanceKey, len(idx))
	for i, j := range idx {
		created[i] = keys[j]
	}
	return out, created, err
}

func (t storeTx) CreateWindows(ctx context.Context, keys []driver.WindowKey) ([]driver.WindowRow, []driver.WindowKey, error) {
	rows, created, err := t.createWindows(ctx, tWindows, keys, func(k driver.WindowKey) any { return driver.WindowRow{WindowKey: k, UpdatedAt: createdAt} })
	out := make([]driver.WindowRow, len(rows))
	for i, r := range rows {
		out[i] = r.(driver.WindowRow)
	}
	return out, created, err
}

func (t storeTx) CreateAdjustments(ctx context.Context, keys []driver.WindowKey) ([]driver.AdjustmentRow, []driver.WindowKey, error) {
	rows, created, err := t.createWindows(ctx, tAdjustments, keys, func(k driver.WindowKey) any { return driver.AdjustmentRow{WindowKey: k, UpdatedAt: createdAt} })
	out := make([]driver.AdjustmentRow, len(rows))
	for i, r := range rows {
		out[i] = r.(driver.AdjustmentRow)
	}
	return out, created, err
}

func (t storeTx) createWindows(ctx context.Context, tb table, keys []driver.WindowKey, zero func(driver.WindowKey) any) ([]any, []driver.WindowKey, error) {
	keys = slices.SortedFunc(slices.Values(keys), compareWindowKeys)
	ids := make([]rowID, len(keys))
	for i := range keys {
		keys[i].Start = datetime(keys[i].Start)
		ids[i] = windowID(tb, keys[i])
	}
	rows, idx, err := t.create(ctx, ids, func(i int) int { return stmt.ArgBytes(keys[i].Account) + resultBytes }, func(i int) any { return zero(keys[i]) })
	created := make([]driver.WindowKey, len(idx))
	for i, j := range idx {
		created[i] = keys[j]
	}
	return rows, created, err
}

// createdAt marks a row a create inserted, as mysqldriver's does (its
// updated_at until the row is written).
var createdAt = time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC)

// create locks the rows ids in order, each as soon as no other
// transaction holds it, inserts zero(i) where row i is missing, and
// returns every row and the indexes of the ones it inserted.
func (t storeTx) create(ctx context.Context, ids []rowID, rowBytes func(i int) int, zero func(i int) any) ([]any, []int, error) {
	c, tx, err := t.begin()
	if err != nil {
		return nil, nil, err
	}
	defer c.mu.Unlock()
	var rows []any
	var created []int
	err = c.statementsLocked(len(ids), 200, rowBytes, func(start, end int) error {
		for i := start; i < end; i++ {
			if err := c.lockLocked(ctx, tx, ids[i]); err != nil {
				return err
			}
			r, ok := c.getLocked(tx, ids[i])
			if !ok {
				r = zero(i)
				c.putLocked(tx, ids[i], r)
				created = append(created, i)
			}
			rows = append(rows, r)
		}
		return nil
	})
	return rows, created, err
}

// sums is one row of an upsert of sums, whatever its table: its key
// (driver.BalanceKey or driver.WindowKey, as the columns keep it), and the
// amount and count to add or set.
type sums struct {
	id            rowID
	key           any
	account, cur  string
	amount, count int64
	absolute      bool
	isNew         bool // a plain INSERT: a stored row is a duplicate
}

// upsertSumsLocked writes rows of sums as mysqldriver's upserts do: the
// adding rows in statements of their own, then the setting ones; build
// makes the stored row from the old one (nil when none) and the new sums.
func (c *Cluster) upsertSumsLocked(ctx context.Context, tx *txn, tb table, rows []sums, rowText int, build func(s sums, old any, amount, count int64) any) error {
	// The statements of mysqldriver's three modes: adding, setting, new.
	mode := func(r sums) int {
		switch {
		case r.isNew:
			return 2
		case r.absolute:
			return 1
		}
		return 0
	}
	for m := range 3 {
		var part []sums
		for _, r := range rows {
			if mode(r) == m {
				part = append(part, r)
			}
		}
		err := c.statementsLocked(len(part), 200, func(i int) int { return stmt.ArgBytes(part[i].account) + rowText }, func(start, end int) error {
			return c.upsertStatementLocked(ctx, tx, tb, part[start:end], build)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) upsertStatementLocked(ctx context.Context, tx *txn, tb table, part []sums, build func(s sums, old any, amount, count int64) any) error {
	for _, r := range part {
		if err := cmp.Or(checkBytes("account_id", r.account, 64), checkASCII("currency", r.cur, 3)); err != nil {
			return err
		}
	}
	for _, r := range part {
		if err := c.lockLocked(ctx, tx, r.id); err != nil {
			return err
		}
	}
	next := map[rowID]any{} // the statement's rows as it leaves them
	for _, r := range part {
		old, ok := next[r.id]
		if !ok {
			old, ok = c.getLocked(tx, r.id)
		}
		if ok && r.isNew {
			return coded(driver.Duplicate, "Duplicate entry '%s-%s' for key 'PRIMARY' in %s", r.account, r.cur, tableNames[tb])
		}
		amount, count := r.amount, r.count
		if ok && !r.absolute {
			a, n := storedSums(old)
			var err error
			if amount, err = addBigint(amountColumn(tb), a, r.amount); err != nil {
				return err
			}
			if count, err = addBigint("event_count", n, r.count); err != nil {
				return err
			}
		}
		if !ok {
			old = nil
		}
		row := build(r, old, amount, count)
		if err := c.fireLocked(tb, row); err != nil {
			return err
		}
		next[r.id] = row
	}
	for id, row := range next {
		c.putLocked(tx, id, row)
	}
	return nil
}

func amountColumn(tb table) string {
	if tb == tBalances {
		return "balance_minor"
	}
	return "amount_minor"
}

func storedSums(row any) (int64, int64) {
	switch r := row.(type) {
	case driver.BalanceRow:
		return r.Amount, r.Count
	case driver.WindowRow:
		return r.Amount, r.Count
	case driver.AdjustmentRow:
		return r.Amount, r.Count
	}
	return 0, 0
}

func (t storeTx) WriteBalances(ctx context.Context, rows []driver.Balance, now time.Time) error {
	c, tx, err := t.begin()
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	ss := make([]sums, len(rows))
	for i, r := range rows {
		ss[i] = sums{balanceID(r.BalanceKey), r.BalanceKey, r.Account, r.Currency, r.Amount, r.Count, r.Absolute, r.New}
	}
	return c.upsertSumsLocked(ctx, tx, tBalances, ss, resultBytes, func(s sums, old any, amount, count int64) any {
		b := driver.BalanceRow{BalanceKey: s.key.(driver.BalanceKey)}
		if old != nil {
			b = old.(driver.BalanceRow)
		}
		b.Amount, b.Count, b.UpdatedAt = amount, count, datetime(now)
		return b
	})
}

func windowSums(tb table, rows []driver.WindowSum) []sums {
	ss := make([]sums, len(rows))
	for i, r := range rows {
		k := r.WindowKey
		k.Start = datetime(k.Start)
		ss[i] = sums{windowID(tb, k), k, r.Account, r.Currency, r.Amount, r.Count, r.Absolute, r.New}
	}
	return ss
}

func (t storeTx) WriteWindows(ctx context.Context, rows []driver.WindowSum, now time.Time) error {
	c, tx, err := t.begin()
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	return c.upsertSumsLocked(ctx, tx, tWindows, windowSums(tWindows, rows), resultBytes, func(s sums, old any, amount, count int64) any {
		w := driver.WindowRow{WindowKey: s.key.(driver.WindowKey)}
		if old != nil {
			w = old.(driver.WindowRow)
		}
		w.Amount, w.Count, w.UpdatedAt = amount, count, datetime(now)
		return w
	})
}

func (t storeTx) WriteAdjustments(ctx context.Context, rows []driver.WindowSum, checkpoint string, now time.Time) error {
	c, tx, err := t.begin()
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	if err := checkBytes("checkpoint_id", checkpoint, 64); err != nil {
		return err
	}
	return c.upsertSumsLocked(ctx, tx, tAdjustments, windowSums(tAdjustments, rows), resultBytes+stmt.ArgBytes(checkpoint), func(s sums, old any, amount, count int64) any {
		a := driver.AdjustmentRow{WindowKey: s.key.(driver.WindowKey)}
		if old != nil {
			a = old.(driver.AdjustmentRow)
		}
		a.Amount, a.Count, a.UpdatedAt, a.Checkpoint = amount, count, datetime(now), checkpoint
		return a
	})
}
