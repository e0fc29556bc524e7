package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/periods"
	"github.com/billing/ledger/internal/safetext"
	"github.com/billing/ledger/internal/service"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

const periodsUsage = `Usage:
  billing periods show [--json]
  billing periods change [--window W] [--timezone Z] [--close=true|false] [--dry-run] [--by NAME]

The ledger's period settings (BILLING_WINDOW, BILLING_TIMEZONE, whether
windows close) are stored in the ledger by the first instance that starts on
it; an instance with other settings refuses to start (exit status 4).

show prints them: each definition with the instant it takes effect from,
whether windows close, the closing frontier and the latest watermark.

change changes them deliberately, with every instance stopped: it refuses
while the consumer group (KAFKA_GROUP, and every group with positions of
KAFKA_TOPIC in the ledger) has members, naming them. A new window or zone takes effect at the
first window start of the new period after the latest event time counted
and after the closing frontier: events before it keep their windows, later
ones get the new, and the last old window ends there. Closing can be turned
on; once windows have closed it cannot be turned off. Every partition is
fenced, so that nothing a stopped instance prepared can commit afterwards.
Then start the instances with the new settings.

billing periods COMMAND --help describes one command (docs/operations.md,
"Changing period settings").
`

// periodsCmd runs `billing periods ...`. It returns the exit status.
func periodsCmd(args []string, stdout, stderr io.Writer) int {
	return runSubcommand("billing periods", periodsUsage, map[string]command{
		"show": periodsShow, "change": periodsChange,
	}, args, stdout, stderr)
}

func periodsShow(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing periods show", "[--json]", "Prints the ledger's period settings (read-only; MySQL only).\n")
	asJSON := fs.Bool("json", false, "print them as JSON")
	if _, code, done := fs.parse(args, 0, stdout, stderr); done {
		return code
	}
	return withConfig(stderr, periodsShowScope(), func(ctx context.Context, cfg config.Config, log *slog.Logger) int {
		r, err := showPeriods(ctx, cfg, log)
		if err != nil {
			fmt.Fprintln(stderr, "billing periods show:", err)
			return 1
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			err = enc.Encode(r)
		} else {
			err = printPeriods(stdout, r)
		}
		if err != nil {
			fmt.Fprintln(stderr, "billing periods show:", err)
			return 1
		}
		return 0
	})
}

// periodsShowScope: show reads MySQL only (the group's watermark too).
func periodsShowScope() config.Scope {
	return slices.Concat(config.MySQLSettings(), config.LogSettings(), config.Scope{"KAFKA_TOPIC", "KAFKA_GROUP"})
}

// openControl opens the ledger's servers through the sink's driver.
func openControl(ctx context.Context, cfg config.Config, log *slog.Logger) (*mysqldriver.Driver, error) {
	dsns, err := service.ResolveDSNs(cfg, log)
	if err != nil {
		return nil, err
	}
	return mysqldriver.Open(ctx, dsns, mysqldriver.Options{LockWaitTimeout: cfg.MySQLLockWaitTimeout, MaxConns: 2})
}

// showPeriods reads the ledger's period settings and KAFKA_GROUP's
// watermark (periods.Show).
func showPeriods(ctx context.Context, cfg config.Config, log *slog.Logger) (*periods.Report, error) {
	d, err := openControl(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return periods.Show(ctx, d.View(), driver.Scope{Group: cfg.KafkaGroup, Topic: cfg.KafkaTopic})
}

func printPeriods(w io.Writer, r *periods.Report) error {
	stamp := func(t *time.Time, none string) string {
		if t == nil {
			return none
		}
		return t.Format(time.RFC3339Nano)
	}
	closing := "windows never close"
	if r.WindowsClose {
		closing = "windows close (WINDOW_CLOSE_AFTER after their end)"
	}
	fmt.Fprintf(w, "windows: %s; %s\n\n", r.Windows, closing)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tFROM\tWINDOW\tTIMEZONE\tCLOSE\tRECORDED\tBY")
	for _, d := range r.Definitions {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%v\t%s\t%s\n", d.Seq, stamp(d.From, "the beginning"), d.Window, d.Timezone, d.WindowsClose,
			d.RecordedAt.Format(time.RFC3339), safetext.Text(d.RecordedBy, 255))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nclosed before: %s, sealed before: %s; latest watermark of the group: %s\n",
		stamp(r.ClosedBefore, "-"), stamp(r.SealedBefore, "-"), stamp(r.Watermark, "-"))
	return err
}

// optional is a flag that remembers whether it was given.
type optional[T any] struct {
	set   bool
	value T
	parse func(string) (T, error)
}

func (o *optional[T]) String() string {
	if !o.set {
		return ""
	}
	return fmt.Sprint(o.value)
}

func (o *optional[T]) Set(s string) error {
	v, err := o.parse(s)
	if err != nil {
		return err
	}
	o.set, o.value = true, v
	return nil
}

func (o *optional[T]) ptr() *T {
	if !o.set {
		return nil
	}
	return &o.value
}

// boolFlag lets --close stand alone for --close=true.
type boolFlag struct{ optional[bool] }

