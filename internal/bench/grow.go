package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/service"
)

// Growing while counting (the add-server variant): the service mode on
// the default workload, its ledger on one database of -mysql-dsn, the
// service configured already with an empty database of -mysql2-dsn last
// in MYSQL_SHARD_DSNS (accepted, unused until a move begins). Once half
// the backlog is committed (childSpec.MarkAt), the parent runs `billing
// shards add --dsn <that database>` as an operator would, with the
// service's settings. The catch-up's events/s before the move and during
// it come from the catch-up's checkpoints (moveRates); when the catch-up
// ends first, the live phase runs while the move does (ending with it if
// it ends first), so that its end-to-end latency is the move's. At the end the ledger must be
// exact over both databases, no row on both.

// liveAccountSuffix marks the accounts of the variant's live phase: the
// generator's expectation holds only the backlog's, so the check at the
// end, after the live phase, leaves them out. A suffix, so that in the
// keys' byte order, the move's, each one is next to the backlog's account
// of its name: the move's steps freeze them as often.
const liveAccountSuffix = "-live"

// seriesPoint is one committed checkpoint of a catch-up.
type seriesPoint struct {
	EndNs   int64 `json:"end_ns"`
	Records int   `json:"records"`
}

// growResult is what the add-server variant measures beside the service
// mode's figures.
type growResult struct {
	StepRows  int     `json:"step_rows,omitempty"`        // --step-rows given (0: the command's default)
	Rest      float64 `json:"rest,omitempty"`             // --rest given (0: the command's default)
	RestCkpts int     `json:"rest_checkpoints,omitempty"` // --rest-checkpoints given (0: the command's default)
	AtRecords int64   `json:"started_at_records"`         // catch-up records committed when the move started
	rates
	// The command: its wall time, and what its last line says.
	MoveS     float64 `json:"move_s"`
	Slots     int     `json:"slots"`
	RowsMoved int64   `json:"rows_moved"`
	Steps     int     `json:"steps"`
	LongestMs float64 `json:"longest_step_ms"`
	MovingS   float64 `json:"moving_s"` // first step's start to last step's end
	RowsPerS  float64 `json:"rows_per_s"`
	// LiveDuring: the live phase began while the move ran (its e2e
	// figures are the move's), and ran LiveS seconds, ending with the move
	// if that came first; LiveEndS is how long the move ran after the
	// live phase ended (negative: it ended first). BoundMs is
	// CHECKPOINT_INTERVAL + 1 s, the bound its e2e p99 is held to.
	LiveDuring bool    `json:"live_during_move"`
	LiveS      float64 `json:"live_s"`
	LiveEndS   float64 `json:"move_after_live_s"`
	BoundMs    float64 `json:"e2e_bound_ms"`
	// Ledger: the check at the end over both databases.
	Ledger string `json:"ledger"`
	Exact  bool   `json:"exact"`
	Err    string `json:"error,omitempty"`
}

// addLine is the last line of billing shards add.
var addLine = regexp.MustCompile(`complete: (\d+) slot\(s\) on the new server, (\d+) row\(s\) moved by this run in (\d+) step\(s\) \(longest ([^,]+), moving ([^)]+)\)\s*$`)

// parseAddOutput reads the figures of billing shards add's last line
// into g.
func parseAddOutput(out string, g *growResult) error {
	out = strings.TrimSpace(out)
	last := out[strings.LastIndexByte(out, '\n')+1:]
	sm := addLine.FindStringSubmatch(last)
	if sm == nil {
		return fmt.Errorf("billing shards add printed no summary line: %q", last)
	}
	longest, err := time.ParseDuration(sm[4])
	if err != nil {
		return fmt.Errorf("the summary's longest step: %w", err)
	}
	moving, err := time.ParseDuration(sm[5])
	if err != nil {
		return fmt.Errorf("the summary's moving time: %w", err)
	}
	g.Slots, _ = strconv.Atoi(sm[1])
	g.RowsMoved, _ = strconv.ParseInt(sm[2], 10, 64)
	g.Steps, _ = strconv.Atoi(sm[3])
	g.LongestMs, g.MovingS = ms(longest), moving.Seconds()
	if g.MovingS > 0 {
		g.RowsPerS = float64(g.RowsMoved) / g.MovingS
	}
	return nil
}

