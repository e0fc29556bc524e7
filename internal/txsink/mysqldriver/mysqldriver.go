// Package mysqldriver runs the exactly-once protocol (package txsink) on
// MySQL 8.4 and MariaDB 10.11: it implements package driver over
// go-sql-driver/mysql, and every quirk of those servers lives here.
//
//   - go-sql-driver/mysql has no XA API: a branch is pinned to one
//     connection for its whole life and XA statements go as plain text,
//     xids as hex literals; BeginTx is never called on that connection, and
//     a connection whose branch did not end cleanly is discarded, never
//     pooled in an XA state.
//   - MariaDB keeps a prepared branch attached to the live connection that
//     prepared it: XA COMMIT or ROLLBACK from another connection answer
//     XAER_NOTA (driver.UnknownXid) until that connection ends. MySQL 8.4
//     detaches it at PREPARE (xa_detach_on_prepare).
//   - XA RECOVER needs XA_RECOVER_ADMIN on MySQL 8.4 and nothing on
//     MariaDB; both list every account's branches. Seeing another
//     connection's transaction (INNODB_TRX) needs PROCESS; without it,
//     Session says it does not know. INNODB_TRX.trx_started is in the
//     server's system time zone on both (see trxAge).
//   - Sessions run READ COMMITTED and UTC (OpenDB).
//   - Statements are bounded by each server's max_allowed_packet (package
//     stmt).
//   - Server error numbers are classified in errors.go, their one home.
package mysqldriver

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Options configure Open.
type Options struct {
	// LockWaitTimeout bounds how long a statement waits for another
	// transaction's row locks (innodb_lock_wait_timeout, whole seconds;
	// 5s when under 1s).
	LockWaitTimeout time.Duration
	// MaxConns bounds each server's pool (branches, lookups, decisions,
	// recovery, health checks, sampling); 10 when 0.
	MaxConns int
	// ReadAheadConns are added to the pool OpenSink sizes (the
	// pipeline's dedup read-ahead, DEDUP_READ_AHEAD_CONNS), so that its
	// statements never keep a lookup or a decision waiting.
	ReadAheadConns int
	// CleanupConns bounds each server's cleanup pool (Server.CleanupDB:
	// the upkeep of the dedup keys' generations and the retention of
	// ledger entries), apart from the other so that cleanup never takes
	// a connection a checkpoint needs; DefaultCleanupConns when 0.
	CleanupConns int
	// Images: the locking reads and the sealing read whole rows (the
	// changelog's before images, CHANGELOG_TOPIC_PREFIX); without it they
	// read only the columns the checkpoint needs, as before the changelog.
	Images bool
	// BeforeSink, if set, runs once OpenSink has opened the servers, before
	// the sink reads or writes anything (its identity, first of all): the
	// check that the servers are the ledger's (package shards), which sets
	// the sink's placement (cfg.Placement) to the ledger's.
	BeforeSink func(ctx context.Context, d *Driver, cfg *txsink.Config) error
}

// Driver is the servers of one ledger, the control server first.
type Driver struct {
	servers []*Server
	control *Control
}

// Open connects to every server and reads their limits.
func Open(ctx context.Context, dsns []string, opts Options) (*Driver, error) {
	if len(dsns) == 0 {
		return nil, errors.New("mysqldriver: no DSN")
	}
	if opts.LockWaitTimeout < time.Second {
		opts.LockWaitTimeout = 5 * time.Second
	}
	if opts.MaxConns == 0 {
		opts.MaxConns = 10
	}
	if opts.CleanupConns == 0 {
		opts.CleanupConns = DefaultCleanupConns
	}
	d := &Driver{}
	for i, dsn := range dsns {
		sv, err := openServer(ctx, i, dsn, opts)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("mysqldriver: server %d: %w", i, err)
		}
		d.servers = append(d.servers, sv)
	}
	d.control = &Control{sv: d.servers[0]}
	return d, nil
}

// Servers are the servers for txsink.New, the control server first.
func (d *Driver) Servers() []driver.Server {
	out := make([]driver.Server, len(d.servers))
	for i, s := range d.servers {
		out[i] = s
	}
	return out
}

// Server is server i.
func (d *Driver) Server(i int) *Server { return d.servers[i] }

// Len is the number of servers.
func (d *Driver) Len() int { return len(d.servers) }

// Control is the control server's bookkeeping.
func (d *Driver) Control() *Control { return d.control }

// Close closes every pool.
func (d *Driver) Close() {
	for _, s := range d.servers {
		_ = s.db.Close()
		_ = s.cleanup.Close()
	}
}

