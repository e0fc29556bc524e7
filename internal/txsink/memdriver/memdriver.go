// Package memdriver is an in-memory implementation of package driver: one
// XA resource manager with the control server's bookkeeping and the
// ledger's tables, faithful to what MySQL 8.4 and MariaDB 10.11 (InnoDB,
// READ COMMITTED) do where the protocol and the pipeline depend on it. It
// passes the same conformance suite (txsink/drivertest) as the real
// servers, so tests of the protocol and of the pipeline can run in
// milliseconds without them.
//
// What it models:
//
//   - XA branches and their states: START, END, PREPARE, COMMIT and
//     ROLLBACK on the connection that owns the branch; XAER_DUPID for an
//     xid in use; a dropped connection rolls back its unprepared branch
//     and leaves a prepared one prepared;
//   - prepared branches attached to their connection until it ends
//     (MariaDB, Options.AttachPrepared) or detached at PREPARE (MySQL 8.4);
//     an attached branch cannot be resolved from elsewhere (XAER_NOTA);
//   - accounts: XA RECOVER lists every account's branches; a connection is
//     visible to its own account, and its transaction only with
//     Options.TxVisible (the PROCESS privilege);
//   - server restarts: connections end, prepared branches survive
//     detached (with their row locks), connection ids start again at 1;
//   - writes: a branch's writes (Conn.Put, and the ledger's tables) become
//     visible when it commits, never when it rolls back;
//   - the control tables: decisions inserted once, partition rows with
//     epochs and owners, the closing frontier, the dedup keys' generations
//     (rotations and records refused while an emptying holds them, as
//     NOWAIT does), the commit log (numbered in
//     commit order: each control method is one serialisable transaction
//     under the server's lock), the ledger identity;
//   - the ledger's tables (ledger.go, store.go): row locks held by a
//     branch until it ends, prepared or not, with lock waits bounded by
//     Options.LockWait (Transient) and deadlocks reported at once; no gap
//     locks; reads in a branch see its own writes and the committed rows,
//     the pools' reads committed rows only; the claim upsert's affected
//     rows; BIGINT overflow (Overflow, error 1690); column bounds (Data);
//     statements cut to the budget read from Options.MaxAllowedPacket and
//     refused as TooLarge when the server's limit (SetMaxAllowedPacket) fell
//     below one (error 1153; MariaDB 10.11 drops the connection instead
//     while a statement far over its limit is sent, a Transient error: the
//     conformance suite takes either); the sealing's locking reads on the
//     period index; identifiers
//     stored as bytes; a trigger (SetTrigger) that refuses rows, as an
//     operator's CHECK constraint or trigger would.
//
// The locks of the control tables are not modelled (each control method
// runs under the server's lock, serialisable): the real servers' locking
// there is exercised by the integration tests.
package memdriver

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// Options describe the server modelled.
type Options struct {
	// AttachPrepared keeps a prepared branch attached to the connection
	// that prepared it until that connection ends (MariaDB). Without it
	// PREPARE detaches the branch (MySQL 8.4's xa_detach_on_prepare).
	AttachPrepared bool
	// TxVisible lets Session tell whether a connection holds a transaction
	// (the PROCESS privilege).
	TxVisible bool
	// MaxAllowedPacket is the server's max_allowed_packet at start (16 MiB
	// when 0): the statement budget is half of it (package stmt), reread
	// by RefreshLimits.
	MaxAllowedPacket int
	// LockWait bounds a wait for another branch's row lock
	// (innodb_lock_wait_timeout); 5s when 0.
	LockWait time.Duration
	// Now is the server's clock; time.Now when nil.
	Now func() time.Time
}