// moveRates is a catch-up's events/s (points in commit order) before the
// move that ran from start to end and during it. Before: the records of
// the checkpoints after the first, committed by start, over the time from
// the first one's end (summarize's rule: start-up left out); during: the
// records of those committed after start, by end or the catch-up's last
// checkpoint if it came first, over that time. A zero end is the
// catch-up's end.
func moveRates(points []seriesPoint, start, end time.Time) rates {
	var r rates
	if len(points) == 0 {
		return r
	}
	at := func(p seriesPoint) time.Time { return time.Unix(0, p.EndNs) }
	sum := func(from, to time.Time) (n int64, k int) {
		for _, p := range points {
			if t := at(p); t.After(from) && !t.After(to) {
				n, k = n+int64(p.Records), k+1
			}
		}
		return n, k
	}
	first, last := at(points[0]), at(points[len(points)-1])
	if span := start.Sub(first); span > 0 {
		n, k := sum(first, start)
		r.Before, r.BeforeN = float64(n)/span.Seconds(), k
	}
	to := last
	if !end.IsZero() && end.Before(last) {
		to = end
	}
	if span := to.Sub(start); span > 0 {
		n, k := sum(start, to)
		r.During, r.DuringN, r.OverlapS = float64(n)/span.Seconds(), k, span.Seconds()
	}
	if r.Before > 0 {
		r.Ratio = r.During / r.Before
	}
	return r
}

// recordRates is moveRates split at a count of records instead of a
// time: before, the checkpoints until at records were committed; after,
// the rest of the catch-up. Over the default variant's catch-up with the
// add-server variant's AtRecords, it is what the same records give
// without a move: the catch-up slows as its tables grow, move or not.
func recordRates(points []seriesPoint, at int64) rates {
	var n int64
	for i, p := range points {
		if n += int64(p.Records); n >= at {
			return moveRates(points, time.Unix(0, points[i].EndNs), time.Time{})
		}
	}
	return rates{}
}

// rates are a catch-up's events/s before a move and during it, with the
// checkpoints each one counts, and the seconds of the catch-up the move
// overlapped (the span of During).
type rates struct {
	Before   float64 `json:"events_per_s_before"`
	BeforeN  int     `json:"checkpoints_before"`
	During   float64 `json:"events_per_s_during"`
	DuringN  int     `json:"checkpoints_during"`
	Ratio    float64 `json:"during_over_before"`
	OverlapS float64 `json:"catch_up_during_move_s"`
}

// dropAccounts removes from act the rows of the accounts whose id ends in
// suffix.
func dropAccounts(act *ledgercheck.Actual, suffix string) {
	act.Balances = slices.DeleteFunc(act.Balances, func(r ledgercheck.ActualBalance) bool { return strings.HasSuffix(r.AccountID, suffix) })
	drop := func(r ledgercheck.ActualWindow) bool { return strings.HasSuffix(r.AccountID, suffix) }
	act.Windows = slices.DeleteFunc(act.Windows, drop)
	act.Adjustments = slices.DeleteFunc(act.Adjustments, drop)
}

// storeOneServerLayout opens the ledger of dsn as an instance does, on that
// server alone: its layout is stored with one server, before the service
// starts with the server to add listed after it.
func storeOneServerLayout(ctx context.Context, env map[string]string, brokers []string, dsn string) error {
	cfg, err := serviceConfig(env, brokers, dsn)
	if err != nil {
		return err
	}
	cfg.MySQLShardDSNs = nil
	l, err := service.OpenLedger(ctx, cfg, []string{dsn}, nil, quietLogger(), nil)
	if err != nil {
		return fmt.Errorf("storing the one-server layout: %w", err)
	}
	l.Close()
	return nil
}

// mover is one run of billing shards add.
type mover struct {
	cmd          *exec.Cmd
	out          bytes.Buffer
	started, end time.Time
	done         chan struct{}
	err          error
}