// RefreshLimits rereads every server's max_allowed_packet: after a
// statement was refused for its size (an operator lowered the limit), the
// replayed checkpoint is cut to the new budget.
func (d *Driver) RefreshLimits(ctx context.Context) error {
	var errs []error
	for _, s := range d.servers {
		if err := s.RefreshLimits(ctx); err != nil {
			errs = append(errs, fmt.Errorf("server %d: %w", s.index, err))
		}
	}
	return errors.Join(errs...)
}

// Server is one MySQL server (driver.Server).
type Server struct {
	index     int
	db        *sqlx.DB
	cleanup   *sqlx.DB // the cleanup pool (CleanupDB)
	clientMax int      // the DSN's maxAllowedPacket; 0: the driver reads the server's
	// budget bounds one statement (package stmt): half the smaller of the
	// server's and the client's max_allowed_packet.
	budget   atomic.Int64
	images   bool          // Options.Images
	lockWait time.Duration // Options.LockWaitTimeout: the sessions' bound
}

var _ driver.Server = (*Server)(nil)

func openServer(ctx context.Context, i int, dsn string, opts Options) (*Server, error) {
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	db, err := OpenDB(dsn, opts.LockWaitTimeout, opts.MaxConns)
	if err != nil {
		return nil, err
	}
	cleanup, err := OpenDB(dsn, opts.LockWaitTimeout, opts.CleanupConns)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	s := &Server{index: i, db: db, cleanup: cleanup, clientMax: mc.MaxAllowedPacket, images: opts.Images, lockWait: opts.LockWaitTimeout}
	fail := func(err error) (*Server, error) {
		_ = db.Close()
		_ = cleanup.Close()
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		return fail(err)
	}
	if err := s.RefreshLimits(ctx); err != nil {
		return fail(err)
	}
	return s, nil
}

// RefreshLimits reads the server's max_allowed_packet and sets the
// statement budget: at start, and after a statement was refused for its
// size (an operator lowered the limit). A server whose limit leaves too
// small a budget is refused: every checkpoint would have to be cut into
// tiny statements, and a dead letter could not keep a useful part of its
// payload.
func (s *Server) RefreshLimits(ctx context.Context) error {
	var serverMax int
	if err := s.db.GetContext(ctx, &serverMax, `SELECT @@max_allowed_packet`); err != nil {
		return fmt.Errorf("read max_allowed_packet: %w", err)
	}
	limit := serverMax
	if s.clientMax > 0 && s.clientMax < limit {
		limit = s.clientMax
	}
	if limit < stmt.MinPacket {
		return fmt.Errorf("max_allowed_packet is %d bytes (the server's %d, the client's %d): the service needs at least %d",
			limit, serverMax, s.clientMax, stmt.MinPacket)
	}
	s.budget.Store(int64(stmt.Budget(limit)))
	return nil
}

// DB is the server's pool, for statements outside branches.
func (s *Server) DB() *sqlx.DB { return s.db }

// CleanupDB is the server's cleanup pool, for the upkeep of the dedup
// keys' generations and the retention of ledger entries: connections of their own, so that however
// much cleanup there is to do, it never holds a connection that a
// checkpoint's lookups, its decision or recovery need.
func (s *Server) CleanupDB() *sqlx.DB { return s.cleanup }

// MaxStatementBytes is the statement budget.
func (s *Server) MaxStatementBytes() int { return int(s.budget.Load()) }

// Code classifies err (see errors.go).
func (s *Server) Code(err error) driver.Code { return Code(err) }

// Select runs a query on the pool (for the pipeline's lookups outside
// branches) and scans every row into dest.
func (s *Server) Select(ctx context.Context, dest any, query string, args ...any) error {
	return s.db.SelectContext(ctx, dest, query, args...)
}

// Conn opens a connection for branches and learns its server-side id.
func (s *Server) Conn(ctx context.Context) (driver.Conn, error) {
	conn, err := s.db.Connx(ctx)
	if err != nil {
		return nil, err
	}
	c := &Conn{conn: conn, sv: s}
	if err := conn.GetContext(ctx, &c.id, "SELECT CONNECTION_ID()"); err != nil {
		discard(conn)
		_ = conn.Close()
		return nil, err
	}
	return c, nil
}

