package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/publisher"
)

// Config is one run of the bench: what cmd/billing-bench's flags set (the
// flag of each field in its comment; their help text has the details).
// Zero NaiveBatch, NaiveWait and SinkChunk take the service's sizes; an
// empty Gen finds billing-gen; an empty Out is bench-results/<time>.
type Config struct {
	Brokers           []string          // -brokers
	Admin             string            // -mysql-dsn: admin DSN without database
	Admin2            string            // -mysql2-dsn: a second server, for the two-servers variant
	Events            int64             // -events
	Accounts          int               // -accounts
	ManyAccounts      int               // -many-accounts
	Partitions        int               // -partitions
	ZipfS             float64           // -zipf-s
	DupRatio          float64           // -dup-ratio
	Seed              uint64            // -seed
	Variants          []string          // -variants
	Modes             []string          // -modes
	ServiceEnv        map[string]string // -service-env
	NaiveBatch        int               // -naive-batch
	NaiveWait         time.Duration     // -naive-wait
	SinkChunk         int               // -sink-chunk
	LargeStateCache   int               // -large-state-cache
	LargeStateKeys    int64             // -large-state-keys
	LTMPool           int64             // -ltm-pool: the larger-than-memory variant's buffer pool, bytes
	LTMKeys           int64             // -ltm-keys: and its stored keys
	LTMOrdered        bool              // -ltm-ordered: and its ids in production order instead of random
	LTMLiveRate       float64           // -ltm-live-rate: and its live phase's rate
	LTMOldPct         int               // -ltm-old-blocks-pct: and its innodb_old_blocks_pct (0: the server's)
	LiveRate          float64           // -live-rate
	LiveDuration      time.Duration     // -live-duration
	Timeout           time.Duration     // -timeout: per phase of each measurement
	Gen               string            // -gen: the billing-gen binary
	Billing           string            // -billing: the billing binary (the add-server variant's billing shards add)
	GrowStepRows      int               // -grow-step-rows: the add-server variant's --step-rows (0: the command's default)
	GrowRest          float64           // -grow-rest: and its --rest (0: the command's default)
	GrowRestCkpts     int               // -grow-rest-checkpoints: and its --rest-checkpoints (0: the command's default)
	Registry          string            // -schema-registry: SCHEMA_REGISTRY_URL of the format variants
	Out               string            // -out
	Profile           bool              // -profile
	Keep              bool              // -keep
	Topic             string            // -topic: an existing topic to measure
	Expected          string            // -expected: its expected ledger
	Repeat            int               // -repeat
	Interleave        bool              // -interleave: the variants' repetitions in turn
	MaxAllowedPacket  int64             // -max-allowed-packet: the server's global for the run, 0 to leave it
	MemLimit          int64             // -service-memlimit
	Load              int               // -load: busy cores of background load during measurements
	Decisions         []int             // -decisions: coordinator counts of the decision-rate measurement
	DecisionsDuration time.Duration     // -decisions-duration
	HostileEvents     int               // -hostile-events: padded valid events of the hostile variant
	HostileJunkEvery  int               // -hostile-junk-every: one junk record of 1 MiB per this many of them
}

// options is a run's Config with what Run derives from it.
type options struct {
	Config
	svc   config.Config  // the service's configuration (serviceConfig)
	watch map[string]int // local processes whose CPU is measured: kafka, mysql
}

// Run measures what cfg asks for: it prints the progress and the table to
// stdout and writes results.json, table.txt, the logs and the profiles in
// cfg.Out. Each measurement runs in a child process: the running binary
// re-executed as `<binary> -child <arg>` (ChildFlag), whose main must
// hand arg to Child before doing anything else.
func Run(ctx context.Context, cfg Config) error {
	o, err := prepare(cfg)
	if err != nil {
		return err
	}
	return run(ctx, o)
}

