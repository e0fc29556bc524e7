package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/publisher"
	"github.com/billing/ledger/internal/service"
)

type options struct {
	brokers          []string
	admin            string
	events           int64
	accounts         int
	manyAcc          int
	partitions       int
	zipfS            float64
	dupRatio         float64
	seed             uint64
	variants         []string
	modes            []string
	serviceEnv       map[string]string
	svc              config.Config
	naiveBatch       int
	naiveWait        time.Duration
	sinkChunk        int
	lsCache          int
	lsKeys           int64
	ltmPool          int64   // the larger-than-memory variant's buffer pool, bytes
	ltmKeys          int64   // and its stored keys
	ltmOrdered       bool    // and its ids in production order instead of random
	ltmLiveRate      float64 // and its live phase's rate
	ltmOldPct        int     // and its innodb_old_blocks_pct (0: the server's)
	liveRate         float64
	liveSeconds      time.Duration
	timeout          time.Duration
	gen              string
	registry         string // SCHEMA_REGISTRY_URL of the format variants
	out              string
	profile          bool
	keep             bool
	watch            map[string]int
	topic            string
	expected         string
	repeat           int
	packet           int64 // -max-allowed-packet: the server's global for the run, 0 to leave it
	memLimit         int64
	admin2           string // a second server, for the two-servers variant
	load             int    // busy cores of background load during measurements
	decisions        []int  // coordinator counts of the decision-rate measurement
	decisionsD       time.Duration
	hostileEvents    int // padded valid events of the hostile variant
	hostileJunkEvery int // one junk record of 1 MiB per this many of them
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
	env      map[string]string // service settings of the variant
	note     string
}

