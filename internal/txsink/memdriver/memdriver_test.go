package memdriver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/drivertest"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

type harness struct{ opts memdriver.Options }

func (h harness) New(ctx context.Context, t *testing.T) drivertest.Fixture {
	opts := h.opts
	opts.LockWait = 250 * time.Millisecond
	c := memdriver.New(opts)
	s := c.As("billing")
	f := drivertest.Fixture{
		Server: s, Control: s, Other: c.As("mallory"), AttachesPrepared: h.opts.AttachPrepared,
		Write: func(ctx context.Context, conn driver.Conn, key, value string) error {
			return conn.(*memdriver.Conn).Put(key, value)
		},
		Read: func(ctx context.Context, key string) (string, bool, error) {
			v, ok := c.Get(key)
			return v, ok, nil
		},
		Store:    s,
		Tables:   func(context.Context) (driver.Tables, error) { return c.Tables(), nil },
		Letters:  s.Letters(),
		LockWait: opts.LockWait,
		Legacy: func(_ context.Context, expires time.Time, ids []string) error {
			c.SeedJournal(expires, ids)
			return nil
		},
	}
	f.LowerPacket = func(_ *testing.T, n int) drivertest.Fixture { c.SetMaxAllowedPacket(n); return f }
	f.MoveCursor = s.ChangeMoveCursor
	f.StepWaiters = func(_ context.Context, cur driver.MoveCursor) ([]string, error) { return s.StepWaiters(cur), nil }
	f.Packet = func(t *testing.T, n int) drivertest.Fixture {
		c.SetMaxAllowedPacket(n)
		if err := s.RefreshLimits(ctx); err != nil {
			t.Fatal(err)
		}
		return f
	}
	return f
}

// The in-memory driver passes the conformance suite in every mode it
// models: MariaDB's attached prepared branches and MySQL 8.4's detached
// ones, with and without the privilege to see other transactions.
func TestConformance(t *testing.T) {
	for _, attach := range []bool{true, false} {
		for _, visible := range []bool{true, false} {
			t.Run(fmt.Sprintf("attach=%v,txvisible=%v", attach, visible), func(t *testing.T) {
				drivertest.RunConformanceTests(t, harness{memdriver.Options{AttachPrepared: attach, TxVisible: visible}})
			})
		}
	}
}
