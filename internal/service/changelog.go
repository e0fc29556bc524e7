package service

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/billing/ledger/internal/buildinfo"
	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/metrics"
	"github.com/billing/ledger/internal/publisher"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
	"github.com/billing/ledger/internal/waits"
)

// changelogParts are the changelog's parts of one instance
// (docs/changelog.md): every instance watches the backlog (it holds the
// checkpoints when full) and runs a publisher, which publishes while it
// holds the ledger's lease.
type changelogParts struct {
	backlog *publisher.Backlog
	pub     *publisher.Publisher
}

// PublisherConfig is the changelog publisher's configuration (the caller
// sets the ledger, the instance and the failpoints).
func PublisherConfig(cfg config.Config, c *conns, log *slog.Logger) publisher.Config {
	return publisher.Config{Prefix: cfg.ChangelogTopicPrefix, Version: buildinfo.Get().Version, KafkaOpts: c.kopts,
		Partitions: int32(cfg.ChangelogTopicPartitions), Replication: int16(cfg.ChangelogTopicReplication),
		MaxEvents: cfg.ChangelogTxnMaxEvents, TxnTimeout: cfg.ChangelogTxnTimeout, Lease: cfg.ChangelogLease, Logger: log,
		SnapshotIndexBytes: cfg.ChangelogSnapshotIndex}
}

// openChangelog turns the ledger's changelog on, or checks it is on with
// this prefix (publisher.Enable), before the pipeline starts; nil without
// CHANGELOG_TOPIC_PREFIX.
//
// It also creates the changelog's topics that are missing and refuses a
// progress topic of several partitions (publisher.EnsureTopics): such an
// instance stops at its start, saying how to repair it. Its waits (the
// commit log settling, the backlog, the publisher's) are reported in ws.
func openChangelog(ctx context.Context, cfg config.Config, c *conns, l *Ledger, fps *failpoint.Set, log *slog.Logger, ws *waits.Set) (*changelogParts, error) {
	if cfg.ChangelogTopicPrefix == "" {
		return nil, nil
	}
	var tables []publisher.Tables
	var servers []publisher.Server
	for i := range l.Driver.Len() {
		tables, servers = append(tables, l.Driver.Server(i)), append(servers, l.Driver.Server(i))
	}
	control := l.Driver.Control()
	pcfg := PublisherConfig(cfg, c, log)
	pcfg.Ledger, pcfg.Instance, pcfg.Failpoints, pcfg.Waits = l.Sink.Ledger(), l.Sink.Instance(), fps, ws
	if err := publisher.EnsureTopics(ctx, pcfg); err != nil {
		return nil, err
	}
	st, err := publisher.Enable(ctx, control, tables, cfg.ChangelogTopicPrefix, l.Clock.Now(), ws)
	if err != nil {
		return nil, err
	}
	log.Info("changelog on", "prefix", st.Prefix, "from", st.From, "published", st.Published, "enabled_at", st.EnabledAt)
	return &changelogParts{
		backlog: publisher.NewBacklog(control, int64(cfg.ChangelogMaxBacklog), time.Second, log, ws),
		pub:     publisher.New(pcfg, control, servers),
	}, nil
}

// register adds the changelog's gauges to the instance's metrics; they
// stay 0 without the changelog (cp nil), so that rules and dashboards
// find them on every instance.
func (cp *changelogParts) register(m *metrics.Metrics) {
	if cp == nil {
		cp = &changelogParts{backlog: publisher.NewBacklog(nil, 1, 0, nil, nil)}
	}
	gauge := func(name, help string, v func() float64) {
		m.Registry().MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "billing", Name: name, Help: help}, v))
	}
	gauge("changelog_backlog_checkpoints", "Checkpoints committed and not yet published to the changelog (by MySQL's published hint).",
		func() float64 { return float64(cp.backlog.Behind()) })
	gauge("changelog_lag_seconds", "Age of the oldest committed checkpoint not yet published to the changelog (0: none).",
		func() float64 { return cp.backlog.Lag().Seconds() })
	gauge("changelog_backlog_full", "1 while the changelog's backlog is at CHANGELOG_MAX_BACKLOG and checkpoints are held.",
		func() float64 {
			if cp.backlog.Hold() != "" {
				return 1
			}
			return 0
		})
	gauge("changelog_publishing", "1 while this instance holds the changelog's lease and publishes.",
		func() float64 {
			if cp.pub != nil && cp.pub.Active() {
				return 1
			}
			return 0
		})
}

// RecoverChangelogProgress runs `billing changelog recover-progress`:
// publisher.RecoverProgress on the ledger of cfg (its servers, its
// identity, CHANGELOG_TOPIC_PREFIX), writing the rebuilt record when
// write is set.
func RecoverChangelogProgress(ctx context.Context, cfg config.Config, log *slog.Logger, write bool) (publisher.Recovery, error) {
	if cfg.ChangelogTopicPrefix == "" {
		return publisher.Recovery{}, fmt.Errorf("CHANGELOG_TOPIC_PREFIX is not set: the changelog of which prefix?")
	}
	c, err := resolveConns(cfg, log)
	if err != nil {
		return publisher.Recovery{}, err
	}
	d, err := mysqldriver.Open(ctx, c.dsns, mysqldriver.Options{LockWaitTimeout: cfg.MySQLLockWaitTimeout, MaxConns: 2})
	if err != nil {
		return publisher.Recovery{}, err
	}
	defer d.Close()
	ledger, _, ok, err := d.View().Identity(ctx)
	if err != nil {
		return publisher.Recovery{}, err
	}
	if !ok {
		return publisher.Recovery{}, fmt.Errorf("the ledger has no identity yet: no instance ever ran on it")
	}
	servers := make([]publisher.Server, d.Len())
	for i := range servers {
		servers[i] = d.Server(i)
	}
	pcfg := PublisherConfig(cfg, c, log)
	pcfg.Ledger, pcfg.Instance, pcfg.Waits = ledger, "billing changelog recover-progress", waits.New(log)
	return publisher.RecoverProgress(ctx, pcfg, d.Control(), servers, write)
}