// Cluster is one server's state, shared by the handles (accounts) that
// connect to it.
type Cluster struct {
	opts Options

	mu         sync.Mutex
	started    time.Time
	nextConn   uint64
	conns      map[uint64]*connState
	branches   map[driver.Xid]*branch
	data       map[string]string
	decisions  map[string]driver.Decision
	partitions map[driver.Scope]map[int32]driver.Stored
	frontier   driver.Frontier
	lastSeq    int64          // the commit log's counter
	commits    []commitRecord // the commit log, in sequence order
	identity   *identity
	gens       driver.KeyGenerations        // the dedup keys' generations (generations.go); Now unused
	cursor     driver.MoveCursor            // the live move's cursor (driver.MoveCursor)
	waits      map[string]driver.MoveCursor // AwaitStep: the step each instance waits for
	genHolders int                          // HoldKeyGenerations running: rotations and records refused
	faults     map[string][]driver.Code     // by operation, one per call
	view       viewState                    // read only by the read-only view (view.go)
	changelog  changelogState               // changelog_state and the counter's flag (outbox.go)

	ledger // the ledger's tables (ledger.go)
}

// commitRecord is a row of the commit log.
type commitRecord struct {
	seq     int64
	gtrid   string
	at      time.Time // the server's clock
	applied bool
	sealed  time.Time
}

type identity struct {
	id     string
	secret []byte
}

type connState struct {
	id     uint64
	user   string
	alive  bool
	branch *branch // the branch this connection holds, if any
}

type branchStateKind int

const (
	active branchStateKind = iota
	idle
	prepared
)

type branch struct {
	xid     driver.Xid
	state   branchStateKind
	holder  uint64 // connection holding it; 0 when detached
	started time.Time
	writes  map[string]string
	tx      *txn // its writes to the ledger's tables, and its row locks
}

// New returns a server modelled by opts.
func New(opts Options) *Cluster {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxAllowedPacket == 0 {
		opts.MaxAllowedPacket = 16 << 20
	}
	if opts.LockWait == 0 {
		opts.LockWait = 5 * time.Second
	}
	return &Cluster{
		opts: opts, started: opts.Now(), nextConn: 1,
		conns: map[uint64]*connState{}, branches: map[driver.Xid]*branch{}, data: map[string]string{},
		decisions: map[string]driver.Decision{}, partitions: map[driver.Scope]map[int32]driver.Stored{},
		faults: map[string][]driver.Code{}, ledger: newLedger(opts.MaxAllowedPacket),
		gens: driver.KeyGenerations{Since: opts.Now().UTC().Truncate(time.Microsecond), Emptied: -1},
	}
}

// As returns a handle that connects as user.
func (c *Cluster) As(user string) *Server { return &Server{c: c, user: user} }

// Restart models a server restart: every connection ends, unprepared
// branches roll back, prepared ones survive detached, connection ids start
// again at 1.
func (c *Cluster) Restart() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cs := range c.conns {
		c.endLocked(cs)
	}
	clear(c.conns)
	c.nextConn = 1
	c.started = c.opts.Now()
}

// Fail makes the next calls of operation op fail with the given codes, one
// per call. Operations: "commit" (Control.Commit: the decision is applied,
// then its COMMIT reported ambiguous, when the code is Transient), "decide",
// "resolve", "xa", "conn", "recover" (XA RECOVER), "applied"
// (Control.MarkApplied).
func (c *Cluster) Fail(op string, codes ...driver.Code) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.faults[op] = append(c.faults[op], codes...)
}

func (c *Cluster) faultLocked(op string) (driver.Code, bool) {
	q := c.faults[op]
	if len(q) == 0 {
		return 0, false
	}
	c.faults[op] = q[1:]
	return q[0], true
}

// SeedIdentity sets the ledger identity this server's control tables hold,
// as if a first start had created it (scenario tests name their ledgers).
func (c *Cluster) SeedIdentity(id string, secret []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.identity = &identity{id: id, secret: slices.Clone(secret)}
}

// Get reads a committed write.
func (c *Cluster) Get(key string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.data[key]
	return v, ok
}

// Decisions returns a copy of the decision table.
func (c *Cluster) Decisions() map[string]driver.Decision {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.decisions)
}

// Branches describes every branch, prepared or not, in xid order: for
// scenario output.
func (c *Cluster) Branches() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, b := range c.branches {
		state := [...]string{"active", "idle", "prepared"}[b.state]
		holder := "detached"
		if b.holder != 0 {
			holder = fmt.Sprintf("attached to c%d", b.holder)
		}
		out = append(out, fmt.Sprintf("%s %s %s %s", b.xid.Gtrid, b.xid.Bqual, state, holder))
	}
	slices.Sort(out)
	return out
}

// endLocked ends a connection: an unprepared branch it holds rolls back, a
// prepared one is detached.
func (c *Cluster) endLocked(cs *connState) {
	cs.alive = false
	if b := cs.branch; b != nil {
		if b.state == prepared {
			b.holder = 0
		} else {
			c.endTxnLocked(b.tx, false)
			delete(c.branches, b.xid)
		}
		cs.branch = nil
	}
}

func coded(code driver.Code, format string, args ...any) error {
	return &driver.CodedError{Code: code, Msg: "memdriver: " + fmt.Sprintf(format, args...)}
}

// Server is a handle on a Cluster for one account. It implements
// driver.Server and driver.Control.
type Server struct {
	c    *Cluster
	user string
}

var (
	_ driver.Server  = (*Server)(nil)
	_ driver.Control = (*Server)(nil)
	_ driver.Conn    = (*Conn)(nil)
)

// Cluster is the server this handle connects to.
func (s *Server) Cluster() *Cluster { return s.c }

// Conn opens a connection.
func (s *Server) Conn(ctx context.Context) (driver.Conn, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if code, ok := c.faultLocked("conn"); ok {
		return nil, coded(code, "injected connection failure")
	}
	cs := &connState{id: c.nextConn, user: s.user, alive: true}
	c.nextConn++
	c.conns[cs.id] = cs
	return &Conn{s: s, cs: cs}, nil
}

// Recover lists every prepared branch, every account's.
func (s *Server) Recover(ctx context.Context) ([]driver.Xid, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if code, ok := s.c.faultLocked("recover"); ok {
		return nil, coded(code, "injected XA RECOVER failure")
	}
	var out []driver.Xid
	for x, b := range s.c.branches {
		if b.state == prepared {
			out = append(out, x)
		}
	}
	slices.SortFunc(out, func(a, b driver.Xid) int { return cmp.Or(cmp.Compare(a.Gtrid, b.Gtrid), cmp.Compare(a.Bqual, b.Bqual)) })
	return out, nil
}

// Resolve commits or rolls back a prepared, detached branch.
func (s *Server) Resolve(ctx context.Context, x driver.Xid, commit bool) error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if code, ok := c.faultLocked("resolve"); ok {
		return coded(code, "injected resolve failure")
	}
	b, ok := c.branches[x]
	if !ok || b.state != prepared || b.holder != 0 {
		return coded(driver.UnknownXid, "XAER_NOTA: unknown xid %s/%s", x.Gtrid, x.Bqual)
	}
	c.finishLocked(b, commit)
	return nil
}

func (c *Cluster) finishLocked(b *branch, commit bool) {
	if commit {
		maps.Copy(c.data, b.writes)
	}
	c.endTxnLocked(b.tx, commit)
	delete(c.branches, b.xid)
	if b.holder != 0 {
		if cs := c.conns[b.holder]; cs != nil && cs.branch == b {
			cs.branch = nil
		}
	}
}

// Session describes a connection as this account sees it: its own
// connections only.
func (s *Server) Session(ctx context.Context, id uint64) (driver.Session, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	cs, ok := c.conns[id]
	if !ok || !cs.alive || cs.user != s.user {
		return driver.Session{}, nil
	}
	out := driver.Session{Exists: true, OwnUser: true, TxKnown: c.opts.TxVisible}
	if out.TxKnown && cs.branch != nil {
		out.InTx, out.TxAge = true, c.opts.Now().Sub(cs.branch.started)
	}
	return out, nil
}

// Kill ends a connection of this account.
func (s *Server) Kill(ctx context.Context, id uint64) error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	cs, ok := c.conns[id]
	if !ok || !cs.alive {
		return coded(driver.Unknown, "unknown thread id %d", id)
	}
	if cs.user != s.user {
		return coded(driver.Unknown, "you are not owner of thread %d", id)
	}
	c.endLocked(cs)
	delete(c.conns, id)
	return nil
}

// Uptime is the time since the server (re)started.
func (s *Server) Uptime(ctx context.Context) (time.Duration, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.opts.Now().Sub(s.c.started), nil
}

// MaxStatementBytes is the statement budget: half the server's
// max_allowed_packet as last read (RefreshLimits).
func (s *Server) MaxStatementBytes() int {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.budget
}

// Code returns the code of a *driver.CodedError, Unknown for any other.
func (s *Server) Code(err error) driver.Code { return Code(err) }

// Code classifies errors of this package.
func Code(err error) driver.Code {
	var ce *driver.CodedError
	if err != nil && asCoded(err, &ce) {
		return ce.Code
	}
	return driver.Unknown
}

// Conn is a connection.
type Conn struct {
	s  *Server
	cs *connState
}

// ID is the connection's id.
func (k *Conn) ID() uint64 { return k.cs.id }

// XA runs an XA statement on the connection.
func (k *Conn) XA(ctx context.Context, verb driver.Verb, x driver.Xid) error {
	c := k.s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if !k.cs.alive {
		return coded(driver.Transient, "connection %d was killed", k.cs.id)
	}
	if code, ok := c.faultLocked("xa"); ok {
		// A failed statement leaves the connection broken, as a lost
		// connection would.
		c.endLocked(k.cs)
		delete(c.conns, k.cs.id)
		return coded(code, "injected failure of XA %s", verb)
	}
	held := k.cs.branch
	switch verb {
	case driver.Start:
		if held != nil {
			return coded(driver.Unknown, "XAER_RMFAIL: connection already in a transaction")
		}
		if _, ok := c.branches[x]; ok {
			return coded(driver.DuplicateXid, "XAER_DUPID: xid %s/%s exists", x.Gtrid, x.Bqual)
		}
		b := &branch{xid: x, state: active, holder: k.cs.id, started: c.opts.Now(), writes: map[string]string{},
			tx: c.newTxnLocked(fmt.Sprintf("branch %s/%s", x.Gtrid, x.Bqual))}
		c.branches[x] = b
		k.cs.branch = b
		return nil
	case driver.End:
		if held == nil || held.xid != x || held.state != active {
			return coded(driver.Unknown, "XAER_RMFAIL: XA END of a branch not active here")
		}
		held.state = idle
		return nil
	case driver.Prepare:
		if held == nil || held.xid != x || held.state != idle {
			return coded(driver.Unknown, "XAER_RMFAIL: XA PREPARE of a branch not idle here")
		}
		held.state = prepared
		if !c.opts.AttachPrepared {
			held.holder = 0
			k.cs.branch = nil
		}
		return nil
	case driver.Commit, driver.Rollback:
		b, ok := c.branches[x]
		switch {
		case !ok:
			return coded(driver.UnknownXid, "XAER_NOTA: unknown xid %s/%s", x.Gtrid, x.Bqual)
		case b.holder != 0 && b.holder != k.cs.id:
			return coded(driver.UnknownXid, "XAER_NOTA: xid %s/%s belongs to another connection", x.Gtrid, x.Bqual)
		case b.state == active:
			return coded(driver.Unknown, "XAER_RMFAIL: branch still active")
		case b.state == idle && verb == driver.Commit:
			return coded(driver.Unknown, "XAER_RMFAIL: one-phase commit is not used by the protocol")
		}
		c.finishLocked(b, verb == driver.Commit)
		return nil
	}
	return coded(driver.Unknown, "unknown verb %q", verb)
}

// Put writes key=value in the branch the connection holds.
func (k *Conn) Put(key, value string) error {
	c := k.s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if !k.cs.alive {
		return coded(driver.Transient, "connection %d was killed", k.cs.id)
	}
	b := k.cs.branch
	if b == nil || b.state != active {
		return coded(driver.Unknown, "no active branch on connection %d", k.cs.id)
	}
	b.writes[key] = value
	return nil
}

// Close gives the connection back; not reusable, it ends.
func (k *Conn) Close(reusable bool) {
	c := k.s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if reusable && k.cs.alive && k.cs.branch == nil {
		return // back in the pool, still open
	}
	c.endLocked(k.cs)
	delete(c.conns, k.cs.id)
}
