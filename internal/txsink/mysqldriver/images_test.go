package mysqldriver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Without Options.Images (the changelog off) the locking reads and the
// sealing read the sums and keys only, the statements of before the
// changelog: the rows come back right but without updated_at; with it,
// whole (the conformance suite's fixtures).
func TestImagesOnlyWithTheOption(t *testing.T) {
	ctx := context.Background()
	dsn, _ := testenv.LedgerDB(t)
	for _, images := range []bool{false, true} {
		t.Run(fmt.Sprintf("images=%v", images), func(t *testing.T) {
			d, err := mysqldriver.Open(ctx, []string{dsn}, mysqldriver.Options{LockWaitTimeout: lockWait, Images: images})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			now := time.Now().UTC().Truncate(time.Second)
			start := now.Add(-48 * time.Hour).Truncate(time.Hour)
			acct := fmt.Sprintf("img-%v", images)
			inBranch(t, ctx, d.Server(0), true, func(tx driver.StoreTx) error {
				if err := tx.WriteBalances(ctx, []driver.Balance{{BalanceKey: driver.BalanceKey{Account: acct, Currency: "EUR"}, Amount: 3, Count: 1}}, now); err != nil {
					return err
				}
				return tx.WriteWindows(ctx, []driver.WindowSum{{WindowKey: driver.WindowKey{Account: acct, Currency: "EUR", Start: start}, Amount: 3, Count: 1}}, now)
			})
			inBranch(t, ctx, d.Server(0), false, func(tx driver.StoreTx) error {
				b, err := tx.LockBalances(ctx, []driver.BalanceKey{{Account: acct, Currency: "EUR"}})
				if err != nil {
					return err
				}
				w, err := tx.LockWindows(ctx, []driver.WindowKey{{Account: acct, Currency: "EUR", Start: start}})
				if err != nil {
					return err
				}
				sealed, _, err := tx.SealWindows(ctx, start, start.Add(time.Hour), 100, now)
				if err != nil {
					return err
				}
				if len(b) != 1 || b[0].Amount != 3 || b[0].Count != 1 || len(w) != 1 || w[0].Amount != 3 || len(sealed) == 0 {
					t.Fatalf("read %+v %+v, sealed %+v", b, w, sealed)
				}
				if whole := !b[0].UpdatedAt.IsZero() && !w[0].UpdatedAt.IsZero() && !sealed[0].UpdatedAt.IsZero(); whole != images {
					t.Errorf("whole rows %v with Images %v: %+v %+v %+v", whole, images, b[0], w[0], sealed[0])
				}
				return nil
			})
		})
	}
}

// inBranch runs fn in an XA branch of s, committed by two phases or
// rolled back.
func inBranch(t *testing.T, ctx context.Context, s driver.Server, commit bool, fn func(driver.StoreTx) error) {
	t.Helper()
	c, err := s.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(false)
	x := driver.Xid{Format: 7, Gtrid: testenv.RandomName("img-"), Bqual: "b"}
	steps := []driver.Verb{driver.End, driver.Prepare, driver.Commit}
	if !commit {
		steps = []driver.Verb{driver.End, driver.Rollback}
	}
	if err := c.XA(ctx, driver.Start, x); err != nil {
		t.Fatal(err)
	}
	if err := fn(c.Store()); err != nil {
		t.Fatal(err)
	}
	for _, v := range steps {
		if err := c.XA(ctx, v, x); err != nil {
			t.Fatal(err)
		}
	}
}
