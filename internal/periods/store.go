package periods

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Reader reads the ledger's period definitions as stored (driver.View
// does; ledger_periods' SQL is mysqldriver's).
type Reader interface {
	Periods(ctx context.Context) ([]driver.PeriodRow, error)
}

// Read returns the ledger's definitions, in order: none (nil) on a ledger
// no instance of this version has started on, or whose schema predates
// migration 00005.
func Read(ctx context.Context, r Reader) (Stored, error) {
	rows, err := r.Periods(ctx)
	if err != nil {
		return nil, err
	}
	return FromRows(rows)
}

// FromRows gives the stored definitions their meaning, and refuses rows
// that are not a schedule (a window or zone this version does not know,
// definitions out of order).
func FromRows(rows []driver.PeriodRow) (Stored, error) {
	out := make(Stored, len(rows))
	for i, r := range rows {
		p, err := ParsePeriod(r.Window, r.Timezone)
		if err != nil {
			return nil, fmt.Errorf("ledger_periods seq %d: %w", r.Seq, err)
		}
		out[i] = Definition{Seq: r.Seq, From: r.From, Settings: Settings{Period: p, Close: r.Close}, RecordedAt: r.RecordedAt, RecordedBy: r.RecordedBy}
	}
	if len(out) > 0 {
		if _, err := out.Schedule(); err != nil {
			return nil, fmt.Errorf("ledger_periods: %w", err)
		}
	}
	return out, nil
}

// row is what d stores.
func (d Definition) row() driver.PeriodRow {
	return driver.PeriodRow{Seq: d.Seq, From: d.From, Window: d.Period.Unit(), Timezone: d.Period.Zone(), Close: d.Close,
		RecordedAt: d.RecordedAt, RecordedBy: d.RecordedBy}
}

// sampled bounds the window starts Ensure checks per server at each end.
const sampled = 32

// Ensure is the start of an instance whose settings are instance (and
// WINDOW_CLOSE_AFTER closeAfter): it returns the ledger's definitions,
// storing instance's as the first if the ledger has none, and refuses
// (MismatchError) an instance whose settings differ from the ledger's.
//
// A ledger with rows that has none stored was built by an older version,
// with settings nobody recorded: the first instance's are stored, since
// they are what it ran with, unless its rows show otherwise. Rows can only
// show it in part, and Ensure checks what is cheap to check: the earliest
// and latest window starts on every server (through the index on
// window_start) must be window starts of instance's period, and windows
// that have closed (the frontier) need closing on. What it cannot tell: a
// period whose window starts are all window starts of the configured one
// (a ledger of days started with hours; of UTC days with months), and
// closing turned on for a ledger that never closed anything (the same as
// turning it on deliberately: windows before the watermark then close).
// by names who stores (the instance).
func Ensure(ctx context.Context, d *mysqldriver.Driver, instance Settings, closeAfter time.Duration, by string, log *slog.Logger) (Stored, error) {
	control := d.Server(0).DB()
	stored, err := Read(ctx, d.View())
	if err != nil {
		return nil, err
	}
	if len(stored) == 0 {
		problems, checked, err := checkRows(ctx, d, instance)
		if err != nil {
			return nil, err
		}
		if len(problems) > 0 {
			return nil, &MismatchError{Problems: []string{"this ledger has no period settings stored yet, and its rows disagree with this instance's: " +
				strings.Join(problems, "; ") + "; start it with the settings the ledger was built with (they are stored at the first start), or rebuild it (docs/operations.md)"}}
		}
		first := Definition{Seq: 1, Settings: instance, RecordedAt: time.Now().UTC(), RecordedBy: by}
		added, err := mysqldriver.InsertPeriod(ctx, control, first.row(), true)
		if err != nil {
			return nil, err
		}
		if stored, err = Read(ctx, d.View()); err != nil {
			return nil, err
		}
		switch {
		case added && checked > 0:
			log.Warn("stored this instance's period settings for a ledger that already has rows: they agree with every row checked, which cannot prove they are the ones it was built with (see docs/operations.md)",
				"periods", stored.Describe(), "windows_close", instance.Close, "window_starts_checked", checked)
		case added:
			log.Info("stored the ledger's period settings", "periods", stored.Describe(), "windows_close", instance.Close)
		}
	}
	if diffs := Diff(stored.Current(), instance, closeAfter); len(diffs) > 0 {
		return nil, &MismatchError{Differences: diffs}
	}
	return stored, nil
}

