package service

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

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
	m, err := openMove(ctx, cfg, dsn, "billing shards add", &opts, log)
	if err != nil {
		return nil, err
	}
	defer m.close()
	all := append(slices.Clone(m.dsns), m.named)
	if err := migrateServers(ctx, cfg, all, log); err != nil {
		return nil, err
	}
	d, err := mysqldriver.Open(ctx, all, m.driverOpts)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return shards.Add(ctx, d, shards.Hosts(all), opts)
}

// RemoveServer runs billing shards remove: the last of cfg's servers,
// which dsn must name (the same server identity), is drained while the
// instances count (shards.Remove). A drain left unfinished is resumed.
func RemoveServer(ctx context.Context, cfg config.Config, dsn string, opts shards.AddOptions, log *slog.Logger) (*shards.AddReport, error) {
	m, err := openMove(ctx, cfg, dsn, "billing shards remove", &opts, log)
	if err != nil {
		return nil, err
	}
	defer m.close()
	if err := migrateServers(ctx, cfg, m.dsns, log); err != nil {
		return nil, err
	}
	d, err := mysqldriver.Open(ctx, m.dsns, m.driverOpts)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	named, err := mysqldriver.Open(ctx, []string{m.named}, m.driverOpts)
	if err != nil {
		return nil, err
	}
	defer named.Close()
	last, _, err := mysqldriver.ReadServerIdentity(ctx, d.Server(d.Len()-1).DB())
	if err != nil {
		return nil, err
	}
	it, _, err := mysqldriver.ReadServerIdentity(ctx, named.Server(0).DB())
	if err != nil {
		return nil, err
	}
	if it.UUID == "" || it.UUID != last.UUID || d.Len() < 2 {
		return nil, fmt.Errorf("--dsn names server %q, the last configured server (the one that can be removed) is %q", it.UUID, last.UUID)
	}
	return shards.Remove(ctx, d, shards.Hosts(m.dsns), opts)
}

// move is what billing shards add and remove share: the configured
// servers (dsns) and the one the command names, and a sink over the
// ledger's servers as they are, for the recovery of what the instances
// left in doubt (AddOptions.Recover).
type move struct {
	dsns       []string
	named      string
	driverOpts mysqldriver.Options
	close      func()
}

// openMove resolves cfg's servers and dsn, opens the recovery sink, and
// fills opts (who moves, recovery, the log, BILLING_FAILPOINTS).
func openMove(ctx context.Context, cfg config.Config, dsn, command string, opts *shards.AddOptions, log *slog.Logger) (*move, error) {
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
		return nil, fmt.Errorf("the DSN of --dsn: %w", err)
	}
	sink, rd, err := mysqldriver.OpenSink(ctx, dsns, MySQLOptions(cfg), SinkConfig(cfg, log))
	if err != nil {
		return nil, err
	}
	opts.By, opts.Log, opts.Failpoints = command+" on "+hostname(), log, fps
	opts.Recover = func(ctx context.Context) error {
		_, err := sink.Recover(ctx, cfg.CheckpointTimeout+ledgerclock.Margin)
		return err
	}
	return &move{dsns: dsns, named: named[0], driverOpts: mysqldriver.Options{LockWaitTimeout: cfg.MySQLLockWaitTimeout, MaxConns: 4},
		close: func() { sink.Close(); rd.Close() }}, nil
}

// migrateServers migrates each of dsns.
func migrateServers(ctx context.Context, cfg config.Config, dsns []string, log *slog.Logger) error {
	for i, dsn := range dsns {
		if err := migrateServer(ctx, cfg, dsn, log.With("server", i), false); err != nil {
			return fmt.Errorf("migrate: server %d: %w", i, err)
		}
	}
	return nil
}
