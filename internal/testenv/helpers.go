package testenv

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/migrations"
)

// Logger is the logger of code under test: silent, unless TEST_LOG is set
// (then everything, debug included, to stderr).
func Logger() *slog.Logger {
	if os.Getenv("TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Eventually polls cond every 50 ms until it holds, and fails the test
// after timeout, with what and the last state cond described.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (%s)", what, timeout, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Produce writes recs to topic (their own Topic when set) and waits for
// every acknowledgement. Records of up to 8 MiB go through; the topic's
// max.message.bytes decides what the broker takes.
func Produce(t testing.TB, brokers []string, topic string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(8<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}

// LedgerDB creates a database (see NewDatabaseOn for options) with the
// ledger's schema applied by migrations.Up, as the service applies it, and
// returns its DSN and an open pool on it; both go when the test ends.
func LedgerDB(t testing.TB, options ...string) (string, *sqlx.DB) {
	t.Helper()
	return LedgerDBOn(t, MySQL(t), RandomName("t_"), options...)
}

// LedgerDBOn is LedgerDB on the server of the admin DSN admin, with a given
// database name (see NewDatabaseOn).
func LedgerDBOn(t testing.TB, admin, name string, options ...string) (string, *sqlx.DB) {
	t.Helper()
	dsn := NewDatabaseOn(t, admin, name, options...)
	db, err := sqlx.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrations.Up(ctx, db.DB, Logger(), nil); err != nil {
		t.Fatalf("migrate %s: %v", dsn, err)
	}
	return dsn, db
}

// InDoubt counts the prepared XA branches on db's server whose gtrid
// begins with prefix (XA RECOVER is server-wide: the prefix names the
// instance, "blg1-<instance>-").
func InDoubt(t testing.TB, db *sqlx.DB, prefix string) int {
	t.Helper()
	rows, err := db.Query("XA RECOVER")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var f, g, b int64
		var data []byte
		if err := rows.Scan(&f, &g, &b, &data); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(string(data), prefix) {
			n++
		}
	}
	return n
}

// SetGlobal sets a server variable for the rest of the test: SET GLOBAL on
// the server of the admin DSN, restored to its value when the test ends.
// Some limits cannot be set per session (MariaDB's max_allowed_packet: a
// session reads the global value when it connects), so a test that needs
// a server configured otherwise changes the global and opens its
// connections afterwards. The change reaches every connection opened on
// that server meanwhile, other tests' too (packages run in parallel): a
// test that needs a limit other tests would trip over (a lowered
// max_allowed_packet) runs on a server of its own (OwnMariaDB) and sets it
// there; on a shared server keep it to values every test copes with. Tests that change the same variable take
// turns (a named lock on the server, held until the value is restored).
func SetGlobal(t testing.TB, admin, name string, value any) {
	t.Helper()
	if !regexp.MustCompile(`^[a-z_]{1,64}$`).MatchString(name) {
		t.Fatalf("SetGlobal: bad variable name %q", name)
	}
	db, err := sql.Open("mysql", admin)
	if err != nil {
		t.Fatalf("open admin DSN: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		t.Fatalf("SetGlobal %s: %v", name, err)
	}
	release := func() {
		_, _ = conn.ExecContext(context.Background(), `SELECT RELEASE_LOCK(?)`, "testenv:global:"+name)
		conn.Close()
		db.Close()
	}
	var locked sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 600)`, "testenv:global:"+name).Scan(&locked); err != nil || locked.Int64 != 1 {
		release()
		t.Fatalf("SetGlobal %s: the lock of the variable: %v (got %v)", name, err, locked)
	}
	var raw []byte
	if err := conn.QueryRowContext(ctx, `SELECT @@GLOBAL.`+name).Scan(&raw); err != nil {
		release()
		t.Fatalf("SetGlobal %s: read: %v", name, err)
	}
	// Numeric variables refuse a quoted value: give the old one back as
	// a number where it is one.
	var old any = string(raw)
	if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		old = n
	}
	if _, err := conn.ExecContext(ctx, `SET GLOBAL `+name+` = ?`, value); err != nil {
		release()
		t.Fatalf("SetGlobal %s = %v: %v", name, value, err)
	}
	t.Cleanup(func() {
		defer release()
		if _, err := conn.ExecContext(context.Background(), `SET GLOBAL `+name+` = ?`, old); err != nil {
			t.Errorf("SetGlobal: restoring %s to %v: %v", name, old, err)
		}
	})
}

// DocumentsEveryFlag fails t unless the document at path (relative to the
// test's package) names, in backquotes, every flag a command's -help
// output lists (lines "  -name ..." of the flag package's usage).
func DocumentsEveryFlag(t testing.TB, help, path string) {
	t.Helper()
	docs, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(help, "\n") {
		if !strings.HasPrefix(line, "  -") {
			continue
		}
		flag := strings.Fields(line)[0]
		n++
		if !strings.Contains(string(docs), "`"+flag+"`") {
			t.Errorf("%s does not document %s", path, flag)
		}
	}
	if n < 5 {
		t.Fatalf("-help listed %d flags", n)
	}
}
