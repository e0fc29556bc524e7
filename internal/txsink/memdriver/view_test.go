package memdriver_test

import (
	"context"
	"testing"

	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/drivertest"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

type viewHarness struct{ harness }

func (h viewHarness) NewView(ctx context.Context, t *testing.T) drivertest.ViewFixture {
	f := h.New(ctx, t)
	s := f.Server.(*memdriver.Server)
	s.Cluster().SetServerIdentity("4f3c2a10-0000-4000-8000-00000000000a")
	return drivertest.ViewFixture{Fixture: f, View: memdriver.NewView(s),
		StorePeriod: func(ctx context.Context, r driver.PeriodRow) error {
			s.Cluster().StorePeriods(r)
			return nil
		},
		StoreLayout: func(ctx context.Context, rows []driver.LayoutRow) (bool, error) {
			return s.Cluster().StoreLayout(rows...), nil
		},
		ClaimServer: func(ctx context.Context, ledger string) error {
			s.Cluster().ClaimServer(ledger)
			return nil
		}}
}

// The in-memory view passes the view's conformance suite, as the MySQL
// one does (mysqldriver.TestViewConformance).
func TestViewConformance(t *testing.T) {
	drivertest.RunViewTests(t, viewHarness{harness{memdriver.Options{AttachPrepared: true}}})
}
