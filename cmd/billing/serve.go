package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/buildinfo"
	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/health"
	"github.com/billing/ledger/internal/kafkaconn"
	"github.com/billing/ledger/internal/ledgerclock"
	"github.com/billing/ledger/internal/metrics"
	"github.com/billing/ledger/internal/mysqlconn"
	"github.com/billing/ledger/internal/periods"
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
	if c.dsns, err = resolveMySQL(cfg, log); err != nil {
		return nil, err
	}
	return c, nil
}

// resolveMySQL returns the ledger's DSNs with MYSQL_PASSWORD_FILE and
// MYSQL_TLS applied, for the commands that use MySQL only.
func resolveMySQL(cfg config.Config, log *slog.Logger) ([]string, error) {
	dsns, err := cfg.MySQLConn().Apply(cfg.DSNs())
	if err != nil {
		return nil, err
	}
	if cfg.MySQLTLS == mysqlconn.TLSSkipVerify || cfg.MySQLTLS == mysqlconn.TLSPreferred {
		log.Warn("MySQL TLS does not verify the server's certificate", "mysql_tls", cfg.MySQLTLS)
	}
	return dsns, nil
}

// migrate applies the schema to every server, under goose's lock. It needs
// an account allowed to run DDL (see docs/operations.md).
func migrate(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	dsns, err := resolveMySQL(cfg, log)
	if err != nil {
		return err
	}
	log.Info("migrating", "mysql", mysqlconn.RedactAll(dsns))
	for i, dsn := range dsns {
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
			if schemaMissing(err) {
				return fmt.Errorf("checking the schema version: %w (the schema is missing and this account may not create it: run `billing migrate` with an account allowed to CREATE and ALTER, see docs/operations.md)", err)
			}
			return fmt.Errorf("checking the schema version: %w", mysqlconn.AccessDenied(dsn, err))
		}
		if !pending {
			log.Debug("schema up to date")
			return nil
		}
	}
	if err := migrations.Up(ctx, db.DB, log); err != nil {
		if denied(err) && mysqlconn.DeniedNumber(err) != mysqlconn.ErDBAccessDenied {
			return fmt.Errorf("%w (applying migrations needs CREATE, ALTER, INDEX, DROP and REFERENCES on the database: run `billing migrate` with such an account first, see docs/operations.md)", err)
		}
		return mysqlconn.AccessDenied(dsn, err)
	}
	return nil
}