// prepare checks cfg and derives what the run needs: the service's
// configuration, the sizes taken from it, the processes to watch, the
// output directory.
func prepare(cfg Config) (*options, error) {
	o := &options{Config: cfg}
	if o.LTMOldPct != 0 && (o.LTMOldPct < 5 || o.LTMOldPct > 95) {
		return nil, fmt.Errorf("-ltm-old-blocks-pct: %d is outside InnoDB's 5–95 (0: the server's)", o.LTMOldPct)
	}
	for _, n := range o.Decisions {
		if n < 1 || n > 256 {
			return nil, fmt.Errorf("-decisions: %q is not a count of coordinators", strconv.Itoa(n))
		}
	}
	for _, m := range o.Modes {
		switch m {
		case modeConsume, modeSink, modeNaive, modeService:
		default:
			return nil, fmt.Errorf("-modes: unknown mode %q", m)
		}
	}
	if o.Repeat < 1 || o.Repeat > 20 {
		return nil, errors.New("-repeat must be 1..20")
	}
	if o.Topic != "" && (o.Expected == "" || len(o.Variants) != 1) {
		return nil, errors.New("-topic needs -expected and exactly one variant")
	}
	if o.Events < 1 || o.Events > 100_000_000 || o.Partitions < 1 || o.LiveRate <= 0 {
		return nil, errors.New("-events must be 1..1e8, -partitions and -live-rate positive")
	}
	if len(o.Brokers) == 0 {
		return nil, errors.New("-brokers: none")
	}
	for _, v := range o.Variants {
		if (v == "avro" || v == "protobuf" || v == "json-schema") && o.Registry == "" {
			return nil, fmt.Errorf("-variants %s needs -schema-registry (or SCHEMA_REGISTRY_URL): make bench starts one (make registry)", v)
		}
	}
	svc, err := serviceConfig(o.ServiceEnv, o.Brokers, "bench:bench@tcp(127.0.0.1:3306)/bench")
	if err != nil {
		return nil, fmt.Errorf("service configuration: %w", err)
	}
	o.svc = svc
	if o.NaiveBatch == 0 {
		o.NaiveBatch = svc.CheckpointMaxRecords
	}
	if o.NaiveWait == 0 {
		o.NaiveWait = svc.CheckpointInterval
	}
	if o.SinkChunk == 0 {
		o.SinkChunk = 2 * svc.CheckpointMaxRecords
	}
	o.watch = map[string]int{}
	if pid := localListener(o.Brokers[0]); pid > 0 {
		o.watch["kafka"] = pid
	}
	if mc, err := mysql.ParseDSN(o.Admin); err == nil && mc.Net == "tcp" {
		if pid := localListener(mc.Addr); pid > 0 {
			o.watch["mysql"] = pid
		}
	}
	if o.Out == "" {
		o.Out = filepath.Join("bench-results", time.Now().Format("20060102-150405"))
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	return o, nil
}

type variant struct {
	name string
	// format: the workload is in this EVENT_FORMAT (billing-gen -format,
	// its schema in -schema-registry), measured in service mode only: the
	// other modes decode the contract's JSON.
	format    string
	accounts  int
	cacheKeys int   // DEDUP_CACHE_KEYS override, 0 = the service's
	preload   int64 // dedup keys inserted before the run
	// steady: the child stores as many keys as the run inserts in the
	// previous generation's table, and as many expired ones in the table
	// the upkeep empties during the run (steady.go).
	steady bool
	// shard: the ledger spans two servers (MYSQL_SHARD_DSNS on -mysql2-dsn).
	shard bool
	// grow: the ledger starts on one server, with a second one (on
	// -mysql2-dsn) added halfway through the catch-up by billing shards
	// add (grow.go), measured in service mode only.
	grow bool
	// tables: the rows of dedup_keys and ledger_entries are counted during
	// the catch-up (tables.go).
	tables bool
	// hostile: the workload is records of the maximum size (produceHostile),
	// measured in service mode only: its peak RSS must stay bounded.
	hostile bool
	// changelog: the service publishes the ledger's changelog
	// (CHANGELOG_TOPIC_PREFIX, a prefix of its own per measurement, its
	// topics deleted after), measured in service mode only.
	changelog bool
	// instances: the service mode runs this many service processes in
	// one consumer group (instances.go).
	instances int
	// randomIDs: the workload's, the live phase's and the preloaded ids
	// are random-looking UUIDs (billing-gen -random-ids); pool: the
	// buffer pool of the variant's measurements (bigstate.go).
	randomIDs bool
	pool      poolSetting
	// liveRate: the live phase's records/s, when not -live-rate.
	liveRate float64
	// versionRatio: the fraction of the workload's events that get
	// versions (billing-gen -version-ratio, docs/corrections.md),
	// measured in service mode only: the other modes know no versions.
	versionRatio float64
	env          map[string]string // service settings of the variant
	note         string
	// vsDefault: the report gives the service's rate over the default
	// variant's service, paired per repetition.
	vsDefault bool
}

// live is the variant's live rate: its own, or -live-rate.
func (v variant) live(o *options) float64 {
	if v.liveRate > 0 {
		return v.liveRate
	}
	return o.LiveRate
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// serviceConfig is the service's configuration as the bench runs it: its
// defaults (config.Defaults), the settings the environment sets, then
// those of env (-service-env and the variant's), on brokers and the
// ledger at dsn, without HTTP endpoints. The parent sizes the naive job
// and sink-only from it (brokers and DSN placeholders), each child runs
// the service on it.
func serviceConfig(env map[string]string, brokers []string, dsn string) (config.Config, error) {
	settings := config.Environment()
	maps.Copy(settings, env)
	cfg, err := config.Defaults().With(settings)
	if err != nil {
		return cfg, err
	}
	cfg.KafkaBrokers, cfg.MySQLDSN, cfg.HTTPAddr = brokers, dsn, ""
	return cfg, cfg.Validate()
}

// measurement is one mode of one variant, as reported.
type measurement struct {
	Variant string      `json:"variant"`
	Mode    string      `json:"mode"`
	Rep     int         `json:"repetition"`
	Result  childResult `json:"result"`
	Ledger  string      `json:"ledger,omitempty"`      // check after the catch-up
	State   *stateInfo  `json:"dedup_state,omitempty"` // the larger-than-memory variant's (bigstate.go)
	Err     string      `json:"error,omitempty"`
	WallS   float64     `json:"wall_s"`
	// Instances: the service as several processes (instances.go).
	Instances *instancesResult `json:"instances,omitempty"`
	// Grow: the add-server variant's move (grow.go).
	Grow *growResult `json:"add_server,omitempty"`
}

type variantInfo struct {
	Name      string  `json:"name"`
	Topic     string  `json:"topic"`
	Records   int64   `json:"records"`
	Accounts  int     `json:"accounts"`
	CacheKeys int     `json:"dedup_cache_keys"`
	Preload   int64   `json:"preloaded_dedup_keys"`
	ProduceS  float64 `json:"produce_s"`
	LiveRate  float64 `json:"live_rate"` // records/s of its live phase
	Note      string  `json:"note"`
	VsDefault bool    `json:"vs_default,omitempty"` // its service over the default's, in the report
}

// amendedRatio is the amended variant's share of events with versions:
// the corrections' promise holds at this share (docs/corrections.md).
const amendedRatio = 0.1

func run(ctx context.Context, o *options) error {
	began := time.Now()
	tmp, err := os.MkdirTemp("", "billing-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if o.Gen, err = findBinary(o.Gen, "billing-gen", tmp); err != nil {
		return err
	}
	if slices.Contains(o.Variants, "add-server") {
		if o.Billing, err = findBinary(o.Billing, "billing", tmp); err != nil {
			return err
		}
	}
	if o.MaxAllowedPacket > 0 {
		restore, err := setServerPacket(ctx, o.Admin, o.MaxAllowedPacket)
		if err != nil {
			return err
		}
		defer restore()
	}
	adm, kcl, err := kafkaAdmin(o.Brokers)
	if err != nil {
		return err
	}
	defer kcl.Close()
	mi := machineInfo(ctx, o, adm)
	fmt.Print(mi.String())
	runID := fmt.Sprintf("%x", time.Now().UnixNano()&0xffffff)

	if len(o.Decisions) > 0 {
		return decisionRates(ctx, o)
	}
	if o.Load > 0 {
		stopLoad, err := backgroundLoad(o.Load)
		if err != nil {
			return err
		}
		defer stopLoad()
		fmt.Printf("background load: %d busy goroutines in a separate process\n", o.Load)
	}
	all := map[string]variant{
		"default":       {name: "default", accounts: o.Accounts, note: "service defaults"},
		"large-state":   {name: "large-state", accounts: o.Accounts, cacheKeys: o.LargeStateCache, preload: o.LargeStateKeys, note: fmt.Sprintf("DEDUP_CACHE_KEYS=%d, %d dedup keys stored beforehand", o.LargeStateCache, o.LargeStateKeys)},
		"many-accounts": {name: "many-accounts", accounts: o.ManyAccounts, note: fmt.Sprintf("%d accounts", o.ManyAccounts)},
		"steady-state": {name: "steady-state", accounts: o.Accounts, steady: true,
			env:  map[string]string{"DEDUP_CLEANUP_INTERVAL": "250ms"},
			note: fmt.Sprintf("%d live keys stored beforehand in the previous generation's table (every claim lock-reads it) and %d expired ones in the table the upkeep empties with one TRUNCATE during the run; DEDUP_CLEANUP_INTERVAL=250ms", o.Events, o.Events)},
		"steady-state-entries": {name: "steady-state-entries", accounts: o.Accounts, steady: true, tables: true,
			env:  map[string]string{"DEDUP_CLEANUP_INTERVAL": "250ms", "LEDGER_ENTRIES": "true", "LEDGER_ENTRIES_RETENTION": "2s"},
			note: "steady-state with LEDGER_ENTRIES=true and LEDGER_ENTRIES_RETENTION=2s: the rows of dedup_keys and ledger_entries are counted during the catch-up; both must stay bounded"},
		"two-servers": {name: "two-servers", accounts: o.Accounts, shard: true, note: "MYSQL_SHARD_DSNS: a second server holds half the results and keys"},
		"add-server": {name: "add-server", accounts: o.Accounts, grow: true,
			note: "the ledger on one server, the service configured with a second (empty) one last in MYSQL_SHARD_DSNS; billing shards add moves the second's share to it once half the backlog is counted, while the service counts; the live phase runs while the move does when the catch-up ends first (its accounts left out of the check); service mode only, the ledger checked exact over both servers at the end"},
		"ledger-entries": {name: "ledger-entries", accounts: o.Accounts, env: map[string]string{"LEDGER_ENTRIES": "true"},
			note: "LEDGER_ENTRIES=true: one ledger_entries row per counted event"},
		"closing": {name: "closing", accounts: o.Accounts, env: map[string]string{"WINDOW_CLOSE_AFTER": "1h"},
			note: "WINDOW_CLOSE_AFTER=1h: the workload's 24 windows close one after the other during the run"},
		"changelog": {name: "changelog", accounts: o.Accounts, changelog: true,
			note: "CHANGELOG_TOPIC_PREFIX set: every change published to Kafka exactly once (docs/changelog.md); the service only, beside the same service without it (service-plain)"},
		"three-instances": {name: "three-instances", accounts: o.Accounts, instances: 3,
			note: "the service as three processes in one consumer group on one backlog and one ledger (repeats of an event on two partitions: two instances claim one key); aborted checkpoints by cause"},
		"larger-than-memory": {name: "larger-than-memory", accounts: o.Accounts, preload: o.LTMKeys, randomIDs: !o.LTMOrdered,
			pool:     poolSetting{measure: o.LTMPool, preload: max(1<<30, 256*o.LTMKeys), oldPct: o.LTMOldPct}, // the preload holds the table in memory: about twice its 118-128 bytes per key
			liveRate: o.LTMLiveRate,
			note: fmt.Sprintf("innodb_buffer_pool_size %d MiB, innodb_old_blocks_pct %s, %d dedup keys stored beforehand, live phase %.0f records/s; %s", o.LTMPool>>20,
				map[bool]string{true: strconv.Itoa(o.LTMOldPct), false: "the server's"}[o.LTMOldPct > 0], o.LTMKeys, max(o.LTMLiveRate, 0), map[bool]string{false: "random UUID event ids (billing-gen -random-ids), the stored keys' of the same shape", true: "-ltm-ordered: billing-gen's ordered ids, the stored keys in a region of their own"}[o.LTMOrdered])},
		"avro":        formatVariant(o, "avro"),
		"protobuf":    formatVariant(o, "protobuf"),
		"json-schema": formatVariant(o, "json-schema"),
		"amended": {name: "amended", accounts: o.Accounts, versionRatio: amendedRatio, vsDefault: true,
			note: fmt.Sprintf("the default workload with %.0f%% of its events amended or cancelled (billing-gen -version-ratio %g: 1 to 3 versions each, out of order, some sent twice, on any partition); service mode only, beside the default's rate", 100*amendedRatio, amendedRatio)},
		"hostile": {name: "hostile", accounts: 1000, hostile: true,
			note: fmt.Sprintf("%d valid events padded to MAX_PAYLOAD_BYTES, one junk record of 1 MiB per %d; service mode only", o.HostileEvents, o.HostileJunkEvery)},
	}
	var infos []variantInfo
	var ms []measurement
	var vs []variant
	for _, name := range o.Variants {
		v, ok := all[name]
		if !ok {
			return fmt.Errorf("unknown variant %q (want one of %s)", name, strings.Join(slices.Sorted(maps.Keys(all)), ", "))
		}
		vs = append(vs, v)
	}
	if o.Interleave {
		var err error
		if infos, ms, err = runInterleaved(ctx, o, vs, runID, adm); err != nil {
			return err
		}
		vs = nil // measured
	}
	for _, v := range vs {
		info, got, err := runVariant(ctx, o, v, runID, adm)
		infos = append(infos, info)
		ms = append(ms, got...)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	mi.LoadEnd = loadAvg()
	mi.TotalS = time.Since(began).Seconds()
	table := renderTable(o, infos, ms)
	fmt.Print("\n" + table)
	fmt.Printf("\nmachine load average at the end: %s; total time %s\n", mi.LoadEnd, time.Since(began).Round(time.Second))
	out, _ := json.MarshalIndent(map[string]any{"machine": mi, "variants": infos, "measurements": ms,
		"service_config": serviceSummary(o), "options": optionSummary(o)}, "", "  ")
	if err := os.WriteFile(filepath.Join(o.Out, "results.json"), out, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.Out, "table.txt"), []byte(mi.String()+"\n"+table), 0o644); err != nil {
		return err
	}
	fmt.Printf("results, logs and profiles in %s\n", o.Out)
	return growFailures(ms)
}

// formatVariant is the default variant's workload in a registry format:
// its service rate is the one to hold against the default's (the JSON
// contract) in the same run.
func formatVariant(o *options, f string) variant {
	return variant{name: f, accounts: o.Accounts, format: f,
		env:  map[string]string{"EVENT_FORMAT": f, "SCHEMA_REGISTRY_URL": o.Registry},
		note: fmt.Sprintf("the default workload with EVENT_FORMAT=%s (billing-gen -format %s, its schema in the registry); service mode only, no live phase (e2e n/a)", f, f)}
}

func runVariant(ctx context.Context, o *options, v variant, runID string, adm *kadmClient) (variantInfo, []measurement, error) {
	pv, err := prepareVariant(ctx, o, v, runID, adm)
	defer pv.cleanup()
	if err != nil {
		return pv.info, nil, err
	}
	var out []measurement
	for rep := 1; rep <= o.Repeat; rep++ {
		got, err := pv.measureRep(ctx, rep)
		out = append(out, got...)
		if err != nil {
			return pv.info, out, err
		}
	}
	return pv.info, out, nil
}

// preparedVariant is a variant's workload produced, ready to measure
// repetition after repetition; cleanup deletes what it made.
type preparedVariant struct {
	info       variantInfo
	measureRep func(ctx context.Context, rep int) ([]measurement, error)
	cleanups   []func()
}

func (pv *preparedVariant) cleanup() {
	for i := len(pv.cleanups) - 1; i >= 0; i-- {
		pv.cleanups[i]()
	}
	pv.cleanups = nil
}

// runInterleaved runs the variants' repetitions in turn (repetition 1 of
// each, then 2, ...) on workloads all produced first: a variant held
// against another then meets the machine's load of the same minutes
// (-interleave). A variant that changes the server's settings for its
// measurements (larger-than-memory) cannot take turns.
func runInterleaved(ctx context.Context, o *options, vs []variant, runID string, adm *kadmClient) ([]variantInfo, []measurement, error) {
	var pvs []*preparedVariant
	defer func() {
		for _, pv := range pvs {
			pv.cleanup()
		}
	}()
	var infos []variantInfo
	for _, v := range vs {
		if v.pool.measure > 0 {
			return infos, nil, fmt.Errorf("-interleave: variant %s sets the server's buffer pool for its measurements and cannot take turns", v.name)
		}
		pv, err := prepareVariant(ctx, o, v, runID, adm)
		pvs = append(pvs, pv)
		if err != nil {
			return append(infos, pv.info), nil, err
		}
	}
	for _, pv := range pvs {
		infos = append(infos, pv.info)
	}
	var out []measurement
	for rep := 1; rep <= o.Repeat; rep++ {
		for _, pv := range pvs {
			fmt.Printf("\n== %s, repetition %d\n", pv.info.Name, rep)
			got, err := pv.measureRep(ctx, rep)
			out = append(out, got...)
			if err != nil {
				return infos, out, err
			}
		}
	}
	return infos, out, nil
}

func prepareVariant(ctx context.Context, o *options, v variant, runID string, adm *kadmClient) (*preparedVariant, error) {
	pv := &preparedVariant{}
	info := &pv.info
	*info = variantInfo{Name: v.name, Accounts: v.accounts, Preload: v.preload, Note: v.note, CacheKeys: o.svc.DedupCacheKeys, LiveRate: v.live(o), VsDefault: v.vsDefault}
	if v.cacheKeys > 0 {
		info.CacheKeys = v.cacheKeys
	}
	topic := fmt.Sprintf("bench-%s-%s", runID, v.name)
	expected := filepath.Join(o.Out, v.name+"-expected.json")
	var d time.Duration
	if o.Topic != "" {
		topic, expected = o.Topic, o.Expected
		fmt.Printf("\n== %s: existing topic %s\n", v.name, topic)
	} else {
		fmt.Printf("\n== %s: producing %d events (%d accounts, %.0f%% duplicates) into %s\n", v.name, o.Events, v.accounts, 100*o.DupRatio, topic)
		logf, err := os.Create(filepath.Join(o.Out, v.name+"-billing-gen.log"))
		if err != nil {
			return pv, err
		}
		pv.cleanups = append(pv.cleanups, func() { logf.Close() })
		if !o.Keep {
			pv.cleanups = append(pv.cleanups, func() { deleteTopic(adm, topic) })
		}
		if v.hostile {
			d, err = produceHostile(ctx, o, adm, topic, expected)
		} else {
			d, err = generate(ctx, o, v, topic, expected, logf)
		}
		if err != nil {
			return pv, err
		}
	}
	info.Topic = topic
	info.ProduceS = d.Seconds()
	ends, total, err := endOffsets(ctx, adm, topic)
	if err != nil {
		return pv, err
	}
	info.Records = total
	if d > 0 {
		fmt.Printf("   %d records in %s (%.0f records/s)\n", total, d.Round(time.Millisecond), float64(total)/d.Seconds())
	}

	if v.pool.measure > 0 {
		orig, restore, err := shrinkPool(ctx, o.Admin, v.pool.measure, v.pool.oldPct)
		if err != nil {
			return pv, err
		}
		pv.cleanups = append(pv.cleanups, restore)
		v.pool.preload = max(v.pool.preload, orig)
		fmt.Printf("   innodb_buffer_pool_size %d MiB for the variant (the server's %d MiB restored after it; %d MiB while keys are preloaded)", v.pool.measure>>20, orig>>20, v.pool.preload>>20)
		if v.pool.oldPct > 0 {
			fmt.Printf(", innodb_old_blocks_pct %d", v.pool.oldPct)
		}
		fmt.Println()
	}
	env := map[string]string{}
	for k, val := range v.env {
		env[k] = val
	}
	for k, val := range o.ServiceEnv {
		env[k] = val
	}
	if v.cacheKeys > 0 {
		env["DEDUP_CACHE_KEYS"] = fmt.Sprint(v.cacheKeys)
	}
	modes := o.Modes
	if v.hostile || v.format != "" || v.versionRatio > 0 || v.grow {
		modes = []string{modeService}
	}
	if v.changelog {
		// The service without the changelog and with it, in every
		// repetition (in alternating order): the changelog's cost is their
		// paired ratio.
		modes = []string{modeServicePlain, modeService}
	}
	// sink-only replays the service's checkpoints of the same repetition
	// (replay.go), so it runs after the service.
	if i := slices.Index(modes, modeSink); i >= 0 && slices.Contains(modes, modeService) {
		modes = append(slices.Delete(slices.Clone(modes), i, i+1), modeSink)
	}
	pv.measureRep = func(ctx context.Context, rep int) (out []measurement, err error) {
		var replay []map[int32]int64
		order := modes
		if v.changelog && rep%2 == 0 {
			order = []string{modeService, modeServicePlain} // alternated: neither always runs first
		}
		for _, mode := range order {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			var m measurement
			if v.instances > 1 && mode == modeService {
				m = measureInstances(ctx, o, v, runID, topic, expected, ends, total, env, adm, rep)
			} else {
				m = measure(ctx, o, v, mode, runID, topic, expected, ends, total, env, adm, rep, replay)
			}
			if mode == modeService && m.Err == "" && !m.Result.TimedOut {
				replay = m.Result.Cuts
			}
			out = append(out, m)
			fmt.Println("   " + oneLine(m))
			if m.Instances != nil {
				fmt.Print("   " + instancesLines([]measurement{m}))
			}
			if m.Grow != nil {
				fmt.Print("   " + growLines([]measurement{m}))
			}
		}
		return out, nil
	}
	return pv, nil
}

func measure(ctx context.Context, o *options, v variant, mode, runID, topic, expected string, ends map[int32]int64, total int64, env map[string]string, adm *kadmClient, rep int, replay []map[int32]int64) (m measurement) {
	m = measurement{Variant: v.name, Mode: mode, Rep: rep}
	svc := mode == modeService || mode == modeServicePlain
	start := time.Now()
	defer func() { m.WallS = time.Since(start).Seconds() }()
	fail := func(err error) measurement {
		m.Err = err.Error()
		m.WallS = time.Since(start).Seconds()
		return m
	}
	short := map[string]string{modeConsume: "consume", modeSink: "sink", modeNaive: "naive", modeService: "service", modeServicePlain: "plain"}[mode]
	if o.Repeat > 1 {
		short += strconv.Itoa(rep)
	}
	childMode := mode
	if mode == modeServicePlain {
		childMode = modeService
	}
	spec := childSpec{Mode: childMode, Brokers: o.Brokers, Topic: topic, Group: fmt.Sprintf("bench-%s-%s-%s", runID, v.name, short),
		Records: total, Ends: ends, ServiceEnv: env, NaiveBatch: o.NaiveBatch, NaiveWait: o.NaiveWait,
		SinkChunk: o.SinkChunk, Timeout: o.Timeout, Watch: o.watch, MemLimit: o.MemLimit}
	if mode == modeSink {
		spec.Replay = replay
	}
	dbName := strings.ReplaceAll(fmt.Sprintf("bench_%s_%s_%s", runID, v.name, short), "-", "_")
	if mode != modeConsume {
		if err := createDatabase(ctx, o.Admin, dbName); err != nil {
			return fail(err)
		}
		if !o.Keep {
			defer dropDatabase(o.Admin, dbName)
		}
		if v.preload > 0 && (mode == modeSink || svc) {
			t := time.Now()
			if v.pool.preload > 0 {
				if _, err := setBufferPool(ctx, o.Admin, v.pool.preload); err != nil {
					return fail(err)
				}
			}
			if err := preloadDedupKeys(ctx, o.Admin, dbName, v.preload, o.svc.DedupTTL, v.randomIDs); err != nil {
				return fail(err)
			}
			fmt.Printf("   (%s: %d dedup keys stored beforehand in %s)\n", mode, v.preload, time.Since(t).Round(time.Millisecond))
		}
		if v.pool.measure > 0 {
			// Measured while the preload's pool still holds the table
			// (counting it through the small pool would take long).
			var st *stateInfo
			if mode == modeSink || svc {
				st = &stateInfo{}
				var err error
				if st.Before, err = measureState(ctx, o.Admin, dbName); err != nil {
					return fail(err)
				}
			}
			pool, err := setBufferPool(ctx, o.Admin, v.pool.measure)
			if err != nil {
				return fail(err)
			}
			if st != nil {
				st.Pool = pool
				m.State = st
				defer func() { // after the child, before the database is dropped
					actx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					defer cancel()
					var err error
					if st.After, err = measureState(actx, o.Admin, dbName); err != nil {
						fmt.Printf("   (%s: dedup state after the run: %v)\n", mode, err)
					}
				}()
			}
		}
		var err error
		if spec.DSN, err = databaseDSN(o.Admin, dbName, true); err != nil {
			return fail(err)
		}
		if v.steady && (mode == modeSink || svc) {
			spec.SteadyKeys = o.Events
		}
		if v.tables && (mode == modeSink || svc) {
			spec.SampleTables = sampledTables
		}
		if v.changelog && mode == modeService { // not in service-plain, its reference
			prefix := strings.ReplaceAll(dbName, "_", "-")
			spec.ServiceEnv = maps.Clone(spec.ServiceEnv)
			spec.ServiceEnv["CHANGELOG_TOPIC_PREFIX"] = prefix
			if !o.Keep {
				defer deleteChangelogTopics(adm, prefix)
			}
		}
		if (v.shard || v.grow) && (mode == modeSink || svc) {
			if err := createDatabase(ctx, o.Admin2, dbName); err != nil {
				return fail(err)
			}
			if !o.Keep {
				defer dropDatabase(o.Admin2, dbName)
			}
			shard, err := databaseDSN(o.Admin2, dbName, true)
			if err != nil {
				return fail(err)
			}
			spec.ServiceEnv = maps.Clone(env)
			spec.ServiceEnv["MYSQL_SHARD_DSNS"] = shard
		}
	}
	// The live phase produces the contract's JSON: a format variant has
	// none (its e2e latency is the default's, decoding aside).
	if (svc || mode == modeNaive) && v.format == "" {
		spec.LiveTopic = liveTopic(topic, short, runID, rep)
		if err := createTopic(ctx, adm, spec.LiveTopic, len(ends)); err != nil {
			return fail(err)
		}
		if !o.Keep {
			defer deleteTopic(adm, spec.LiveTopic)
		}
	}
	if o.Profile && (svc || mode == modeNaive) {
		spec.CPUProfile = filepath.Join(o.Out, fmt.Sprintf("%s-%s.cpu.pprof", v.name, short))
		spec.HeapProfile = filepath.Join(o.Out, fmt.Sprintf("%s-%s.heap.pprof", v.name, short))
	}
	servers := []string{o.Admin}
	if (v.shard || v.grow) && (mode == modeSink || svc) {
		servers = append(servers, o.Admin2)
	}
	var g *growRun
	if v.grow && svc {
		g = &growRun{res: &growResult{StepRows: o.GrowStepRows, Rest: o.GrowRest, RestCkpts: o.GrowRestCkpts, BoundMs: ms(o.svc.CheckpointInterval + time.Second)}}
		m.Grow = g.res
		spec.MarkAt = total / 2
		dsn, err := databaseDSN(o.Admin, dbName, false)
		if err != nil {
			return fail(err)
		}
		if g.dsnB, err = databaseDSN(o.Admin2, dbName, false); err != nil {
			return fail(err)
		}
		g.dsnA = dsn
		if err := storeOneServerLayout(ctx, env, o.Brokers, dsn); err != nil {
			return fail(err)
		}
	}
	for _, admin := range servers {
		waited, history, prepared, err := settle(ctx, admin, 2*time.Minute)
		if err != nil {
			return fail(err)
		}
		if waited > time.Second {
			fmt.Printf("   (%s: waited %s for the server's purge to catch up)\n", mode, waited.Round(100*time.Millisecond))
		}
		if history >= settleHistory {
			fmt.Printf("   WARNING: undo history still %d after %s; %d prepared XA branches on the server hold purge back (XA RECOVER): resolve them, the figures are slowed\n", history, waited.Round(time.Second), prepared)
		}
	}
	specJSON, _ := json.Marshal(spec)
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	logf, err := os.Create(filepath.Join(o.Out, fmt.Sprintf("%s-%s.log", v.name, short)))
	if err != nil {
		return fail(err)
	}
	defer logf.Close()
	cmd := exec.Command(self, "-"+ChildFlag, string(specJSON))
	cmd.Stderr = logf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fail(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fail(err)
	}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	defer func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			if strings.HasPrefix(sc.Text(), "BENCH ") {
				lines <- strings.TrimPrefix(sc.Text(), "BENCH ")
			}
		}
		close(lines)
	}()
	next := func(timeout time.Duration) (string, childResult, error) {
		select {
		case l, ok := <-lines:
			if !ok {
				return "", childResult{}, fmt.Errorf("child exited early (see %s)", logf.Name())
			}
			kind, body, _ := strings.Cut(l, " ")
			var r childResult
			err := json.Unmarshal([]byte(body), &r)
			return kind, r, err
		case <-time.After(timeout):
			return "", childResult{}, errors.New("child did not report in time")
		case <-ctx.Done():
			return "", childResult{}, ctx.Err()
		}
	}
	budget := 2*o.Timeout + o.LiveDuration + 2*time.Minute
	kind, r, err := next(budget)
	if err == nil && kind == "mark" && g != nil {
		// Half the backlog counted: the move begins.
		g.res.AtRecords = r.Records
		fmt.Printf("   (%d records counted: billing shards add begins)\n", r.Records)
		moverLog, lerr := os.Create(filepath.Join(o.Out, fmt.Sprintf("%s-%s-shards-add.log", v.name, short)))
		if lerr != nil {
			_ = cmd.Process.Kill()
			return fail(lerr)
		}
		defer moverLog.Close()
		if g.mv, err = startMover(ctx, o, o.Billing, env, topic, spec.Group, g.dsnA, g.dsnB, moverLog); err == nil {
			defer func() { _ = g.mv.wait(time.Minute) }() // on the early returns
			kind, r, err = next(budget)
		}
	}
	if err != nil {
		_ = cmd.Process.Kill()
		return fail(err)
	}
	m.Result = r
	if kind == "result" { // consume-only and sink-only end here
		if mode == modeSink && r.Err == "" && !r.TimedOut {
			m.Ledger = check(ctx, servers, dbName, expected, topic, "")
		}
		return m
	}
	// caught-up: check the ledger, then the live phase. With a move
	// under way, the check waits for its end (rows between servers).
	if !r.TimedOut && r.Err == "" && g == nil {
		m.Ledger = check(ctx, servers, dbName, expected, topic, "")
	}
	if !r.TimedOut && r.Err == "" && spec.LiveTopic != "" {
		fmt.Fprintln(stdin, "live-start")
		d, stopLive, acct := o.LiveDuration, (<-chan struct{})(nil), ""
		if g != nil {
			acct = liveAccountSuffix
			if g.mv != nil && g.mv.running() {
				// The live phase ends with the move, if that comes first.
				// Not longer than it: the live ids come after the move's
				// cursor, which would chase them.
				stopLive, g.res.LiveDuring = g.mv.done, true
			}
		}
		liveStart := time.Now()
		n, err := liveProducer(ctx, o.Brokers, spec.LiveTopic, fmt.Sprintf("live-%s-%s", runID, short), v.live(o), d, stopLive, acct, v.accounts, o.DupRatio, o.Seed, v.randomIDs)
		if g != nil {
			g.liveEnd = time.Now()
			g.res.LiveS = g.liveEnd.Sub(liveStart).Seconds()
		}
		if err != nil {
			m.Err = "live producer: " + err.Error()
		}
		fmt.Fprintf(stdin, "live-end %d\n", n)
	} else {
		fmt.Fprintln(stdin, "stop")
	}
	kind, r, err = next(o.Timeout + time.Minute)
	if err != nil {
		_ = cmd.Process.Kill()
		return fail(err)
	}
	m.Result = r
	if g != nil {
		g.finish(ctx, o, dbName, expected, topic, r)
		m.Ledger = g.res.Ledger
	}
	return m
}

