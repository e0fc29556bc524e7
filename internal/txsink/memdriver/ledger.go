package memdriver

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The ledger's tables as InnoDB keeps them under READ COMMITTED, as far as
// the pipeline depends on it: committed rows, each transaction's own
// versions of the rows it changed (visible to it alone until it commits),
// and row locks held until the transaction ends. A transaction is an XA
// branch's (branch.tx) or a short local one of the pools (the cleanup).

// table names a table of the ledger.
type table int

const (
	tKeys table = iota // generation tables 0 (dedup_keys), 1 and 2: tKeys + Generation.Table()
	_
	_
	tJournal
	tBalances
	tWindows
	tAdjustments
	tEntries
	tDeadLetters
	tOutbox
	numTables
)

var tableNames = [numTables]string{"dedup_keys", "dedup_keys_g1", "dedup_keys_g2", "dedup_expiry", "account_balances", "billing_windows", "window_adjustments",
	"ledger_entries", "dead_letters", "changelog_outbox"}

// rowID names a row by its table and primary key (encoded by key).
type rowID struct {
	t   table
	key string
}

// key encodes a primary key's parts, each length-prefixed so that no two
// tuples share an encoding whatever bytes they hold.
func key(parts ...string) string {
	var b []byte
	for _, p := range parts {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return string(b)
}

func intKey(v int64) string { return string(binary.BigEndian.AppendUint64(nil, uint64(v))) }

// version is a transaction's own version of a row; deleted when it deleted
// the row.
type version struct {
	row     any
	deleted bool
}

// txn is a transaction on the ledger's tables.
type txn struct {
	name    string
	done    chan struct{} // closed when it ends: its lock waiters wake
	ended   bool
	waiting *txn // the transaction whose lock it waits for, if any
	// lockWait bounds its lock waits (SetLockWait); 0: Options.LockWait
	lockWait time.Duration
	locks    map[rowID]struct{}
	shared   map[rowID]struct{}
	writes   map[rowID]version
	// tables it touched: it holds their metadata lock until it ends (a
	// table is not emptied under it, see EmptyKeys).
	tables map[table]struct{}
}

// ledger is the ledger's state in a Cluster, guarded by Cluster.mu.
type ledger struct {
	rows    [numTables]map[string]any // committed, by primary key
	locks   map[rowID]*txn            // exclusive row locks
	shared  map[rowID]map[*txn]struct{}
	live    map[*txn]struct{} // transactions not ended
	autoInc [numTables]int64
	packet  int // the server's max_allowed_packet now
	budget  int // the statement budget as last read (RefreshLimits)
	trigger func(table string, row any) error
	// reinjected holds the re-injection columns of dead_letters, by id
	// (letters.go): only the operator's statements change them.
	reinjected map[int64]reinjection
}

func newLedger(packet int) ledger {
	l := ledger{locks: map[rowID]*txn{}, shared: map[rowID]map[*txn]struct{}{}, live: map[*txn]struct{}{}, packet: packet, budget: stmt.Budget(packet),
		reinjected: map[int64]reinjection{}}
	for i := range l.rows {
		l.rows[i] = map[string]any{}
	}
	return l
}

// SetMaxAllowedPacket sets the server's max_allowed_packet, as an
// operator's SET GLOBAL does: statements larger than it are refused
// (TooLarge) from now on, and the budget follows at the next
// RefreshLimits.
func (c *Cluster) SetMaxAllowedPacket(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.packet = n
}

// SetTrigger installs fn, called with every row a statement is about to
// insert or update (table name, the row as Tables returns it): an error
// refuses the statement, as a CHECK constraint or an operator's trigger
// does (make it a Data error to be taken for one: Refusal). nil removes
// it.
func (c *Cluster) SetTrigger(fn func(table string, row any) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.trigger = fn
}

// LockWaits is how many transactions are waiting for a row lock now: a
// test that orders two transactions' statements waits for one to block
// (information_schema.INNODB_LOCK_WAITS on the server).
func (c *Cluster) LockWaits() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for tx := range c.live {
		if tx.waiting != nil {
			n++
		}
	}
	return n
}

// Refusal is the error a trigger returns to refuse a row for its data
// (driver.Data, as SIGNAL SQLSTATE '45000' or a CHECK constraint).
func Refusal(msg string) error { return coded(driver.Data, "%s", msg) }

func (c *Cluster) newTxnLocked(name string) *txn {
	tx := &txn{name: name, done: make(chan struct{}), locks: map[rowID]struct{}{}, shared: map[rowID]struct{}{}, writes: map[rowID]version{},
		tables: map[table]struct{}{}}
	c.live[tx] = struct{}{}
	return tx
}

// endTxnLocked commits or rolls back tx and releases its locks.
func (c *Cluster) endTxnLocked(tx *txn, commit bool) {
	if tx == nil || tx.ended {
		return
	}
	if commit {
		for id, v := range tx.writes {
			if v.deleted {
				delete(c.rows[id.t], id.key)
			} else {
				c.rows[id.t][id.key] = v.row
			}
		}
	}
	for id := range tx.locks {
		if c.locks[id] == tx {
			delete(c.locks, id)
		}
	}
	for id := range tx.shared {
		delete(c.shared[id], tx)
		if len(c.shared[id]) == 0 {
			delete(c.shared, id)
		}
	}
	tx.ended, tx.locks, tx.shared, tx.writes, tx.tables = true, nil, nil, nil, nil
	delete(c.live, tx)
	close(tx.done)
}

