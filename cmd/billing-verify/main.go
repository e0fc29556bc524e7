package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/mysqlconn"
	"github.com/billing/ledger/internal/periods"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// listFlag is a repeatable flag whose values may also be comma-separated.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	*l = append(*l, splitList(v)...)
	return nil
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

type options struct {
	dsns         []string
	expectedPath string
	topic        string
	maxDiffs     int
	wait         time.Duration
	interval     time.Duration
	queryTimeout time.Duration
}

// usageText is -help's description, before the flags.
const usageText = `Usage of billing-verify:
  billing-verify -expected FILE [-dsn DSN] [-shard-dsns DSN,...] [-topic T] [-wait D]

Compares the ledger in MySQL (account_balances, billing_windows,
window_adjustments, dead_letters, and ledger_entries when the expected file
has them) with the expected ledger billing-gen wrote, exactly: every balance,
every window, the dead letters per reason, and with windows that close the
sealing invariants. Prints the first differences and one verdict line,
EXACT: ... or MISMATCH: ...; with -wait, polls until EXACT or the wait is
over, printing progress on stderr. Read-only. The servers are -dsn and
-shard-dsns (default: MYSQL_DSN and MYSQL_SHARD_DSNS).

Exit status:
  0  EXACT
  1  MISMATCH: a difference remains
  2  usage error (a bad flag)
  3  could not compare: the expected file or a database could not be read,
     or the ledger's period settings are not the file's (with -wait: the
     last attempt failed so)

Flags:
`

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("billing-verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	var (
		o      options
		dsn    string
		shards listFlag
	)
	env := config.Unchecked()
	fs.StringVar(&dsn, "dsn", env.MySQLDSN, "MySQL DSN of the (first) server (env MYSQL_DSN)")
	fs.Var(&shards, "shard-dsns", "DSNs of further servers; repeatable or comma-separated (env MYSQL_SHARD_DSNS)")
	fs.StringVar(&o.expectedPath, "expected", "expected.json", "expected-ledger file written by billing-gen")
	fs.StringVar(&o.topic, "topic", "", "only count dead letters of this Kafka topic (default: all)")
	fs.IntVar(&o.maxDiffs, "max-diffs", 20, "print at most this many differences (0 = all)")
	fs.DurationVar(&o.wait, "wait", 0, "poll until exact or this long has passed (0 = check once)")
	fs.DurationVar(&o.interval, "interval", 2*time.Second, "polling interval with -wait")
	fs.DurationVar(&o.queryTimeout, "query-timeout", time.Minute, "timeout of one read of all servers")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "shard-dsns" })
	if !set {
		shards = env.MySQLShardDSNs
	}
	// The same server listed twice would double every row: drop repeats.
	seen := map[string]bool{}
	for _, d := range append([]string{dsn}, shards...) {
		if d = strings.TrimSpace(d); d != "" && !seen[d] {
			seen[d] = true
			o.dsns = append(o.dsns, d)
		}
	}
	var errs []error
	if len(o.dsns) == 0 {
		errs = append(errs, errors.New("no database: set -dsn or MYSQL_DSN"))
	}
	for _, d := range o.dsns {
		if _, err := ledgercheck.NormalizeDSN(d); err != nil {
			errs = append(errs, err)
		}
	}
	if o.expectedPath == "" {
		errs = append(errs, errors.New("-expected is empty"))
	}
	if o.maxDiffs < 0 || o.wait < 0 || o.interval <= 0 || o.queryTimeout <= 0 {
		errs = append(errs, errors.New("-max-diffs and -wait must not be negative, -interval and -query-timeout must be positive"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &o, nil
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// Exit statuses.
const (
	exitExact      = 0
	exitMismatch   = 1
	exitUsage      = 2
	exitUnreadable = 3 // the expected file or a database could not be read
)

// run is the command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitExact
	}
	if err != nil {
		fmt.Fprintf(stderr, "billing-verify: %v\n", err)
		return exitUsage
	}
	exp, err := ledgercheck.ReadFile(o.expectedPath)
	if err != nil {
		fmt.Fprintf(stderr, "billing-verify: could not compare: %v\n", err)
		return exitUnreadable
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	period, _ := exp.Period() // validated by ReadFile
	fmt.Fprintf(stdout, "billing-verify: expected %s (seed %d, topic %q, window %v): %d balances, %d windows, %d dead letters, %d events\n",
		o.expectedPath, exp.Seed, exp.Topic, period, len(exp.Balances), len(exp.Windows), exp.DeadLetterTotal(), exp.EventsValid)
	if exp.CloseAfter > 0 {
		split := "sums of windows and adjustments per window, the split checked by invariants"
		if exp.SplitExact {
			split = fmt.Sprintf("%d adjustments, split exactly", len(exp.Adjustments))
		}
		var frontier string
		if exp.ClosedBefore != nil {
			frontier = exp.ClosedBefore.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(stdout, "billing-verify: windows close %v after their end; windows before %s sealed; %s\n", time.Duration(exp.CloseAfter), frontier, split)
	}
	if exp.LedgerEntries {
		fmt.Fprintf(stdout, "billing-verify: ledger entries expected: %d, digest %016x\n", exp.EventsValid, exp.EntriesDigest)
	}
	for i, d := range o.dsns {
		fmt.Fprintf(stdout, "billing-verify: server %d: %s\n", i, mysqlconn.Redact(d))
	}

	v := &verifier{o: o, exp: exp, dbs: make([]*sqlx.DB, len(o.dsns)), stderr: stderr}
	defer v.close()
	deadline := time.Now().Add(o.wait)
	for {
		r, err := v.check(ctx)
		if err == nil && r.Exact() {
			fmt.Fprintln(stdout, r.Verdict())
			return exitExact
		}
		var disagree *periods.MismatchError
		if errors.As(err, &disagree) {
			fmt.Fprintf(stderr, "billing-verify: could not compare: the ledger's period settings are not the expected file's: %v\n", err)
			return exitUnreadable
		}
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			if err != nil {
				fmt.Fprintf(stderr, "billing-verify: could not compare: %v\n", err)
				return exitUnreadable
			}
			if werr := r.WriteDiffs(stdout, o.maxDiffs); werr != nil {
				fmt.Fprintf(stderr, "billing-verify: %v\n", werr)
			}
			fmt.Fprintln(stdout, r.Verdict())
			return exitMismatch
		}
		if err != nil {
			fmt.Fprintf(stderr, "billing-verify: waiting (%v left): %v\n", left.Round(time.Second), err)
		} else {
			fmt.Fprintf(stderr, "billing-verify: waiting (%v left): %d/%d events, %d/%d dead letters, %d difference(s)\n",
				left.Round(time.Second), r.ActualEvents, r.ExpectedEvents, r.ActualDeadLetters, r.ExpectedDeadLetters, len(r.Diffs))
		}
		select {
		case <-ctx.Done():
		case <-time.After(min(o.interval, max(left, time.Millisecond))):
		}
	}
}

// verifier holds the connection pools across polls.
type verifier struct {
	o      *options
	exp    *ledgercheck.Expected
	dbs    []*sqlx.DB
	stderr io.Writer
	warned bool // that the ledger has no period settings stored
}

// check connects to any server not yet connected, reads all of them and
// compares. An error means no comparison could be made.
func (v *verifier) check(ctx context.Context) (*ledgercheck.Report, error) {
	ctx, cancel := context.WithTimeout(ctx, v.o.queryTimeout)
	defer cancel()
	for i, d := range v.o.dsns {
		if v.dbs[i] != nil {
			continue
		}
		db, err := ledgercheck.OpenDB(ctx, d)
		if err != nil {
			return nil, fmt.Errorf("server %d: %w", i, mysqldriver.AccessDenied(d, err))
		}
		v.dbs[i] = db
	}
	if err := v.checkPeriods(ctx); err != nil {
		return nil, err
	}
	act, err := ledgercheck.ReadActual(ctx, v.dbs, v.o.topic, v.exp.LedgerEntries)
	if err != nil {
		return nil, err
	}
	return ledgercheck.Compare(v.exp, act), nil
}

// checkPeriods holds the expected file's period settings against the
// ledger's own (ledger_periods): the comparison means something only if
// they are the same, and if the ledger kept one definition (the model
// knows one). A ledger without any stored (not yet started, or by an
// older version) is compared under the file's, with a warning.
func (v *verifier) checkPeriods(ctx context.Context) error {
	stored, err := periods.Read(ctx, mysqldriver.NewView(v.dbs[0]))
	if err != nil {
		return err
	}
	if len(stored) == 0 {
		if !v.warned {
			v.warned = true
			fmt.Fprintln(v.stderr, "billing-verify: warning: the ledger has no period settings stored (yet): compared under the expected file's")
		}
		return nil
	}
	zone := v.exp.Timezone
	if zone == "" {
		zone = "UTC" // the file's way of saying it
	}
	want, err := periods.ParsePeriod(v.exp.Window, zone)
	if err != nil {
		return err
	}
	sched, err := stored.Schedule()
	if err != nil {
		return err
	}
	if steps := sched.Steps(); len(steps) > 1 {
		return &periods.MismatchError{Problems: []string{fmt.Sprintf("the ledger's windows changed (%s); an expected file describes one definition", sched)}}
	}
	if d := periods.Diff(stored.Current(), periods.Settings{Period: want, Close: v.exp.CloseAfter > 0}, time.Duration(v.exp.CloseAfter)); len(d) > 0 {
		return &periods.MismatchError{Differences: d, Of: "the expected file"}
	}
	return nil
}

func (v *verifier) close() {
	for _, db := range v.dbs {
		if db != nil {
			_ = db.Close()
		}
	}
}
