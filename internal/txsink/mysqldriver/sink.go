package mysqldriver

import (
	"context"
	"fmt"

	"github.com/billing/ledger/internal/txsink"
)

// OtherConns is the connections of a server's pool beyond the branches
// (OpenSink).
const OtherConns = 8

// OpenSink connects to the servers of dsns (the control server first) and
// builds the exactly-once sink over them. On each server, the pool holds
// the sink's branches plus 8 connections for statements outside them
// (lookups, decisions, recovery, health checks, sampling), and the cleanup
// pool one connection per branch for the janitor's workers and one for the
// retention of ledger entries. Close the sink, then the driver.
func OpenSink(ctx context.Context, dsns []string, opts Options, cfg txsink.Config) (*txsink.Sink, *Driver, error) {
	if opts.MaxConns == 0 {
		opts.MaxConns = cfg.Branches + OtherConns
	}
	if opts.CleanupConns == 0 {
		opts.CleanupConns = cfg.Branches + 1
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
