package integration_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"slices"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/testenv"
)

// TestKafkaTransactions checks the Kafka guarantee the ledger relies on: a
// read_committed consumer sees the records of committed transactions and
// never those of aborted ones.
func TestKafkaTransactions(t *testing.T) {
	brokers := testenv.Kafka(t)
	// One partition: records keep their produce order, so comparing whole
	// sequences also catches reordering or a batch delivered twice.
	topic := testenv.NewTopic(t, brokers, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const perBatch = 5
	committed1 := batch("committed-1", perBatch)
	aborted := batch("aborted", perBatch)
	committed2 := batch("committed-2", perBatch)

	producer, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.TransactionalID("integration-"+topic),
		kgo.DefaultProduceTopic(topic),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()

	// committed-2 comes after the aborted batch so the partition's last
	// stable offset moves past it: a read_committed consumer then has to
	// skip the aborted records rather than merely stop before them.
	for _, step := range []struct {
		values []string
		end    kgo.TransactionEndTry
	}{
		{committed1, kgo.TryCommit},
		{aborted, kgo.TryAbort},
		{committed2, kgo.TryCommit},
	} {
		if err := producer.BeginTransaction(); err != nil {
			t.Fatalf("begin transaction: %v", err)
		}
		recs := make([]*kgo.Record, len(step.values))
		for i, v := range step.values {
			recs[i] = &kgo.Record{Value: []byte(v)}
		}
		if err := producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatalf("produce %s: %v", step.values[0], err)
		}
		if err := producer.EndTransaction(ctx, step.end); err != nil {
			t.Fatalf("end transaction (commit=%v) of %s: %v", step.end, step.values[0], err)
		}
	}

	// The aborted records must really be in the log, or the read_committed
	// check below would pass without proving anything.
	t.Run("read_uncommitted consumer sees the aborted batch too", func(t *testing.T) {
		want := slices.Concat(committed1, aborted, committed2)
		got := consume(ctx, t, brokers, topic, kgo.ReadUncommitted(), want[len(want)-1])
		if !slices.Equal(got, want) {
			t.Fatalf("read_uncommitted got %q\nwant %q", got, want)
		}
	})

	t.Run("read_committed consumer sees exactly the committed batches", func(t *testing.T) {
		want := slices.Concat(committed1, committed2)
		got := consume(ctx, t, brokers, topic, kgo.ReadCommitted(), want[len(want)-1])
		if !slices.Equal(got, want) {
			t.Fatalf("read_committed got %q\nwant %q", got, want)
		}
	})
}

