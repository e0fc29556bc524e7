package integration_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/testenv"
)

// The chaos suite (issue 4, docs/chaos.md): three billing instances in one
// consumer group consume what billing-gen produces while a driver with its
// own seeded random source kills, terminates, freezes and restarts them and
// restarts (gracefully or by SIGKILL) MariaDB and the Kafka broker. At the
// end the faults stop, the generator finishes, the consumer catches up, and
// billing-verify must find the ledger EXACT; an audit trail of the control
// tables must satisfy the protocol's invariants.
//
// It restarts the shared services, so it never runs in a plain `go test
// ./...`: set CHAOS=ci (make chaos, the step at the end of make test) or
// CHAOS=long (make chaos-long). Knobs, all optional:
//
//	CHAOS_SEED, CHAOS_GEN_SEED  fault and generator seeds (default: clock)
//	CHAOS_EVENTS, CHAOS_RATE    events and records/s of billing-gen
//	CHAOS_VERSION_RATIO         billing-gen's -version-ratio: that share of
//	                            the events get versions (docs/corrections.md)
//	CHAOS_FAULTS                number of faults
//	CHAOS_KINDS                 comma-separated fault kinds to draw from
//	                            (default: all but add-server; naming
//	                            add-server adds one server to the ledger)
//	CHAOS_LOG_DIR               where the processes' logs go (default: a
//	                            temporary folder, removed after a pass
//	                            unless CHAOS_KEEP_LOGS is set)
//	CHAOS_SERVICE_LOG_LEVEL     LOG_LEVEL of the instances (default info)
//	CHAOS_REPORT                where to write the JSON report (default:
//	                            report.json in the log folder)
//	CHAOS_SERVICES_SCRIPT       services.sh of the running services
//	                            (default ../scripts/services.sh)
//	CHAOS_SERVICE_ENV           settings of the instances over the suite's,
//	                            NAME=value[,NAME=value]; BILLING_WINDOW,
//	                            BILLING_TIMEZONE, WINDOW_CLOSE_AFTER and
//	                            LEDGER_ENTRIES are passed to billing-gen too
//	                            (its -window, -timezone, -close-after and
//	                            -ledger-entries), so that the expected ledger
//	                            follows; with WINDOW_CLOSE_AFTER set, an audit
//	                            trigger also watches sealed windows (A8); with
//	                            CHANGELOG_TOPIC_PREFIX=p the instances publish
//	                            the changelog under p-<topic> and the
//	                            verification adds its chain check
//	                            (changelogMatches); the changelog is on
//	                            unless set here (p "chaos-cl"), and
//	                            CHANGELOG_TOPIC_PREFIX= (empty) turns it off;
//	                            EVENT_FORMAT and SCHEMA_REGISTRY_URL (here
//	                            or in the suite's environment) make
//	                            billing-gen and the hostile bursts write
//	                            that format

// publisherSteps are the changelog publisher's failpoints, in order.
var publisherSteps = []string{"changelog-before-txn", "changelog-after-produce", "changelog-after-kafka", "changelog-after-bookkeep"}

// publisherKill is the publisher failpoint an incarnation (its writer tag)
// is started with when the changelog is on: half of them, drawn from the
// fault seed, die by kill -9 at their Nth Kafka transaction (N from 2 to
// 11) at one of the publisher's steps, if they hold the lease that long.
// Which instance publishes is the lease's choice, not the schedule's, so
// the publisher's kills ride along every incarnation instead of being
// scheduled faults; the supervisor counts them as failpoint exits.
func publisherKill(seed uint64, tag string) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s", seed, tag)
	x := h.Sum64()
	if x%2 == 0 {
		return ""
	}
	return fmt.Sprintf("%s=kill@%d", publisherSteps[(x/2)%uint64(len(publisherSteps))], 2+(x/8)%10)
}

// chaosProfile sizes a run.
type chaosProfile struct {
	Name          string
	Events        int64         // valid events billing-gen produces
	Rate          float64       // records/s; sized so production spans the faults
	AbortEvery    time.Duration // one aborted transaction of 5 records this often
	DupRatio      float64
	ConflictRatio float64
	OverflowCases int
	Faults        int
	// Required: one kind of each group is always injected.
	Required [][]faultKind
	// Weights draw the remaining faults.
	Weights map[faultKind]int
	// Gap is the range of quiet time before each fault.
	Gap [2]time.Duration

	CheckpointMaxRecords int
	MaxPollRecords       int

	// Deadlines. They bound waits for conditions and only matter when
	// something is wrong: generous, so that a slow machine never fails a
	// correct service.
	Progress       time.Duration // without any committed checkpoint, after a fault
	Settle         time.Duration // for the final catch-up
	ShutdownGrace  time.Duration // for an instance to exit after SIGTERM
	FailpointWait  time.Duration // for an armed failpoint to fire
	ServiceTimeout time.Duration // for one services.sh step
	GenTimeout     time.Duration // for billing-gen as a whole
}

