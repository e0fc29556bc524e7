package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/ledgercheck"
)

// options are the parsed command-line flags.
type options struct {
	brokers      []string
	expectedPath string
	rate         float64
	progress     string
	createTopic  bool
	partitions   int
	replication  int
	maxInFlight  int
	timeout      time.Duration
	seedSet      bool
	gen          genConfig
	registryURL  string
	params       map[string]string
}

// localBrokers are the brokers of a development machine: the service
// requires KAFKA_BROKERS and has no default for it, the generator takes
// these when neither -brokers nor KAFKA_BROKERS names any.
const localBrokers = "127.0.0.1:9092"

// usageText is -help's description, before the flags.
const usageText = `Usage of billing-gen:
  billing-gen -brokers HOST:PORT -topic T [-create-topic -partitions N] -events N -expected FILE

Produces a reproducible billing workload to Kafka and writes the ledger the
service must end up with (for billing-verify): -events valid, distinct events
keyed by account, with exact and conflicting duplicates, malformed records of
every kind, overflow cases and aborted transactions around them. The same
-seed and flags give the same records and the same expected file (the seed
is printed). The expected file assumes the service runs with BILLING_WINDOW,
BILLING_TIMEZONE, WINDOW_CLOSE_AFTER, LEDGER_ENTRIES and MAX_PAYLOAD_BYTES
equal to -window, -timezone, -close-after, -ledger-entries and -max-payload,
on a fresh topic and database. Progress goes to stderr, the summary to
stdout.

Exit status:
  0  every record acknowledged; the expected file written
  1  a produce failed, or -timeout passed: the expected file is not written
     (records already sent may be in the topic: use a fresh topic)
  2  usage error (a bad flag)

Flags:
`