// live is the variant's live rate: its own, or -live-rate.
func (v variant) live(o *options) float64 {
	if v.liveRate > 0 {
		return v.liveRate
	}
	return o.liveRate
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func main() {
	childSpecJSON := flag.String("child", "", "internal: run one measurement as a child process")
	var o options
	var brokers, variants, modes, serviceEnv string
	flag.StringVar(&brokers, "brokers", envOr("KAFKA_BROKERS", "127.0.0.1:9092"), "Kafka seed brokers (env KAFKA_BROKERS)")
	flag.StringVar(&o.admin, "mysql-dsn", envOr("MYSQL_DSN", "root:root@tcp(127.0.0.1:3306)/"), "admin DSN without database, allowed to create and drop databases (env MYSQL_DSN)")
	flag.Int64Var(&o.events, "events", 1_000_000, "distinct valid events per variant (duplicates come on top)")
	flag.IntVar(&o.accounts, "accounts", 10_000, "accounts of the default and large-state variants")
	flag.IntVar(&o.manyAcc, "many-accounts", 1_000_000, "accounts of the many-accounts variant")
	flag.IntVar(&o.partitions, "partitions", 6, "partitions of each topic")
	flag.Float64Var(&o.zipfS, "zipf-s", 1.1, "Zipf skew of account popularity")
	flag.Float64Var(&o.dupRatio, "dup-ratio", 0.05, "fraction of events sent twice")
	flag.Uint64Var(&o.seed, "seed", 1, "generator seed")
	flag.StringVar(&variants, "variants", "default,avro,protobuf,json-schema,large-state,many-accounts,steady-state,changelog,larger-than-memory,three-instances", "workload variants to run: default, avro, protobuf, json-schema, large-state, many-accounts, steady-state, larger-than-memory, three-instances, steady-state-entries, two-servers, hostile, ledger-entries, closing, changelog")
	flag.StringVar(&modes, "modes", "consume-only,sink-only,naive,service", "what to measure per variant")
	flag.StringVar(&serviceEnv, "service-env", "", "service settings over its defaults, e.g. MYSQL_BRANCHES=1,CHECKPOINT_MAX_RECORDS=20000")
	flag.IntVar(&o.naiveBatch, "naive-batch", 0, "naive batch size (default: the service's CHECKPOINT_MAX_RECORDS)")
	flag.DurationVar(&o.naiveWait, "naive-wait", 0, "naive batch fill wait (default: the service's CHECKPOINT_INTERVAL)")
	flag.IntVar(&o.sinkChunk, "sink-chunk", 0, "records per checkpoint in sink-only (default: twice CHECKPOINT_MAX_RECORDS, the size the service's checkpoints reach in a backlog)")
	flag.IntVar(&o.lsCache, "large-state-cache", 10_000, "DEDUP_CACHE_KEYS of the large-state variant")
	flag.Int64Var(&o.lsKeys, "large-state-keys", 2_000_000, "dedup keys already stored when the large-state variant starts")
	flag.Int64Var(&o.ltmPool, "ltm-pool", 128<<20, "innodb_buffer_pool_size (bytes) of the larger-than-memory variant's measurements (MySQL 8.4's default); the server's own is restored after it")
	flag.Int64Var(&o.ltmKeys, "ltm-keys", 11_500_000, "dedup keys (random UUIDs) stored before each measurement of the larger-than-memory variant: at least 10 × -ltm-pool of table")
	flag.IntVar(&o.ltmOldPct, "ltm-old-blocks-pct", 80, "innodb_old_blocks_pct of the larger-than-memory variant's measurements, so that the old sublist of its small pool holds two intervals of its live ids' leaves, as a production pool's does at MySQL's 37% (docs/performance.md); 0: the server's; the server's own is restored after it")
	flag.Float64Var(&o.ltmLiveRate, "ltm-live-rate", 2500, "records/s of the larger-than-memory variant's live phase: what its disk serves with half its IOPS to spare (docs/performance.md); 0: -live-rate")
	flag.BoolVar(&o.ltmOrdered, "ltm-ordered", false, "larger-than-memory variant with billing-gen's ordered ids (e-<seed>-<n>) and the stored keys in a region of their own, as ids in time order are: the A/B of the key layout")
	flag.Float64Var(&o.liveRate, "live-rate", 5000, "records/s produced during the live (latency) phase")
	flag.DurationVar(&o.liveSeconds, "live-duration", 15*time.Second, "length of the live phase")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "bound on each phase of each measurement")
	flag.StringVar(&o.registry, "schema-registry", os.Getenv("SCHEMA_REGISTRY_URL"), "schema registry of the avro, protobuf and json-schema variants (env SCHEMA_REGISTRY_URL)")
	flag.StringVar(&o.gen, "gen", "", "billing-gen binary (default: next to this one, else go build)")
	flag.StringVar(&o.out, "out", "", "directory for results, logs and profiles (default bench-results/<time>)")
	flag.BoolVar(&o.profile, "profile", false, "write CPU and heap profiles of the naive and service catch-up")
	flag.BoolVar(&o.keep, "keep", false, "keep topics and databases")
	flag.Int64Var(&o.memLimit, "service-memlimit", service.DefaultMemoryLimit, "Go soft memory limit of the service mode in bytes unless GOMEMLIMIT is set, as cmd/billing sets it (0: none)")
	flag.IntVar(&o.repeat, "repeat", 2, "measure every mode this many times, interleaved; the table shows the median run and the range, and every ratio's range over the repetitions")
	packet := flag.String("max-allowed-packet", "", "set the MySQL server's global max_allowed_packet for the run and restore it at the end, e.g. 1M or 64M (the service sizes its statements from it; default: leave it)")
	flag.StringVar(&o.topic, "topic", "", "measure an existing topic (kept) instead of producing one, e.g. from an earlier -keep run; needs -expected and one variant")
	flag.StringVar(&o.expected, "expected", "", "billing-gen's expected ledger of -topic")
	flag.StringVar(&o.admin2, "mysql2-dsn", envOr("MYSQL2_DSN", "root:root@tcp(127.0.0.1:3307)/"), "admin DSN of a second server, for the two-servers variant (env MYSQL2_DSN)")
	flag.IntVar(&o.load, "load", 0, "run this many busy goroutines in a separate process during the measurements (the limit must hold under load too)")
	var decisions string
	flag.StringVar(&decisions, "decisions", "", "measure only the decision rate of the control server with these numbers of concurrent coordinators, e.g. 1,2,4,8,16")
	flag.DurationVar(&o.decisionsD, "decisions-duration", 5*time.Second, "length of each decision-rate measurement")
	flag.IntVar(&o.hostileEvents, "hostile-events", 20_000, "hostile variant: valid events padded to just under MAX_PAYLOAD_BYTES")
	flag.IntVar(&o.hostileJunkEvery, "hostile-junk-every", 40, "hostile variant: one junk record of 1 MiB per this many events")
	flag.Parse()
	if o.ltmOldPct != 0 && (o.ltmOldPct < 5 || o.ltmOldPct > 95) {
		fatalf("-ltm-old-blocks-pct: %d is outside InnoDB's 5–95 (0: the server's)", o.ltmOldPct)
	}
	for _, d := range splitList(decisions) {
		n, err := strconv.Atoi(d)
		if err != nil || n < 1 || n > 256 {
			fatalf("-decisions: %q is not a count of coordinators", d)
		}
		o.decisions = append(o.decisions, n)
	}

	if *childSpecJSON == "burn" {
		burn()
		return
	}
	if *childSpecJSON != "" {
		var spec childSpec
		if err := json.Unmarshal([]byte(*childSpecJSON), &spec); err != nil {
			fmt.Fprintln(os.Stderr, "billing-bench child:", err)
			os.Exit(2)
		}
		if err := child(spec); err != nil {
			fmt.Fprintln(os.Stderr, "billing-bench child:", err)
			os.Exit(1)
		}
		return
	}

	for _, b := range strings.Split(brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			o.brokers = append(o.brokers, b)
		}
	}
	o.variants = splitList(variants)
	for _, v := range o.variants {
		if (v == "avro" || v == "protobuf" || v == "json-schema") && o.registry == "" {
			fatalf("-variants %s needs -schema-registry (or SCHEMA_REGISTRY_URL): make bench starts one (make registry)", v)
		}
	}
	o.modes = splitList(modes)
	o.serviceEnv = map[string]string{}
	for _, kv := range splitList(serviceEnv) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			fatalf("-service-env: %q is not KEY=VALUE", kv)
		}
		o.serviceEnv[k] = v
	}
	for _, m := range o.modes {
		switch m {
		case modeConsume, modeSink, modeNaive, modeService:
		default:
			fatalf("-modes: unknown mode %q", m)
		}
	}
	if o.repeat < 1 || o.repeat > 20 {
		fatalf("-repeat must be 1..20")
	}
	if *packet != "" {
		var err error
		if o.packet, err = parsePacket(*packet); err != nil {
			fatalf("-max-allowed-packet: %v", err)
		}
	}
	if o.topic != "" && (o.expected == "" || len(o.variants) != 1) {
		fatalf("-topic needs -expected and exactly one variant")
	}
	if o.events < 1 || o.events > 100_000_000 || o.partitions < 1 || o.liveRate <= 0 {
		fatalf("-events must be 1..1e8, -partitions and -live-rate positive")
	}
	svc, err := serviceConfig(o.serviceEnv, o.brokers, "bench:bench@tcp(127.0.0.1:3306)/bench")
	if err != nil {
		fatalf("service configuration: %v", err)
	}
	o.svc = svc
	if o.naiveBatch == 0 {
		o.naiveBatch = svc.CheckpointMaxRecords
	}
	if o.naiveWait == 0 {
		o.naiveWait = svc.CheckpointInterval
	}
	if o.sinkChunk == 0 {
		o.sinkChunk = 2 * svc.CheckpointMaxRecords
	}
	o.watch = map[string]int{}
	if pid := localListener(o.brokers[0]); pid > 0 {
		o.watch["kafka"] = pid
	}
	if mc, err := mysql.ParseDSN(o.admin); err == nil && mc.Net == "tcp" {
		if pid := localListener(mc.Addr); pid > 0 {
			o.watch["mysql"] = pid
		}
	}
	if o.out == "" {
		o.out = filepath.Join("bench-results", time.Now().Format("20060102-150405"))
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		fatalf("%v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, &o); err != nil {
		fatalf("%v", err)
	}
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "billing-bench: "+format+"\n", args...)
	os.Exit(1)
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
}

