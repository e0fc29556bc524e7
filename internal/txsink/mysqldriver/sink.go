package mysqldriver

import (
	"context"
	"fmt"

	"github.com/billing/ledger/internal/txsink"
)

// OtherConns is the connections of a server's pool beyond the branches
// (OpenSink).
const OtherConns = 8

// DefaultCleanupConns is the size of each server's cleanup pool:
// the upkeep's hold of the state, its emptying, the retention.
const DefaultCleanupConns = 3

// OpenSink connects to the servers of dsns (the control server first) and
// builds the exactly-once sink over them. On each server, the pool holds
// the sink's branches plus 8 connections for statements outside them
// (lookups, decisions, recovery, health checks, sampling) plus
// Options.ReadAheadConns, and the cleanup
// pool DefaultCleanupConns: the upkeep of the dedup keys' generations holds the
// generations' state on the control server while it empties a table on
// each server (one connection each), and the retention of ledger entries
// takes one. Close the sink, then the driver.
func OpenSink(ctx context.Context, dsns []string, opts Options, cfg txsink.Config) (*txsink.Sink, *Driver, error) {
	if opts.MaxConns == 0 {
		opts.MaxConns = cfg.Branches + OtherConns + opts.ReadAheadConns
	}
	if opts.CleanupConns == 0 {
		opts.CleanupConns = DefaultCleanupConns
	}
	d, err := Open(ctx, dsns, opts)
	if err != nil {
		return nil, nil, err
	}
	if opts.BeforeSink != nil {
		if err := opts.BeforeSink(ctx, d, &cfg); err != nil {
			d.Close()
			return nil, nil, err
		}
	}
	s, err := txsink.New(ctx, cfg, d.Control(), d.Servers())
	if err != nil {
		d.Close()
		return nil, nil, fmt.Errorf("mysqldriver: %w", err)
	}
	return s, d, nil
}
