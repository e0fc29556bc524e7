package ledgercompare

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/periods"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Ledger is what a comparison reads of one ledger.
type Ledger interface {
	// Rows reads its balances, windows, adjustments and dead letters (of
	// topic; of every topic when empty), calling rows, if not nil, with
	// the number of rows read so far.
	Rows(ctx context.Context, topic string, rows func(n int64)) (*ledgercheck.Actual, error)
	// Periods reads its period settings (none stored: empty).
	Periods(ctx context.Context) (periods.Stored, error)
}

// Servers is a ledger on MySQL: the pools of its servers, the control
// server first (ledgercheck.OpenDB), and their DSNs, which name the
// account of a refusal (never shown with a password).
type Servers struct {
	DBs  []*sqlx.DB
	DSNs []string
}

// Rows reads every server, each in one snapshot (ledgercheck.ReadActual).
func (s Servers) Rows(ctx context.Context, topic string, rows func(n int64)) (*ledgercheck.Actual, error) {
	return ledgercheck.ReadActualProgress(ctx, s.DBs, topic, false, rows)
}

// Periods reads ledger_periods on the control server.
func (s Servers) Periods(ctx context.Context) (periods.Stored, error) {
	stored, err := periods.Read(ctx, mysqldriver.NewView(s.DBs[0]))
	if err != nil {
		return nil, mysqldriver.AccessDenied(s.DSNs[0], err)
	}
	return stored, nil
}

// Options are a comparison's.
type Options struct {
	// Topic: the dead letters of this topic are compared; of every topic
	// when empty.
	Topic string
	// Environment are the period settings of the environment, for ledgers
	// that have none stored.
	Environment periods.Settings
	// Log receives the warnings; slog.Default() when nil.
	Log *slog.Logger
	// Progress, if not nil, is told what is read and how many rows of
	// both ledgers were read so far (called from the reading goroutine).
	Progress func(what string, rows int64)
}

// Compare reads both ledgers, this one first, and compares them, this one
// taken as the reference. An error means no comparison could be made (a
// ledger could not be read, or their period settings differ).
func Compare(ctx context.Context, this, other Ledger, o Options) (*ledgercheck.Report, error) {
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	progress := o.Progress
	if progress == nil {
		progress = func(string, int64) {}
	}
	var before int64 // rows read from the ledgers before this one
	read := func(which string, l Ledger) (*ledgercheck.Actual, periods.Stored, error) {
		what := "reading " + which
		progress(what, before)
		stored, err := l.Periods(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", which, err)
		}
		var n int64
		act, err := l.Rows(ctx, o.Topic, func(rows int64) {
			n = rows
			progress(what, before+rows)
		})
		before += n
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", which, err)
		}
		return act, stored, nil
	}
	ref, refPeriods, err := read("this ledger", this)
	if err != nil {
		return nil, err
	}
	act, actPeriods, err := read("the other ledger", other)
	if err != nil {
		return nil, err
	}
	settings, err := comparedPeriods(o.Environment, log, refPeriods, actPeriods)
	if err != nil {
		return nil, err
	}
	return ledgercheck.Compare(asExpected(ref, o.Topic, settings), act), nil
}

// comparedPeriods are the period settings the two ledgers are compared
// under: the ledgers' own (stored in each, ledger_periods), which must be
// the same; env only for ledgers that have none stored (older, never
// started by this version), with a warning.
func comparedPeriods(env periods.Settings, log *slog.Logger, ref, other periods.Stored) (periods.Settings, error) {
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
		"window", env.Period.Unit(), "timezone", env.Period.Zone(), "windows_close", env.Close)
	return env, nil
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