var chaosProfiles = map[string]chaosProfile{
	// Under three minutes on two noisy cores: every kind of fault, MariaDB
	// and Kafka both restarted and crashed, three zombies (a thawed zombie
	// attempts a stale commit about every other time: three make a broken
	// fence show in most runs), two step-kills (one before, one after the
	// commit point), while about two minutes of production run.
	"ci": {
		Name: "ci", Events: 22000, Rate: 200, AbortEvery: 500 * time.Millisecond, DupRatio: 0.1, ConflictRatio: 0.01, OverflowCases: 6,
		Faults: 12,
		Required: [][]faultKind{{faultKill}, {faultTerm}, {faultZombie}, {faultZombie}, {faultZombie},
			{faultStepKill}, {faultStepKill},
			{faultRestartMariaDB}, {faultCrashMariaDB}, {faultRestartKafka}, {faultCrashKafka}, {faultHostile}},
		Weights:              map[faultKind]int{faultKill: 1},
		Gap:                  [2]time.Duration{time.Second, 3 * time.Second},
		CheckpointMaxRecords: 500, MaxPollRecords: 250,
		Progress: 2 * time.Minute, Settle: 3 * time.Minute, ShutdownGrace: time.Minute,
		FailpointWait: time.Minute, ServiceTimeout: 3 * time.Minute, GenTimeout: 10 * time.Minute,
	},
	// At least a million events and a hundred faults of every kind.
	"long": {
		Name: "long", Events: 1_000_000, Rate: 1000, AbortEvery: 200 * time.Millisecond, DupRatio: 0.1, ConflictRatio: 0.01, OverflowCases: 30,
		Faults: 130,
		Required: [][]faultKind{{faultKill}, {faultTerm}, {faultZombie}, {faultStepKill},
			{faultRestartMariaDB}, {faultCrashMariaDB}, {faultRestartKafka}, {faultCrashKafka}, {faultHostile}},
		Weights: map[faultKind]int{faultKill: 20, faultTerm: 12, faultZombie: 12, faultStepKill: 16,
			faultRestartMariaDB: 10, faultCrashMariaDB: 10, faultRestartKafka: 10, faultCrashKafka: 10, faultHostile: 8},
		Gap:                  [2]time.Duration{time.Second, 4 * time.Second},
		CheckpointMaxRecords: 2000, MaxPollRecords: 500,
		Progress: 3 * time.Minute, Settle: 15 * time.Minute, ShutdownGrace: time.Minute,
		FailpointWait: time.Minute, ServiceTimeout: 3 * time.Minute, GenTimeout: 60 * time.Minute,
	},
}

const chaosInstances = 3
const chaosPartitions = 6

// chaosRun is the state of one run shared by the driver and the checks.
type chaosRun struct {
	t              *testing.T
	prof           chaosProfile
	svc            *servicesCtl
	brokers        []string
	topic, group   string
	dsn            string
	db             *sqlx.DB
	instances      []*instance
	sessionTimeout time.Duration
	began          time.Time

	// For the add-server fault: the admin DSN new databases are made
	// with, the service's binary, its environment for a writer tag, the
	// log folder; the servers added so far (MYSQL_SHARD_DSNS of every
	// incarnation started since) and the writer tags of the moves.
	admin      string
	billingBin string
	logDir     string
	moverEnv   func(tag string) []string
	shardsMu   sync.Mutex
	shards     []string
	moverTags  []string

	// endsMu orders taking the end offsets with hostile bursts, which
	// produce beside the generator and may come after it finished: a
	// burst either lands before the ends are first taken, or takes them
	// again itself (retarget).
	endsMu    sync.Mutex
	mu        sync.Mutex
	targets   map[int32]int64 // set once the generator finished
	lso       map[int32]int64
	anomalies []string
}

// addShard makes dsn the last server of the list every incarnation
// started from now on runs with.
func (r *chaosRun) addShard(dsn string) {
	r.shardsMu.Lock()
	defer r.shardsMu.Unlock()
	r.shards = append(r.shards, dsn)
}

// shardDSNs are the servers added so far.
func (r *chaosRun) shardDSNs() []string {
	r.shardsMu.Lock()
	defer r.shardsMu.Unlock()
	return slices.Clone(r.shards)
}

// moverTag records the writer tag of a run of billing shards add.
func (r *chaosRun) moverTag(tag string) {
	r.shardsMu.Lock()
	defer r.shardsMu.Unlock()
	r.moverTags = append(r.moverTags, tag)
}

// takeEnds records the positions consumption must reach: the offset after
// each partition's last committed record, and its read_committed end
// offset.
func (r *chaosRun) takeEnds(ctx context.Context) error {
	target, lso, err := committedEnds(ctx, r.brokers, r.topic)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.targets, r.lso = target, lso
	r.mu.Unlock()
	return nil
}

// retarget takes the ends again if the generator has finished (targets
// known); the caller holds endsMu and has just produced more records.
// Without it a burst after the generator leaves the targets behind the
// log: the positions pass the old end offsets, the run never counts as
// caught up again, and an idle service looks stuck.
func (r *chaosRun) retarget(ctx context.Context) error {
	r.mu.Lock()
	known := r.targets != nil
	r.mu.Unlock()
	if !known {
		return nil
	}
	return r.takeEnds(ctx)
}

func (r *chaosRun) logf(format string, args ...any) {
	r.t.Helper()
	r.t.Logf("[%7s] "+format, append([]any{time.Since(r.began).Round(100 * time.Millisecond)}, args...)...)
}

// anomaly records something odd that is not a correctness failure (an
// instance that ended with an error status after SIGTERM, a slow
// shutdown); the report lists them.
func (r *chaosRun) anomaly(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.anomalies = append(r.anomalies, msg)
	r.mu.Unlock()
	r.logf("anomaly: %s", msg)
}