// schemaMissing reports the one refusal that means "no schema yet": goose
// found no version table and the account may not create it. Any other
// refusal (the database itself, a wrong password, a table's privilege) is
// access denied, whatever the schema holds.
func schemaMissing(err error) bool {
	var me *mysql.MySQLError
	return mysqlconn.DeniedNumber(err) == mysqlconn.ErTableAccessDenied && errors.As(err, &me) &&
		strings.HasPrefix(me.Message, "CREATE command denied")
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
	log.Info("configured", "kafka", c.kafka, "mysql", mysqlconn.RedactAll(c.dsns), "topic", cfg.KafkaTopic, "group", cfg.KafkaGroup,
		"settings", resultSettings(cfg), "window", cfg.Period().String(), "closing", closingText(cfg),
		"version", buildinfo.Get().Version, "commit", buildinfo.Get().Commit)

	// Health and metrics are served from the first second, before
	// anything connects: a slow start (migrations under their lock,
	// recovery, the first claim) answers /healthz 200 and /readyz 503
	// "starting: <phase>" instead of not answering. A bad or busy
	// HTTP_ADDR is a startup error.
	mon := health.New(health.Options{ReadyMaxAge: cfg.ReadyMaxAge, MaxStall: cfg.LiveMaxAge, CheckInterval: cfg.HealthCheck})
	m := metrics.New(metrics.Options{Topic: cfg.KafkaTopic, Group: cfg.KafkaGroup, CheckpointTimeout: cfg.CheckpointTimeout, Process: true})
	if cfg.HTTPAddr != "" {
		ln, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("HTTP_ADDR: %w", err)
		}
		srv := newHTTPServer(handler(ctx, mon, m.Handler()))
		served := make(chan struct{})
		go func() {
			defer close(served)
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server failed", "addr", cfg.HTTPAddr, "err", err)
			}
		}()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			_ = srv.Close()
			<-served
		}()
		log.Info("serving /metrics, /healthz and /readyz", "addr", ln.Addr().String())
	}

	mon.SetPhase("migrating the schema")
	for i, dsn := range c.dsns {
		if err := migrateServer(ctx, cfg, dsn, log.With("server", i), false); err != nil {
			return fmt.Errorf("migrate: server %d: %w", i, err)
		}
	}
	// Before the sink reads or writes anything (its identity, first of
	// all): a missing grant stops the service here, named.
	mon.SetPhase("checking grants")
	if err := preflight(ctx, c.dsns, cfg.MySQLLockWaitTimeout, mysqldriver.Access(cfg.Pipeline(nil, log, nil).Features())); err != nil {
		return err
	}
	mon.SetPhase("connecting to MySQL")
	// Every age and expiry is judged on the ledger's clock, the control
	// server's (package ledgerclock); it is measured once the servers
	// are open, before anything is judged.
	clock := ledgerclock.New(nil)
	sinkCfg := cfg.Sink(log)
	sinkCfg.Failpoints = fps
	sinkCfg.Now = clock.Now
	sink, dbs, err := mysqldriver.OpenSink(ctx, c.dsns, cfg.MySQL(), sinkCfg)
	if err != nil {
		return err
	}
	defer dbs.Close()
	defer sink.Close()
	if err := clock.Sync(ctx, dbs.Server(0)); err != nil {
		return err
	}
	if off, unc := clock.Offset(); off > time.Second || off < -time.Second {
		log.Warn("this host's clock is off the control server's; the ledger judges time by the server's", "offset", off, "uncertainty", unc)
	} else {
		log.Info("ledger clock measured", "offset", off, "uncertainty", unc)
	}
	mon.SetPhase("checking the topic")
	if err := checkTopic(ctx, c.kopts, c.kafka.Brokers, cfg.KafkaTopic); err != nil {
		return err
	}
	// The ledger's period settings are the ledger's: stored at the first
	// start, compared at every start (package periods).
	mon.SetPhase("checking the period settings")
	stored, err := periods.Ensure(ctx, dbs, periods.Settings{Period: cfg.Period(), Close: cfg.WindowCloseAfter > 0},
		time.Duration(cfg.WindowCloseAfter), "instance "+sink.Instance(), log)
	if err != nil {
		return err
	}
	schedule, err := stored.Schedule()
	if err != nil {
		return err
	}
	log.Info("period settings (the ledger's)", "windows", schedule.String(), "windows_close", stored.Current().Close,
		"window_close_after", time.Duration(cfg.WindowCloseAfter), "max_event_time_skew", cfg.MaxEventTimeSkew)
	log.Info("starting", "instance", sink.Instance(), "topic", cfg.KafkaTopic, "group", cfg.KafkaGroup,
		"servers", len(c.dsns), "participants", sink.Participants())

	// The callback runs only once Run has started; m and mon exist before.
	// The kprom hooks go to the pipeline's client only. The client id names
	// the instance, so that the group's members (billing status, Kafka's
	// tools) tell which member is which owner of partition_offsets.
	kopts := append(slices.Clip(c.kopts), m.KafkaHooks(), kgo.ClientID("billing-"+sink.Instance()))
	pcfg := cfg.Pipeline(kopts, log, func(info pipeline.CheckpointInfo) {
		m.OnCheckpoint(info)
		mon.OnCheckpoint(info)
	})
	pcfg.Failpoints = fps
	pcfg.Clock = clock.Now
	pcfg.Window = schedule
	pcfg.CheckSettings = func(ctx context.Context) error {
		err := periods.Verify(ctx, dbs.Server(0).DB(), stored)
		var changed *periods.MismatchError
		if errors.As(err, &changed) {
			return err
		}
		if err != nil {
			log.Warn("cannot check the ledger's period settings; checked again later", "err", err)
		}
		return nil
	}
	p, err := pipeline.New(pcfg, sink, dbs.Stores())
	if err != nil {
		return err
	}
	servers := make([]*sql.DB, dbs.Len())
	for i := range servers {
		servers[i] = dbs.Server(i).DB().DB
		m.AddDB(strconv.Itoa(i), servers[i])
		m.AddDB(strconv.Itoa(i)+"-cleanup", dbs.Server(i).CleanupDB().DB)
	}
	m.Attach(p.Stats(), p.DedupCacheKeys, mon.Stall)
	adm := kadm.NewClient(p.Client())
	mon.Start(health.Checks{
		Stats:      p.Stats(),
		MySQL:      pingAll(servers),
		Membership: membership(p.Client(), adm, cfg.KafkaGroup, cfg.KafkaTopic),
	})

	// Health checks and sampling go on during the graceful shutdown (lag
	// while draining); they use the pipeline's client and the sink's pools:
	// stop them before those close.
	bgctx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	bg.Go(func() { clock.Run(bgctx, dbs.Server(0), ledgerclock.Interval, log) })
	if cfg.HTTPAddr != "" { // nobody asks otherwise
		bg.Add(1)
		go func() {
			defer bg.Done()
			mon.Run(bgctx)
		}()
		sampler := &metrics.Sampler{
			Kafka: adm, Servers: servers, Topic: cfg.KafkaTopic, Group: cfg.KafkaGroup, Owner: sink.Instance(),
			Interval: cfg.MetricsSample, Timeout: min(cfg.MetricsSample, 10*time.Second), Logger: log,
		}
		bg.Add(1)
		go func() {
			defer bg.Done()
			sampler.Run(bgctx, m)
		}()
	}
	defer func() {
		stopBackground()
		bg.Wait()
	}()

	began := time.Now()
	err = p.Run(ctx)
	stopBackground()
	log.Info("stopped", summary(p.Stats(), time.Since(began))...)
	return err
}

