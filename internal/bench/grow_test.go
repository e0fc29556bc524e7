package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/ledgercheck"
)

// TestParseAddOutput: the figures of billing shards add's last line (its
// format in cmd/billing/shards.go), after its other output; rows/s is rows
// over the moving time; output without the line is an error.
func TestParseAddOutput(t *testing.T) {
	out := "some log line\nlayout version 2: 2 servers (a, b) complete: 2048 slot(s) on the new server, 494230 row(s) moved by this run in 167 step(s) (longest 3.947s, moving 2m3.3s)\n"
	var g growResult
	if err := parseAddOutput(out, &g); err != nil {
		t.Fatal(err)
	}
	if g.Slots != 2048 || g.RowsMoved != 494230 || g.Steps != 167 || g.LongestMs != 3947 || g.MovingS != 123.3 {
		t.Errorf("parsed %+v", g)
	}
	if want := 494230 / 123.3; g.RowsPerS < want-0.01 || g.RowsPerS > want+0.01 {
		t.Errorf("rows/s %.2f, want %.2f", g.RowsPerS, want)
	}
	if err := parseAddOutput("layout complete: 1 slot(s)\n", &growResult{}); err == nil {
		t.Error("a line without the figures parsed")
	}
	// The summary must be the last line: an earlier one is not the run's.
	if err := parseAddOutput(out+"billing shards add: failed\n", &growResult{}); err == nil {
		t.Error("a summary followed by an error parsed")
	}
}

// TestMoveRates: before the move, the checkpoints after the first up to
// its start over the time since the first; during it, those after its
// start up to its end, or up to the catch-up's last checkpoint when that
// came first.
func TestMoveRates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64, n int) seriesPoint {
		return seriesPoint{EndNs: t0.Add(time.Duration(s * float64(time.Second))).UnixNano(), Records: n}
	}
	// 1000 records/s for 4 s after the first checkpoint, then 500/s.
	points := []seriesPoint{at(1, 5000), at(2, 1000), at(3, 1000), at(4, 1000), at(5, 1000), at(7, 1000), at(9, 1000), at(11, 1000)}
	// The move from 5 s to 9 s: 2000 records in 4 s.
	r := moveRates(points, t0.Add(5*time.Second), t0.Add(9*time.Second))
	if r.Before != 1000 || r.BeforeN != 4 || r.During != 500 || r.DuringN != 2 || r.Ratio != 0.5 || r.OverlapS != 4 {
		t.Errorf("move 5 s–9 s: %+v", r)
	}
	// A move that outlasts the catch-up: during it up to the last
	// checkpoint (11 s), 3000 records in 6 s.
	r = moveRates(points, t0.Add(5*time.Second), t0.Add(60*time.Second))
	if r.During != 500 || r.DuringN != 3 || r.OverlapS != 6 {
		t.Errorf("move 5 s–60 s: %+v", r)
	}
	// A move that has not ended: the same.
	if r2 := moveRates(points, t0.Add(5*time.Second), time.Time{}); r2 != r {
		t.Errorf("move without an end: %+v, want %+v", r2, r)
	}
	if r := moveRates(nil, t0, t0.Add(time.Second)); r != (rates{}) {
		t.Errorf("no checkpoints: %+v", r)
	}
}

// TestRecordRates: a catch-up without a move split at a count of records:
// before, up to the checkpoint that reached it; after, the rest. The
// add-server report sets the default variant's beside its own.
func TestRecordRates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64, n int) seriesPoint {
		return seriesPoint{EndNs: t0.Add(time.Duration(s * float64(time.Second))).UnixNano(), Records: n}
	}
	points := []seriesPoint{at(1, 5000), at(2, 1000), at(3, 1000), at(4, 1000), at(5, 1000), at(7, 1000), at(9, 1000), at(11, 1000)}
	// 9000 records were committed at 5 s.
	r := recordRates(points, 9000)
	if r.Before != 1000 || r.BeforeN != 4 || r.During != 500 || r.DuringN != 3 || r.Ratio != 0.5 {
		t.Errorf("split at 9000 records: %+v", r)
	}
	if r := recordRates(points, 1e9); r != (rates{}) {
		t.Errorf("split past the catch-up: %+v", r)
	}
	def := measurement{Variant: "default", Mode: modeService, Rep: 1, Result: childResult{Series: points}}
	m := measurement{Variant: "add-server", Mode: modeService, Rep: 1,
		Grow: &growResult{AtRecords: 9000, rates: rates{Before: 1000, During: 400, Ratio: 0.4}, Ledger: "exact", Exact: true}}
	if out := growLines([]measurement{def, m}); !strings.Contains(out, "= 0.50 ×; during the move ÷ the same records without it: 0.80 ×") {
		t.Errorf("the report beside the default variant's catch-up:\n%s", out)
	}
}