// check verifies the ledger of database dbName on servers (verify),
// waiting a little for it to become exact.
func check(ctx context.Context, servers []string, dbName, expected, topic, dropSuffix string) string {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	// Windows closed by the last checkpoint of the catch-up are sealed by
	// the next one: give it a moment.
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, rep, err := verify(cctx, servers, dbName, expected, topic, dropSuffix)
		if err != nil {
			return "check failed: " + err.Error()
		}
		if rep.Exact() || rep.Violations == 0 || time.Now().After(deadline) {
			return v
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func steadyLine(r childResult) string {
	return fmt.Sprintf("%d expired keys emptied while %d were inserted (%.2f per insert)", r.SteadyDeleted, r.SteadyInserted, float64(r.SteadyDeleted)/float64(r.SteadyInserted))
}

func oneLine(m measurement) string {
	r := m.Result
	s := fmt.Sprintf("%-13s %9.0f records/s", m.Mode, r.CatchUp.Rate)
	if m.Rep > 1 {
		s = fmt.Sprintf("%-13s %9.0f records/s", fmt.Sprintf("%s #%d", m.Mode, m.Rep), r.CatchUp.Rate)
	}
	if r.CatchUp.Count > 0 && m.Mode != modeConsume {
		s += fmt.Sprintf(", %d units of %.0f records, p50 %.0f ms p99 %.0f ms, %.1f round trips/unit", r.CatchUp.Count, r.CatchUp.Mean, r.CatchUp.P50, r.CatchUp.P99, r.RoundTrip)
	}
	if r.Failed > 0 {
		s += fmt.Sprintf(", %d FAILED attempts", r.Failed)
	}
	if r.LatP99 > 0 {
		s += fmt.Sprintf(", e2e p50 %.0f ms p99 %.0f ms", r.LatP50, r.LatP99)
	}
	if r.ChangelogN > 0 {
		s += fmt.Sprintf(", changelog visible after the commit p50 %.0f ms p99 %.0f ms (%d checkpoints)", r.ChangelogP50, r.ChangelogP99, r.ChangelogN)
	}
	if r.ChangelogLiveN > 0 {
		s += fmt.Sprintf(", live: p50 %.0f ms p99 %.0f ms (%d checkpoints)", r.ChangelogLiveP50, r.ChangelogLiveP99, r.ChangelogLiveN)
	}
	s += fmt.Sprintf(", peak RSS %.0f MiB", r.PeakRSSMiB)
	if r.IO != nil {
		s += fmt.Sprintf(", InnoDB %.3f pool reads/event", perEvent(r.IO.PoolReads, r.Records))
	}
	if r.SteadyInserted > 0 {
		s += ", " + steadyLine(r)
	}
	if len(r.Tables) > 0 {
		s += "; " + tablesLine(r)
	}
	if len(r.LiveTables) > 0 {
		s += "; live: " + liveTablesLine(r)
	}
	if m.Ledger != "" {
		s += ", ledger " + m.Ledger
	}
	if r.TimedOut {
		s += ", TIMED OUT"
	}
	if m.Err != "" || r.Err != "" {
		s += ", error: " + strings.TrimSpace(m.Err+" "+r.Err)
	}
	return s + fmt.Sprintf(" [%.0fs]", m.WallS)
}

// deleteChangelogTopics deletes the topics of the changelog of prefix.
func deleteChangelogTopics(adm *kadmClient, prefix string) {
	topics := []string{publisher.ProgressTopic(prefix)}
	for _, tb := range changelog.Tables() {
		topics = append(topics, publisher.Topic(prefix, tb.Name))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := adm.DeleteTopics(ctx, topics...); err != nil {
		fmt.Printf("   (cannot delete the changelog's topics of %s: %v)\n", prefix, err)
	}
}

// liveTopic names a measurement's live topic by run and repetition: with
// -keep, or an existing -topic measured again, a live topic from before
// must not be reused (TOPIC_ALREADY_EXISTS).
func liveTopic(topic, mode, runID string, rep int) string {
	return fmt.Sprintf("%s-live-%s-%s-%d", topic, mode, runID, rep)
}