// get is the row as tx sees it: its own version, else the committed one
// (tx nil: the committed one).
func (c *Cluster) getLocked(tx *txn, id rowID) (any, bool) {
	if tx != nil {
		if v, ok := tx.writes[id]; ok {
			return v.row, !v.deleted
		}
	}
	r, ok := c.rows[id.t][id.key]
	return r, ok
}

func (c *Cluster) putLocked(tx *txn, id rowID, row any) { tx.writes[id] = version{row: row} }

func (c *Cluster) deleteLocked(tx *txn, id rowID) { tx.writes[id] = version{deleted: true} }

// lockLocked takes the exclusive lock of row id for tx, waiting while
// another transaction holds it, exclusive or shared (see waitLocked).
func (c *Cluster) lockLocked(ctx context.Context, tx *txn, id rowID) error {
	tx.tables[id.t] = struct{}{}
	for {
		if tx.ended {
			return coded(driver.Transient, "%s ended while it waited for a lock", tx.name)
		}
		h := c.locks[id]
		if h == nil || h == tx {
			if s := c.sharedByOther(tx, id); s != nil {
				h = s
			} else {
				c.locks[id] = tx
				tx.locks[id] = struct{}{}
				return nil
			}
		}
		if err := c.waitLocked(ctx, tx, h, id); err != nil {
			return err
		}
	}
}

// sharedByOther is a transaction other than tx holding id's shared lock,
// if any.
func (c *Cluster) sharedByOther(tx *txn, id rowID) *txn {
	for h := range c.shared[id] {
		if h != tx {
			return h
		}
	}
	return nil
}

// lockSharedLocked takes a shared lock of row id for tx (a locking read
// of a row that exists), waiting while another transaction holds its
// exclusive lock; shared locks of several transactions do not wait for
// each other.
func (c *Cluster) lockSharedLocked(tx *txn, id rowID) {
	if c.locks[id] == tx {
		return // the exclusive lock covers it
	}
	if c.shared[id] == nil {
		c.shared[id] = map[*txn]struct{}{}
	}
	c.shared[id][tx] = struct{}{}
	tx.shared[id] = struct{}{}
}

// waitLocked waits, with the cluster's lock released, until h ends, at
// most Options.LockWait (then a Transient error, as error 1205) or until
// ctx ends. A wait that would close a cycle of waits is a deadlock
// (Transient, as error 1213), reported at once as InnoDB does.
func (c *Cluster) waitLocked(ctx context.Context, tx, h *txn, id rowID) error {
	for w := h; w != nil; w = w.waiting {
		if w == tx {
			return coded(driver.Transient, "Deadlock found when trying to get lock on %s; try restarting transaction", tableNames[id.t])
		}
	}
	tx.waiting = h
	c.mu.Unlock()
	wait := c.opts.LockWait
	if tx.lockWait > 0 {
		wait = tx.lockWait
	}
	t := time.NewTimer(wait)
	var err error
	select {
	case <-h.done:
	case <-t.C:
		err = coded(driver.Transient, "Lock wait timeout exceeded on %s (held by %s); try restarting transaction", tableNames[id.t], h.name)
	case <-ctx.Done():
		err = ctx.Err()
	}
	t.Stop()
	c.mu.Lock()
	tx.waiting = nil
	return err
}

// lockedByOther is the transaction other than tx holding id's lock, if any.
func (c *Cluster) lockedByOther(tx *txn, id rowID) *txn {
	if h := c.locks[id]; h != nil && h != tx {
		return h
	}
	return nil
}

// statementsLocked cuts n rows into the statements mysqldriver would send
// (stmt.Split within the budget as last read; fixed is the text besides
// the rows) and runs fn on each: a statement larger than the server's
// max_allowed_packet now is refused as TooLarge before it runs, as the
// server refuses the packet.
func (c *Cluster) statementsLocked(n, fixed int, rowBytes func(i int) int, fn func(start, end int) error) error {
	return stmt.Split(n, fixed, c.budget, rowBytes, func(start, end int) error {
		size := fixed
		for i := start; i < end; i++ {
			size += rowBytes(i)
		}
		if size > c.packet {
			return coded(driver.TooLarge, "Got a packet bigger than 'max_allowed_packet' bytes (%d > %d)", size, c.packet)
		}
		return fn(start, end)
	})
}

// fire runs the trigger on a row about to be written.
func (c *Cluster) fireLocked(t table, row any) error {
	if c.trigger == nil {
		return nil
	}
	return c.trigger(tableNames[t], row)
}

// Column checks, as strict mode refuses what a column cannot hold.

func checkBytes(column string, v string, max int) error {
	if len(v) > max {
		return coded(driver.Data, "Data too long for column '%s' (%d bytes, at most %d)", column, len(v), max)
	}
	return nil
}

func checkASCII(column string, v string, max int) error {
	for i := 0; i < len(v); i++ {
		if v[i] >= 0x80 {
			return coded(driver.Data, "Incorrect string value for column '%s'", column)
		}
	}
	return checkBytes(column, v, max)
}

// addBigint is a + b as a BIGINT column takes it: out of range, the
// statement fails as error 1690 does.
func addBigint(column string, a, b int64) (int64, error) {
	s := a + b
	if (a >= 0) == (b >= 0) && (s >= 0) != (a >= 0) {
		return 0, coded(driver.Overflow, "BIGINT value is out of range in '%s + %d'", column, b)
	}
	return s, nil
}

// datetime is an instant as a DATETIME(6) column keeps it.
func datetime(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }
