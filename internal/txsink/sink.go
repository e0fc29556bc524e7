package txsink

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/stmt"
)

// Failpoint names, in protocol order. Tests arm them (see package failpoint)
// to stop the process between any two steps.
const (
	FailBeforePrepare  = "before-prepare"   // all branches written, none prepared
	FailBetweenPrepare = "between-prepares" // first branch prepared, the others not
	FailAfterPrepare   = "after-prepare"    // all prepared, no decision
	FailAfterDecision  = "after-decision"   // decision and offsets durable, no XA COMMIT
	FailBetweenCommits = "between-commits"  // first branch committed, the others prepared
	FailAfterCommit    = "after-commit"     // all committed, Kafka group offsets not yet
)

// Config configures a Sink.
type Config struct {
	// DSNs of the MySQL servers, the control server first. The control
	// server holds partition offsets and checkpoint decisions; every server
	// holds a shard of the results and dedup keys.
	DSNs []string
	// Branches is the number of parallel XA branches per server.
	Branches int
	// Group and Topic scope the partition offsets.
	Group, Topic string
	// LockWaitTimeout bounds how long a statement waits for another
	// transaction's row locks (innodb_lock_wait_timeout, whole seconds).
	LockWaitTimeout time.Duration
	// StepTimeout bounds one protocol step (prepare, decide, commit of all
	// branches), detached from the caller's cancellation.
	StepTimeout time.Duration
	Failpoints  *failpoint.Set
	Logger      *slog.Logger
}

func (c *Config) validate() error {
	var errs []error
	if len(c.DSNs) == 0 {
		errs = append(errs, errors.New("no DSN"))
	}
	if c.Branches < 1 {
		errs = append(errs, errors.New("Branches must be at least 1"))
	}
	if c.Group == "" || c.Topic == "" {
		errs = append(errs, errors.New("Group and Topic are required"))
	}
	if c.StepTimeout <= 0 {
		errs = append(errs, errors.New("StepTimeout must be positive"))
	}
	return errors.Join(errs...)
}

type server struct {
	index int
	db    *sqlx.DB
	// budget bounds the bytes of one statement on this server (see package
	// stmt): half the smaller of the server's and the client's
	// max_allowed_packet, read when the sink opens and again after a
	// statement was refused for its size (RefreshLimits).
	budget atomic.Int64
}

// Sink is the exactly-once sink: it runs checkpoints as XA transactions over
// every participant (Branches connections on each server), decides them
// durably on the control server, and resolves branches left in doubt.
//
// A Sink is safe for concurrent use; the transactions it begins are not.
type Sink struct {
	cfg      Config
	instance string
	scope    string // this deployment's mark in every bqual
	servers  []*server
	log      *slog.Logger

	mu   sync.Mutex // guards idle
	idle []*pinned  // per participant: its connection between checkpoints

	clientMaxPacket []int // per server: the DSN's maxAllowedPacket
}

// Open connects to every server. The instance id is new at every Open: it is
// the owner written into partition_offsets and part of every gtrid.
func Open(ctx context.Context, cfg Config) (*Sink, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("txsink: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LockWaitTimeout < time.Second {
		cfg.LockWaitTimeout = 5 * time.Second
	}
	var id [6]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("txsink: instance id: %w", err)
	}
	mc, err := mysql.ParseDSN(cfg.DSNs[0])
	if err != nil {
		return nil, fmt.Errorf("txsink: control DSN: %w", err)
	}
	s := &Sink{cfg: cfg, instance: hex.EncodeToString(id[:]), scope: scopeOf(mc.DBName), log: cfg.Logger}
	s.idle = make([]*pinned, len(cfg.DSNs)*cfg.Branches)
	s.clientMaxPacket = make([]int, len(cfg.DSNs))
	for i, dsn := range cfg.DSNs {
		if c, err := mysql.ParseDSN(dsn); err == nil {
			s.clientMaxPacket[i] = c.MaxAllowedPacket // 0: the driver reads the server's
		}
		db, err := OpenDB(dsn, cfg.LockWaitTimeout, cfg.Branches+8)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("txsink: server %d: %w", i, err)
		}
		if err := db.PingContext(ctx); err != nil {
			_ = db.Close()
			s.Close()
			return nil, fmt.Errorf("txsink: server %d: %w", i, err)
		}
		sv := &server{index: i, db: db}
		s.servers = append(s.servers, sv)
		if err := s.readLimits(ctx, sv); err != nil {
			s.Close()
			return nil, fmt.Errorf("txsink: server %d: %w", i, err)
		}
	}
	return s, nil
}

// readLimits reads a server's max_allowed_packet and sets its statement
// budget. A server whose limit leaves too small a budget is refused: every
// checkpoint would have to be cut into tiny statements, and a dead letter
// could not keep a useful part of its payload.
func (s *Sink) readLimits(ctx context.Context, sv *server) error {
	var serverMax int
	if err := sv.db.GetContext(ctx, &serverMax, `SELECT @@max_allowed_packet`); err != nil {
		return fmt.Errorf("read max_allowed_packet: %w", err)
	}
	limit := serverMax
	if clientMax := s.clientMaxPacket[sv.index]; clientMax > 0 && clientMax < limit {
		limit = clientMax
	}
	if limit < stmt.MinPacket {
		return fmt.Errorf("max_allowed_packet is %d bytes (the server's %d, the client's %d): the service needs at least %d",
			limit, serverMax, s.clientMaxPacket[sv.index], stmt.MinPacket)
	}
	sv.budget.Store(int64(stmt.Budget(limit)))
	return nil
}

// RefreshLimits rereads every server's max_allowed_packet: after a
// statement was refused for its size (an operator lowered the limit), the
// replayed checkpoint is cut to the new budget.
func (s *Sink) RefreshLimits(ctx context.Context) error {
	var errs []error
	for _, sv := range s.servers {
		if err := s.readLimits(ctx, sv); err != nil {
			errs = append(errs, fmt.Errorf("server %d: %w", sv.index, err))
		}
	}
	return errors.Join(errs...)
}

// MaxStatementBytes is the budget of one statement on the server a
// participant's branches run on.
func (s *Sink) MaxStatementBytes(participant int) int {
	return int(s.serverOf(participant).budget.Load())
}

// ServerStatementBytes is the budget of one statement on server i (in the
// order of Servers).
func (s *Sink) ServerStatementBytes(i int) int { return int(s.servers[i].budget.Load()) }

// OpenDB opens a pool with the session settings the protocol relies on:
// client-side interpolation (one round trip per statement), UTC times, a
// bounded lock wait, and READ COMMITTED.
//
// READ COMMITTED matters for liveness, not safety. Under REPEATABLE READ a
// locking read of a row that does not exist yet takes a gap lock; two
// instances seeding new accounts in the same gap both get it, and then
// block each other's inserts: a deadlock, repeated at every retry. Under
// READ COMMITTED locking reads lock records only. Safety rests on record
// locks and unique keys (the dedup key's primary key, the decision's
// compare-and-set, the partition row's epoch), which every level keeps.
// MySQL 8 names the session variable transaction_isolation; MariaDB (before
// 11.1) tx_isolation: the first that the server knows is used.
func OpenDB(dsn string, lockWait time.Duration, maxOpen int) (*sqlx.DB, error) {
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	mc.InterpolateParams = true
	mc.ParseTime = true
	mc.Loc = time.UTC
	mc.MultiStatements = false
	// Affected rows count changed rows only: dedup.Claim tells a new key
	// from an existing one by it (with CLIENT_FOUND_ROWS an existing key
	// would count as inserted, and its repeat would count twice).
	mc.ClientFoundRows = false
	if mc.Params == nil {
		mc.Params = map[string]string{}
	}
	mc.Params["time_zone"] = "'+00:00'"
	mc.Params["innodb_lock_wait_timeout"] = strconv.Itoa(int(lockWait / time.Second))
	var lastErr error
	for _, isolation := range []string{"transaction_isolation", "tx_isolation"} {
		delete(mc.Params, "transaction_isolation")
		delete(mc.Params, "tx_isolation")
		mc.Params[isolation] = "'READ-COMMITTED'"
		conn, err := mysql.NewConnector(mc)
		if err != nil {
			return nil, err
		}
		db := sqlx.NewDb(sql.OpenDB(conn), "mysql")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = db.PingContext(ctx)
		cancel()
		if mysqlCode(err) == erUnknownSystemVariable {
			_ = db.Close()
			lastErr = err
			continue
		}
		// Other errors (server down) surface at first use; the pool
		// retries connecting then.
		db.SetMaxOpenConns(maxOpen)
		db.SetMaxIdleConns(maxOpen)
		db.SetConnMaxIdleTime(5 * time.Minute)
		return db, nil
	}
	return nil, fmt.Errorf("set READ COMMITTED: %w", lastErr)
}

// Close closes every connection.
func (s *Sink) Close() {
	s.mu.Lock()
	for i, pc := range s.idle {
		if pc != nil {
			pc.close()
			s.idle[i] = nil
		}
	}
	s.mu.Unlock()
	for _, sv := range s.servers {
		_ = sv.db.Close()
	}
}

// Instance is this process's owner id.
func (s *Sink) Instance() string { return s.instance }

// Participants is the number of XA branches a checkpoint may use.
func (s *Sink) Participants() int { return len(s.servers) * s.cfg.Branches }

// Control is the control server's pool.
func (s *Sink) Control() *sqlx.DB { return s.servers[0].db }

// Servers are the pools of every server, the control server first.
func (s *Sink) Servers() []*sqlx.DB {
	dbs := make([]*sqlx.DB, len(s.servers))
	for i, sv := range s.servers {
		dbs[i] = sv.db
	}
	return dbs
}

// ServerOf is the pool of the server a participant's branches run on.
func (s *Sink) ServerOf(participant int) *sqlx.DB { return s.serverOf(participant).db }

// Route places a key (an account id or an event id) on a participant. The
// server depends only on the key and the number of servers, so rows keep
// their server across restarts; the branch within a server only spreads the
// work.
func (s *Sink) Route(key string) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	sum := h.Sum64()
	n := uint64(len(s.servers))
	sv := sum % n
	slot := (sum / n) % uint64(s.cfg.Branches)
	return int(sv)*s.cfg.Branches + int(slot)
}

func (s *Sink) serverOf(participant int) *server { return s.servers[participant/s.cfg.Branches] }

// Begin starts a checkpoint transaction. No branch exists until it is first
// used: participants a checkpoint does not touch take no part in it.
func (s *Sink) Begin(checkpoint uint64) *Txn {
	id := GlobalID{Instance: s.instance, Checkpoint: checkpoint, Created: time.Now()}
	return &Txn{s: s, id: id, gtrid: id.String(), branches: make([]*Branch, s.Participants())}
}

// Txn is one checkpoint's global transaction. Its methods are called by one
// goroutine; Each runs branches in parallel internally.
type Txn struct {
	s        *Sink
	id       GlobalID
	gtrid    string
	mu       sync.Mutex // guards branches while Each starts them
	branches []*Branch
	decided  bool
}

// Gtrid is the global transaction id, also recorded as the checkpoint id of
// the rows the checkpoint writes.
func (t *Txn) Gtrid() string { return t.gtrid }

func (t *Txn) branch(ctx context.Context, participant int) (*Branch, error) {
	t.mu.Lock()
	b := t.branches[participant]
	t.mu.Unlock()
	if b != nil {
		return b, nil
	}
	sv := t.s.serverOf(participant)
	// A connection kept from an earlier checkpoint may have died with the
	// server in between: one retry on a fresh connection.
	var err error
	for try := 0; try < 2; try++ {
		var pc *pinned
		if pc, err = t.s.acquire(ctx, participant); err != nil {
			continue
		}
		b = &Branch{Participant: participant, server: sv, sink: t.s, pc: pc, conn: pc.conn,
			xid: Xid{Gtrid: t.gtrid, Bqual: bqual(participant, pc.id, t.s.scope)}}
		if err = b.xa(ctx, "START"); err == nil {
			break
		}
		b.release(false)
		b = nil
	}
	if err != nil {
		return nil, &StatementError{Participant: participant, Err: err}
	}
	t.mu.Lock()
	t.branches[participant] = b
	t.mu.Unlock()
	return b, nil
}

// acquire takes the participant's kept connection, or opens one.
func (s *Sink) acquire(ctx context.Context, participant int) (*pinned, error) {
	s.mu.Lock()
	pc := s.idle[participant]
	s.idle[participant] = nil
	s.mu.Unlock()
	if pc != nil {
		return pc, nil
	}
	conn, err := s.serverOf(participant).db.Connx(ctx)
	if err != nil {
		return nil, err
	}
	pc = &pinned{conn: conn}
	if err := conn.GetContext(ctx, &pc.id, "SELECT CONNECTION_ID()"); err != nil {
		discard(conn)
		_ = conn.Close()
		return nil, err
	}
	return pc, nil
}

