package service

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/ledgerclock"
	"github.com/billing/ledger/internal/shards"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// AddServer runs billing shards add: the server of dsn (its schema
// migrated first, and the ledger's servers' too) is added to the ledger of
// cfg's servers, and its share of the rows moved to it (shards.Add). A
// move left unfinished is resumed. BILLING_FAILPOINTS arms the move's
// failpoints (shards.Fail*).
func AddServer(ctx context.Context, cfg config.Config, dsn string, opts shards.AddOptions, log *slog.Logger) (*shards.AddReport, error) {
	fps, err := failpoint.Parse(cfg.Failpoints)
	if err != nil {
		return nil, err
	}
	dsns, err := ResolveDSNs(cfg, log)
	if err != nil {
		return nil, err
	}
	added, err := cfg.MySQLConn().Apply([]string{dsn})
	if err != nil {
		return nil, fmt.Errorf("the new server's DSN: %w", err)
	}
	all := append(append([]string(nil), dsns...), added[0])
	for i, dsn := range all {
		if err := migrateServer(ctx, cfg, dsn, log.With("server", i), false); err != nil {
			return nil, fmt.Errorf("migrate: server %d: %w", i, err)
		}
	}
	d, err := mysqldriver.Open(ctx, all, mysqldriver.Options{LockWaitTimeout: cfg.MySQLLockWaitTimeout, MaxConns: 4})
	if err != nil {
		return nil, err
	}
	defer d.Close()
	// Recovery of what the instances left in doubt, as an instance's:
	// over the ledger's servers as they were.
	sink, rd, err := mysqldriver.OpenSink(ctx, dsns, MySQLOptions(cfg), SinkConfig(cfg, log))
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	defer sink.Close()
	recover := func(ctx context.Context) error {
		_, err := sink.Recover(ctx, cfg.CheckpointTimeout+ledgerclock.Margin)
		return err
	}
	hosts := make([]string, len(all))
	for i, dsn := range all {
		hosts[i] = shards.Host(dsn)
	}
	opts.By, opts.Recover, opts.Log, opts.Failpoints = "billing shards add on "+hostname(), recover, log, fps
	return shards.Add(ctx, d, hosts, opts)
}

// RemoveServer runs billing shards remove: the last of cfg's servers,
// which dsn must name (the same server identity), is drained while the
// instances count (shards.Remove). A drain left unfinished is resumed.
func RemoveServer(ctx context.Context, cfg config.Config, dsn string, opts shards.AddOptions, log *slog.Logger) (*shards.AddReport, error) {
	fps, err := failpoint.Parse(cfg.Failpoints)
	if err != nil {
		return nil, err
	}
	dsns, err := ResolveDSNs(cfg, log)
	if err != nil {
		return nil, err
	}
	named, err := cfg.MySQLConn().Apply([]string{dsn})
	if err != nil {
		return nil, fmt.Errorf("the server's DSN: %w", err)
	}
	for i, dsn := range dsns {
		if err := migrateServer(ctx, cfg, dsn, log.With("server", i), false); err != nil {
			return nil, fmt.Errorf("migrate: server %d: %w", i, err)
		}
	}
	d, err := mysqldriver.Open(ctx, append(append([]string(nil), dsns...), named[0]), mysqldriver.Options{LockWaitTimeout: cfg.MySQLLockWaitTimeout, MaxConns: 4})
	if err != nil {
		return nil, err
	}
	defer d.Close()
	last, _, err := mysqldriver.ReadServerIdentity(ctx, d.Server(len(dsns)-1).DB())
	if err != nil {
		return nil, err
	}
	it, _, err := mysqldriver.ReadServerIdentity(ctx, d.Server(len(dsns)).DB())
	if err != nil {
		return nil, err
	}
	if it.UUID == "" || it.UUID != last.UUID || len(dsns) < 2 {
		return nil, fmt.Errorf("--dsn names server %q, the last configured server (the one that can be removed) is %q", it.UUID, last.UUID)
	}
	sink, rd, err := mysqldriver.OpenSink(ctx, dsns, MySQLOptions(cfg), SinkConfig(cfg, log))
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	defer sink.Close()
	hosts := make([]string, len(dsns))
	for i, dsn := range dsns {
		hosts[i] = shards.Host(dsn)
	}
	ld, err := mysqldriver.Open(ctx, dsns, mysqldriver.Options{LockWaitTimeout: cfg.MySQLLockWaitTimeout, MaxConns: 4})
	if err != nil {
		return nil, err
	}
	defer ld.Close()
	opts.By, opts.Log, opts.Failpoints = "billing shards remove on "+hostname(), log, fps
	opts.Recover = func(ctx context.Context) error {
		_, err := sink.Recover(ctx, cfg.CheckpointTimeout+ledgerclock.Margin)
		return err
	}
	return shards.Remove(ctx, ld, hosts, opts)
}