func run(ctx context.Context, o *options) error {
	began := time.Now()
	tmp, err := os.MkdirTemp("", "billing-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if o.gen, err = findGenerator(o.gen, tmp); err != nil {
		return err
	}
	if o.packet > 0 {
		restore, err := setServerPacket(ctx, o.admin, o.packet)
		if err != nil {
			return err
		}
		defer restore()
	}
	adm, kcl, err := kafkaAdmin(o.brokers)
	if err != nil {
		return err
	}
	defer kcl.Close()
	mi := machineInfo(ctx, o, adm)
	fmt.Print(mi.String())
	runID := fmt.Sprintf("%x", time.Now().UnixNano()&0xffffff)

	if len(o.decisions) > 0 {
		return decisionRates(ctx, o)
	}
	if o.load > 0 {
		stopLoad, err := backgroundLoad(o.load)
		if err != nil {
			return err
		}
		defer stopLoad()
		fmt.Printf("background load: %d busy goroutines in a separate process\n", o.load)
	}
	all := map[string]variant{
		"default":       {name: "default", accounts: o.accounts, note: "service defaults"},
		"large-state":   {name: "large-state", accounts: o.accounts, cacheKeys: o.lsCache, preload: o.lsKeys, note: fmt.Sprintf("DEDUP_CACHE_KEYS=%d, %d dedup keys stored beforehand", o.lsCache, o.lsKeys)},
		"many-accounts": {name: "many-accounts", accounts: o.manyAcc, note: fmt.Sprintf("%d accounts", o.manyAcc)},
		"steady-state": {name: "steady-state", accounts: o.accounts, steady: true,
			env:  map[string]string{"DEDUP_CLEANUP_INTERVAL": "250ms"},
			note: fmt.Sprintf("%d live keys stored beforehand in the previous generation's table (every claim lock-reads it) and %d expired ones in the table the upkeep empties with one TRUNCATE during the run; DEDUP_CLEANUP_INTERVAL=250ms", o.events, o.events)},
		"steady-state-entries": {name: "steady-state-entries", accounts: o.accounts, steady: true, tables: true,
			env:  map[string]string{"DEDUP_CLEANUP_INTERVAL": "250ms", "LEDGER_ENTRIES": "true", "LEDGER_ENTRIES_RETENTION": "2s"},
			note: "steady-state with LEDGER_ENTRIES=true and LEDGER_ENTRIES_RETENTION=2s: the rows of dedup_keys and ledger_entries are counted during the catch-up; both must stay bounded"},
		"two-servers": {name: "two-servers", accounts: o.accounts, shard: true, note: "MYSQL_SHARD_DSNS: a second server holds half the results and keys"},
		"ledger-entries": {name: "ledger-entries", accounts: o.accounts, env: map[string]string{"LEDGER_ENTRIES": "true"},
			note: "LEDGER_ENTRIES=true: one ledger_entries row per counted event"},
		"closing": {name: "closing", accounts: o.accounts, env: map[string]string{"WINDOW_CLOSE_AFTER": "1h"},
			note: "WINDOW_CLOSE_AFTER=1h: the workload's 24 windows close one after the other during the run"},
		"changelog": {name: "changelog", accounts: o.accounts, changelog: true,
			note: "CHANGELOG_TOPIC_PREFIX set: every change published to Kafka exactly once (docs/changelog.md); the service only, beside the same service without it (service-plain)"},
		"three-instances": {name: "three-instances", accounts: o.accounts, instances: 3,
			note: "the service as three processes in one consumer group on one backlog and one ledger (repeats of an event on two partitions: two instances claim one key); aborted checkpoints by cause"},
		"larger-than-memory": {name: "larger-than-memory", accounts: o.accounts, preload: o.ltmKeys, randomIDs: !o.ltmOrdered,
			pool:     poolSetting{measure: o.ltmPool, preload: max(1<<30, 256*o.ltmKeys), oldPct: o.ltmOldPct}, // the preload holds the table in memory: about twice its 118-128 bytes per key
			liveRate: o.ltmLiveRate,
			note: fmt.Sprintf("innodb_buffer_pool_size %d MiB, innodb_old_blocks_pct %s, %d dedup keys stored beforehand, live phase %.0f records/s; %s", o.ltmPool>>20,
				map[bool]string{true: strconv.Itoa(o.ltmOldPct), false: "the server's"}[o.ltmOldPct > 0], o.ltmKeys, max(o.ltmLiveRate, 0), map[bool]string{false: "random UUID event ids (billing-gen -random-ids), the stored keys' of the same shape", true: "-ltm-ordered: billing-gen's ordered ids, the stored keys in a region of their own"}[o.ltmOrdered])},
		"avro":        formatVariant(o, "avro"),
		"protobuf":    formatVariant(o, "protobuf"),
		"json-schema": formatVariant(o, "json-schema"),
		"hostile": {name: "hostile", accounts: 1000, hostile: true,
			note: fmt.Sprintf("%d valid events padded to MAX_PAYLOAD_BYTES, one junk record of 1 MiB per %d; service mode only", o.hostileEvents, o.hostileJunkEvery)},
	}
	var infos []variantInfo
	var ms []measurement
	for _, name := range o.variants {
		v, ok := all[name]
		if !ok {
			return fmt.Errorf("unknown variant %q (want one of %s)", name, strings.Join(slices.Sorted(maps.Keys(all)), ", "))
		}
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
	if err := os.WriteFile(filepath.Join(o.out, "results.json"), out, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "table.txt"), []byte(mi.String()+"\n"+table), 0o644); err != nil {
		return err
	}
	fmt.Printf("results, logs and profiles in %s\n", o.out)
	return nil
}

