package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/ledgercompare"
	"github.com/billing/ledger/internal/periods"
	"github.com/billing/ledger/internal/service"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Exit statuses of billing compare (and billing status, which uses 0 and
// 3 the same way). 2 is a usage or configuration error, as everywhere.
const (
	exitEqual      = 0 // compare: EXACT
	exitDifferent  = 1 // compare: MISMATCH
	exitUnreadable = 3 // could not compare (a ledger could not be read); status: part of the report unknown
)

// compareCmd runs `billing compare --other-dsn DSN [--other-shard-dsns
// DSNs]`: an exact comparison of this ledger (MYSQL_DSN and
// MYSQL_SHARD_DSNS) with another one, such as a ledger rebuilt by a
// blue/green deployment. Read-only. Exit status 0 EXACT, 1 MISMATCH, 3
// when a ledger could not be read, 2 usage or configuration.
func compareCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing compare", "--other-dsn DSN [--other-shard-dsns DSN,...] [--max-diffs N] [--timeout D]",
		`Compares this ledger (MYSQL_DSN and MYSQL_SHARD_DSNS) with another, exactly: every
balance (amount and event count), every billing window (with its adjustment),
and the number of dead letters per reason: those of KAFKA_TOPIC when it is set,
else of every topic (the output says which). Prints EXACT, or MISMATCH and the
first differences ("lost" = counted here and not there, "counted twice" = the
other way round). Read-only; reads MySQL only (no Kafka setting is needed);
MYSQL_PASSWORD_FILE and MYSQL_TLS apply to the other DSNs too. The period
settings (windows, whether they close) are the ledgers' own, stored in them,
and must be the same (else: could not compare); only for ledgers without any
stored is this environment's used, with a warning. On a terminal, shows the
rows read so far on stderr.

Exit status:
  0  EXACT: the ledgers are equal
  1  MISMATCH: they differ (the differences are printed)
  2  usage or configuration error
  3  could not compare: a ledger could not be read (unreachable, access
     denied, no schema); nothing is said about equality

Used to tell when a rebuilt ledger has caught up (docs/operations.md); compare
while both have stopped advancing, or repeat: each server is read in one
snapshot, but the two ledgers are read one after the other.
`)
	other := fs.String("other-dsn", "", "control server DSN of the other ledger (required)")
	otherShards := fs.String("other-shard-dsns", "", "shard server DSNs of the other ledger, comma separated, in its MYSQL_SHARD_DSNS order")
	maxDiffs := fs.Int("max-diffs", 20, "print at most this many differences")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound on reading both ledgers")
	if _, code, done := fs.parse(args, 0, stdout, stderr); done {
		return code
	}
	if *other == "" {
		return fs.fail(stderr, fmt.Errorf("--other-dsn is required"))
	}
	otherDSNs := []string{*other}
	if *otherShards != "" {
		otherDSNs = append(otherDSNs, strings.Split(*otherShards, ",")...)
	}
	return withConfig(stderr, compareScope(), func(ctx context.Context, cfg config.Config, log *slog.Logger) int {
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		// Dead letters of KAFKA_TOPIC when it is set; without it, of
		// every topic rather than of the default topic's name, which
		// would compare none of a ledger of another topic and call it
		// EXACT.
		topic, scope := "", "every topic (KAFKA_TOPIC is not set)"
		if config.Environment()["KAFKA_TOPIC"] != "" {
			topic, scope = cfg.KafkaTopic, "topic "+cfg.KafkaTopic
		}
		bar := newTermProgress(stderr, isTerminal(stderr), "reading this ledger", "rows", -1)
		rep, err := compareLedgers(ctx, cfg, log, otherDSNs, topic, bar)
		bar.done()
		if err != nil {
			fmt.Fprintln(stderr, "billing compare: could not compare:", err)
			return exitUnreadable
		}
		if err := rep.WriteDiffs(stdout, *maxDiffs); err != nil {
			fmt.Fprintln(stderr, "billing compare:", err)
			return exitUnreadable
		}
		fmt.Fprintf(stdout, "compared: balances, windows with their adjustments, dead letters of %s\n", scope)
		fmt.Fprintln(stdout, rep.Verdict())
		if !rep.Exact() {
			return exitDifferent
		}
		return exitEqual
	})
}

// compareScope: compare reads the ledgers' servers only (no Kafka), the
// topic whose dead letters it compares, and the period settings.
func compareScope() config.Scope {
	return slices.Concat(config.MySQLSettings(), config.LogSettings(),
		config.Scope{"KAFKA_TOPIC", "BILLING_WINDOW", "BILLING_TIMEZONE", "WINDOW_CLOSE_AFTER"})
}

// compareLedgers opens both ledgers and compares them (package
// ledgercompare), this one taken as the reference; dead letters of topic,
// every topic when empty. bar, if not nil, shows the rows read.
func compareLedgers(ctx context.Context, cfg config.Config, log *slog.Logger, otherDSNs []string, topic string, bar *termProgress) (*ledgercheck.Report, error) {
	dsns, err := service.ResolveDSNs(cfg, log)
	if err != nil {
		return nil, err
	}
	resolved, err := cfg.MySQLConn().Apply(otherDSNs)
	if err != nil {
		return nil, fmt.Errorf("--other-dsn: %w", err)
	}
	this, err := openLedger(ctx, "this ledger", dsns)
	if err != nil {
		return nil, err
	}
	defer closeAll(this.DBs)
	other, err := openLedger(ctx, "the other ledger", resolved)
	if err != nil {
		return nil, err
	}
	defer closeAll(other.DBs)
	return ledgercompare.Compare(ctx, this, other, ledgercompare.Options{Topic: topic, Log: log,
		Environment: periods.Settings{Period: cfg.Period(), Close: cfg.WindowCloseAfter > 0},
		Progress: func(what string, rows int64) {
			bar.describe(what)
			bar.set(rows)
		}})
}

// openLedger opens a small pool on each server of a ledger (which names
// it in errors).
func openLedger(ctx context.Context, which string, dsns []string) (ledgercompare.Servers, error) {
	l := ledgercompare.Servers{DSNs: dsns}
	for i, dsn := range dsns {
		db, err := ledgercheck.OpenDB(ctx, dsn)
		if err != nil {
			closeAll(l.DBs)
			return ledgercompare.Servers{}, fmt.Errorf("%s, server %d: %w", which, i, mysqldriver.AccessDenied(dsn, err))
		}
		l.DBs = append(l.DBs, db)
	}
	return l, nil
}