func batch(prefix string, n int) []string {
	values := make([]string, n)
	for i := range values {
		values[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return values
}

// consume reads topic from the start with the given isolation level until
// it has seen the record last (with one partition, everything before it
// has been delivered by then) and returns the values read.
func consume(ctx context.Context, t *testing.T, brokers []string, topic string, level kgo.IsolationLevel, last string) []string {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(level),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()

	var got []string
	for {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("did not see %q before the deadline; got %q", last, got)
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			t.Fatalf("fetch: %v", errs)
		}
		for _, r := range fetches.Records() {
			got = append(got, string(r.Value))
		}
		if slices.Contains(got, last) {
			return got
		}
	}
}

// xaFormatID is the formatID of the test's xids ("LEDG"). Any value other
// than the usual default 1 keeps them apart from other XA users' xids.
const xaFormatID = 0x4C454447

// TestMySQLXA checks the XA behaviour the ledger's two-phase commit relies
// on: a prepared branch survives its connection, XA RECOVER reports it, its
// writes stay invisible until a different connection commits it by xid.
//
// go-sql-driver/mysql has no XA API and BeginTx would send its own
// START TRANSACTION, so XA statements go as plain text on one pinned
// *sql.Conn, with the xid parts as hex literals (binary-safe).
func TestMySQLXA(t *testing.T) {
	dsn := testenv.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx,
		"CREATE TABLE xa_probe (id BIGINT PRIMARY KEY, note VARCHAR(64) NOT NULL) ENGINE=InnoDB"); err != nil {
		t.Fatal(err)
	}

	gtrid := make([]byte, 16)
	_, _ = rand.Read(gtrid)
	bqual := []byte("shard-0")
	xid := fmt.Sprintf("X'%s',X'%s',%d", hex.EncodeToString(gtrid), hex.EncodeToString(bqual), xaFormatID)
	rowCount := func(t *testing.T) int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM xa_probe WHERE id = 1").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	if !t.Run("prepare on a pinned connection, then lose the connection", func(t *testing.T) {
		// A pool of its own, so closing it really ends the server session.
		prepDB, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer prepDB.Close()
		conn, err := prepDB.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var connID int64
		if err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&connID); err != nil {
			t.Fatal(err)
		}
		for _, stmt := range []string{
			"XA START " + xid,
			"INSERT INTO xa_probe (id, note) VALUES (1, 'prepared')",
			"XA END " + xid,
			"XA PREPARE " + xid,
		} {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				t.Fatalf("%s: %v", stmt, err)
			}
		}
		// Returning driver.ErrBadConn from Raw makes database/sql discard
		// the connection instead of pooling it: the session ends as if the
		// process had died after XA PREPARE.
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		_ = conn.Close()
		if err := prepDB.Close(); err != nil {
			t.Fatal(err)
		}
		// The server notices the disconnect asynchronously; wait for the
		// session to be gone so the checks below run against a branch that
		// no connection owns.
		for {
			var n int
			if err := db.QueryRowContext(ctx,
				"SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?", connID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("session %d still open after closing its connection", connID)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}) {
		t.FailNow()
	}

	if !t.Run("XA RECOVER on another connection lists the prepared xid", func(t *testing.T) {
		if !recovered(ctx, t, db, gtrid, bqual) {
			t.Fatalf("XA RECOVER does not list gtrid %x bqual %q formatID %d", gtrid, bqual, xaFormatID)
		}
	}) {
		t.FailNow()
	}

	t.Run("prepared row is invisible before XA COMMIT", func(t *testing.T) {
		if n := rowCount(t); n != 0 {
			t.Fatalf("prepared but uncommitted row visible: count = %d", n)
		}
	})

	t.Run("XA COMMIT by xid from another connection makes the row visible", func(t *testing.T) {
		if _, err := db.ExecContext(ctx, "XA COMMIT "+xid); err != nil {
			t.Fatalf("XA COMMIT %s: %v", xid, err)
		}
		if n := rowCount(t); n != 1 {
			t.Fatalf("row count after XA COMMIT = %d, want 1", n)
		}
		if recovered(ctx, t, db, gtrid, bqual) {
			t.Fatal("XA RECOVER still lists the xid after XA COMMIT")
		}
	})
}

// recovered reports whether XA RECOVER lists the xid (xaFormatID, gtrid,
// bqual). Its columns are formatID, gtrid_length, bqual_length and data,
// data being gtrid and bqual concatenated.
func recovered(ctx context.Context, t *testing.T, db *sql.DB, gtrid, bqual []byte) bool {
	t.Helper()
	rows, err := db.QueryContext(ctx, "XA RECOVER")
	if err != nil {
		t.Fatalf("XA RECOVER: %v", err)
	}
	defer rows.Close()
	found := false
	for rows.Next() {
		var formatID, gtridLen, bqualLen int64
		var data []byte
		if err := rows.Scan(&formatID, &gtridLen, &bqualLen, &data); err != nil {
			t.Fatalf("scan XA RECOVER row: %v", err)
		}
		if gtridLen < 0 || bqualLen < 0 || int64(len(data)) != gtridLen+bqualLen {
			t.Fatalf("XA RECOVER row: data is %d bytes, gtrid_length %d + bqual_length %d", len(data), gtridLen, bqualLen)
		}
		if formatID == xaFormatID && bytes.Equal(data[:gtridLen], gtrid) && bytes.Equal(data[gtridLen:], bqual) {
			found = true
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("XA RECOVER: %v", err)
	}
	return found
}