func (b *boolFlag) IsBoolFlag() bool { return true }

func periodsChange(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing periods change", "[--window W] [--timezone Z] [--close=true|false] [--dry-run] [--by NAME]",
		`Changes the ledger's period settings, with every instance stopped (it refuses
while KAFKA_GROUP, or any group with positions of KAFKA_TOPIC in the ledger,
has members).
Flags not given keep the ledger's value. A new window or zone takes effect at
the first window start of the new period after the latest event time counted
and after the closing frontier; the last old window ends there; counted events
and sealed rows keep their windows. --close=true turns closing on (windows
before the watermark minus WINDOW_CLOSE_AFTER then close); --close=false is
refused once windows have closed. Every partition is fenced (its epoch
raised). Exit status 0 changed, 1 refused or failed, 2 usage.
`)
	window := &optional[string]{parse: func(s string) (string, error) { return s, nil }}
	zone := &optional[string]{parse: func(s string) (string, error) { return s, nil }}
	closeFlag := &boolFlag{optional[bool]{parse: func(s string) (bool, error) {
		switch s {
		case "true", "1":
			return true, nil
		case "false", "0":
			return false, nil
		}
		return false, fmt.Errorf("invalid boolean %q", s)
	}}}
	fs.Var(window, "window", "the new BILLING_WINDOW: a duration (1h), day or month")
	fs.Var(zone, "timezone", "the new BILLING_TIMEZONE (IANA zone) of day and month windows")
	fs.Var(closeFlag, "close", "whether windows close (true turns closing on)")
	dryRun := fs.Bool("dry-run", false, "say what would change, change nothing")
	by := fs.String("by", defaultOperator(), "who changes: recorded in ledger_periods")
	if _, code, done := fs.parse(args, 0, stdout, stderr); done {
		return code
	}
	if !window.set && !zone.set && !closeFlag.set {
		return fs.fail(stderr, errors.New("give --window, --timezone or --close"))
	}
	if *by == "" || len(*by) > 200 {
		return fs.fail(stderr, errors.New("--by must be 1 to 200 characters"))
	}
	req := periods.Change{Window: window.ptr(), Timezone: zone.ptr(), Close: closeFlag.ptr()}
	// Kafka too: the change is refused while the groups have members.
	return withConfig(stderr, statusScope(), func(ctx context.Context, cfg config.Config, log *slog.Logger) int {
		plan, def, err := changePeriods(ctx, cfg, log, req, "billing periods change by "+*by, *dryRun)
		if err != nil {
			fmt.Fprintln(stderr, "billing periods change:", err)
			return 1
		}
		printPlan(stdout, plan, def, *dryRun)
		return 0
	})
}

// changePeriods applies req once Kafka says no instance runs
// (periods.ChangeStopped).
func changePeriods(ctx context.Context, cfg config.Config, log *slog.Logger, req periods.Change, by string, dryRun bool) (periods.Plan, periods.Definition, error) {
	kopts, err := cfg.KafkaConn().Opts()
	if err != nil {
		return periods.Plan{}, periods.Definition{}, err
	}
	d, err := openControl(ctx, cfg, log)
	if err != nil {
		return periods.Plan{}, periods.Definition{}, err
	}
	defer d.Close()
	cl, err := kgo.NewClient(append(kopts, kgo.WithLogger(kgo.BasicLogger(io.Discard, kgo.LogLevelNone, nil)))...)
	if err != nil {
		return periods.Plan{}, periods.Definition{}, err
	}
	defer cl.Close()
	return periods.ChangeStopped(ctx, d, kadm.NewClient(cl), cfg.KafkaGroup, cfg.KafkaTopic, req, by, dryRun)
}

func printPlan(w io.Writer, p periods.Plan, def periods.Definition, dryRun bool) {
	verb := "changed"
	if dryRun {
		verb = "would change (dry run, nothing changed)"
	}
	closing := func(c bool) string {
		if c {
			return "windows close"
		}
		return "windows never close"
	}
	fmt.Fprintf(w, "%s: %v, %s -> %v, %s\n", verb, p.Previous.Period, closing(p.Previous.Close), p.Next.Period, closing(p.Next.Close))
	switch {
	case p.PeriodChanged() && p.From.IsZero():
		fmt.Fprintf(w, "nothing was counted yet: %v applies from the beginning\n", p.Next.Period)
	case p.PeriodChanged():
		fmt.Fprintf(w, "from %s on events get %v windows; before it they keep %v (the last of them ends there); counted or closed so far: up to %s\n",
			p.From.Format(time.RFC3339), p.Next.Period, p.Previous.Period, p.Counted.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
	default:
		fmt.Fprintln(w, "the windows stay as they are")
	}
	fmt.Fprintf(w, "definition %d, recorded by %s; start the instances with BILLING_WINDOW=%s BILLING_TIMEZONE=%s and WINDOW_CLOSE_AFTER %s\n",
		def.Seq, safetext.Text(def.RecordedBy, 255), p.Next.Period.Unit(), p.Next.Period.Zone(), map[bool]string{true: "set", false: "empty"}[p.Next.Close])
}
