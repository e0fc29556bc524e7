package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/kafkaconn"
	"github.com/billing/ledger/internal/metrics"
	"github.com/billing/ledger/internal/mysqlconn"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
	"github.com/billing/ledger/migrations"
)

// conns are the connection settings resolved from the configuration:
// secrets read from their files, TLS configurations built.
type conns struct {
	kafka kafkaconn.Config
	kopts []kgo.Opt
	dsns  []string // with MYSQL_PASSWORD_FILE and MYSQL_TLS applied; never log them, see mysqlconn.Redact
}

func resolveConns(cfg config.Config, log *slog.Logger) (*conns, error) {
	c := &conns{kafka: cfg.KafkaConn()}
	var err error
	if c.kopts, err = c.kafka.Opts(); err != nil {
		return nil, err
	}
	if c.dsns, err = cfg.MySQLConn().Apply(cfg.DSNs()); err != nil {
		return nil, err
	}
	if cfg.MySQLTLS == mysqlconn.TLSSkipVerify || cfg.MySQLTLS == mysqlconn.TLSPreferred {
		log.Warn("MySQL TLS does not verify the server's certificate", "mysql_tls", cfg.MySQLTLS)
	}
	return c, nil
}

// migrate applies the schema to every server, under goose's lock. It needs
// an account allowed to run DDL (see docs/operations.md).
func migrate(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	c, err := resolveConns(cfg, log)
	if err != nil {
		return err
	}
	log.Info("migrating", "mysql", mysqlconn.RedactAll(c.dsns))
	for i, dsn := range c.dsns {
		if err := migrateServer(ctx, cfg, dsn, log.With("server", i), true); err != nil {
			return fmt.Errorf("server %d: %w", i, err)
		}
	}
	return nil
}

// migrateServer applies pending migrations to one server. Unless always is
// set, it first checks without any lock or DDL whether something is
// pending, so that a service account without DDL grants runs against a
// schema migrated beforehand by `billing migrate`.
func migrateServer(ctx context.Context, cfg config.Config, dsn string, log *slog.Logger, always bool) error {
	db, err := mysqldriver.OpenDB(dsn, cfg.MySQLLockWaitTimeout, 2)
	if err != nil {
		return err
	}
	defer db.Close()
	if !always {
		pending, err := hasPending(ctx, db.DB)
		if err != nil {
			if denied(err) {
				return fmt.Errorf("checking the schema version: %w (the schema is missing and this account may not create it: run `billing migrate` with an account allowed to CREATE and ALTER, see docs/operations.md)", err)
			}
			return fmt.Errorf("checking the schema version: %w", err)
		}
		if !pending {
			log.Debug("schema up to date")
			return nil
		}
	}
	if err := migrations.Up(ctx, db.DB, log); err != nil {
		if denied(err) {
			return fmt.Errorf("%w (applying migrations needs CREATE, ALTER, INDEX, DROP and REFERENCES on the database: run `billing migrate` with such an account first, see docs/operations.md)", err)
		}
		return err
	}
	return nil
}

// hasPending reports whether migrations remain to be applied; it takes no
// lock and runs no DDL once goose's version table exists.
func hasPending(ctx context.Context, db *sql.DB) (bool, error) {
	p, err := goose.NewProvider(goose.DialectMySQL, db, migrations.FS, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return false, err
	}
	return p.HasPending(ctx)
}

func serve(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	fps, err := failpoint.Parse(cfg.Failpoints)
	if err != nil {
		return err
	}
	if fps != nil {
		log.Warn("failpoints armed (testing only)", "spec", cfg.Failpoints)
	}
	c, err := resolveConns(cfg, log)
	if err != nil {
		return err
	}
	log.Info("configured", "kafka", c.kafka, "mysql", mysqlconn.RedactAll(c.dsns), "topic", cfg.KafkaTopic, "group", cfg.KafkaGroup)

	// Listen first: a bad or busy HTTP_ADDR is a startup error, found
	// before anything connects. Serving starts once the pipeline exists.
	var ln net.Listener
	if cfg.HTTPAddr != "" {
		if ln, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			return fmt.Errorf("HTTP_ADDR: %w", err)
		}
		defer ln.Close()
	}

	for i, dsn := range c.dsns {
		if err := migrateServer(ctx, cfg, dsn, log.With("server", i), false); err != nil {
			return fmt.Errorf("migrate: server %d: %w", i, err)
		}
	}
	sinkCfg := cfg.Sink(log)
	sinkCfg.Failpoints = fps
	sink, dbs, err := mysqldriver.OpenSink(ctx, c.dsns, cfg.MySQL(), sinkCfg)
	if err != nil {
		return err
	}
	defer dbs.Close()
	defer sink.Close()
	if err := preflight(ctx, dbs); err != nil {
		return err
	}
	log.Info("starting", "instance", sink.Instance(), "topic", cfg.KafkaTopic, "group", cfg.KafkaGroup,
		"servers", len(c.dsns), "participants", sink.Participants())

	ready := newReadiness(cfg.ReadyMaxAge)
	var m *metrics.Metrics
	// The callback runs only once Run has started: m and ready, set just
	// after New returns, exist before the first checkpoint.
	pcfg := cfg.Pipeline(c.kopts, log, func(info pipeline.CheckpointInfo) {
		m.OnCheckpoint(info)
		ready.OnCheckpoint(info)
	})
	pcfg.Failpoints = fps
	p, err := pipeline.New(pcfg, sink, pipeline.Pools(dbs))
	if err != nil {
		return err
	}
	ready.stats = p.Stats()
	m = metrics.New(metrics.Options{Stats: p.Stats(), DedupCacheKeys: dedupCacheKeys(p), Process: true})

	sampling := make(chan struct{})
	// Sampling goes on during the graceful shutdown (lag while draining).
	sctx, stopSampling := context.WithCancel(context.WithoutCancel(ctx))
	if ln != nil {
		servers := make([]*sql.DB, dbs.Len())
		for i := range servers {
			servers[i] = dbs.Server(i).DB().DB
		}
		sampler := &metrics.Sampler{
			Kafka: kadm.NewClient(p.Client()), Control: servers[0], Servers: servers,
			Topic: cfg.KafkaTopic, Group: cfg.KafkaGroup, Owner: sink.Instance(),
			Interval: cfg.MetricsSample, Timeout: min(cfg.MetricsSample, 10*time.Second), Logger: log,
		}
		go func() {
			defer close(sampling)
			sampler.Run(sctx, m)
		}()
	} else {
		close(sampling)
	}
	// The sampler uses the pipeline's client and the sink's pools: stop it
	// before they close.
	defer func() {
		stopSampling()
		<-sampling
	}()

	if ln != nil {
		srv := &http.Server{Handler: handler(ctx, m, ready), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server failed", "addr", cfg.HTTPAddr, "err", err)
			}
		}()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		log.Info("serving /metrics, /healthz and /readyz", "addr", ln.Addr().String())
	}
	err = p.Run(ctx)
	stopSampling()
	st := p.Stats()
	log.Info("stopped", "counted", st.Counted.Load(), "checkpoints", st.Checkpoints.Load(), "consumed", st.Consumed.Load())
	return err
}

// dedupCacheKeys returns the pipeline's in-memory dedup key count getter
// when it has one (see the report: pipeline.Pipeline.DedupCacheKeys is a
// requested addition); nil otherwise, which leaves the metric out.
func dedupCacheKeys(p *pipeline.Pipeline) func() int {
	if g, ok := any(p).(interface{ DedupCacheKeys() int }); ok {
		return g.DedupCacheKeys
	}
	return nil
}
