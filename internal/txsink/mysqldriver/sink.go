package mysqldriver

import (
	"context"
	"fmt"

	"github.com/billing/ledger/internal/txsink"
)

// OpenSink connects to the servers of dsns (the control server first) and
// builds the exactly-once sink over them. Each pool holds the sink's
// branches plus a few connections for statements outside them. Close the
// sink, then the driver.
func OpenSink(ctx context.Context, dsns []string, opts Options, cfg txsink.Config) (*txsink.Sink, *Driver, error) {
	if opts.MaxConns == 0 {
		opts.MaxConns = cfg.Branches + 8
	}
	d, err := Open(ctx, dsns, opts)
	if err != nil {
		return nil, nil, err
	}
	s, err := txsink.New(ctx, cfg, d.Control(), d.Servers())
	if err != nil {
		d.Close()
		return nil, nil, fmt.Errorf("mysqldriver: %w", err)
	}
	return s, d, nil
}
