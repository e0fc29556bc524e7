package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/billing/ledger/internal/bench"
	"github.com/billing/ledger/internal/service"
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func main() {
	childArg := flag.String(bench.ChildFlag, "", "internal: run one measurement as a child process")
	var o bench.Config
	var brokers, variants, modes, serviceEnv string
	flag.StringVar(&brokers, "brokers", envOr("KAFKA_BROKERS", "127.0.0.1:9092"), "Kafka seed brokers (env KAFKA_BROKERS)")
	flag.StringVar(&o.Admin, "mysql-dsn", envOr("MYSQL_DSN", "root:root@tcp(127.0.0.1:3306)/"), "admin DSN without database, allowed to create and drop databases (env MYSQL_DSN)")
	flag.Int64Var(&o.Events, "events", 1_000_000, "distinct valid events per variant (duplicates come on top)")
	flag.IntVar(&o.Accounts, "accounts", 10_000, "accounts of the default and large-state variants")
	flag.IntVar(&o.ManyAccounts, "many-accounts", 1_000_000, "accounts of the many-accounts variant")
	flag.IntVar(&o.Partitions, "partitions", 6, "partitions of each topic")
	flag.Float64Var(&o.ZipfS, "zipf-s", 1.1, "Zipf skew of account popularity")
	flag.Float64Var(&o.DupRatio, "dup-ratio", 0.05, "fraction of events sent twice")
	flag.Uint64Var(&o.Seed, "seed", 1, "generator seed")
	flag.StringVar(&variants, "variants", "default,amended,avro,protobuf,json-schema,large-state,many-accounts,steady-state,changelog,larger-than-memory,three-instances", "workload variants to run: default, amended, avro, protobuf, json-schema, large-state, many-accounts, steady-state, larger-than-memory, three-instances, add-server, steady-state-entries, two-servers, hostile, ledger-entries, closing, changelog")
	flag.BoolVar(&o.Interleave, "interleave", false, "produce every variant's workload first, then run the variants' repetitions in turn (1 of each, then 2, ...), so that ratios between variants pair measurements minutes apart (not with larger-than-memory)")
	flag.StringVar(&modes, "modes", "consume-only,sink-only,naive,service", "what to measure per variant")
	flag.StringVar(&serviceEnv, "service-env", "", "service settings over its defaults, e.g. MYSQL_BRANCHES=1,CHECKPOINT_MAX_RECORDS=20000")
	flag.IntVar(&o.NaiveBatch, "naive-batch", 0, "naive batch size (default: the service's CHECKPOINT_MAX_RECORDS)")
	flag.DurationVar(&o.NaiveWait, "naive-wait", 0, "naive batch fill wait (default: the service's CHECKPOINT_INTERVAL)")
	flag.IntVar(&o.SinkChunk, "sink-chunk", 0, "records per checkpoint in sink-only (default: twice CHECKPOINT_MAX_RECORDS, the size the service's checkpoints reach in a backlog)")
	flag.IntVar(&o.LargeStateCache, "large-state-cache", 10_000, "DEDUP_CACHE_KEYS of the large-state variant")
	flag.Int64Var(&o.LargeStateKeys, "large-state-keys", 2_000_000, "dedup keys already stored when the large-state variant starts")
	flag.Int64Var(&o.LTMPool, "ltm-pool", 128<<20, "innodb_buffer_pool_size (bytes) of the larger-than-memory variant's measurements (MySQL 8.4's default); the server's own is restored after it")
	flag.Int64Var(&o.LTMKeys, "ltm-keys", 11_500_000, "dedup keys (random UUIDs) stored before each measurement of the larger-than-memory variant: at least 10 × -ltm-pool of table")
	flag.IntVar(&o.LTMOldPct, "ltm-old-blocks-pct", 80, "innodb_old_blocks_pct of the larger-than-memory variant's measurements, so that the old sublist of its small pool holds two intervals of its live ids' leaves, as a production pool's does at MySQL's 37% (docs/performance.md); 0: the server's; the server's own is restored after it")
	flag.Float64Var(&o.LTMLiveRate, "ltm-live-rate", 2500, "records/s of the larger-than-memory variant's live phase: what its disk serves with half its IOPS to spare (docs/performance.md); 0: -live-rate")
	flag.BoolVar(&o.LTMOrdered, "ltm-ordered", false, "larger-than-memory variant with billing-gen's ordered ids (e-<seed>-<n>) and the stored keys in a region of their own, as ids in time order are: the A/B of the key layout")
	flag.Float64Var(&o.LiveRate, "live-rate", 5000, "records/s produced during the live (latency) phase")
	flag.DurationVar(&o.LiveDuration, "live-duration", 15*time.Second, "length of the live phase")
	flag.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "bound on each phase of each measurement")
	flag.StringVar(&o.Registry, "schema-registry", envOr("SCHEMA_REGISTRY_URL", ""), "schema registry of the avro, protobuf and json-schema variants (env SCHEMA_REGISTRY_URL)")
	flag.StringVar(&o.Gen, "gen", "", "billing-gen binary (default: next to this one, else go build)")
	flag.StringVar(&o.Billing, "billing", "", "billing binary, whose billing shards add the add-server variant runs (default: next to this one, else go build)")
	flag.IntVar(&o.GrowStepRows, "grow-step-rows", 0, "add-server variant: billing shards add --step-rows (0: the command's default)")
	flag.Float64Var(&o.GrowRest, "grow-rest", 0, "add-server variant: billing shards add --rest (0: the command's default; negative: --rest 0, no rest)")
	flag.IntVar(&o.GrowRestCkpts, "grow-rest-checkpoints", 0, "add-server variant: billing shards add --rest-checkpoints (0: the command's default; negative: --rest-checkpoints 0, none)")
	flag.StringVar(&o.Out, "out", "", "directory for results, logs and profiles (default bench-results/<time>)")
	flag.BoolVar(&o.Profile, "profile", false, "write CPU and heap profiles of the naive and service catch-up")
	flag.BoolVar(&o.Keep, "keep", false, "keep topics and databases")
	flag.Int64Var(&o.MemLimit, "service-memlimit", service.DefaultMemoryLimit, "Go soft memory limit of the service mode in bytes unless GOMEMLIMIT is set, as cmd/billing sets it (0: none)")
	flag.IntVar(&o.Repeat, "repeat", 2, "measure every mode this many times, interleaved; the table shows the median run and the range, and every ratio's range over the repetitions")
	packet := flag.String("max-allowed-packet", "", "set the MySQL server's global max_allowed_packet for the run and restore it at the end, e.g. 1M or 64M (the service sizes its statements from it; default: leave it)")
	flag.StringVar(&o.Topic, "topic", "", "measure an existing topic (kept) instead of producing one, e.g. from an earlier -keep run; needs -expected and one variant")
	flag.StringVar(&o.Expected, "expected", "", "billing-gen's expected ledger of -topic")
	flag.StringVar(&o.Admin2, "mysql2-dsn", envOr("MYSQL2_DSN", "root:root@tcp(127.0.0.1:3307)/"), "admin DSN of a second server, for the two-servers variant (env MYSQL2_DSN)")
	flag.IntVar(&o.Load, "load", 0, "run this many busy goroutines in a separate process during the measurements (the limit must hold under load too)")
	var decisions string
	flag.StringVar(&decisions, "decisions", "", "measure only the decision rate of the control server with these numbers of concurrent coordinators, e.g. 1,2,4,8,16")
	flag.DurationVar(&o.DecisionsDuration, "decisions-duration", 5*time.Second, "length of each decision-rate measurement")
	flag.IntVar(&o.HostileEvents, "hostile-events", 20_000, "hostile variant: valid events padded to just under MAX_PAYLOAD_BYTES")
	flag.IntVar(&o.HostileJunkEvery, "hostile-junk-every", 40, "hostile variant: one junk record of 1 MiB per this many events")
	flag.Parse()
	for _, d := range splitList(decisions) {
		n, err := strconv.Atoi(d)
		if err != nil {
			fatalf("-decisions: %q is not a count of coordinators", d)
		}
		o.Decisions = append(o.Decisions, n)
	}

	if *childArg != "" {
		if err := bench.Child(*childArg); err != nil {
			fmt.Fprintln(os.Stderr, "billing-bench child:", err)
			os.Exit(bench.ChildExitCode(err))
		}
		return
	}

	for _, b := range strings.Split(brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			o.Brokers = append(o.Brokers, b)
		}
	}
	o.Variants = splitList(variants)
	o.Modes = splitList(modes)
	o.ServiceEnv = map[string]string{}
	for _, kv := range splitList(serviceEnv) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			fatalf("-service-env: %q is not KEY=VALUE", kv)
		}
		o.ServiceEnv[k] = v
	}
	if *packet != "" {
		var err error
		if o.MaxAllowedPacket, err = parsePacket(*packet); err != nil {
			fatalf("-max-allowed-packet: %v", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench.Run(ctx, o); err != nil {
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

// parsePacket reads a max_allowed_packet size: bytes, or a number with K,
// M or G (binary units). The server accepts 1 KiB to 1 GiB in multiples of
// 1 KiB; anything else is refused here rather than rounded there.
func parsePacket(s string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, strings.TrimSuffix(s, "G")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > (1<<30)/mult {
		return 0, fmt.Errorf("want a size from 1K to 1G, e.g. 1M")
	}
	if n *= mult; n%1024 != 0 {
		return 0, fmt.Errorf("%d bytes is not a multiple of 1 KiB", n)
	}
	return n, nil
}