// resultSettings are the settings that change what the ledger holds
// (config.ResultSettings), by variable name, for the "configured" line.
func resultSettings(cfg config.Config) slog.Value {
	var attrs []slog.Attr
	for _, name := range config.ResultSettings() {
		v, _ := cfg.Setting(name)
		attrs = append(attrs, slog.String(name, v))
	}
	return slog.GroupValue(attrs...)
}

// closingText says in words whether and when windows close.
func closingText(cfg config.Config) string {
	if cfg.WindowCloseAfter == 0 {
		return "windows never close (WINDOW_CLOSE_AFTER empty)"
	}
	return fmt.Sprintf("a window closes once the watermark is %s past its end", time.Duration(cfg.WindowCloseAfter))
}

// pingAll checks that every server answers.
func pingAll(servers []*sql.DB) func(context.Context) error {
	return func(ctx context.Context) error {
		for i, db := range servers {
			if err := db.PingContext(ctx); err != nil {
				return fmt.Errorf("server %d: %w", i, err)
			}
		}
		return nil
	}
}

// membership asks the group coordinator whether the pipeline's client is
// a member of the group (kgo's own view, GroupMetadata, says whether it
// believes it joined; DescribeGroups confirms it and that the group is
// Stable, not in the middle of a rebalance), and how many partitions of
// the topic the group assigned it.
func membership(cl *kgo.Client, adm *kadm.Client, group, topic string) func(context.Context) (bool, int, error) {
	return func(ctx context.Context) (bool, int, error) {
		gs, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			return false, 0, fmt.Errorf("describe group: %w", err)
		}
		g, ok := gs[group]
		if !ok {
			return false, 0, nil
		}
		if g.Err != nil {
			return false, 0, fmt.Errorf("describe group: %w", g.Err)
		}
		id, _ := cl.GroupMetadata()
		if id == "" || g.State != "Stable" {
			// Not joined, or the group is rebalancing: nobody consumes
			// until the assignment is settled.
			return false, 0, nil
		}
		for _, mem := range g.Members {
			if mem.MemberID != id {
				continue
			}
			n := 0
			if ca, ok := mem.Assigned.AsConsumer(); ok {
				for _, t := range ca.Topics {
					if t.Topic == topic {
						n += len(t.Partitions)
					}
				}
			}
			return true, n, nil
		}
		return false, 0, nil
	}
}

// TopicError stops the service at start when its topic cannot be consumed:
// the brokers do not know it (a topic not created yet, or a mistyped
// KAFKA_TOPIC), or the principal may not describe it. Without the check
// the consumer waits for the topic's metadata forever, logging nothing,
// and /readyz says only that the group does not exist.
type TopicError struct {
	Topic   string
	Brokers []string
	Err     error
}

func (e *TopicError) Error() string {
	if errors.Is(e.Err, kerr.UnknownTopicOrPartition) {
		return fmt.Sprintf("KAFKA_TOPIC %q does not exist on the brokers %s: create it first (docs/production.md), or correct KAFKA_TOPIC", e.Topic, strings.Join(e.Brokers, ","))
	}
	if errors.Is(e.Err, kerr.TopicAuthorizationFailed) {
		return fmt.Sprintf("the Kafka principal may not describe KAFKA_TOPIC %q (it needs Describe and Read on the topic, see docs/operations.md): %v", e.Topic, e.Err)
	}
	return fmt.Sprintf("cannot read the metadata of KAFKA_TOPIC %q from the brokers %s: %v", e.Topic, strings.Join(e.Brokers, ","), e.Err)
}

func (e *TopicError) Unwrap() error { return e.Err }

// checkTopic asks the brokers for the topic's metadata, bounded by a
// minute (a broker that does not answer is an error too).
func checkTopic(ctx context.Context, kopts []kgo.Opt, brokers []string, topic string) error {
	cl, err := kgo.NewClient(append(slices.Clip(kopts), kgo.WithLogger(kgo.BasicLogger(io.Discard, kgo.LogLevelNone, nil)))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tds, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err == nil {
		err = tds.Error()
	}
	if err == nil && !tds.Has(topic) {
		err = kerr.UnknownTopicOrPartition
	}
	if err != nil {
		return &TopicError{Topic: topic, Brokers: brokers, Err: err}
	}
	return nil
}

// summary is the "stopped" line: the totals of this run and its rate.
func summary(st *pipeline.Stats, ran time.Duration) []any {
	counted := st.Counted.Load()
	return []any{"counted", counted, "checkpoints", st.Checkpoints.Load(), "consumed", st.Consumed.Load(),
		"duplicates", st.Duplicates.Load(), "dead_letters", st.DeadLetters.Load(), "aborted_checkpoints", st.Aborts.Load(),
		"in_doubt_resolved", st.RecoveredCommit.Load() + st.RecoveredAbort.Load(),
		"ran_for", ran.Round(time.Millisecond), "average_events_per_second", int64(float64(counted)/max(ran.Seconds(), 1e-3) + 0.5)}
}