// startMover runs `bin shards add --dsn dsn` with the service's settings
// (env: its variant's and -service-env, over this process's environment)
// on the ledger of ledgerDSN alone, its output to logf.
func startMover(ctx context.Context, o *options, bin string, env map[string]string, topic, group, ledgerDSN, dsn string, logf io.Writer) (*mover, error) {
	args := []string{"shards", "add", "--dsn", dsn}
	if o.GrowStepRows > 0 {
		args = append(args, "--step-rows", strconv.Itoa(o.GrowStepRows))
	}
	if o.GrowRest != 0 {
		args = append(args, "--rest", strconv.FormatFloat(max(o.GrowRest, 0), 'g', -1, 64))
	}
	if o.GrowRestCkpts != 0 {
		args = append(args, "--rest-checkpoints", strconv.Itoa(max(o.GrowRestCkpts, 0)))
	}
	m := &mover{cmd: exec.CommandContext(ctx, bin, args...), done: make(chan struct{})}
	m.cmd.Env = os.Environ()
	for k, v := range env {
		m.cmd.Env = append(m.cmd.Env, k+"="+v)
	}
	m.cmd.Env = append(m.cmd.Env, "KAFKA_BROKERS="+strings.Join(o.Brokers, ","), "KAFKA_TOPIC="+topic, "KAFKA_GROUP="+group,
		"MYSQL_DSN="+ledgerDSN, "MYSQL_SHARD_DSNS=")
	m.cmd.Stdout = io.MultiWriter(&m.out, logf)
	m.cmd.Stderr = logf
	fmt.Fprintf(logf, "== %s %s\n", bin, strings.Join(args, " "))
	m.started = time.Now()
	if err := m.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		m.err = m.cmd.Wait()
		m.end = time.Now()
		close(m.done)
	}()
	return m, nil
}

// running says whether the move has not ended yet.
func (m *mover) running() bool {
	select {
	case <-m.done:
		return false
	default:
		return true
	}
}