// putBack keeps a connection whose branch ended cleanly for the
// participant's next checkpoint, and drops any other, so that no
// connection in an XA state is ever reused.
func (s *Sink) putBack(participant int, pc *pinned, clean bool) {
	if clean {
		s.mu.Lock()
		if s.idle[participant] == nil {
			s.idle[participant] = pc
			pc = nil
		}
		s.mu.Unlock()
	} else {
		discard(pc.conn)
	}
	if pc != nil {
		pc.close()
	}
}

// Each runs fn on the branch of every listed participant, in parallel,
// starting branches as needed. It returns the errors of all that failed.
func (t *Txn) Each(ctx context.Context, participants []int, fn func(context.Context, *Branch) error) error {
	if len(participants) == 0 {
		return nil
	}
	errs := make([]error, len(participants))
	var wg sync.WaitGroup
	for i, p := range participants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := t.branch(ctx, p)
			if err == nil {
				err = fn(ctx, b)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// started returns the branches that exist, in participant order.
func (t *Txn) started() []*Branch {
	var bs []*Branch
	for _, b := range t.branches {
		if b != nil {
			bs = append(bs, b)
		}
	}
	return bs
}

// Prepare ends every branch and prepares those that wrote something;
// read-only branches are rolled back instead (an empty branch is not
// prepared). Once Prepare returns nil, every write of the checkpoint is
// durable on its server and waits for the decision.
func (t *Txn) Prepare(ctx context.Context) error {
	fp := t.s.cfg.Failpoints
	if err := fp.Inject(FailBeforePrepare); err != nil {
		return &PhaseError{"prepare", err}
	}
	var writers []*Branch
	for _, b := range t.started() {
		if b.wrote {
			writers = append(writers, b)
			continue
		}
		// Read-only: end it, roll it back, keep the connection.
		err := b.xa(ctx, "END")
		if err == nil {
			err = b.xa(ctx, "ROLLBACK")
		}
		b.state = branchDone
		b.release(err == nil)
		t.branches[b.Participant] = nil
	}
	if len(writers) == 0 {
		return nil
	}
	// The first branch alone, then the rest in parallel: the failpoint
	// between them then has a well-defined meaning.
	if err := writers[0].prepare(ctx, t.s.cfg.StepTimeout); err != nil {
		return &PhaseError{"prepare", &StatementError{Participant: writers[0].Participant, Err: err}}
	}
	if err := fp.Inject(FailBetweenPrepare); err != nil {
		return &PhaseError{"prepare", err}
	}
	errs := make([]error, len(writers))
	var wg sync.WaitGroup
	for i, b := range writers[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.prepare(ctx, t.s.cfg.StepTimeout); err != nil {
				errs[i] = &StatementError{Participant: b.Participant, Err: err}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return &PhaseError{"prepare", err}
	}
	return nil
}

// Commit delivers XA COMMIT to every prepared branch. It must only be
// called after Decide returned nil. A branch whose connection broke is
// committed through a fresh connection; a branch the server no longer knows
// (XAER_NOTA) was committed by a recoverer, since nothing rolls back a
// branch decided commit. If some branch still cannot be committed when the
// step times out, Commit returns an error: the checkpoint is decided and its
// offsets already moved, so the caller must not replay it; the recoverer
// rolls the branch forward later.
func (t *Txn) Commit(ctx context.Context) error {
	if !t.decided {
		return &PhaseError{"commit", errors.New("commit before decision")}
	}
	var prepared []*Branch
	for _, b := range t.started() {
		if b.state == branchPrepared {
			prepared = append(prepared, b)
		}
	}
	if len(prepared) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.s.cfg.StepTimeout)
	defer cancel()
	if err := t.s.resolveBranch(ctx, prepared[0], "COMMIT"); err != nil {
		return &PhaseError{"commit", err}
	}
	if err := t.s.cfg.Failpoints.Inject(FailBetweenCommits); err != nil {
		return &PhaseError{"commit", err}
	}
	errs := make([]error, len(prepared))
	var wg sync.WaitGroup
	for i, b := range prepared[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = t.s.resolveBranch(ctx, b, "COMMIT")
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return &PhaseError{"commit", err}
	}
	return t.s.cfg.Failpoints.Inject(FailAfterCommit)
}

// Abort rolls back every branch of a checkpoint that was not decided
// commit. Prepared branches first get an abort decision, so that a
// recoverer may roll back whatever this call cannot reach without waiting
// for the branch to age. Abort is best effort: what it leaves in doubt,
// recovery resolves by the same decision.
func (t *Txn) Abort(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.s.cfg.StepTimeout)
	defer cancel()
	if t.decided {
		return &PhaseError{"abort", errors.New("abort after a commit decision")}
	}
	var errs []error
	var anyPrepared bool
	for _, b := range t.started() {
		anyPrepared = anyPrepared || b.state == branchPrepared
	}
	if anyPrepared {
		// A prepared branch is rolled back only under an abort decision
		// that won: without one, a commit may still be (or have been)
		// decided, and the branches are left to recovery.
		outcome, err := t.s.decide(ctx, t.gtrid, outcomeAbort)
		if err != nil {
			for _, b := range t.started() {
				b.release(false)
			}
			return &PhaseError{"abort", fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)}
		}
		if outcome == outcomeCommit {
			// Only possible after an ambiguous Decide: the commit won.
			t.decided = true
			return t.Commit(ctx)
		}
	}
	for _, b := range t.started() {
		switch b.state {
		case branchActive:
			err := b.xa(ctx, "END")
			if err == nil {
				err = b.xa(ctx, "ROLLBACK")
			}
			b.state = branchDone
			b.release(err == nil)
		case branchPrepared:
			if err := t.s.resolveBranch(ctx, b, "ROLLBACK"); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return &PhaseError{"abort", err}
	}
	return nil
}

// resolveBranch sends XA COMMIT or ROLLBACK for a prepared branch, first on
// its own connection, then on fresh ones, until it succeeds, the server
// says the xid is unknown (already resolved), or ctx ends.
func (s *Sink) resolveBranch(ctx context.Context, b *Branch, verb string) error {
	if b.conn != nil {
		err := b.xa(ctx, verb)
		if err == nil || mysqlCode(err) == erXAERNota {
			b.state = branchDone
			b.release(err == nil)
			return nil
		}
		b.release(false)
	}
	err := s.resolveXid(ctx, b.server, b.xid, verb)
	if err == nil {
		b.state = branchDone
	}
	return err
}

// errUnknownXid is XAER_NOTA: the server knows no prepared branch by that
// xid that this connection may resolve. Either the branch was resolved, or
// (MariaDB) it is still attached to the live connection that prepared it.
var errUnknownXid = errors.New("txsink: xid unknown to the server (XAER_NOTA)")

// xaOnce sends XA COMMIT or ROLLBACK for xid once, on a pooled connection.
func (s *Sink) xaOnce(ctx context.Context, sv *server, xid Xid, verb string) error {
	conn, err := sv.db.Connx(ctx)
	if err != nil {
		return err
	}
	_, err = conn.ExecContext(ctx, "XA "+verb+" "+xid.sql())
	if err != nil && mysqlCode(err) != erXAERNota {
		discard(conn)
	}
	_ = conn.Close()
	if mysqlCode(err) == erXAERNota {
		return errUnknownXid
	}
	return err
}

// resolveXid delivers XA COMMIT or ROLLBACK for a branch of this process
// whose own connection broke, through pooled connections, retrying with
// backoff until it succeeds, the xid is unknown (the broken connection is
// gone, so unknown means resolved), or ctx ends.
func (s *Sink) resolveXid(ctx context.Context, sv *server, xid Xid, verb string) error {
	backoff := 50 * time.Millisecond
	for {
		err := s.xaOnce(ctx, sv, xid, verb)
		if err == nil || errors.Is(err, errUnknownXid) {
			return nil
		}
		s.log.Warn("XA resolution failed, retrying", "verb", verb, "gtrid", xid.Gtrid, "bqual", xid.Bqual, "server", sv.index, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("XA %s %s/%s on server %d: %w (last error: %w)", verb, xid.Gtrid, xid.Bqual, sv.index, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}