// formatVariant is the default variant's workload in a registry format:
// its service rate is the one to hold against the default's (the JSON
// contract) in the same run.
func formatVariant(o *options, f string) variant {
	return variant{name: f, accounts: o.accounts, format: f,
		env:  map[string]string{"EVENT_FORMAT": f, "SCHEMA_REGISTRY_URL": o.registry},
		note: fmt.Sprintf("the default workload with EVENT_FORMAT=%s (billing-gen -format %s, its schema in the registry); service mode only, no live phase (e2e n/a)", f, f)}
}

func runVariant(ctx context.Context, o *options, v variant, runID string, adm *kadmClient) (variantInfo, []measurement, error) {
	info := variantInfo{Name: v.name, Accounts: v.accounts, Preload: v.preload, Note: v.note, CacheKeys: o.svc.DedupCacheKeys, LiveRate: v.live(o)}
	if v.cacheKeys > 0 {
		info.CacheKeys = v.cacheKeys
	}
	topic := fmt.Sprintf("bench-%s-%s", runID, v.name)
	expected := filepath.Join(o.out, v.name+"-expected.json")
	var d time.Duration
	if o.topic != "" {
		topic, expected = o.topic, o.expected
		fmt.Printf("\n== %s: existing topic %s\n", v.name, topic)
	} else {
		fmt.Printf("\n== %s: producing %d events (%d accounts, %.0f%% duplicates) into %s\n", v.name, o.events, v.accounts, 100*o.dupRatio, topic)
		logf, err := os.Create(filepath.Join(o.out, v.name+"-billing-gen.log"))
		if err != nil {
			return info, nil, err
		}
		defer logf.Close()
		if !o.keep {
			defer deleteTopic(adm, topic)
		}
		if v.hostile {
			d, err = produceHostile(ctx, o, adm, topic, expected)
		} else {
			d, err = generate(ctx, o, v, topic, expected, logf)
		}
		if err != nil {
			return info, nil, err
		}
	}
	info.Topic = topic
	info.ProduceS = d.Seconds()
	ends, total, err := endOffsets(ctx, adm, topic)
	if err != nil {
		return info, nil, err
	}
	info.Records = total
	if d > 0 {
		fmt.Printf("   %d records in %s (%.0f records/s)\n", total, d.Round(time.Millisecond), float64(total)/d.Seconds())
	}

	if v.pool.measure > 0 {
		orig, restore, err := shrinkPool(ctx, o.admin, v.pool.measure, v.pool.oldPct)
		if err != nil {
			return info, nil, err
		}
		defer restore()
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
	for k, val := range o.serviceEnv {
		env[k] = val
	}
	if v.cacheKeys > 0 {
		env["DEDUP_CACHE_KEYS"] = fmt.Sprint(v.cacheKeys)
	}
	modes := o.modes
	if v.hostile || v.format != "" {
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
	var out []measurement
	for rep := 1; rep <= o.repeat; rep++ {
		var replay []map[int32]int64
		order := modes
		if v.changelog && rep%2 == 0 {
			order = []string{modeService, modeServicePlain} // alternated: neither always runs first
		}
		for _, mode := range order {
			if ctx.Err() != nil {
				return info, out, ctx.Err()
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
		}
	}
	return info, out, nil
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
	if o.repeat > 1 {
		short += strconv.Itoa(rep)
	}
	childMode := mode
	if mode == modeServicePlain {
		childMode = modeService
	}
	spec := childSpec{Mode: childMode, Brokers: o.brokers, Topic: topic, Group: fmt.Sprintf("bench-%s-%s-%s", runID, v.name, short),
		Records: total, Ends: ends, ServiceEnv: env, NaiveBatch: o.naiveBatch, NaiveWait: o.naiveWait,
		SinkChunk: o.sinkChunk, Timeout: o.timeout, Watch: o.watch, MemLimit: o.memLimit}
	if mode == modeSink {
		spec.Replay = replay
	}
	dbName := strings.ReplaceAll(fmt.Sprintf("bench_%s_%s_%s", runID, v.name, short), "-", "_")
	if mode != modeConsume {
		if err := createDatabase(ctx, o.admin, dbName); err != nil {
			return fail(err)
		}
		if !o.keep {
			defer dropDatabase(o.admin, dbName)
		}
		if v.preload > 0 && (mode == modeSink || svc) {
			t := time.Now()
			if v.pool.preload > 0 {
				if _, err := setBufferPool(ctx, o.admin, v.pool.preload); err != nil {
					return fail(err)
				}
			}
			if err := preloadDedupKeys(ctx, o.admin, dbName, v.preload, o.svc.DedupTTL, v.randomIDs); err != nil {
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
				if st.Before, err = measureState(ctx, o.admin, dbName); err != nil {
					return fail(err)
				}
			}
			pool, err := setBufferPool(ctx, o.admin, v.pool.measure)
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
					if st.After, err = measureState(actx, o.admin, dbName); err != nil {
						fmt.Printf("   (%s: dedup state after the run: %v)\n", mode, err)
					}
				}()
			}
		}
		var err error
		if spec.DSN, err = databaseDSN(o.admin, dbName, true); err != nil {
			return fail(err)
		}
		if v.steady && (mode == modeSink || svc) {
			spec.SteadyKeys = o.events
		}
		if v.tables && (mode == modeSink || svc) {
			spec.SampleTables = sampledTables
		}
		if v.changelog && mode == modeService { // not in service-plain, its reference
			prefix := strings.ReplaceAll(dbName, "_", "-")
			spec.ServiceEnv = maps.Clone(spec.ServiceEnv)
			spec.ServiceEnv["CHANGELOG_TOPIC_PREFIX"] = prefix
			if !o.keep {
				defer deleteChangelogTopics(adm, prefix)
			}
		}
		if v.shard && (mode == modeSink || svc) {
			if err := createDatabase(ctx, o.admin2, dbName); err != nil {
				return fail(err)
			}
			if !o.keep {
				defer dropDatabase(o.admin2, dbName)
			}
			shard, err := databaseDSN(o.admin2, dbName, true)
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
		if !o.keep {
			defer deleteTopic(adm, spec.LiveTopic)
		}
	}
	if o.profile && (svc || mode == modeNaive) {
		spec.CPUProfile = filepath.Join(o.out, fmt.Sprintf("%s-%s.cpu.pprof", v.name, short))
		spec.HeapProfile = filepath.Join(o.out, fmt.Sprintf("%s-%s.heap.pprof", v.name, short))
	}
	servers := []string{o.admin}
	if v.shard && (mode == modeSink || svc) {
		servers = append(servers, o.admin2)
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
	logf, err := os.Create(filepath.Join(o.out, fmt.Sprintf("%s-%s.log", v.name, short)))
	if err != nil {
		return fail(err)
	}
	defer logf.Close()
	cmd := exec.Command(self, "-child", string(specJSON))
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
	budget := 2*o.timeout + o.liveSeconds + 2*time.Minute
	kind, r, err := next(budget)
	if err != nil {
		_ = cmd.Process.Kill()
		return fail(err)
	}
	m.Result = r
	if kind == "result" { // consume-only and sink-only end here
		if mode == modeSink && r.Err == "" && !r.TimedOut {
			m.Ledger = check(ctx, o, dbName, expected, topic)
		}
		return m
	}
	// caught-up: check the ledger, then the live phase.
	if !r.TimedOut && r.Err == "" {
		m.Ledger = check(ctx, o, dbName, expected, topic)
	}
	if !r.TimedOut && r.Err == "" && spec.LiveTopic != "" {
		fmt.Fprintln(stdin, "live-start")
		n, err := liveProducer(ctx, o.brokers, spec.LiveTopic, fmt.Sprintf("live-%s-%s", runID, short), v.live(o), o.liveSeconds, v.accounts, o.dupRatio, o.seed, v.randomIDs)
		if err != nil {
			m.Err = "live producer: " + err.Error()
		}
		fmt.Fprintf(stdin, "live-end %d\n", n)
	} else {
		fmt.Fprintln(stdin, "stop")
	}
	kind, r, err = next(o.timeout + time.Minute)
	if err != nil {
		_ = cmd.Process.Kill()
		return fail(err)
	}
	m.Result = r
	return m
}

func check(ctx context.Context, o *options, dbName, expected, topic string) string {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	// Windows closed by the last checkpoint of the catch-up are sealed by
	// the next one: give it a moment.
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, rep, err := verify(cctx, o.admin, dbName, expected, topic)
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
