package integration_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/testenv"
)

// Billing periods that close (issue 14), end to end: billing-gen produces a
// workload over two years of calendar months in Europe/Berlin (late events,
// repeats, conflicts, malformed records, overflow cases), the service runs
// with windows that close and ledger entries, and billing-verify must find
// the ledger EXACT. On one partition the generator knows which events are
// late, and the split between billing_windows and window_adjustments is
// compared row by row; on several partitions, with an instance killed and
// replaced, each window is compared with its adjustment as their sum, and
// the split by the contract's invariants (see billing-verify).
func TestPeriodsVerifiedEndToEnd(t *testing.T) {
	tests := []struct {
		name       string
		partitions int
		instances  int
		kill       bool
	}{
		{"one partition, split exact", 1, 1, false},
		{"three partitions, two instances, one killed", 3, 2, true},
	}
	genBin := testenv.Binary(t, "github.com/billing/ledger/cmd/billing-gen")
	verifyBin := testenv.Binary(t, "github.com/billing/ledger/cmd/billing-verify")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, tt.partitions)
			settings := map[string]string{
				"BILLING_WINDOW": "month", "BILLING_TIMEZONE": "Europe/Berlin", "WINDOW_CLOSE_AFTER": "48h", "LEDGER_ENTRIES": "true",
			}
			var procs []*testenv.Process
			for i := range tt.instances {
				procs = append(procs, e.start(t, fmt.Sprintf("billing-%d", i+1), settings))
			}
			expected := filepath.Join(t.TempDir(), "expected.json")
			gen := testenv.Start(t, "billing-gen", genBin, nil,
				"-brokers", strings.Join(e.brokers, ","), "-topic", e.topic, "-events", "3000", "-rate", "1500",
				"-windows", "24", "-window", "month", "-timezone", "Europe/Berlin", "-close-after", "48h", "-ledger-entries",
				"-overflow-cases", "4", "-dup-ratio", "0.05", "-conflict-ratio", "0.01", "-late-ratio", "0.1", "-future-ratio", "0.005",
				"-seed", strconv.Itoa(7+tt.partitions), "-expected", expected, "-progress", "none")
			if tt.kill {
				time.Sleep(time.Second)
				procs[0].Signal(syscall.SIGKILL)
				procs = append(procs, e.start(t, "billing-3", settings))
			}
			if err := gen.Wait(t, 3*time.Minute); err != nil {
				t.Fatalf("billing-gen: %v\n%s", err, gen.Output())
			}
			exp, err := ledgercheck.ReadFile(expected)
			if err != nil {
				t.Fatal(err)
			}
			if exp.CloseAfter == 0 || exp.ClosedBefore == nil || !exp.LedgerEntries || exp.SplitExact != (tt.partitions == 1) {
				t.Fatalf("expected ledger: close after %v, closed before %v, entries %v, split exact %v", exp.CloseAfter, exp.ClosedBefore, exp.LedgerEntries, exp.SplitExact)
			}
			if exp.SplitExact && len(exp.Adjustments) == 0 {
				t.Fatal("the workload has no late event: the split is not tested")
			}
			if exp.DeadLetters["event_time_in_future"] == 0 {
				t.Fatal("the workload has no record dated in the future: the bound is not tested")
			}
			verify := testenv.Start(t, "billing-verify", verifyBin, nil,
				"-dsn", e.dsn, "-expected", expected, "-topic", e.topic, "-wait", "2m", "-interval", "500ms")
			if err := verify.Wait(t, 3*time.Minute); err != nil || !strings.Contains(verify.Output(), "\nEXACT: ") {
				t.Fatalf("billing-verify: %v\n%s", err, verify.Output())
			}
			var sealed, adjustments int
			if err := e.db.Get(&sealed, `SELECT COUNT(*) FROM billing_windows WHERE closed_at IS NOT NULL`); err != nil {
				t.Fatal(err)
			}
			if err := e.db.Get(&adjustments, `SELECT COUNT(*) FROM window_adjustments`); err != nil {
				t.Fatal(err)
			}
			if sealed == 0 || adjustments == 0 {
				t.Fatalf("%d sealed windows, %d adjustments: closing not exercised", sealed, adjustments)
			}
			t.Logf("%s", strings.TrimSpace(verify.Output()))
			for _, p := range procs {
				p.Signal(syscall.SIGTERM)
			}
		})
	}
}

// The chaos suite's audit of sealed windows (A8) sees a committed change of
// a sealed row, and not one that was rolled back: the check the long chaos
// runs with windows that close rely on.
func TestChaosAuditOfSealedWindows(t *testing.T) {
	ctx := context.Background()
	_, db := testenv.LedgerDB(t)
	if err := installAudit(ctx, db, true); err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`INSERT INTO billing_windows (account_id, currency, window_start, amount_minor, event_count, updated_at) VALUES ('a', 'EUR', '2026-11-01 00:00:00', 5, 1, UTC_TIMESTAMP(6))`)
	exec(`UPDATE billing_windows SET amount_minor = 6, event_count = 2, updated_at = UTC_TIMESTAMP(6)`) // open: not audited
	exec(`UPDATE billing_windows SET closed_at = UTC_TIMESTAMP(6), updated_at = closed_at`)             // the seal
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE billing_windows SET amount_minor = 99`); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback() // a refused checkpoint: never committed
	s, err := checkAudit(ctx, db, map[string]string{}, nil, true)
	if err != nil || s.Seals != 1 || s.ViolationCount != 0 {
		t.Fatalf("after a seal and a rolled-back change: %+v, %v", s, err)
	}
	exec(`UPDATE billing_windows SET amount_minor = 7, event_count = 3, updated_at = UTC_TIMESTAMP(6)`)
	s, err = checkAudit(ctx, db, map[string]string{}, nil, true)
	if err != nil || s.ViolationCount != 1 || !strings.Contains(s.Violations[0], "A8") {
		t.Fatalf("a committed change of a sealed row: %+v, %v", s, err)
	}
}
