package mysqldriver_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/placement"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// MoveRows moves exactly the rows of the key range whose key moves, page
// after page of a composite primary key, and no row outside the range:
// a step freezes only its range, and a row moved from outside it would be
// written on its old server meanwhile, then lost at its own step. A range
// to the end of the keys (driver.KeysEnd) takes every key from its start.
func TestMoveRowsMovesTheRangeOnly(t *testing.T) {
	ctx := context.Background()
	dsnA, dbA := testenv.LedgerDB(t)
	dsnB, dbB := testenv.LedgerDB(t)
	d, err := mysqldriver.Open(ctx, []string{dsnA, dsnB}, mysqldriver.Options{LockWaitTimeout: lockWait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var all []string
	for a := range 30 {
		acct := fmt.Sprintf("a%02d", a)
		for _, cur := range []string{"EUR", "USD", "JPY"} {
			for w := range 4 {
				if _, err := dbA.ExecContext(ctx, `INSERT INTO billing_windows (account_id, currency, window_start, amount_minor, event_count, updated_at) VALUES (?, ?, ?, ?, 1, ?)`,
					acct, cur, start.Add(time.Duration(w)*time.Hour), a*100+w, start); err != nil {
					t.Fatal(err)
				}
			}
		}
		all = append(all, acct)
	}
	moves := func(key []byte) bool { return placement.Hash(string(key))%2 == 0 }
	accounts := func(db interface {
		SelectContext(context.Context, any, string, ...any) error
	}) []string {
		var got []string
		if err := db.SelectContext(ctx, &got, `SELECT DISTINCT account_id FROM billing_windows ORDER BY account_id`); err != nil {
			t.Fatal(err)
		}
		return got
	}
	step := func(from, below string) {
		// Batches of 5 rows: every account's 12 rows take pages.
		if _, err := mysqldriver.MoveRows(ctx, d.Server(0), d.Server(1), "billing_windows", "account_id", mysqldriver.KeyRange{From: from, Below: below}, moves, 5, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	step("a05", "a20")
	var wantB, wantA []string
	for _, a := range all {
		if a >= "a05" && a < "a20" && moves([]byte(a)) {
			wantB = append(wantB, a)
		} else {
			wantA = append(wantA, a)
		}
	}
	if got := accounts(dbB); !slices.Equal(got, wantB) {
		t.Fatalf("moved accounts %q, want those of the range that move %q", got, wantB)
	}
	if got := accounts(dbA); !slices.Equal(got, wantA) {
		t.Fatalf("accounts left %q, want %q", got, wantA)
	}
	var n int
	if err := dbB.GetContext(ctx, &n, `SELECT COUNT(*) FROM billing_windows`); err != nil || n != 12*len(wantB) {
		t.Fatalf("%d rows moved (%v), want %d", n, err, 12*len(wantB))
	}
	step("a20", driver.KeysEnd)
	step("", "a05")
	for _, a := range accounts(dbA) {
		if moves([]byte(a)) {
			t.Fatalf("account %s of a moving slot left after every range moved", a)
		}
	}
}
