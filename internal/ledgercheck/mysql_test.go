package ledgercheck

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/testenv"
)

// testDB is a throwaway ledger database.
type testDB struct {
	dsn string // DSN of the throwaway database
	db  *sqlx.DB
}

// newTestDB creates a database with the ledger schema (testenv.LedgerDB)
// and opens it as the verifier does.
func newTestDB(ctx context.Context, t *testing.T) *testDB {
	t.Helper()
	dsn, _ := testenv.LedgerDB(t)
	db, err := OpenDB(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return &testDB{dsn, db}
}

func (d *testDB) exec(ctx context.Context, t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := d.db.ExecContext(ctx, q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func insertBalance(ctx context.Context, t *testing.T, d *testDB, b BalanceRow) {
	d.exec(ctx, t, `INSERT INTO account_balances (account_id, currency, balance_minor, event_count, updated_at)
		VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6))`, []byte(b.AccountID), b.Currency, b.BalanceMinor, b.EventCount)
}

func insertWindow(ctx context.Context, t *testing.T, d *testDB, w WindowRow) {
	d.exec(ctx, t, `INSERT INTO billing_windows (account_id, currency, window_start, amount_minor, event_count, updated_at)
		VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6))`, []byte(w.AccountID), w.Currency, w.WindowStart.UTC(), w.AmountMinor, w.EventCount)
}

func insertDeadLetter(ctx context.Context, t *testing.T, d *testDB, topic string, partition int32, offset int64, reason string) {
	d.exec(ctx, t, `INSERT INTO dead_letters (kafka_topic, kafka_partition, kafka_offset, reason, detail,
		event_id, record_key, payload, payload_size, checkpoint_id, created_at)
		VALUES (?, ?, ?, ?, 'test', NULL, NULL, 'x', 1, 'cp-test', UTC_TIMESTAMP(6))`, topic, partition, offset, reason)
}

// TestVerifierAgainstMariaDB loads an expectation into two throwaway
// databases (two "servers", accounts split between them), checks that the
// union reads back exactly, then breaks it in several ways.
func TestVerifierAgainstMariaDB(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	shards := []*testDB{newTestDB(ctx, t), newTestDB(ctx, t)}

	// An expectation with extreme amounts and a pre-1970 window.
	l, err := NewModel(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []Event{
		{"e1", "acct-1", 1250, "EUR", at("2026-11-29T13:05:00Z")},
		{"e2", "acct-1", -250, "EUR", at("2026-11-29T13:55:00+02:00")},
		{"e3", "acct-1", 10, "USD", at("1969-12-31T23:59:59Z")},
		{"e4", "acct-2", 1 << 62, "JPY", at("2026-11-29T10:00:00Z")},
		{"e5", "acct-2", 1<<62 - 1, "JPY", at("2026-11-29T11:00:00Z")}, // balance MaxInt64
		{"e6", "acct-2", 1 << 62, "JPY", at("2026-11-29T12:00:00Z")},   // balance overflow
		{"e7", "acct-2 ", 1, "JPY", at("2026-11-29T12:00:00Z")},        // trailing space: another account
		{"e8", "ovf", -1 << 63, "GBP", at("2026-11-29T12:00:00Z")},
	} {
		l.Add(e)
	}
	l.DeadLetter(ReasonInvalidJSON)
	l.DeadLetter(ReasonEmptyPayload)
	exp := l.Expected()
	if err := exp.Validate(); err != nil {
		t.Fatal(err)
	}
	shardOf := func(account string) *testDB {
		if account == "acct-1" || account == "ovf" {
			return shards[0]
		}
		return shards[1]
	}
	for _, b := range exp.Balances {
		insertBalance(ctx, t, shardOf(b.AccountID), b)
	}
	for _, w := range exp.Windows {
		insertWindow(ctx, t, shardOf(w.AccountID), w)
	}
	insertDeadLetter(ctx, t, shards[0], "billing", 0, 10, ReasonInvalidJSON)
	insertDeadLetter(ctx, t, shards[1], "billing", 1, 10, ReasonEmptyPayload)
	insertDeadLetter(ctx, t, shards[1], "billing", 1, 11, ReasonAmountOverflow)
	insertDeadLetter(ctx, t, shards[1], "other-topic", 0, 1, ReasonInvalidJSON) // filtered out by topic

	var dbs []*sqlx.DB
	for _, s := range shards {
		db, err := OpenDB(ctx, s.dsn) // as the verifier does: parseTime/loc forced
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		dbs = append(dbs, db)
	}
	check := func(wantExact bool, topic string, wantVerdict ...string) *Report {
		t.Helper()
		act, err := ReadActual(ctx, dbs, topic, false)
		if err != nil {
			t.Fatal(err)
		}
		r := Compare(exp, act)
		var b strings.Builder
		_ = r.WriteDiffs(&b, 0)
		t.Logf("%s\n%s", r.Verdict(), b.String())
		if r.Exact() != wantExact {
			t.Fatalf("exact = %v, want %v", r.Exact(), wantExact)
		}
		for _, s := range wantVerdict {
			if !strings.Contains(r.Verdict(), s) {
				t.Errorf("verdict %q lacks %q", r.Verdict(), s)
			}
		}
		return r
	}

	check(true, "billing", fmt.Sprintf("EXACT: %d balances, %d windows, 3 dead letters, %d events",
		len(exp.Balances), len(exp.Windows), exp.EventsValid))
	// Without the topic filter the other topic's dead letter is extra.
	check(false, "", "1 extra dead letter")

	// One event counted twice (balance and window), one window lost.
	shards[0].exec(ctx, t, `UPDATE account_balances SET balance_minor = balance_minor + 1250, event_count = event_count + 1
		WHERE account_id = 'acct-1' AND currency = 'EUR'`)
	shards[0].exec(ctx, t, `UPDATE billing_windows SET amount_minor = amount_minor + 1250, event_count = event_count + 1
		WHERE account_id = 'acct-1' AND currency = 'EUR' AND window_start = '2026-11-29 13:00:00'`)
	shards[1].exec(ctx, t, `DELETE FROM billing_windows WHERE account_id = 'acct-2' AND window_start = '2026-11-29 10:00:00'`)
	r := check(false, "billing", "counted twice 1 event", "windows: lost 1, counted twice 1 event")
	if r.CountedTwice != 1 || r.WindowLost != 1 || r.WindowCountedTwice != 1 || len(r.Diffs) != 3 {
		t.Errorf("classification %+v", r)
	}

	// Back to exact, then the same balance row on both servers.
	load := func() {
		for _, d := range shards {
			d.exec(ctx, t, `DELETE FROM account_balances`)
			d.exec(ctx, t, `DELETE FROM billing_windows`)
		}
		for _, b := range exp.Balances {
			insertBalance(ctx, t, shardOf(b.AccountID), b)
		}
		for _, w := range exp.Windows {
			insertWindow(ctx, t, shardOf(w.AccountID), w)
		}
	}
	load()
	check(true, "billing", "EXACT")
	insertBalance(ctx, t, shards[1], exp.Balances[0]) // acct-1 lives on server 0
	r = check(false, "billing", "1 row on more than one server")
	if r.Duplicates != 1 {
		t.Errorf("duplicates %d", r.Duplicates)
	}
}

// The reader takes closed_at and updated_at of windows, the adjustments,
// and summarises the ledger entries from the server as Compare needs them.
func TestReadClosingAndEntries(t *testing.T) {
	ctx := context.Background()
	d := newTestDB(ctx, t)
	exp, want := closingCase(t)
	insertBalance(ctx, t, d, want.Balances[0].BalanceRow)
	for _, w := range want.Windows {
		d.exec(ctx, t, `INSERT INTO billing_windows (account_id, currency, window_start, amount_minor, event_count, closed_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			[]byte(w.AccountID), w.Currency, w.WindowStart, w.AmountMinor, w.EventCount, w.ClosedAt, w.UpdatedAt)
	}
	for _, w := range want.Adjustments {
		d.exec(ctx, t, `INSERT INTO window_adjustments (account_id, currency, window_start, amount_minor, event_count, updated_at) VALUES (?, ?, ?, ?, ?, ?)`,
			[]byte(w.AccountID), w.Currency, w.WindowStart, w.AmountMinor, w.EventCount, w.UpdatedAt)
	}
	for i, e := range []struct {
		id, when string
		amount   int64
		late     bool
	}{{"1", "2026-11-29T10:05:00Z", 1, false}, {"2", "2026-11-29T11:40:00Z", 2, false}, {"3", "2026-11-29T10:10:00Z", 4, true}} {
		occurred := at(e.when)
		d.exec(ctx, t, `INSERT INTO ledger_entries (kafka_topic, kafka_partition, kafka_offset, event_id, account_id, currency, amount_minor, occurred_at, window_start, late, checkpoint_id, created_at)
			VALUES ('billing', 0, ?, ?, 'a', 'EUR', ?, ?, ?, ?, 'c', UTC_TIMESTAMP(6))`, i, e.id, e.amount, occurred, WindowStart(occurred, time.Hour), e.late)
	}
	d.exec(ctx, t, `INSERT INTO ledger_entries (kafka_topic, kafka_partition, kafka_offset, event_id, account_id, currency, amount_minor, occurred_at, window_start, late, checkpoint_id, created_at)
		VALUES ('other-topic', 0, 0, 'x', 'a', 'EUR', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), FALSE, 'c', UTC_TIMESTAMP(6))`) // filtered out by topic
	db, err := OpenDB(ctx, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	read := func() *Report {
		t.Helper()
		act, err := ReadActual(ctx, []*sqlx.DB{db}, "billing", true)
		if err != nil {
			t.Fatal(err)
		}
		return Compare(exp, act)
	}
	if r := read(); !r.Exact() {
		var b strings.Builder
		_ = r.WriteDiffs(&b, 0)
		t.Fatalf("%s\n%s", r.Verdict(), b.String())
	}
	d.exec(ctx, t, `UPDATE billing_windows SET amount_minor = amount_minor + 1, event_count = event_count + 1, updated_at = UTC_TIMESTAMP(6) WHERE closed_at IS NOT NULL`)
	if r := read(); r.Violations < 2 { // changed after sealing, and its entries no longer sum to it
		t.Fatalf("a sealed row changed: %s", r.Verdict())
	}
}
