package testenv

import (
	"context"
	"io"
	"log/slog"
	"os"
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
	if err := migrations.Up(ctx, db.DB, Logger()); err != nil {
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
