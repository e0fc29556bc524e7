package service

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/ledgerclock"
	"github.com/billing/ledger/internal/ledgerstatus"
	"github.com/billing/ledger/internal/metrics"
	"github.com/billing/ledger/internal/periods"
	"github.com/billing/ledger/internal/placement"
	"github.com/billing/ledger/internal/shards"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Ledger is the service's MySQL side, opened as the service opens it
// (OpenLedger): the sink over every server, on the ledger's clock.
type Ledger struct {
	Sink   *txsink.Sink
	Driver *mysqldriver.Driver
	// Clock is the ledger's clock, the control server's as this host
	// measures it (package ledgerclock): every age and expiry is judged by
	// it. Run keeps measuring it; a caller that runs no Run measures it
	// once, at OpenLedger.
	Clock *ledgerclock.Clock
	// Layout is the ledger's layout the instance started on (its
	// placement is the sink's); a newer one stops the instance.
	Layout shards.Layout
	// Servers are the configured servers' identities, in order: the
	// layout's first, then any to be added (shards.Covers).
	Servers []string
}

// Close closes the sink, then the servers' pools.
func (l *Ledger) Close() {
	l.Sink.Close()
	l.Driver.Close()
}

// OpenLedger opens the servers of dsns (ResolveDSNs) as the service does,
// in order: pending migrations are applied (checked without DDL first, so
// an account without DDL grants runs on a schema `billing migrate`
// applied), every grant the configuration needs is checked before
// anything is read or written (a missing one stops here, named), the
// sink is opened with fps armed, and the ledger's clock is measured
// before anything is judged. phase, if not nil, is told each step (the
// health endpoints report it during a slow start).
func OpenLedger(ctx context.Context, cfg config.Config, dsns []string, fps *failpoint.Set, log *slog.Logger, phase func(string)) (*Ledger, error) {
	if phase == nil {
		phase = func(string) {}
	}
	phase("migrating the schema")
	for i, dsn := range dsns {
		if err := migrateServer(ctx, cfg, dsn, log.With("server", i), false); err != nil {
			return nil, fmt.Errorf("migrate: server %d: %w", i, err)
		}
	}
	// Before the sink reads or writes anything (its identity, first of
	// all): a missing grant stops the service here, named.
	phase("checking grants")
	if err := mysqldriver.Preflight(ctx, dsns, cfg.MySQLLockWaitTimeout, mysqldriver.Access(PipelineConfig(cfg, nil, log, nil).Features())); err != nil {
		return nil, err
	}
	phase("connecting to MySQL")
	// Every age and expiry is judged on the ledger's clock, the control
	// server's (package ledgerclock); it is measured once the servers
	// are open, before anything is judged.
	clock := ledgerclock.New(nil)
	sinkCfg := SinkConfig(cfg, log)
	sinkCfg.Failpoints = fps
	sinkCfg.Now = clock.Now
	opts := MySQLOptions(cfg)
	// Before the sink writes anything: the servers must be the ledger's,
	// in its order (package shards), or its identity would be created on
	// a shard listed first.
	var layout shards.Layout
	var uuids []string
	opts.BeforeSink = func(ctx context.Context, d *mysqldriver.Driver, cfg *txsink.Config) error {
		phase("checking the ledger's layout")
		hosts := shards.Hosts(dsns)
		var err error
		if _, layout, err = shards.Ensure(ctx, d, hosts, txsink.NewIdentity, "an instance on "+hostname(), log); err != nil {
			return err
		}
		_, servers, err := shards.Read(ctx, d, hosts)
		if err != nil {
			return err
		}
		uuids = shards.UUIDs(servers)
		cfg.Placement, cfg.LayoutVersion = layout.Placement, layout.Version
		cfg.Layouts = layouts(d, uuids)
		return nil
	}
	sink, d, err := mysqldriver.OpenSink(ctx, dsns, opts, sinkCfg)
	if err != nil {
		return nil, err
	}
	l := &Ledger{Sink: sink, Driver: d, Clock: clock, Layout: layout, Servers: uuids}
	if err := clock.Sync(ctx, d.Server(0)); err != nil {
		l.Close()
		return nil, err
	}
	if off, unc := clock.Offset(); off > time.Second || off < -time.Second {
		log.Warn("this host's clock is off the control server's; the ledger judges time by the server's", "offset", off, "uncertainty", unc)
	} else {
		log.Info("ledger clock measured", "offset", off, "uncertainty", unc)
	}
	return l, nil
}

// Periods returns the ledger's period settings and the schedule of its
// windows: stored from cfg's at the ledger's first start, compared with
// cfg's at every start (a *periods.MismatchError when they differ; package
// periods).
func (l *Ledger) Periods(ctx context.Context, cfg config.Config, log *slog.Logger) (periods.Stored, event.Schedule, error) {
	stored, err := periods.Ensure(ctx, l.Driver, periods.Settings{Period: cfg.Period(), Close: cfg.WindowCloseAfter > 0},
		time.Duration(cfg.WindowCloseAfter), "instance "+l.Sink.Instance(), log)
	if err != nil {
		return nil, event.Schedule{}, err
	}
	schedule, err := stored.Schedule()
	if err != nil {
		return nil, event.Schedule{}, err
	}
	log.Info("period settings (the ledger's)", "windows", schedule.String(), "windows_close", stored.Current().Close,
		"window_close_after", time.Duration(cfg.WindowCloseAfter), "max_event_time_skew", cfg.MaxEventTimeSkew)
	return stored, schedule, nil
}

// serverStats are the counters of the driver's servers the metrics
// sample, the control server first.
func serverStats(d *mysqldriver.Driver) []metrics.Stats {
	out := make([]metrics.Stats, d.Len())
	for i := range out {
		out[i] = d.Server(i)
	}
	return out
}

// serverLetters are the dead letters of the driver's servers, the control
// server first.
func serverLetters(d *mysqldriver.Driver) ledgerstatus.ServerLetters {
	out := make(ledgerstatus.ServerLetters, d.Len())
	for i := range out {
		out[i] = d.Server(i).Letters()
	}
	return out
}

// hostname names this host in what the ledger records of who stored it.
func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "an unnamed host"
	}
	return h
}

// layouts reads a layout version's placements for a sink over the
// servers of uuids (txsink.Layouts): a version with a server the instance
// was not configured with cannot be followed (txsink.ErrNotPlaceable,
// wrapping a *shards.MismatchError that says what to do).
func layouts(d *mysqldriver.Driver, uuids []string) txsink.Layouts {
	return func(ctx context.Context, version int) (place, before placement.Placement, err error) {
		l, err := shards.ReadVersion(ctx, d, version)
		if err != nil {
			return place, before, err
		}
		if l.Version == 0 {
			return place, before, fmt.Errorf("layout version %d is not stored", version)
		}
		if diffs := shards.Covers(l, uuids); len(diffs) > 0 {
			return place, before, fmt.Errorf("%w: %w", txsink.ErrNotPlaceable, &shards.MismatchError{Stored: l, Differences: diffs})
		}
		if version > 1 {
			prev, err := shards.ReadVersion(ctx, d, version-1)
			if err != nil {
				return place, before, err
			}
			before = prev.Placement
		}
		return l.Placement, before, nil
	}
}