// running waits until the instance has a live incarnation.
func (r *chaosRun) running(ctx context.Context, in *instance) (*incarnation, error) {
	ctx, cancel := context.WithTimeout(ctx, r.prof.Progress)
	defer cancel()
	for {
		cur, changed := in.current()
		if cur != nil && !cur.exited() {
			return cur, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("%s has no running incarnation: %w", in.name, context.Cause(ctx))
		}
	}
}

func envInt(t *testing.T, name string, def int64) int64 {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a non-negative integer", name, v)
	}
	return n
}

func envSeed(t *testing.T, name string) uint64 {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return uint64(time.Now().UnixNano())
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: want an unsigned integer", name, v)
	}
	return n
}

func TestChaos(t *testing.T) {
	mode := os.Getenv("CHAOS")
	if mode == "" {
		t.Skip("chaos suite: restarts Kafka and MariaDB; run with CHAOS=ci (make chaos) or CHAOS=long (make chaos-long)")
	}
	prof, ok := chaosProfiles[mode]
	if !ok {
		t.Fatalf("CHAOS=%q: want ci or long", mode)
	}
	// Overrides, echoed in the replay command.
	var overrides []string
	for _, name := range []string{"CHAOS_EVENTS", "CHAOS_RATE", "CHAOS_FAULTS", "CHAOS_KINDS", "CHAOS_SERVICE_ENV"} {
		if v := os.Getenv(name); v != "" {
			overrides = append(overrides, name+"="+v)
		}
	}
	prof.Events = envInt(t, "CHAOS_EVENTS", prof.Events)
	prof.Faults = int(envInt(t, "CHAOS_FAULTS", int64(prof.Faults)))
	if v := os.Getenv("CHAOS_RATE"); v != "" {
		rate, err := strconv.ParseFloat(v, 64)
		if err != nil || rate < 0 {
			t.Fatalf("CHAOS_RATE=%q: want records per second (0 = unlimited)", v)
		}
		prof.Rate = rate
	}
	allowed := defaultFaultKinds
	if v := os.Getenv("CHAOS_KINDS"); v != "" {
		allowed = nil
		for _, k := range strings.Split(v, ",") {
			k := faultKind(strings.TrimSpace(k))
			if !slices.Contains(allFaultKinds, k) {
				t.Fatalf("CHAOS_KINDS: unknown fault kind %q (known: %v)", k, allFaultKinds)
			}
			allowed = append(allowed, k)
		}
	}
	faultSeed, genSeed := envSeed(t, "CHAOS_SEED"), envSeed(t, "CHAOS_GEN_SEED")
	serviceEnv, genPeriod := chaosServiceEnv(t)

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	if d, ok := t.Deadline(); ok {
		// Leave a minute for the report and cleanup before go test panics.
		var c2 context.CancelFunc
		ctx, c2 = context.WithDeadline(ctx, d.Add(-time.Minute))
		defer c2()
	}

	brokers := testenv.Kafka(t)
	admin := testenv.MySQL(t)
	svc, err := newServicesCtl(ctx, brokers, admin)
	if err != nil {
		t.Fatal(err)
	}

	schedule := planFaults(faultSeed, prof, allowed, chaosInstances)
	seeds := fmt.Sprintf("CHAOS_SEED=%d CHAOS_GEN_SEED=%d", faultSeed, genSeed)
	for _, o := range overrides {
		// Quoted: CHAOS_SERVICE_ENV holds commas and slashes.
		k, v, _ := strings.Cut(o, "=")
		seeds += " " + k + "='" + v + "'"
	}
	replay := seeds + " make " + map[string]string{"ci": "chaos", "long": "chaos-long"}[mode]
	t.Logf("chaos %s: fault seed %d, generator seed %d", mode, faultSeed, genSeed)
	t.Logf("chaos %s: replay with: %s  (or: CHAOS=%s %s go test -p 1 -count=1 -v -timeout 90m -run '^TestChaos$' ./integration/)", mode, replay, mode, seeds)
	t.Logf("chaos %s: %d events at %.0f records/s, %d instances, %d partitions, %d faults:", mode, prof.Events, prof.Rate, chaosInstances, chaosPartitions, len(schedule))
	for _, f := range schedule {
		t.Logf("  %s", f)
	}

	logDir := os.Getenv("CHAOS_LOG_DIR")
	if logDir == "" {
		if logDir, err = os.MkdirTemp("", "chaos-"+mode+"-"); err != nil {
			t.Fatal(err)
		}
		// A temporary folder goes after a pass (the report is in the
		// test log); a failed run keeps it for the post-mortem.
		t.Cleanup(func() {
			if !t.Failed() && os.Getenv("CHAOS_KEEP_LOGS") == "" {
				_ = os.RemoveAll(logDir)
			}
		})
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("chaos %s: logs in %s", mode, logDir)

	billingBin := testenv.Binary(t, billingPkg)
	genBin := testenv.Binary(t, "github.com/billing/ledger/cmd/billing-gen")
	verifyBin := testenv.Binary(t, "github.com/billing/ledger/cmd/billing-verify")
	// Records up to 8 MiB: the hostile fault's junk exceeds the broker's
	// default limit of 1 MiB.
	topic := testenv.NewTopicWithConfigs(t, brokers, chaosPartitions, map[string]string{"max.message.bytes": "8388608"})
	dsn := testenv.NewDatabase(t)
	db, err := sqlx.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })

	r := &chaosRun{t: t, prof: prof, svc: svc, brokers: brokers, topic: topic, group: "g-" + topic, dsn: dsn, db: db,
		sessionTimeout: 6 * time.Second, began: time.Now(), admin: admin, billingBin: billingBin, logDir: logDir}
	base := (&testEnv{brokers: brokers, topic: topic, dsn: dsn}).serviceEnv(map[string]string{
		"MYSQL_BRANCHES":          "2",
		"MYSQL_LOCK_WAIT_TIMEOUT": "1s",
		"CHECKPOINT_INTERVAL":     "200ms",
		"CHECKPOINT_TIMEOUT":      "5s",
		"CHECKPOINT_MAX_RECORDS":  strconv.Itoa(prof.CheckpointMaxRecords),
		"KAFKA_MAX_POLL_RECORDS":  strconv.Itoa(prof.MaxPollRecords),
		"KAFKA_SESSION_TIMEOUT":   r.sessionTimeout.String(),
		"KAFKA_REBALANCE_TIMEOUT": "15s",
		"RECOVERY_INTERVAL":       "1s",
		"SHUTDOWN_TIMEOUT":        "10s",
		"LOG_LEVEL":               envOr("CHAOS_SERVICE_LOG_LEVEL", "info"),
	})
	maps.Copy(base, serviceEnv)
	// The changelog (CHANGELOG_TOPIC_PREFIX in CHAOS_SERVICE_ENV): a
	// prefix of this run's own (the progress topic is one ledger's), its
	// topics deleted after; the chain check joins the verification.
	clPrefix := base["CHANGELOG_TOPIC_PREFIX"]
	if clPrefix != "" {
		clPrefix += "-" + topic
		base["CHANGELOG_TOPIC_PREFIX"] = clPrefix
		cleanupChangelogTopics(t, brokers, clPrefix)
		if _, set := serviceEnv["CHANGELOG_LEASE"]; !set {
			base["CHANGELOG_LEASE"] = "3s" // a killed or paused publisher is replaced within the faults' pace
		}
	}
	envFor := func(tag string) []string {
		var env []string
		if clPrefix != "" && tag != "" {
			if fp := publisherKill(faultSeed, tag); fp != "" {
				env = append(env, "BILLING_FAILPOINTS="+fp) // a step-kill's own comes after it and wins
			}
		}
		for k, v := range base {
			if k == "MYSQL_DSN" && tag != "" {
				// The writer tag of the audit trail: the driver sends
				// it as SET @chaos_writer = '<tag>' on every connection.
				v += "&@chaos_writer=%27" + tag + "%27"
			}
			env = append(env, k+"="+v)
		}
		if added := r.shardDSNs(); len(added) > 0 {
			env = append(env, "MYSQL_SHARD_DSNS="+strings.Join(added, ","))
		}
		return env
	}
	r.moverEnv = func(tag string) []string {
		r.moverTag(tag)
		return envFor(tag)
	}

	// Failure diagnostics: the last lines of every instance, the
	// generator and the servers.
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, r, logDir)
		}
	})

	// The schema first, then the audit triggers on it, then the service.
	mig, err := startProc("billing migrate", filepath.Join(logDir, "migrate.log"), billingBin, envFor(""), "migrate")
	if err != nil {
		t.Fatal(err)
	}
	if err, ok := mig.waitFor(ctx, 2*time.Minute); !ok || err != nil {
		t.Fatalf("billing migrate: %v (ok=%v)\n%s", err, ok, strings.Join(tail(mig.logPath, 30), "\n"))
	}
	if err := installAudit(ctx, db, genPeriod.closing()); err != nil {
		t.Fatal(err)
	}
	// The audit monitor has its own pool: it polls many times a second.
	mdb, err := sqlx.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mdb.Close() })
	mctx, stopMonitor := context.WithCancel(ctx)
	defer stopMonitor()
	type monitorResult struct {
		found []string
		polls int
	}
	monitored := make(chan monitorResult, 1)
	go func() {
		found, polls := watchMoves(mctx, mdb)
		monitored <- monitorResult{found, polls}
	}()

	for i := range chaosInstances {
		in := newInstance(i+1, billingBin, logDir, envFor)
		if err := in.run(); err != nil {
			t.Fatal(err)
		}
		r.instances = append(r.instances, in)
	}
	t.Cleanup(func() {
		for _, in := range r.instances {
			_, _ = in.stop(context.Background(), syscall.SIGKILL, 30*time.Second)
		}
	})

	expectedPath := filepath.Join(logDir, "expected.json")
	genArgs := []string{"-brokers", strings.Join(brokers, ","), "-topic", topic,
		"-events", strconv.FormatInt(prof.Events, 10), "-rate", strconv.FormatFloat(prof.Rate, 'f', -1, 64),
		"-seed", strconv.FormatUint(genSeed, 10), "-expected", expectedPath, "-progress", "log",
		"-dup-ratio", strconv.FormatFloat(prof.DupRatio, 'f', -1, 64),
		"-conflict-ratio", strconv.FormatFloat(prof.ConflictRatio, 'f', -1, 64),
		"-overflow-cases", strconv.Itoa(prof.OverflowCases),
		"-aborted-ratio", "0", // produced by the suite's aborter instead, see there
		"-timeout", prof.GenTimeout.String()}
	genArgs = append(genArgs, genPeriod.args()...)
	if v := os.Getenv("CHAOS_VERSION_RATIO"); v != "" {
		genArgs = append(genArgs, "-version-ratio", v)
	}
	t.Logf("chaos %s: billing-gen %s", mode, strings.Join(genArgs, " "))
	gen, err := startProc("billing-gen", filepath.Join(logDir, "billing-gen.log"), genBin, nil, genArgs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gen.signal(syscall.SIGKILL); <-gen.done })
	ab := newAborter(brokers, topic, prof.AbortEvery, genSeed)
	abCtx, stopAborter := context.WithCancel(ctx)
	defer stopAborter()
	abDone := make(chan error, 1)
	go func() { abDone <- ab.run(abCtx) }()
	genErr := make(chan error, 1)
	go func() {
		err, ok := gen.waitFor(ctx, prof.GenTimeout+time.Minute)
		// Production is over (or failed): the aborter stops with it, its
		// last transaction aborted, before the end offsets are taken.
		stopAborter()
		if aerr := <-abDone; err == nil && ok {
			err = aerr
		}
		switch {
		case !ok:
			gen.signal(syscall.SIGKILL)
			err = fmt.Errorf("billing-gen still running after %s (or the run was cancelled: %v)", prof.GenTimeout+time.Minute, context.Cause(ctx))
		case err != nil:
			err = fmt.Errorf("billing-gen failed (%v): the run has no expected ledger; this is a generator or Kafka failure, not a ledger one:\n%s",
				err, strings.Join(tail(gen.logPath, 20), "\n"))
		default:
			// Production is over: the positions consumption must reach.
			r.endsMu.Lock()
			err = r.takeEnds(ctx)
			r.endsMu.Unlock()
			if err == nil {
				r.mu.Lock()
				r.logf("billing-gen finished; committed record ends %v (read_committed end offsets %v)", r.targets, r.lso)
				r.mu.Unlock()
			}
		}
		if err != nil {
			cancel(err)
		}
		genErr <- err
	}()

	// Faults.
	d := &faultDriver{r: r, hostile: newHostileSource(t, brokers, topic, faultSeed, genPeriod)}
	defer d.hostile.close()
	faultsBegan := time.Now()
	if err := d.run(ctx, schedule); err != nil {
		t.Errorf("fault driver: %v", err)
	}
	faultsTook := time.Since(faultsBegan)
	r.logf("faults over: %d of %d injected in %s", len(d.results), len(schedule), faultsTook.Round(time.Second))

	// Catch-up: generator done, every position at its target, nothing of
	// this run left in doubt.
	var settleTook time.Duration
	var final map[int32]int64
	if !t.Failed() {
		select {
		case err := <-genErr:
			if err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatalf("waiting for billing-gen: %v", context.Cause(ctx))
		}
		t0 := time.Now()
		final, err = r.settle(ctx)
		settleTook = time.Since(t0)
		if err != nil {
			t.Errorf("settle: %v", err)
		} else {
			r.logf("settled in %s: positions %v", settleTook.Round(100*time.Millisecond), final)
		}
	}

	// The verdict, on billing-gen's expected ledger plus what the hostile
	// bursts added (merged whatever happened before: the report compares
	// the ledger with it too).
	if expectedPath, err = d.hostile.mergeInto(expectedPath, filepath.Join(logDir, "expected-with-hostile.json")); err != nil {
		t.Fatal(err)
	}
	var verdict string
	if !t.Failed() {
		// Windows closed by the last checkpoints are sealed by the next
		// ones, taken for that alone a moment after the catch-up.
		var wait []string
		if genPeriod.closing() {
			wait = []string{"-wait", "90s", "-interval", "1s"}
		}
		if added := r.shardDSNs(); len(added) > 0 {
			wait = append(wait, "-shard-dsns", strings.Join(added, ","))
		}
		verdict, err = runVerify(ctx, verifyBin, logDir, dsn, expectedPath, topic, wait...)
		r.logf("billing-verify: %s", verdict)
		if err != nil {
			t.Errorf("billing-verify: %v", err)
		}
	}
	var clVerdict string
	if clPrefix != "" && !t.Failed() {
		err := published(ctx, dsn, 3*time.Minute)
		if err == nil {
			clVerdict, _, err = changelogMatches(ctx, brokers, dsn, clPrefix, r.shardDSNs()...)
		}
		if err != nil {
			clVerdict = "FAILED: " + err.Error()
			t.Errorf("changelog: %v", err)
		}
		r.logf("changelog: %s", clVerdict)
	}
	writers := map[string]string{}
	for _, in := range r.instances {
		maps.Copy(writers, in.writers())
	}
	r.shardsMu.Lock()
	for _, tag := range r.moverTags {
		writers[tag] = moverWriter
	}
	r.shardsMu.Unlock()
	stopMonitor()
	mon := <-monitored
	audit, aerr := checkAudit(ctx, db, writers, mon.found, genPeriod.closing())
	audit.MonitorPolls = mon.polls
	if aerr != nil {
		t.Errorf("audit: %v", aerr)
	} else if audit.ViolationCount > 0 {
		t.Errorf("audit: %d protocol invariant violations in the committed history of the control tables:\n  %s",
			audit.ViolationCount, strings.Join(audit.Violations, "\n  "))
	}

	// Graceful shutdown of every instance, then nothing may be in doubt
	// (also what lets the database be dropped).
	var shutdownErrs []string
	for _, in := range r.instances {
		inc, err := in.stop(ctx, syscall.SIGTERM, prof.ShutdownGrace)
		if err != nil {
			shutdownErrs = append(shutdownErrs, fmt.Sprintf("%s: %v", in.name, err))
		} else if inc != nil && inc.err != nil {
			shutdownErrs = append(shutdownErrs, fmt.Sprintf("%s#%d: %s", in.name, inc.n, inc.exitText()))
		}
	}
	for _, s := range shutdownErrs {
		r.anomaly("final shutdown: %s", s)
	}
	ids := map[string]bool{}
	for _, id := range writers {
		ids[id] = true
	}
	if left, err := chaosInDoubt(ctx, db, ids); err != nil {
		t.Errorf("in doubt after shutdown: %v", err)
	} else if len(left) > 0 {
		t.Errorf("%d branches of this run still in doubt after every instance stopped: %v", len(left), left)
	}

	rep := buildReport(r, mode, faultSeed, genSeed, replay, schedule, d.results, expectedPath, verdict, audit,
		faultsTook, settleTook, time.Since(r.began), logDir)
	rep.Changelog = clVerdict
	rep.Aborted = map[string]int64{"transactions": ab.txns.Load(), "records": ab.records.Load(),
		"retries": ab.retries.Load(), "client_restarts": ab.restarts.Load()}
	rep.log(t)
	reportPath := os.Getenv("CHAOS_REPORT")
	if reportPath == "" {
		reportPath = filepath.Join(logDir, "report.json")
	}
	if b, err := json.MarshalIndent(rep, "", "  "); err == nil {
		if err := os.WriteFile(reportPath, b, 0o644); err != nil {
			t.Logf("report: %v", err)
		} else {
			t.Logf("chaos %s: report written to %s", mode, reportPath)
		}
	}
	if t.Failed() {
		t.Logf("chaos %s FAILED; replay with: %s", mode, replay)
	}
}