// parseFlags parses and validates args. It returns flag.ErrHelp for -h.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("billing-gen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	var (
		o          options
		brokers    string
		currencies string
		baseTime   string
		seed       uint64
		window     string
		zone       string
		skew       time.Duration
	)
	env := config.Unchecked()
	fs.StringVar(&brokers, "brokers", cmp.Or(strings.Join(env.KafkaBrokers, ","), localBrokers), "comma-separated Kafka seed brokers (env KAFKA_BROKERS)")
	fs.StringVar(&o.gen.Topic, "topic", cmp.Or(env.KafkaTopic, config.Defaults().KafkaTopic), "topic to produce to (env KAFKA_TOPIC)")
	fs.Int64Var(&o.gen.Events, "events", 10000, "valid distinct billable events to produce")
	fs.Float64Var(&o.rate, "rate", 0, "records per second (0 = as fast as possible)")
	fs.IntVar(&o.gen.Accounts, "accounts", 1000, "number of accounts")
	fs.Float64Var(&o.gen.ZipfS, "zipf-s", 1.1, "Zipf skew of account popularity (> 1)")
	fs.StringVar(&currencies, "currencies", "EUR,USD,GBP,JPY", "comma-separated currencies (3 upper-case letters each)")
	fs.Float64Var(&o.gen.DupRatio, "dup-ratio", 0.05, "fraction of valid events sent again with identical content (half keyed to another partition)")
	fs.Float64Var(&o.gen.ConflictRatio, "conflict-ratio", 0.005, "fraction of valid events followed by a conflicting duplicate (same key, different content)")
	fs.Float64Var(&o.gen.MalformedRatio, "malformed-ratio", 0.01, "malformed records per valid event, spread over every malformed kind")
	fs.Float64Var(&o.gen.AbortedRatio, "aborted-ratio", 0.01, "records produced in aborted transactions, per valid event")
	fs.IntVar(&o.gen.OverflowCases, "overflow-cases", 2, "int64 overflow cases, each on a dedicated account")
	fs.StringVar(&window, "window", "1h", "billing window, a duration, day or month; must equal the service's BILLING_WINDOW")
	fs.StringVar(&zone, "timezone", "UTC", "time zone of day and month windows; must equal the service's BILLING_TIMEZONE")
	fs.DurationVar(&o.gen.CloseAfter, "close-after", 0, "the service's WINDOW_CLOSE_AFTER (0: windows never close)")
	fs.BoolVar(&o.gen.Entries, "ledger-entries", false, "the service writes ledger entries (LEDGER_ENTRIES=true): expect them")
	fs.IntVar(&o.gen.Windows, "windows", 24, "event times span this many windows before -base-time")
	fs.StringVar(&baseTime, "base-time", "2026-11-29T00:00:00Z", "RFC 3339 end of the event-time span")
	fs.Float64Var(&o.gen.LateRatio, "late-ratio", 0.05, "fraction of valid events moved back to older windows (out of order)")
	fs.Float64Var(&o.gen.FutureRatio, "future-ratio", 0.001, "fraction of valid events followed by a record dated in the year 9000 (an event_time_in_future dead letter) and then by its correction (counted)")
	fs.Float64Var(&o.gen.VersionRatio, "version-ratio", 0, "fraction of valid events that get versions (docs/corrections.md): amendments and cancellations, in any order and on any partition, some sent twice; the ledger counts each event's highest revision (with -ledger-entries, its entries explain every version: docs/corrections.md)")
	fs.DurationVar(&skew, "max-event-time-skew", time.Hour, "the service's MAX_EVENT_TIME_SKEW: a run whose event times reach past now plus this is refused (the service would dead-letter them)")
	fs.Uint64Var(&seed, "seed", 0, "random seed (default: from the clock; always printed)")
	fs.IntVar(&o.gen.MaxPayload, "max-payload", 64*1024, "the service's maximum payload in bytes; payload_too_large records exceed it by 6 KiB")
	fs.BoolVar(&o.gen.RandomIDs, "random-ids", false, "valid events get random-looking UUID ids (a digest of e-<seed>-<n>) instead of e-<seed>-<n>, which sort in production order")
	fs.StringVar(&o.gen.Format, "format", env.EventFormat, "record format, the service's EVENT_FORMAT: json, avro, protobuf or json-schema (the last three register their schema under <topic>-value in -schema-registry and write the Confluent wire format) (env EVENT_FORMAT)")
	fs.StringVar(&o.gen.CloudEvents, "cloudevents", "", "write valid events as CloudEvents (the service's EVENT_CLOUDEVENTS=true): structured or binary mode, source billing-gen, type billing.event, the event id as id; malformed records are sent bare (invalid_cloudevent); not with -ledger-entries (the ledger's event ids are then \"billing-gen <id>\")")
	fs.StringVar(&o.registryURL, "schema-registry", env.SchemaRegistryURL, "schema registry base URL of -format avro, protobuf and json-schema (env SCHEMA_REGISTRY_URL)")
	fs.StringVar(&o.expectedPath, "expected", "expected.json", "where to write the expected ledger")
	fs.StringVar(&o.progress, "progress", "auto", "progress display: auto (bar on a terminal, else log lines), bar, log or none")
	fs.BoolVar(&o.createTopic, "create-topic", false, "create the topic if it does not exist")
	fs.IntVar(&o.partitions, "partitions", 6, "partitions of a created topic")
	fs.IntVar(&o.replication, "replication-factor", -1, "replication factor of a created topic (-1 = broker default)")
	fs.IntVar(&o.maxInFlight, "max-in-flight", 10000, "maximum records buffered or in flight")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up (exit 1) after this long")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "seed" {
			o.seedSet = true
		}
	})
	if !o.seedSet {
		seed = uint64(time.Now().UnixNano())
		if err := fs.Set("seed", fmt.Sprint(seed)); err != nil {
			return nil, err
		}
	}
	o.gen.Seed = seed

	for _, b := range strings.Split(brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			o.brokers = append(o.brokers, b)
		}
	}
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(o.brokers) == 0 {
		bad("-brokers is empty")
	}
	if o.gen.Topic == "" || len(o.gen.Topic) > 249 {
		bad("-topic must be 1-249 characters")
	}
	seen := map[string]bool{}
	for _, c := range strings.Split(currencies, ",") {
		c = strings.TrimSpace(c)
		if len(c) != 3 || strings.Trim(c, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" || seen[c] {
			bad("-currencies: %q is not a distinct code of 3 letters A-Z", c)
		}
		seen[c] = true
		o.gen.Currencies = append(o.gen.Currencies, c)
	}
	if o.gen.Events < 0 || o.gen.Events > 1e9 {
		bad("-events must be 0..1e9")
	}
	if o.rate < 0 {
		bad("-rate must not be negative")
	}
	if o.gen.Accounts < 1 || o.gen.Accounts > 1e8 {
		bad("-accounts must be 1..1e8")
	}
	if !(o.gen.ZipfS > 1) || o.gen.ZipfS > 100 {
		bad("-zipf-s must be > 1 (and at most 100)")
	}
	for name, r := range map[string]float64{"dup-ratio": o.gen.DupRatio, "conflict-ratio": o.gen.ConflictRatio,
		"malformed-ratio": o.gen.MalformedRatio, "aborted-ratio": o.gen.AbortedRatio, "late-ratio": o.gen.LateRatio, "future-ratio": o.gen.FutureRatio,
		"version-ratio": o.gen.VersionRatio} {
		if !(r >= 0 && r <= 1) {
			bad("-%s must be in [0, 1]", name)
		}
	}
	if o.gen.OverflowCases < 0 || o.gen.OverflowCases > 1000 {
		bad("-overflow-cases must be 0..1000")
	}
	if p, err := ledgercheck.NewPeriod(window, zone); err != nil {
		bad("-window/-timezone: %w", err)
	} else if w := p.Size(); !p.Calendar() && (w < time.Second || w%time.Second != 0 || w > 366*24*time.Hour) {
		bad("-window must be a whole number of seconds, 1s..366d, day or month")
	} else {
		o.gen.Period = p
	}
	if o.gen.CloseAfter < 0 {
		bad("-close-after must not be negative")
	}
	if o.gen.Windows < 1 || o.gen.Windows > 100000 {
		bad("-windows must be 1..100000")
	}
	bt, err := time.Parse(time.RFC3339, baseTime)
	if err != nil {
		bad("-base-time: %w", err)
	}
	o.gen.BaseTime = bt.UTC()
	if err == nil && len(errs) == 0 {
		first := o.gen.BaseTime.Add(-time.Duration(int64(o.gen.Windows)*o.gen.windowSeconds()) * time.Second)
		if first.Year() < 1000 || o.gen.BaseTime.Year() > 9998 {
			bad("-base-time and -windows put event times outside years 1000-9998 (DATETIME range)")
		}
	}
	if skew <= 0 {
		bad("-max-event-time-skew must be positive")
	} else if len(errs) == 0 {
		// The service judges each event against its processing time,
		// which comes later than now: an event not in the future now is
		// not then.
		cfg := o.gen
		cfg.Partitions = 1 // the topic's, known later; event times do not depend on it
		if g, err := newGenerator(cfg); err != nil {
			bad("%w", err)
		} else if latest, bound := g.latestEventTime(), time.Now().Add(skew); latest.After(bound) {
			bad("-base-time %s: event times reach %s, later than now plus -max-event-time-skew (%s): the service would dead-letter them as event_time_in_future; choose an earlier -base-time",
				baseTime, latest.UTC().Format(time.RFC3339), bound.UTC().Format(time.RFC3339))
		}
	}
	if o.gen.MaxPayload < 1024 || o.gen.MaxPayload > 512*1024 {
		bad("-max-payload must be 1024..524288 (the too-large record must still fit a Kafka message)")
	}
	switch o.progress {
	case "auto", "bar", "log", "none":
	default:
		bad("-progress must be auto, bar, log or none")
	}
	if o.partitions < 1 || o.partitions > 10000 {
		bad("-partitions must be 1..10000")
	}
	if o.replication == 0 || o.replication < -1 || o.replication > 32767 {
		bad("-replication-factor must be -1 or 1..32767")
	}
	if o.maxInFlight < 1 {
		bad("-max-in-flight must be positive")
	}
	if o.timeout <= 0 {
		bad("-timeout must be positive")
	}
	if !slices.Contains(format.Formats(), o.gen.Format) {
		bad("-format must be one of %s", strings.Join(format.Formats(), ", "))
	} else if format.NeedsRegistry(o.gen.Format) && o.registryURL == "" {
		bad("-format %s needs -schema-registry (or SCHEMA_REGISTRY_URL)", o.gen.Format)
	}
	switch o.gen.CloudEvents {
	case "", "structured", "binary":
	default:
		bad("-cloudevents must be structured or binary")
	}
	if o.gen.CloudEvents != "" && o.gen.Entries {
		bad("-cloudevents and -ledger-entries: the ledger's event ids are the CloudEvents' (source and id), not the entries the expected file holds")
	}
	if o.expectedPath == "" {
		bad("-expected is empty")
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	o.params = map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { o.params[f.Name] = f.Value.String() })
	return &o, nil
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command; it returns the exit status: 0 success, 1 failure
// (nothing written to -expected), 2 usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "billing-gen: %v\n", err)
		return 2
	}
	fmt.Fprintf(stdout, "billing-gen: seed %d (replay with -seed %d and the same flags)\n", o.gen.Seed, o.gen.Seed)

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if sent, err := produceRun(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "billing-gen: FAILED: %v\n", err)
		fmt.Fprintf(stderr, "billing-gen: %s was not written", o.expectedPath)
		if sent > 0 {
			fmt.Fprintf(stderr, "; up to %d records already sent may be in topic %q (use a fresh topic and database)", sent, o.gen.Topic)
		}
		fmt.Fprintln(stderr)
		return 1
	}
	return 0
}
