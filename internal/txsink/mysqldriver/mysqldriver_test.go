package mysqldriver_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/drivertest"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

type fixtures struct{}

// New makes a ledger database on the test server (MariaDB from `make
// test`, or MySQL 8.4 through testcontainers), a scratch table for the
// suite's writes, and a second account without any privilege.
func (h fixtures) New(ctx context.Context, t *testing.T) drivertest.Fixture {
	dsn, _ := testenv.LedgerDB(t)
	return h.on(ctx, t, dsn)
}

// on makes the fixture on the ledger database dsn.
func (fixtures) on(ctx context.Context, t *testing.T, dsn string) drivertest.Fixture {
	d := open(ctx, t, dsn)
	db := d.Server(0).DB()
	if _, err := db.ExecContext(ctx, `CREATE TABLE conformance_kv (k VARBINARY(64) PRIMARY KEY, v VARBINARY(64) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var detach []int
	attaches := db.SelectContext(ctx, &detach, `SELECT @@xa_detach_on_prepare`) != nil || len(detach) == 0 || detach[0] == 0
	f := drivertest.Fixture{
		Server: d.Server(0), Control: d.Control(), Other: otherAccount(ctx, t), AttachesPrepared: attaches,
		Write: func(ctx context.Context, c driver.Conn, key, value string) error {
			_, err := c.(*mysqldriver.Conn).Exec(ctx, `INSERT INTO conformance_kv (k, v) VALUES (?, ?)`, key, value)
			return err
		},
		Read: func(ctx context.Context, key string) (string, bool, error) {
			var v []string
			err := db.SelectContext(ctx, &v, `SELECT v FROM conformance_kv WHERE k = ?`, key)
			if err != nil || len(v) == 0 {
				return "", false, err
			}
			return v[0], true, nil
		},
		Store:    d.Server(0),
		Tables:   func(ctx context.Context) (driver.Tables, error) { return readTables(ctx, db) },
		Letters:  d.Server(0).Letters(),
		LockWait: lockWait,
		Legacy: func(ctx context.Context, expires time.Time, ids []string) error {
			return storeLegacy(ctx, db.DB, expires, ids)
		},
		MoveCursor: func(ctx context.Context, was, next driver.MoveCursor) (int64, error) {
			return mysqldriver.ChangeMoveCursor(ctx, db, was, next)
		},
		StepWaiters: func(ctx context.Context, cur driver.MoveCursor) ([]string, error) {
			return mysqldriver.StepWaiters(ctx, db, cur)
		},
	}
	// MariaDB's max_allowed_packet is global, read by a session when it
	// connects: the suite's property runs on a server of the test's own
	// (never the shared one, whose other tests would get the limit too),
	// whose limit is lowered once the fixture's budget was read; its pool
	// keeps no connection opened before.
	f.LowerPacket = func(t *testing.T, n int) drivertest.Fixture {
		admin := testenv.OwnMariaDB(t)
		dsn, _ := testenv.LedgerDBOn(t, admin, testenv.RandomName("t_"))
		g := fixtures{}.on(ctx, t, dsn)
		g.Server.(*mysqldriver.Server).DB().SetMaxIdleConns(0)
		own, err := sql.Open("mysql", admin)
		if err != nil {
			t.Fatal(err)
		}
		defer own.Close()
		if _, err := own.ExecContext(ctx, fmt.Sprintf("SET GLOBAL max_allowed_packet = %d", n)); err != nil {
			t.Fatal(err)
		}
		return g
	}
	f.Packet = func(t *testing.T, n int) drivertest.Fixture {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxAllowedPacket = n
		g := f
		e := open(ctx, t, cfg.FormatDSN())
		g.Server, g.Control, g.Store = e.Server(0), e.Control(), e.Server(0)
		return g
	}
	return f
}

// lockWait is the fixtures' innodb_lock_wait_timeout.
const lockWait = time.Second

func open(ctx context.Context, t *testing.T, dsn string) *mysqldriver.Driver {
	t.Helper()
	d, err := mysqldriver.Open(ctx, []string{dsn}, mysqldriver.Options{LockWaitTimeout: lockWait, Images: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

// otherAccount creates an account with no privilege at all and connects
// as it.
func otherAccount(ctx context.Context, t *testing.T) driver.Server {
	admin := testenv.MySQL(t)
	user := testenv.RandomName("dt_")
	db, err := sql.Open("mysql", admin)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY 'pw'", user)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("mysql", admin)
		if err == nil {
			_, _ = db.Exec(fmt.Sprintf("DROP USER IF EXISTS '%s'@'%%'", user))
			db.Close()
		}
	})
	cfg, err := mysql.ParseDSN(admin)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd, cfg.DBName = user, "pw", ""
	d, err := mysqldriver.Open(ctx, []string{cfg.FormatDSN()}, mysqldriver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d.Server(0)
}

// The MySQL driver passes the conformance suite against the test server.
func TestConformance(t *testing.T) {
	drivertest.RunConformanceTests(t, fixtures{})
}

// A branch's connection whose lock wait was raised (SetLockWait) and not
// set back is dropped when it closes, so no later branch inherits the
// longer wait; one whose lock wait was set back goes back to the pool.
func TestRaisedLockWaitIsNotPooled(t *testing.T) {
	ctx := context.Background()
	dsn, _ := testenv.LedgerDB(t)
	d := open(ctx, t, dsn)
	s := d.Server(0)
	s.DB().SetMaxIdleConns(1)
	session := func(c driver.Conn) int {
		var n []int
		if err := c.(*mysqldriver.Conn).Select(ctx, &n, `SELECT @@SESSION.innodb_lock_wait_timeout`); err != nil || len(n) != 1 {
			t.Fatalf("session lock wait: %v, %v", n, err)
		}
		return n[0]
	}
	branch := func(restore bool) (id uint64) {
		c, err := s.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		id = c.(*mysqldriver.Conn).ID()
		if got := session(c); got != int(lockWait/time.Second) {
			t.Fatalf("a new branch's connection waits %d s, want the server's %s", got, lockWait)
		}
		if err := c.Store().SetLockWait(ctx, 7*time.Second); err != nil {
			t.Fatal(err)
		}
		if got := session(c); got != 7 {
			t.Fatalf("after SetLockWait(7s): %d s", got)
		}
		if restore {
			if err := c.Store().SetLockWait(ctx, 0); err != nil {
				t.Fatal(err)
			}
		}
		c.Close(true)
		return id
	}
	first := branch(false)
	second := branch(true)
	if second == first {
		t.Fatalf("connection %d was pooled with its lock wait raised", first)
	}
	if third := branch(true); third != second {
		t.Errorf("connection %d, set back, was not pooled (got %d)", second, third)
	}
}