// chaosPeriod is what the instances' settings say of billing periods and
// of the records' format, for billing-gen and the hostile bursts.
type chaosPeriod struct {
	window, zone, closeAfter string
	entries                  bool
	// format and registry: EVENT_FORMAT and SCHEMA_REGISTRY_URL (empty:
	// the contract's JSON).
	format, registry string
}

func (p chaosPeriod) closing() bool {
	d, err := time.ParseDuration(p.closeAfter)
	return err == nil && d > 0
}

// args are billing-gen's flags for these settings.
func (p chaosPeriod) args() []string {
	args := []string{"-window", p.window, "-timezone", p.zone}
	if p.closeAfter != "" {
		args = append(args, "-close-after", p.closeAfter)
	}
	if p.entries {
		args = append(args, "-ledger-entries")
	}
	if p.format != "" {
		args = append(args, "-format", p.format, "-schema-registry", p.registry)
	}
	return args
}

// chaosServiceEnv reads CHAOS_SERVICE_ENV (NAME=value,...) and the period
// settings it implies (the service's defaults otherwise).
func chaosServiceEnv(t *testing.T) (map[string]string, chaosPeriod) {
	t.Helper()
	env := map[string]string{}
	if v := os.Getenv("CHAOS_SERVICE_ENV"); v != "" {
		for _, kv := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok || k == "" {
				t.Fatalf("CHAOS_SERVICE_ENV: %q is not NAME=value", kv)
			}
			env[k] = val
		}
	}
	if _, set := env["CHANGELOG_TOPIC_PREFIX"]; !set {
		env["CHANGELOG_TOPIC_PREFIX"] = "chaos-cl"
	}
	p := chaosPeriod{window: "1h", zone: "UTC", closeAfter: env["WINDOW_CLOSE_AFTER"], entries: env["LEDGER_ENTRIES"] == "true"}
	if w := env["BILLING_WINDOW"]; w != "" {
		p.window = w
	}
	if z := env["BILLING_TIMEZONE"]; z != "" {
		p.zone = z
	}
	// The format may come from the suite's own environment, which the
	// instances inherit, or from CHAOS_SERVICE_ENV.
	p.format, p.registry = cmp.Or(env["EVENT_FORMAT"], os.Getenv("EVENT_FORMAT")), cmp.Or(env["SCHEMA_REGISTRY_URL"], os.Getenv("SCHEMA_REGISTRY_URL"))
	if _, err := ledgercheck.NewPeriod(p.window, p.zone); err != nil {
		t.Fatalf("CHAOS_SERVICE_ENV: %v", err)
	}
	return env, p
}