// TestDropAccounts: the live phase's accounts leave every table of the
// check, the backlog's stay.
func TestDropAccounts(t *testing.T) {
	bal := func(acct string) ledgercheck.ActualBalance {
		return ledgercheck.ActualBalance{BalanceRow: ledgercheck.BalanceRow{AccountID: acct}}
	}
	win := func(acct string) ledgercheck.ActualWindow {
		return ledgercheck.ActualWindow{WindowRow: ledgercheck.WindowRow{AccountID: acct}}
	}
	act := &ledgercheck.Actual{
		Balances:    []ledgercheck.ActualBalance{bal("acct-000001"), bal("acct-000001" + liveAccountSuffix)},
		Windows:     []ledgercheck.ActualWindow{win("acct-000002" + liveAccountSuffix), win("acct-000002")},
		Adjustments: []ledgercheck.ActualWindow{win("acct-000003" + liveAccountSuffix)},
	}
	dropAccounts(act, liveAccountSuffix)
	if len(act.Balances) != 1 || act.Balances[0].AccountID != "acct-000001" || len(act.Windows) != 1 || act.Windows[0].AccountID != "acct-000002" || len(act.Adjustments) != 0 {
		t.Errorf("after dropping the live accounts: %+v", act)
	}
}

// TestGrowFailures: a move that failed or a ledger not exact over both
// servers fails the run, naming the measurement; an exact one does not.
func TestGrowFailures(t *testing.T) {
	ok := measurement{Variant: "add-server", Mode: modeService, Rep: 1, Grow: &growResult{Ledger: "exact", Exact: true}}
	if err := growFailures([]measurement{ok, {Variant: "default"}}); err != nil {
		t.Errorf("an exact move failed the run: %v", err)
	}
	bad := measurement{Variant: "add-server", Mode: modeService, Rep: 2, Grow: &growResult{Ledger: "3 lost, 0 twice"}}
	if err := growFailures([]measurement{ok, bad}); err == nil || !strings.Contains(err.Error(), "#2") || !strings.Contains(err.Error(), "3 lost") {
		t.Errorf("a ledger not exact: %v", err)
	}
	failed := measurement{Variant: "add-server", Mode: modeService, Rep: 1, Grow: &growResult{Ledger: "exact", Exact: true, Err: "billing shards add: exit status 1"}}
	if err := growFailures([]measurement{failed}); err == nil {
		t.Error("a failed move did not fail the run")
	}
}

// TestGrowLines: the report holds the ratio against 0.7 and the e2e p99
// against CHECKPOINT_INTERVAL + 1 s, each met or not, and says so when
// the live phase did not run during the move.
func TestGrowLines(t *testing.T) {
	m := measurement{Variant: "add-server", Mode: modeService, Rep: 1,
		Result: childResult{LatP50: 700, LatP99: 2500},
		Grow:   &growResult{rates: rates{Before: 1000, During: 800, Ratio: 0.8}, LiveDuring: true, LiveS: 15, BoundMs: 2000, Ledger: "exact", Exact: true}}
	out := growLines([]measurement{m})
	if !strings.Contains(out, "= 0.80 × (target ≥ 0.70: met)") || !strings.Contains(out, "p99 2500 ms") || !strings.Contains(out, "= 2000 ms: NOT MET)") {
		t.Errorf("ratio 0.8 met, p99 2.5 s over 2 s not:\n%s", out)
	}
	m.Grow.Ratio, m.Result.LatP99 = 0.5, 1500
	out = growLines([]measurement{m})
	if !strings.Contains(out, "(target ≥ 0.70: NOT MET)") || !strings.Contains(out, "= 2000 ms: met)") {
		t.Errorf("ratio 0.5 not met, p99 1.5 s met:\n%s", out)
	}
	m.Grow.LiveDuring = false
	if out = growLines([]measurement{m}); !strings.Contains(out, "e2e NOT measured during the move") {
		t.Errorf("a live phase after the move reported as during it:\n%s", out)
	}
}
