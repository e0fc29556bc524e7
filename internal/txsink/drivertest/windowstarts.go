package drivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// windowStarter is what the period settings read of billing_windows on
// each server (package periods): every Store implements it.
type windowStarter interface {
	WindowStarts(ctx context.Context, n int) ([]time.Time, error)
	LatestWindowStart(ctx context.Context) (time.Time, error)
}

// Property (window starts): WindowStarts returns up to n of the earliest
// distinct window starts ascending, then up to n of the latest
// descending, of the committed rows; LatestWindowStart the latest, zero
// on a server without rows.
func testWindowStarts(t *testing.T, ctx context.Context, f Fixture) {
	w, ok := f.Store.(windowStarter)
	if !ok {
		t.Fatalf("%T does not read window starts", f.Store)
	}
	if got, err := w.WindowStarts(ctx, 4); err != nil || len(got) != 0 {
		t.Fatalf("WindowStarts of no row = %v, %v", got, err)
	}
	if got, err := w.LatestWindowStart(ctx); err != nil || !got.IsZero() {
		t.Fatalf("LatestWindowStart of no row = %v, %v", got, err)
	}
	base := clock().Truncate(time.Hour)
	var starts []time.Time
	var rows []driver.WindowSum
	for i := range 6 {
		s := base.Add(time.Duration(i) * time.Hour)
		starts = append(starts, s)
		for a := range 3 { // several rows per start: distinct starts only
			rows = append(rows, driver.WindowSum{WindowKey: driver.WindowKey{Account: fmt.Sprint("a", a), Currency: "EUR", Start: s}, Amount: 1, Count: 1})
		}
	}
	commit(t, ctx, f, func(tx driver.StoreTx) error { return tx.WriteWindows(ctx, rows, base) })
	// An open branch's row is not read.
	b := open(t, ctx, f.Server)
	must(t, b.tx().WriteWindows(ctx, []driver.WindowSum{{WindowKey: driver.WindowKey{Account: "x", Currency: "EUR", Start: base.Add(99 * time.Hour)}, Amount: 1, Count: 1}}, base))
	defer func() { must(t, b.end(false)) }()
	got, err := w.WindowStarts(ctx, 2)
	must(t, err)
	if want := []time.Time{starts[0], starts[1], starts[5], starts[4]}; !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Errorf("WindowStarts(2) = %v, want %v", got, want)
	}
	got, err = w.WindowStarts(ctx, 10)
	must(t, err)
	want := slices.Clone(starts)
	for i := len(starts) - 1; i >= 0; i-- {
		want = append(want, starts[i])
	}
	if !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Errorf("WindowStarts(10) = %v, want %v", got, want)
	}
	if got, err := w.LatestWindowStart(ctx); err != nil || !got.Equal(starts[5]) || got.Location() != time.UTC {
		t.Errorf("LatestWindowStart = %v, %v, want %v", got, err, starts[5])
	}
}

// stats is what the metrics sample of each server besides the ledger's
// view (package metrics): every Store implements it.
type stats interface {
	PurgeHistory(ctx context.Context) (int64, error)
	DedupRows(ctx context.Context) (int64, error)
}

// Property (server counters): DedupRows estimates the rows of every
// generation's key table and of no other table: 0 on an empty ledger,
// never more than the keys stored (MariaDB keeps the estimate live, MySQL
// 8.4 may lag); PurgeHistory reads for the suite's account.
func testStats(t *testing.T, ctx context.Context, f Fixture) {
	s, ok := f.Store.(stats)
	if !ok {
		t.Fatalf("%T does not read the server's counters", f.Store)
	}
	if n, err := s.DedupRows(ctx); err != nil || n != 0 {
		t.Fatalf("DedupRows of an empty ledger = %d, %v", n, err)
	}
	later := clock().Add(time.Hour)
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		_, err := tx.ClaimKeys(ctx, 0, keys("s0", 30, later))
		if err == nil {
			_, err = tx.ClaimKeys(ctx, 1, keys("s1", 20, later))
		}
		var bals []driver.Balance
		for i := range 200 { // rows of another table, which must not count
			bals = append(bals, driver.Balance{BalanceKey: driver.BalanceKey{Account: fmt.Sprint("acct-", i), Currency: "EUR"}, Amount: 1, Count: 1})
		}
		return errors.Join(err, tx.WriteBalances(ctx, bals, later))
	})
	n, err := s.DedupRows(ctx)
	must(t, err)
	if n < 0 || n > 50 {
		t.Errorf("DedupRows = %d, want at most the 50 keys stored", n)
	}
	if h, err := s.PurgeHistory(ctx); err != nil || h < 0 {
		t.Errorf("PurgeHistory = %d, %v", h, err)
	}
}