// Recover runs XA RECOVER. Its data column is the gtrid followed by the
// bqual, split by their lengths.
func (s *Server) Recover(ctx context.Context) ([]driver.Xid, error) {
	rows, err := s.db.QueryContext(ctx, "XA RECOVER")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []driver.Xid
	for rows.Next() {
		var format, glen, blen int64
		var data []byte
		if err := rows.Scan(&format, &glen, &blen, &data); err != nil {
			return nil, err
		}
		if format < 0 || format > 1<<32-1 || glen < 0 || blen < 0 || int(glen+blen) > len(data) {
			continue
		}
		out = append(out, driver.Xid{Format: uint32(format), Gtrid: string(data[:glen]), Bqual: string(data[glen : glen+blen])})
	}
	return out, rows.Err()
}

// Resolve sends XA COMMIT or ROLLBACK once, on a pooled connection.
func (s *Server) Resolve(ctx context.Context, x driver.Xid, commit bool) error {
	conn, err := s.db.Connx(ctx)
	if err != nil {
		return err
	}
	verb := driver.Rollback
	if commit {
		verb = driver.Commit
	}
	_, err = conn.ExecContext(ctx, xaSQL(verb, x))
	if err != nil && Code(err) != driver.UnknownXid {
		discard(conn)
	}
	_ = conn.Close()
	return err
}

// Session looks a connection up: PROCESSLIST shows this account's own
// connections (all of them with PROCESS), INNODB_TRX their transactions
// (only with PROCESS).
func (s *Server) Session(ctx context.Context, id uint64) (driver.Session, error) {
	var rows []struct {
		User string `db:"user"`
		Own  string `db:"own"`
	}
	err := s.db.SelectContext(ctx, &rows, `SELECT USER AS user, SUBSTRING_INDEX(CURRENT_USER(), '@', 1) AS own FROM information_schema.PROCESSLIST WHERE ID = ?`, id)
	if err != nil {
		return driver.Session{}, err
	}
	if len(rows) == 0 {
		return driver.Session{}, nil
	}
	out := driver.Session{Exists: true, OwnUser: rows[0].User == rows[0].Own}
	var ages []int64
	err = s.db.SelectContext(ctx, &ages, `SELECT `+trxAge+` FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ?`, id)
	switch {
	case number(err) == erSpecificAccessDenied:
		return out, nil // without PROCESS the server does not say
	case err != nil:
		return driver.Session{}, err
	}
	out.TxKnown = true
	if len(ages) > 0 {
		out.InTx, out.TxAge = true, time.Duration(ages[0])*time.Microsecond
	}
	return out, nil
}

// trxAge is the age of an INNODB_TRX row's transaction, in microseconds,
// measured in one time zone. trx_started is a DATETIME written in the
// server's system time zone (InnoDB formats it with localtime_r, in
// MariaDB 10.11 and in MySQL 8's storage/innobase/handler/i_s.cc alike),
// whatever the session's time_zone, while NOW() follows the session's
// (UTC here): compared as they are, on a server east of UTC a transaction
// looks hours younger than it is, and a frozen coordinator's branch is
// never ended. So trx_started is converted from the system zone ('SYSTEM'
// names it on both servers, without the time zone tables) and compared
// with UTC_TIMESTAMP. In the hour a daylight-saving change repeats, a
// trx_started inside it is ambiguous and may be taken an hour off; the
// verdict then errs for that hour only (an older-looking transaction is
// ended, and its checkpoint replayed).
const trxAge = `TIMESTAMPDIFF(MICROSECOND, CONVERT_TZ(trx_started, 'SYSTEM', '+00:00'), UTC_TIMESTAMP(6))`

// Kill ends a connection. The service's own account may end its own
// connections without any privilege (CONNECTION_ADMIN is needed for
// others').
func (s *Server) Kill(ctx context.Context, id uint64) error {
	_, err := s.db.ExecContext(ctx, "KILL CONNECTION "+strconv.FormatUint(id, 10))
	return err
}

// Uptime reads the server's Uptime status.
func (s *Server) Uptime(ctx context.Context) (time.Duration, error) {
	var row struct {
		Name  string `db:"Variable_name"`
		Value int64  `db:"Value"`
	}
	if err := s.db.GetContext(ctx, &row, `SHOW GLOBAL STATUS LIKE 'Uptime'`); err != nil {
		return 0, err
	}
	return time.Duration(row.Value) * time.Second, nil
}

// UTCTime reads the server's clock (package ledgerclock: the control
// server's is the ledger's clock).
func (s *Server) UTCTime(ctx context.Context) (time.Time, error) {
	var t time.Time
	if err := s.db.GetContext(ctx, &t, `SELECT UTC_TIMESTAMP(6)`); err != nil {
		return time.Time{}, err
	}
	return t.UTC(), nil
}