// Verify reports, as a MismatchError, whether the ledger's definitions are
// no longer want (billing periods change ran since the instance started).
func Verify(ctx context.Context, r Reader, want Stored) error {
	stored, err := Read(ctx, r)
	if err != nil {
		return err
	}
	if len(stored) != len(want) {
		return &MismatchError{Problems: []string{fmt.Sprintf("the ledger's period settings changed since this instance started (now %s, windows close: %v; were %s): restart it with the ledger's settings",
			stored.Describe(), len(stored) > 0 && stored.Current().Close, want.Describe())}}
	}
	return nil
}

// checkRows lists what the ledger's rows and frontier show instance cannot
// have written, and how many window starts it checked.
func checkRows(ctx context.Context, d *mysqldriver.Driver, instance Settings) ([]string, int, error) {
	var problems []string
	checked := 0
	for i := range d.Len() {
		starts, err := d.Server(i).WindowStarts(ctx, sampled)
		if err != nil {
			return nil, 0, fmt.Errorf("server %d: %w", i, err)
		}
		checked += len(starts)
		for _, s := range starts {
			if !instance.Period.Start(s).Equal(s) {
				problems = append(problems, fmt.Sprintf("billing_windows on server %d has a window starting at %s, which is not a window start of %v (BILLING_WINDOW, BILLING_TIMEZONE)",
					i, s.Format(time.RFC3339), instance.Period))
				break
			}
		}
	}
	f, _, err := d.Control().EventTime(ctx, driver.Scope{})
	if err != nil {
		return nil, 0, err
	}
	if !instance.Close && !f.Closed.IsZero() {
		problems = append(problems, fmt.Sprintf("windows of this ledger have closed (window_frontier.closed_before %s), but WINDOW_CLOSE_AFTER is empty", f.Closed.UTC().Format(time.RFC3339)))
	}
	return problems, checked, nil
}

// errDryRun rolls a dry run's transaction back.
var errDryRun = errors.New("dry run")

// Apply decides req on the ledger of d and, unless dryRun, appends its
// definition (recorded by by), in one transaction that fences every
// partition of the ledger first (mysqldriver.Control.Quiesce): no
// checkpoint prepared before it can commit after it. The caller has
// checked that no instance runs. Counted is the latest of the partitions'
// watermarks and the end of the latest window with a row on any server
// (rows of an older version whose partitions hold no watermark yet).
func Apply(ctx context.Context, d *mysqldriver.Driver, req Change, by string, dryRun bool) (Plan, Definition, error) {
	var latest time.Time
	for i := range d.Len() {
		s, err := d.Server(i).LatestWindowStart(ctx)
		if err != nil {
			return Plan{}, Definition{}, fmt.Errorf("server %d: %w", i, err)
		}
		latest = laterOf(latest, s)
	}
	var plan Plan
	var def Definition
	err := d.Control().Quiesce(ctx, func(ctx context.Context, tx *sqlx.Tx, q mysqldriver.Quiesced) error {
		rows, err := mysqldriver.ReadPeriods(ctx, tx, true)
		if err != nil {
			return err
		}
		stored, err := FromRows(rows)
		if err != nil {
			return err
		}
		counted := q.Watermark
		if !latest.IsZero() && len(stored) > 0 {
			sched, err := stored.Schedule()
			if err != nil {
				return err
			}
			counted = laterOf(counted, sched.End(latest).Add(-time.Nanosecond))
		}
		if plan, err = PlanChange(stored, req, counted, q.Frontier); err != nil {
			return err
		}
		def = plan.Definition(stored, time.Now().UTC(), by)
		if dryRun {
			return errDryRun
		}
		_, err = mysqldriver.InsertPeriod(ctx, tx, def.row(), false)
		return err
	})
	if errors.Is(err, errDryRun) {
		err = nil
	}
	return plan, def, err
}
