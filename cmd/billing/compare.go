package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/ledgercheck"
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
		if v, ok := os.LookupEnv("KAFKA_TOPIC"); ok && v != "" {
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

// compareLedgers reads both ledgers (dead letters of topic, every topic
// when empty) and compares them, this one taken as the reference. bar, if
// not nil, shows the rows read.
func compareLedgers(ctx context.Context, cfg config.Config, log *slog.Logger, otherDSNs []string, topic string, bar *termProgress) (*ledgercheck.Report, error) {
	dsns, err := service.ResolveDSNs(cfg, log)
	if err != nil {
		return nil, err
	}
	resolved, err := cfg.MySQLConn().Apply(otherDSNs)
	if err != nil {
		return nil, fmt.Errorf("--other-dsn: %w", err)
	}
	var before int64 // rows read from the ledgers before this one
	read := func(which string, dsns []string) (*ledgercheck.Actual, periods.Stored, error) {
		bar.describe("reading " + which)
		var dbs []*sqlx.DB
		defer func() { closeAll(dbs) }()
		for i, dsn := range dsns {
			db, err := ledgercheck.OpenDB(ctx, dsn)
			if err != nil {
				return nil, nil, fmt.Errorf("%s, server %d: %w", which, i, mysqldriver.AccessDenied(dsn, err))
			}
			dbs = append(dbs, db)
		}
		stored, err := periods.Read(ctx, mysqldriver.NewView(dbs[0]))
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", which, mysqldriver.AccessDenied(dsns[0], err))
		}
		var n int64
		act, err := ledgercheck.ReadActualProgress(ctx, dbs, topic, false, func(rows int64) {
			n = rows
			bar.set(before + rows)
		})
		before += n
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", which, err)
		}
		return act, stored, nil
	}
	ref, refPeriods, err := read("this ledger", dsns)
	if err != nil {
		return nil, err
	}
	act, actPeriods, err := read("the other ledger", resolved)
	if err != nil {
		return nil, err
	}
	settings, err := comparedPeriods(cfg, log, refPeriods, actPeriods)
	if err != nil {
		return nil, err
	}
	return ledgercheck.Compare(asExpected(ref, topic, settings), act), nil
}

// comparedPeriods are the period settings the two ledgers are compared
// under: the ledgers' own (stored in each, ledger_periods), which must be
// the same; this environment's only for ledgers that have none stored
// (older, never started by this version), with a warning.
func comparedPeriods(cfg config.Config, log *slog.Logger, ref, other periods.Stored) (periods.Settings, error) {
	switch {
	case len(ref) > 0 && len(other) > 0:
		if a, b := ref.Describe(), other.Describe(); a != b || ref.Current().Close != other.Current().Close {
			return periods.Settings{}, fmt.Errorf("the two ledgers have different period settings (this one: %s, windows close: %v; the other: %s, windows close: %v): their windows cannot be compared",
				a, ref.Current().Close, b, other.Current().Close)
		}
		return ref.Current(), nil
	case len(ref) > 0:
		log.Warn("the other ledger has no period settings stored; compared under this ledger's", "windows", ref.Describe())
		return ref.Current(), nil
	case len(other) > 0:
		log.Warn("this ledger has no period settings stored; compared under the other ledger's", "windows", other.Describe())
		return other.Current(), nil
	}
	log.Warn("neither ledger has period settings stored (older ledgers, never started by this version): compared under this environment's BILLING_WINDOW, BILLING_TIMEZONE and WINDOW_CLOSE_AFTER",
		"window", cfg.BillingWindow, "timezone", cfg.BillingTimezone, "window_close_after", time.Duration(cfg.WindowCloseAfter))
	return periods.Settings{Period: cfg.Period(), Close: cfg.WindowCloseAfter > 0}, nil
}

// asExpected turns the rows of a ledger into the expectation another
// ledger is compared with. Rows of one key read from two servers (which
// placement by hash never produces) are added up, so the sum is what the
// comparison sees.
func asExpected(a *ledgercheck.Actual, topic string, s periods.Settings) *ledgercheck.Expected {
	// With windows that close, which events are late depends on when each
	// ledger read which partition: each window is compared as the sum of
	// its row and its adjustment.
	exp := &ledgercheck.Expected{Version: ledgercheck.FileVersion, Topic: topic, Window: s.Period.Unit(), Timezone: s.Period.Zone(),
		WindowsClose: s.Close, DeadLetters: map[string]int64{}}
	balances := map[ledgercheck.BalanceKey]int{}
	for _, b := range a.Balances {
		if i, ok := balances[b.Key()]; ok {
			exp.Balances[i].BalanceMinor += b.BalanceMinor
			exp.Balances[i].EventCount += b.EventCount
		} else {
			balances[b.Key()] = len(exp.Balances)
			exp.Balances = append(exp.Balances, b.BalanceRow)
		}
		exp.EventsValid += b.EventCount
	}
	windows := map[ledgercheck.WindowKey]int{}
	for _, w := range append(slices.Clip(a.Windows), a.Adjustments...) {
		if i, ok := windows[w.Key()]; ok {
			exp.Windows[i].AmountMinor += w.AmountMinor
			exp.Windows[i].EventCount += w.EventCount
		} else {
			windows[w.Key()] = len(exp.Windows)
			exp.Windows = append(exp.Windows, w.WindowRow)
		}
	}
	for _, d := range a.DeadLetters {
		exp.DeadLetters[d.Reason]++
	}
	return exp
}
