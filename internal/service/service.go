package service

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/buildinfo"
	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/health"
	"github.com/billing/ledger/internal/ledgerclock"
	"github.com/billing/ledger/internal/metrics"
	"github.com/billing/ledger/internal/mysqlconn"
	"github.com/billing/ledger/internal/periods"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/shards"
	"github.com/billing/ledger/internal/waits"
)

// DefaultMemoryLimit is the Go runtime's soft memory limit of a service
// process when GOMEMLIMIT is not set (cmd/billing, the benchmark's
// children): the heap (dedup cache, buffered records, fetched batches)
// stays well below the 512 MiB a container of this service is sized for,
// because the collector works harder as the limit nears instead of letting
// the heap double between cycles.
const DefaultMemoryLimit = 400 << 20

// Options are what a caller of Run adds to the configuration.
type Options struct {
	// Logger receives the service's logs; slog.Default() when nil.
	Logger *slog.Logger
	// OnCheckpoint, if set, is called after every checkpoint attempt,
	// after the metrics and the health monitor saw it (the benchmark's
	// measurements). It must not block.
	OnCheckpoint func(pipeline.CheckpointInfo)
	// OnStart, if set, is called with the pipeline once it is built,
	// right before it runs (the benchmark watches its Stats).
	OnStart func(*pipeline.Pipeline)
}

// Run runs one instance of the service until ctx ends (or it fails), then
// shuts it down in order. It starts the metrics and health endpoints
// first, then opens the ledger (OpenLedger: migrations, grants, sink,
// clock), checks the topic and the ledger's period settings (a
// *periods.MismatchError when they are not the instance's), builds the
// Kafka client and the pipeline, starts the background work (the clock's
// measurements, health checks, the metrics sampler) and runs the
// pipeline. Shutdown is the reverse: the pipeline's final checkpoint, the
// background work (which uses the pipeline's client and the sink's
// pools), the sink and the pools, the HTTP server last.
//
// A shutdown asked for (ctx cancelled) before the pipeline runs, while
// the service connects, migrates or reads its state, is a clean stop like
// one later: nothing was prepared that recovery would not resolve, so Run
// returns nil, not the context.Canceled of the step it interrupted.
func Run(ctx context.Context, cfg config.Config, o Options) error {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	err := run(ctx, cfg, o, log)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		log.Info("stopped while starting", "interrupted", err.Error())
		return nil
	}
	return err
}

func run(ctx context.Context, cfg config.Config, o Options, log *slog.Logger) error {
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
	ws := waits.New(log) // the waits without a bound of their own: logged, and listed on /waits
	if cfg.HTTPAddr != "" {
		stopHTTP, err := serveHTTP(ctx, cfg.HTTPAddr, mon, m, ws, log)
		if err != nil {
			return err
		}
		defer stopHTTP()
	}

	l, err := OpenLedger(ctx, cfg, c.dsns, fps, log, mon.SetPhase)
	if err != nil {
		return err
	}
	defer l.Close()
	mon.SetPhase("checking the topic")
	if err := checkTopic(ctx, c.kopts, c.kafka.Brokers, cfg.KafkaTopic); err != nil {
		return err
	}
	// The ledger's period settings are the ledger's: stored at the first
	// start, compared at every start (package periods).
	mon.SetPhase("checking the period settings")
	stored, schedule, err := l.Periods(ctx, cfg, log)
	if err != nil {
		return err
	}
	mon.SetPhase("turning the changelog on")
	cl, err := openChangelog(ctx, cfg, c, l, fps, log, ws)
	if err != nil {
		return err
	}
	log.Info("starting", "instance", l.Sink.Instance(), "topic", cfg.KafkaTopic, "group", cfg.KafkaGroup,
		"servers", len(c.dsns), "participants", l.Sink.Participants())

	p, err := newPipeline(cfg, c, l, stored, schedule, fps, m, mon, o, cl, ws, log)
	if err != nil {
		return err
	}
	servers := make([]*sql.DB, l.Driver.Len())
	for i := range servers {
		servers[i] = l.Driver.Server(i).DB().DB
		m.AddDB(strconv.Itoa(i), servers[i])
		m.AddDB(strconv.Itoa(i)+"-cleanup", l.Driver.Server(i).CleanupDB().DB)
	}
	m.Attach(p.Stats(), p.DedupCacheKeys, mon.Stall)
	adm := kadm.NewClient(p.Client())
	checks := health.Checks{
		Stats:      p.Stats(),
		MySQL:      pingAll(servers),
		Membership: membership(p.Client(), adm, cfg.KafkaGroup, cfg.KafkaTopic),
	}
	if cl != nil {
		checks.Hold = cl.backlog.Hold
	}
	cl.register(m)
	mon.Start(checks)

	// Health checks and sampling go on during the graceful shutdown (lag
	// while draining); they use the pipeline's client and the sink's pools:
	// stop them before those close.
	bgctx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	bg.Go(func() { l.Clock.Run(bgctx, l.Driver.Server(0), ledgerclock.Interval, log) })
	if cl != nil {
		bg.Go(func() { cl.backlog.Run(bgctx) })
		bg.Go(func() {
			if err := cl.pub.Run(bgctx); err != nil && bgctx.Err() == nil {
				log.Error("the changelog publisher stopped: the backlog grows until CHANGELOG_MAX_BACKLOG holds the checkpoints", "err", err)
			}
		})
	}
	if cfg.HTTPAddr != "" { // nobody asks otherwise
		bg.Go(func() { mon.Run(bgctx) })
		sampler := &metrics.Sampler{
			Kafka: adm, View: l.Driver.View(), Letters: serverLetters(l.Driver), Servers: serverStats(l.Driver),
			Topic: cfg.KafkaTopic, Group: cfg.KafkaGroup, Owner: l.Sink.Instance(),
			Interval: cfg.MetricsSample, Timeout: min(cfg.MetricsSample, 10*time.Second), Logger: log,
		}
		bg.Go(func() { sampler.Run(bgctx, m) })
	}
	defer func() {
		stopBackground()
		bg.Wait()
	}()

	if o.OnStart != nil {
		o.OnStart(p)
	}
	began := time.Now()
	err = p.Run(ctx)
	stopBackground()
	log.Info("stopped", summary(p.Stats(), time.Since(began))...)
	return err
}