// wait waits for the move to end (killing it after timeout) and returns
// its error.
func (m *mover) wait(timeout time.Duration) error {
	select {
	case <-m.done:
	case <-time.After(timeout):
		_ = m.cmd.Process.Kill()
		<-m.done
		return fmt.Errorf("billing shards add did not end within %s (killed)", timeout)
	}
	if m.err != nil {
		return fmt.Errorf("billing shards add: %w: %s", m.err, lastLine(m.out.String()))
	}
	return nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// growLines reports each add-server measurement: the rates before and
// during the move and their ratio against 0.7, the e2e p99 during it
// against CHECKPOINT_INTERVAL + 1 s, the move's own figures and the check.
func growLines(ms []measurement) string {
	var b strings.Builder
	for _, m := range ms {
		g := m.Grow
		if g == nil {
			continue
		}
		verdict := func(ok bool) string {
			if ok {
				return "met"
			}
			return "NOT MET"
		}
		e2e := fmt.Sprintf("e2e during the move p50 %s p99 %s over a live phase of %.0fs, the move ending %.0fs after it (bound CHECKPOINT_INTERVAL + 1 s = %s: %s)",
			fmtMs(m.Result.LatP50), fmtMs(m.Result.LatP99), g.LiveS, g.LiveEndS, fmtMs(g.BoundMs), verdict(m.Result.LatP99 > 0 && m.Result.LatP99 < g.BoundMs))
		if !g.LiveDuring {
			e2e = fmt.Sprintf("e2e NOT measured during the move (it ended before the catch-up did; p99 after it %s)", fmtMs(m.Result.LatP99))
		}
		settings := "--step-rows " + map[bool]string{true: strconv.Itoa(g.StepRows), false: "default"}[g.StepRows > 0] +
			" --rest " + map[bool]string{true: strconv.FormatFloat(max(g.Rest, 0), 'g', -1, 64), false: "default"}[g.Rest != 0] +
			" --rest-checkpoints " + map[bool]string{true: strconv.Itoa(max(g.RestCkpts, 0)), false: "default"}[g.RestCkpts != 0]
		fmt.Fprintf(&b, "%s %s #%d: move started at %d records; catch-up %s events/s before it (%d checkpoints), %s during it (%d checkpoints over %.1fs) = %.2f × (target ≥ 0.70: %s); %s; the move (%s): %d rows moved in %d steps, %.1fs moving (%s rows/s), longest step %s, %d slots, %.1fs in all; ledger over both databases: %s\n",
			m.Variant, m.Mode, m.Rep, g.AtRecords, fmtRate(g.Before), g.BeforeN, fmtRate(g.During), g.DuringN, g.OverlapS, g.Ratio, verdict(g.Ratio >= 0.7), e2e,
			settings, g.RowsMoved, g.Steps, g.MovingS, fmtRate(g.RowsPerS), fmtMs(g.LongestMs), g.Slots, g.MoveS, g.Ledger)
		if c, ok := withoutMove(ms, m); ok {
			fmt.Fprintf(&b, "   without a move (the default variant's %s #%d, split at the same records): %s events/s before, %s after = %.2f ×; during the move ÷ the same records without it: %.2f ×\n",
				c.Mode, c.Rep, fmtRate(c.rates.Before), fmtRate(c.rates.During), c.rates.Ratio, g.During/c.rates.During)
		}
		if g.Err != "" {
			fmt.Fprintf(&b, "   FAILED: %s\n", g.Err)
		}
	}
	return b.String()
}

// control is a catch-up without a move split as one with a move was.
type control struct {
	Mode  string
	Rep   int
	rates rates
}

// withoutMove is the default variant's catch-up of m's mode (its
// repetition, else the first) split at the records m's move started at.
func withoutMove(ms []measurement, m measurement) (control, bool) {
	var found *measurement
	for i := range ms {
		d := &ms[i]
		if d.Variant != "default" || d.Mode != m.Mode || len(d.Result.Series) == 0 {
			continue
		}
		if found == nil || d.Rep == m.Rep {
			found = d
		}
	}
	if found == nil {
		return control{}, false
	}
	r := recordRates(found.Result.Series, m.Grow.AtRecords)
	return control{Mode: found.Mode, Rep: found.Rep, rates: r}, r.Ratio > 0
}

// growFailures is an error naming each add-server measurement whose move
// failed or whose ledger is not exact over both databases: the run fails
// loudly (after its table is written).
func growFailures(ms []measurement) error {
	var errs []error
	for _, m := range ms {
		if g := m.Grow; g != nil && (!g.Exact || g.Err != "") {
			errs = append(errs, fmt.Errorf("%s %s #%d: ledger %s; %s", m.Variant, m.Mode, m.Rep, g.Ledger, g.Err))
		}
	}
	return errors.Join(errs...)
}

// growRun is the add-server variant's side of one service measurement.
type growRun struct {
	res        *growResult
	dsnA, dsnB string    // the ledger's database and the one added (plain DSNs)
	mv         *mover    // nil until the move begins
	liveEnd    time.Time // when the live phase stopped producing
}

// finish waits for the move, takes its figures and the rates of the
// catch-up r, and checks the ledger over both databases.
func (g *growRun) finish(ctx context.Context, o *options, dbName, expected, topic string, r childResult) {
	res := g.res
	var errs []string
	if g.mv == nil {
		errs = append(errs, "the move never began (the catch-up did not report half the backlog counted)")
	} else {
		if err := g.mv.wait(o.Timeout); err != nil {
			errs = append(errs, err.Error())
		} else if err := parseAddOutput(g.mv.out.String(), res); err != nil {
			errs = append(errs, err.Error())
		}
		res.MoveS = g.mv.end.Sub(g.mv.started).Seconds()
		res.rates = moveRates(r.Series, g.mv.started, g.mv.end)
		if res.LiveDuring {
			res.LiveEndS = g.mv.end.Sub(g.liveEnd).Seconds()
		}
	}
	res.Ledger = check(ctx, []string{o.Admin, o.Admin2}, dbName, expected, topic, liveAccountSuffix)
	res.Exact = res.Ledger == "exact"
	if !res.Exact {
		errs = append(errs, "the ledger is NOT exact over both databases after the move: "+res.Ledger)
	}
	res.Err = strings.Join(errs, "; ")
}
