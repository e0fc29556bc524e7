package mysqldriver_test

import (
	"context"
	"testing"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/drivertest"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

func (f fixtures) NewView(ctx context.Context, t *testing.T) drivertest.ViewFixture {
	fx := f.New(ctx, t)
	db := fx.Server.(*mysqldriver.Server).DB()
	return drivertest.ViewFixture{Fixture: fx, View: mysqldriver.NewView(db),
		StorePeriod: func(ctx context.Context, r driver.PeriodRow) error {
			_, err := mysqldriver.InsertPeriod(ctx, db, r, false)
			return err
		},
		StoreLayout: func(ctx context.Context, rows []driver.LayoutRow) (bool, error) {
			return mysqldriver.InsertLayout(ctx, db, rows)
		},
		ClaimServer: func(ctx context.Context, ledger string) error {
			return mysqldriver.ClaimServer(ctx, db, ledger)
		}}
}

// The MySQL view passes the view's conformance suite against the test
// server, as the in-memory one does.
func TestViewConformance(t *testing.T) {
	drivertest.RunViewTests(t, fixtures{})
}

// TestViewOfAnOlderSchema: a ledger migrated by an older version (no
// ledger_identity, commit log or ledger_periods yet) reads as nothing
// stored, not as an error, so that status reports what there is.
func TestViewOfAnOlderSchema(t *testing.T) {
	ctx := t.Context()
	dsn, db := testenv.LedgerDB(t)
	for _, table := range []string{"ledger_identity", "checkpoint_commits", "commit_sequence", "ledger_periods", "ledger_layout", "ledger_server"} {
		if _, err := db.ExecContext(ctx, "DROP TABLE "+table); err != nil {
			t.Fatal(err)
		}
	}
	pool, err := mysqldriver.OpenDB(dsn, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	v := mysqldriver.NewView(pool)
	if _, _, found, err := v.Identity(ctx); err != nil || found {
		t.Errorf("identity: found %v, %v", found, err)
	}
	if _, found, err := v.CommitLog(ctx); err != nil || found {
		t.Errorf("commit log: found %v, %v", found, err)
	}
	if p, err := v.Periods(ctx); err != nil || len(p) != 0 {
		t.Errorf("periods: %v %v", p, err)
	}
	if l, err := v.Layout(ctx); err != nil || len(l) != 0 {
		t.Errorf("layout: %v %v", l, err)
	}
	if _, found, err := v.ServerIdentity(ctx, 0); err != nil || found {
		t.Errorf("server identity: found %v, %v", found, err)
	}
	if _, err := v.Positions(ctx, driver.Scope{Group: "g", Topic: "t"}); err != nil {
		t.Errorf("positions: %v", err)
	}
}