// settle waits until every position reached its target and no branch of
// this run is in doubt, then returns the positions.
func (r *chaosRun) settle(ctx context.Context) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.prof.Settle)
	defer cancel()
	lastLog := time.Now()
	for {
		ok, pos, err := r.caughtUp(ctx)
		var left []string
		if err == nil && ok {
			ids := map[string]bool{}
			for _, in := range r.instances {
				for _, id := range in.writers() {
					ids[id] = true
				}
			}
			left, err = chaosInDoubt(ctx, r.db, ids)
			if err == nil && len(left) == 0 {
				return pos, nil
			}
		}
		if time.Since(lastLog) > 10*time.Second {
			lastLog = time.Now()
			r.mu.Lock()
			target := r.targets
			r.mu.Unlock()
			r.logf("catching up: positions %v, targets %v, in doubt %d, err %v", pos, target, len(left), err)
		}
		select {
		case <-ctx.Done():
			r.mu.Lock()
			target := r.targets
			r.mu.Unlock()
			return nil, fmt.Errorf("not caught up after %s: positions %v, targets %v, in doubt %v (last error: %v)", r.prof.Settle, pos, target, left, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// runVerify runs billing-verify once and returns its verdict line; an
// error unless it said EXACT.
func runVerify(ctx context.Context, bin, logDir, dsn, expected, topic string, extra ...string) (string, error) {
	p, err := startProc("billing-verify", filepath.Join(logDir, "billing-verify.log"), bin, nil,
		append([]string{"-dsn", dsn, "-expected", expected, "-topic", topic, "-max-diffs", "40"}, extra...)...)
	if err != nil {
		return "", err
	}
	werr, ok := p.waitFor(ctx, 5*time.Minute)
	if !ok {
		p.signal(syscall.SIGKILL)
		<-p.done
		return "", errors.New("billing-verify did not finish within 5 minutes")
	}
	out := tail(p.logPath, 60)
	verdict := ""
	for _, l := range out {
		if strings.HasPrefix(l, "EXACT") || strings.HasPrefix(l, "MISMATCH") {
			verdict = l
		}
	}
	if werr != nil || !strings.HasPrefix(verdict, "EXACT") {
		return verdict, fmt.Errorf("%v:\n%s", werr, strings.Join(out, "\n"))
	}
	return verdict, nil
}

// dumpLogs prints the last lines of every process and server log.
func dumpLogs(t *testing.T, r *chaosRun, logDir string) {
	for _, in := range r.instances {
		logs := in.logs()
		for i, path := range logs {
			n := 0
			switch len(logs) - i {
			case 1:
				n = 40
			case 2:
				n = 15
			}
			if n > 0 {
				t.Logf("---- last %d lines of %s ----\n%s", n, path, strings.Join(tail(path, n), "\n"))
			}
		}
	}
	for _, name := range []string{"billing-gen.log", "billing-verify.log"} {
		path := filepath.Join(logDir, name)
		if _, err := os.Stat(path); err == nil {
			t.Logf("---- last lines of %s ----\n%s", path, strings.Join(tail(path, 20), "\n"))
		}
	}
	if r.svc != nil {
		for name, path := range r.svc.serviceLogs() {
			t.Logf("---- last lines of %s (%s) ----\n%s", name, path, strings.Join(tail(path, 15), "\n"))
		}
	}
	t.Logf("all logs: %s", logDir)
}

// ---------------------------------------------------------------- report

// chaosReport is what a run did, for the log and docs/chaos.md.
type chaosReport struct {
	Mode            string            `json:"mode"`
	FaultSeed       uint64            `json:"fault_seed"`
	GenSeed         uint64            `json:"generator_seed"`
	Replay          string            `json:"replay"`
	Events          int64             `json:"events_valid"`
	Records         int64             `json:"records_committed"`
	Produced        any               `json:"produced"`
	Aborted         map[string]int64  `json:"aborted_transactions"`
	FaultsPlanned   int               `json:"faults_planned"`
	FaultsInjected  int               `json:"faults_injected"`
	FaultsByKind    map[string]int    `json:"faults_by_kind"`
	Faults          []faultResult     `json:"faults"`
	Incarnations    int               `json:"incarnations"`
	ExitsExpected   int               `json:"exits_expected"`
	PublisherKills  map[string]int    `json:"publisher_kills,omitempty"` // by failpoint: incarnations killed while publishing
	ExitsOnTheirOwn []exitRecord      `json:"exits_on_their_own"`
	Verdict         string            `json:"verdict"`
	Changelog       string            `json:"changelog,omitempty"` // the chain check, with CHANGELOG_TOPIC_PREFIX
	Lost            int64             `json:"lost"`
	CountedTwice    int64             `json:"counted_twice"`
	DeadLetters     map[string]int64  `json:"dead_letters_expected"`
	DeadLettersGot  map[string]int64  `json:"dead_letters_actual"`
	Audit           auditSummary      `json:"audit"`
	ServiceLog      map[string]int    `json:"service_log"`
	Anomalies       []string          `json:"anomalies"`
	Durations       map[string]string `json:"durations"`
	LogDir          string            `json:"log_dir"`
}

func buildReport(r *chaosRun, mode string, faultSeed, genSeed uint64, replay string, schedule []plannedFault, results []faultResult,
	expectedPath, verdict string, audit auditSummary, faults, settle, total time.Duration, logDir string) *chaosReport {
	rep := &chaosReport{Mode: mode, FaultSeed: faultSeed, GenSeed: genSeed, Replay: replay, FaultsPlanned: len(schedule),
		FaultsInjected: len(results), FaultsByKind: map[string]int{}, Faults: results, Verdict: verdict, Audit: audit,
		LogDir: logDir, Durations: map[string]string{
			"faults": faults.Round(time.Second).String(), "settle": settle.Round(100 * time.Millisecond).String(),
			"total": total.Round(time.Second).String()}}
	for _, f := range results {
		rep.FaultsByKind[string(f.Kind)]++
	}
	for _, in := range r.instances {
		for _, e := range in.exits() {
			if e.Expected == "" {
				rep.ExitsOnTheirOwn = append(rep.ExitsOnTheirOwn, e)
			} else if e.Expected != "final shutdown" {
				rep.ExitsExpected++
			}
			if step, _, ok := strings.Cut(e.Failpoints, "="); ok && strings.HasPrefix(step, "changelog-") && strings.Contains(e.Exit, "killed") &&
				strings.HasPrefix(e.Expected, "failpoint ") {
				if rep.PublisherKills == nil {
					rep.PublisherKills = map[string]int{}
				}
				rep.PublisherKills[step]++
			}
		}
		rep.Incarnations += len(in.logs())
	}
	if exp, err := ledgercheck.ReadFile(expectedPath); err == nil {
		rep.Events, rep.Records, rep.Produced, rep.DeadLetters = exp.EventsValid, exp.Produced.Records, exp.Produced, exp.DeadLetters
		if act, err := ledgercheck.ReadActual(context.Background(), []*sqlx.DB{r.db}, r.topic, exp.LedgerEntries); err == nil {
			cmp := ledgercheck.Compare(exp, act)
			rep.Lost, rep.CountedTwice = cmp.Lost, cmp.CountedTwice
			rep.DeadLettersGot = map[string]int64{}
			for _, d := range act.DeadLetters {
				rep.DeadLettersGot[d.Reason]++
			}
		}
	}
	rep.ServiceLog = serviceLogStats(r)
	r.mu.Lock()
	rep.Anomalies = append([]string(nil), r.anomalies...)
	r.mu.Unlock()
	return rep
}

// serviceLogStats counts notable events in every incarnation's log.
func serviceLogStats(r *chaosRun) map[string]int {
	patterns := map[string]string{
		"checkpoints failed":            `msg="checkpoint failed"`,
		"checkpoints fenced":            "fenced",
		"frontier moved under":          "was written as open, but windows before",
		"in-doubt branches committed":   `msg="resolved in-doubt branch"` + "\x00outcome=commit",
		"in-doubt branches rolled back": `msg="resolved in-doubt branch"` + "\x00outcome=abort",
		"holder connections ended":      "ended the connection holding",
		"partitions assigned":           `msg="partitions assigned"`,
		"partitions revoked":            `msg="partitions revoked"`,
		"partitions lost":               `msg="partitions lost"`,
		"ERROR lines":                   "level=ERROR",
	}
	counts := map[string]int{}
	for _, in := range r.instances {
		for _, path := range in.logs() {
			b, err := os.ReadFile(path)
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				for name, pat := range patterns {
					match := true
					for _, part := range strings.Split(pat, "\x00") {
						match = match && strings.Contains(line, part)
					}
					if match {
						counts[name]++
					}
				}
			}
		}
	}
	return counts
}

func (rep *chaosReport) log(t *testing.T) {
	t.Logf("==== chaos %s report ====", rep.Mode)
	t.Logf("seeds: fault %d, generator %d; replay: %s", rep.FaultSeed, rep.GenSeed, rep.Replay)
	t.Logf("events: %d valid events in %d committed records; produced %+v", rep.Events, rep.Records, rep.Produced)
	t.Logf("aborted transactions (never to be seen): %v", rep.Aborted)
	t.Logf("faults: %d of %d injected: %v", rep.FaultsInjected, rep.FaultsPlanned, rep.FaultsByKind)
	for _, f := range rep.Faults {
		t.Logf("  at %-7s %s: took %s, then %s to progress; %s %s", f.At.Round(100*time.Millisecond), f.plannedFault,
			f.Took.Round(100*time.Millisecond), f.Recovery.Round(100*time.Millisecond), f.Victim, f.Note)
	}
	t.Logf("instances: %d incarnations, %d ended by faults, %d exited on their own (restarted by the supervisor)",
		rep.Incarnations, rep.ExitsExpected, len(rep.ExitsOnTheirOwn))
	if rep.PublisherKills != nil {
		t.Logf("publishers killed at their failpoints (kill -9 while publishing): %v", rep.PublisherKills)
	}
	for _, e := range rep.ExitsOnTheirOwn {
		t.Logf("  billing-%d#%d (%s) exited on its own after %s: %s; last line: %s", e.Slot, e.N, e.Instance, e.Lived.Round(100*time.Millisecond), e.Exit, e.LastLine)
	}
	t.Logf("verdict: %s", rep.Verdict)
	if rep.Changelog != "" {
		t.Logf("changelog: %s", rep.Changelog)
	}
	t.Logf("lost %d, counted twice %d", rep.Lost, rep.CountedTwice)
	for _, reason := range slices.Sorted(maps.Keys(rep.DeadLetters)) {
		t.Logf("  dead letters %-26s expected %6d, actual %6d", reason, rep.DeadLetters[reason], rep.DeadLettersGot[reason])
	}
	t.Logf("audit: %d offset changes (%d moves, %d claims), %d commit and %d abort decisions (%d pruned), %d windows sealed, %d monitor polls, %d invariant violations",
		rep.Audit.OffsetRows, rep.Audit.Moves, rep.Audit.Claims, rep.Audit.Commits, rep.Audit.Aborts, rep.Audit.Pruned, rep.Audit.Seals, rep.Audit.MonitorPolls, rep.Audit.ViolationCount)
	t.Logf("service logs: %v", rep.ServiceLog)
	for _, a := range rep.Anomalies {
		t.Logf("anomaly: %s", a)
	}
	t.Logf("durations: %v", rep.Durations)
}
