// Command billing-verify compares the billing service's result tables with
// the expected ledger written by billing-gen, exactly.
//
// It reads account_balances, billing_windows and dead_letters from the
// server of -dsn and from every -shard-dsns server (accounts are sharded:
// the union of the rows is compared; a row found on two servers is itself a
// difference), and compares every balance (amount and event count), every
// window, and the number of dead letters per reason: no missing rows, no
// extra rows, no different values. It prints the first -max-diffs
// differences and a one-line verdict:
//
//	EXACT: 1000 balances, 5312 windows, 1234 dead letters, 100000 events
//	MISMATCH: 3 differences (lost 2 events, counted twice 1 event); actual ...
//
// "lost N" sums the events that balance rows count fewer times than
// expected, "counted twice N" those they count more times.
//
// With -wait it polls every -interval until the tables match or the wait is
// over, printing progress; use it while the service catches up.
//
// Exit status: 0 exact, 1 a difference remains, 2 usage, file or database
// errors (with -wait: if the last attempt failed with such an error).
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

	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/mysqlconn"
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

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("billing-verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		o      options
		dsn    string
		shards listFlag
	)
	fs.StringVar(&dsn, "dsn", os.Getenv("MYSQL_DSN"), "MySQL DSN of the (first) server (env MYSQL_DSN)")
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
		shards = splitList(os.Getenv("MYSQL_SHARD_DSNS"))
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
	exitExact    = 0
	exitMismatch = 1
	exitError    = 2
)

// run is the command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitExact
	}
	if err != nil {
		fmt.Fprintf(stderr, "billing-verify: %v\n", err)
		return exitError
	}
	exp, err := ledgercheck.ReadFile(o.expectedPath)
	if err != nil {
		fmt.Fprintf(stderr, "billing-verify: %v\n", err)
		return exitError
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	fmt.Fprintf(stdout, "billing-verify: expected %s (seed %d, topic %q, window %v): %d balances, %d windows, %d dead letters, %d events\n",
		o.expectedPath, exp.Seed, exp.Topic, time.Duration(exp.Window), len(exp.Balances), len(exp.Windows), exp.DeadLetterTotal(), exp.EventsValid)
	for i, d := range o.dsns {
		fmt.Fprintf(stdout, "billing-verify: server %d: %s\n", i, mysqlconn.Redact(d))
	}

	v := &verifier{o: o, exp: exp, dbs: make([]*sqlx.DB, len(o.dsns))}
	defer v.close()
	deadline := time.Now().Add(o.wait)
	for {
		r, err := v.check(ctx)
		if err == nil && r.Exact() {
			fmt.Fprintln(stdout, r.Verdict())
			return exitExact
		}
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			if err != nil {
				fmt.Fprintf(stderr, "billing-verify: %v\n", err)
				return exitError
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
	o   *options
	exp *ledgercheck.Expected
	dbs []*sqlx.DB
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
			return nil, fmt.Errorf("server %d: %w", i, err)
		}
		v.dbs[i] = db
	}
	act, err := ledgercheck.ReadActual(ctx, v.dbs, v.o.topic)
	if err != nil {
		return nil, err
	}
	return ledgercheck.Compare(v.exp, act), nil
}

func (v *verifier) close() {
	for _, db := range v.dbs {
		if db != nil {
			_ = db.Close()
		}
	}
}