// Conn is a connection pinned to one branch at a time, kept across
// checkpoints with its server-side id and the statements prepared on it.
type Conn struct {
	conn  *sqlx.Conn
	sv    *Server
	id    uint64
	stmts map[string]*prepared // by query text; at most maxPrepared
	uses  uint64               // counts the uses of prepared statements
	// lockWait: the session's lock wait is not the server's bound
	// (SetLockWait), so the connection is not pooled again.
	lockWait bool
}

// prepared is a statement prepared on a connection, and when it was last
// used (Conn.uses).
type prepared struct {
	st   *sqlx.Stmt
	used uint64
}

var _ driver.Conn = (*Conn)(nil)

// maxPrepared bounds the statements kept per connection; a statement
// prepared beyond it closes the one used least recently (after a rotation
// of the dedup generations, the claim and read of the new tables replace
// the old ones).
const maxPrepared = 8

// ID is the server's id of the connection.
func (c *Conn) ID() uint64 { return c.id }

// XA runs an XA statement.
func (c *Conn) XA(ctx context.Context, verb driver.Verb, x driver.Xid) error {
	_, err := c.conn.ExecContext(ctx, xaSQL(verb, x))
	return err
}

// Close closes the prepared statements, then gives the connection back to
// the pool, or drops it when not reusable (the server then rolls back an
// unprepared branch on it; a prepared one stays prepared).
func (c *Conn) Close(reusable bool) {
	if !reusable || c.lockWait {
		discard(c.conn)
	}
	for _, p := range c.stmts {
		_ = p.st.Close()
	}
	_ = c.conn.Close()
}

// Exec runs a statement in the branch.
func (c *Conn) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return c.conn.ExecContext(ctx, query, args...)
}

// ExecPrepared is Exec through a server-side prepared statement, kept with
// the connection for later checkpoints. Meant for large statements run
// every checkpoint: the binary protocol spares the client's interpolation
// and the server's parsing of every literal (a 1,000-row dedup claim runs
// 35-55% faster). The first use on a connection prepares the statement
// (one round trip more); a connection holds at most maxPrepared of them.
func (c *Conn) ExecPrepared(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := c.prepare(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// SelectPrepared is Select through a server-side prepared statement, as
// ExecPrepared.
func (c *Conn) SelectPrepared(ctx context.Context, dest any, query string, args ...any) error {
	st, err := c.prepare(ctx, query)
	if err != nil {
		return err
	}
	return st.SelectContext(ctx, dest, args...)
}

// prepare returns the statement prepared for query on the connection,
// preparing it (and closing the least recently used one if maxPrepared
// are kept) the first time.
func (c *Conn) prepare(ctx context.Context, query string) (*sqlx.Stmt, error) {
	c.uses++
	if p, ok := c.stmts[query]; ok {
		p.used = c.uses
		return p.st, nil
	}
	if len(c.stmts) >= maxPrepared {
		var oldest string
		for q, p := range c.stmts {
			if oldest == "" || p.used < c.stmts[oldest].used {
				oldest = q
			}
		}
		_ = c.stmts[oldest].st.Close()
		delete(c.stmts, oldest)
	}
	st, err := c.conn.PreparexContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if c.stmts == nil {
		c.stmts = map[string]*prepared{}
	}
	c.stmts[query] = &prepared{st: st, used: c.uses}
	return st, nil
}

// Select runs a query in the branch and scans every row into dest.
func (c *Conn) Select(ctx context.Context, dest any, query string, args ...any) error {
	return c.conn.SelectContext(ctx, dest, query, args...)
}

// Query runs a query in the branch; the caller closes the rows.
func (c *Conn) Query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return c.conn.QueryContext(ctx, query, args...)
}

// Prepared is the number of statements prepared on the connection (tests).
func (c *Conn) Prepared() int { return len(c.stmts) }

// discard marks a connection bad so that Close drops it instead of pooling
// it.
func discard(c *sqlx.Conn) {
	_ = c.Raw(func(any) error { return sqldriver.ErrBadConn })
}

// lockWaitSeconds is d as innodb_lock_wait_timeout: whole seconds, at
// least 1.
func lockWaitSeconds(d time.Duration) int { return max(1, int(d/time.Second)) }

// xaSQL renders an XA statement: xids as hex literals, so that no byte of
// them needs quoting.
func xaSQL(verb driver.Verb, x driver.Xid) string {
	return fmt.Sprintf("XA %s X'%s',X'%s',%d", verb, hex.EncodeToString([]byte(x.Gtrid)), hex.EncodeToString([]byte(x.Bqual)), x.Format)
}

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
	mc.Params["innodb_lock_wait_timeout"] = strconv.Itoa(lockWaitSeconds(lockWait))
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
		if number(err) == erUnknownSystemVariable {
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