// newPipeline builds the pipeline over the ledger: the Kafka client's
// options (the kprom hooks go to the pipeline's client only; the client
// id names the instance, so that the group's members, in billing status
// and Kafka's tools, tell which member is which owner of
// partition_offsets), the ledger's clock and period schedule, the check
// that the settings stay the ledger's, the checkpoint hooks, and ws for
// its waits.
func newPipeline(cfg config.Config, c *conns, l *Ledger, stored periods.Stored, schedule event.Schedule,
	fps *failpoint.Set, m *metrics.Metrics, mon *health.Monitor, o Options, cl *changelogParts, ws *waits.Set, log *slog.Logger) (*pipeline.Pipeline, error) {
	kopts := append(slices.Clip(c.kopts), m.KafkaHooks(), kgo.ClientID("billing-"+l.Sink.Instance()))
	pcfg := PipelineConfig(cfg, kopts, log, func(info pipeline.CheckpointInfo) {
		m.OnCheckpoint(info)
		mon.OnCheckpoint(info)
		if o.OnCheckpoint != nil {
			o.OnCheckpoint(info)
		}
	})
	dec, err := EventDecoder(cfg)
	if err != nil {
		return nil, err
	}
	pcfg.Decoder = dec
	pcfg.Failpoints = fps
	pcfg.Clock = l.Clock.Now
	pcfg.Window = schedule
	if cl != nil {
		pcfg.Hold = cl.backlog.Hold
	}
	view := l.Driver.View()
	pcfg.Waits = ws
	pcfg.CheckSettings = func(ctx context.Context) error {
		err := periods.Verify(ctx, view, stored)
		var changed *periods.MismatchError
		if errors.As(err, &changed) {
			return err
		}
		if err != nil {
			log.Warn("cannot check the ledger's period settings; checked again later", "err", err)
		}
		// A server added (billing shards add) that this instance was not
		// configured with: it cannot reach the rows moved there.
		err = shards.Verify(ctx, l.Driver, l.Servers)
		var moved *shards.MismatchError
		if errors.As(err, &moved) {
			return err
		}
		if err != nil {
			log.Warn("cannot check the ledger's layout; checked again later", "err", err)
		}
		return nil
	}
	return pipeline.New(pcfg, l.Sink, l.Driver.Stores())
}

// serveHTTP serves /metrics, /healthz, /readyz, /waits and /records on addr until the
// returned function stops it (bounded by two seconds).
func serveHTTP(ctx context.Context, addr string, mon *health.Monitor, m *metrics.Metrics, ws *waits.Set, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("HTTP_ADDR: %w", err)
	}
	srv := newHTTPServer(handler(ctx, mon, m.Handler(), ws))
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server failed", "addr", addr, "err", err)
		}
	}()
	log.Info("serving /metrics, /healthz, /readyz, /waits and /records", "addr", ln.Addr().String())
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		_ = srv.Close()
		<-served
	}, nil
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
