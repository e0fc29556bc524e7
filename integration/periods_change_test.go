package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/testenv"
)

// The ledger's period settings are the ledger's (issue 18, item 3), through
// the binary: stored at the first start; an instance with another window,
// or without closing, refuses to start with exit status 4 naming each
// setting; billing periods change refuses while an instance runs, naming
// it, and with every instance stopped changes the window from the first
// window start of the new period after the watermark: events before it
// keep their (hourly) windows, the closed ones stay sealed and unchanged,
// later events get Berlin days. Closing cannot be turned off once windows
// closed. billing status shows the ledger's settings, and billing compare
// takes them from the ledgers, not from its environment.
func TestPeriodSettingsAreTheLedgers(t *testing.T) {
	e := newTestEnv(t, 2)
	ctx := context.Background()
	hourly := map[string]string{"BILLING_WINDOW": "1h", "WINDOW_CLOSE_AFTER": "1h"}
	cli := func(extra map[string]string, args ...string) (string, int) {
		t.Helper()
		p := testenv.Start(t, "billing "+strings.Join(args, " "), e.bin, e.serviceEnv(extra), args...)
		err := p.Wait(t, 2*time.Minute)
		var ee *exec.ExitError
		switch {
		case err == nil:
			return p.Output(), 0
		case errors.As(err, &ee):
			return p.Output(), ee.ExitCode()
		}
		t.Fatalf("billing %v: %v", args, err)
		return "", -1
	}
	produce := func(evs ...billingEvent) {
		t.Helper()
		var recs []*kgo.Record
		for _, ev := range evs {
			b, _ := json.Marshal(ev)
			recs = append(recs, &kgo.Record{Key: []byte(ev.Account), Value: b})
		}
		testenv.Produce(t, e.brokers, e.topic, recs...)
	}
	counted := func(want int64) {
		t.Helper()
		testenv.Eventually(t, time.Minute, "events counted", func() (bool, string) {
			_, n := ledger(t, e.db)
			return n == want, fmt.Sprintf("%d counted, want %d", n, want)
		})
	}

	first := e.start(t, "billing-1", hourly)
	produce(
		billingEvent{"p-1", "acct-a", 10, "EUR", "2026-11-29T10:05:00Z"},
		billingEvent{"p-2", "acct-b", 20, "EUR", "2026-11-29T11:10:00Z"},
		billingEvent{"p-3", "acct-a", 30, "EUR", "2026-11-29T13:30:00Z"}, // closes 10:00 and 11:00
	)
	counted(3)
	testenv.Eventually(t, time.Minute, "10:00 and 11:00 sealed", func() (bool, string) {
		var n int
		_ = e.db.Get(&n, `SELECT COUNT(*) FROM billing_windows WHERE closed_at IS NOT NULL`)
		return n == 2, fmt.Sprintf("%d sealed", n)
	})
	sealedBefore := sealedRows(t, e.db)

	// Other settings refuse to start, naming each.
	out, code := cli(map[string]string{"BILLING_WINDOW": "day", "WINDOW_CLOSE_AFTER": "1h"})
	t.Logf("an instance with other settings:\n%s", out)
	if code != 4 || !strings.Contains(out, "BILLING_WINDOW is 1h0m0s in the ledger, day here") {
		t.Fatalf("an instance with day windows: exit %d\n%s", code, out)
	}
	out, code = cli(map[string]string{"BILLING_WINDOW": "1h", "WINDOW_CLOSE_AFTER": ""})
	if code != 4 || !strings.Contains(out, "WINDOW_CLOSE_AFTER is set (windows close) in the ledger, empty (windows never close) here") {
		t.Fatalf("an instance without closing: exit %d\n%s", code, out)
	}
	// A change while an instance runs is refused, naming it.
	out, code = cli(nil, "periods", "change", "--window", "day", "--timezone", "Europe/Berlin")
	if code != 1 || !strings.Contains(out, "stop every instance first") || !strings.Contains(out, "billing-"+instanceOf(t, first)) {
		t.Fatalf("a change beside a running instance: exit %d\n%s", code, out)
	}

	first.Signal(syscall.SIGTERM)
	if err := first.Wait(t, time.Minute); err != nil {
		t.Fatalf("billing-1: %v\n%s", err, first.Output())
	}
	out, code = cli(nil, "periods", "change", "--window", "day", "--timezone", "Europe/Berlin", "--dry-run")
	if code != 0 || !strings.Contains(out, "would change (dry run, nothing changed)") || !strings.Contains(out, "from 2026-11-29T23:00:00Z on events get day in Europe/Berlin windows") {
		t.Fatalf("dry run: exit %d\n%s", code, out)
	}
	out, code = cli(nil, "periods", "change", "--window", "day", "--timezone", "Europe/Berlin", "--by", "the test")
	t.Logf("billing periods change:\n%s", out)
	if code != 0 || !strings.Contains(out, "changed: 1h0m0s, windows close -> day in Europe/Berlin, windows close") ||
		!strings.Contains(out, "from 2026-11-29T23:00:00Z on") || !strings.Contains(out, "BILLING_WINDOW=day BILLING_TIMEZONE=Europe/Berlin") {
		t.Fatalf("the change: exit %d\n%s", code, out)
	}
	out, code = cli(nil, "periods", "show", "--json")
	var shown struct {
		Definitions []struct {
			From       *time.Time `json:"from"`
			Window     string     `json:"window"`
			Timezone   string     `json:"timezone"`
			RecordedBy string     `json:"recorded_by"`
		} `json:"definitions"`
		WindowsClose bool `json:"windows_close"`
	}
	if code != 0 || json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &shown) != nil || len(shown.Definitions) != 2 || !shown.WindowsClose ||
		shown.Definitions[0].From != nil || shown.Definitions[1].Window != "day" || shown.Definitions[1].Timezone != "Europe/Berlin" ||
		!shown.Definitions[1].From.Equal(time.Date(2026, 11, 29, 23, 0, 0, 0, time.UTC)) || shown.Definitions[1].RecordedBy != "billing periods change by the test" {
		t.Fatalf("periods show: exit %d\n%s", code, out)
	}
	out, code = cli(nil, "periods", "change", "--close=false")
	if code != 1 || !strings.Contains(out, "closing, once on, stays on") {
		t.Fatalf("turning closing off: exit %d\n%s", code, out)
	}

	// The old settings are refused now; the new ones run.
	berlin := map[string]string{"BILLING_WINDOW": "day", "BILLING_TIMEZONE": "Europe/Berlin", "WINDOW_CLOSE_AFTER": "1h"}
	if out, code = cli(hourly); code != 4 || !strings.Contains(out, "BILLING_WINDOW is day in the ledger, 1h0m0s here") {
		t.Fatalf("the old settings after the change: exit %d\n%s", code, out)
	}
	second := e.start(t, "billing-2", berlin)
	// One at a time: which windows are late depends on the order the
	// partitions are consumed in.
	produce(billingEvent{"p-4", "acct-b", 40, "EUR", "2026-11-29T14:10:00Z"}) // before the change: its hour
	counted(4)
	produce(billingEvent{"p-5", "acct-a", 50, "EUR", "2026-11-29T10:30:00Z"}) // late: 10:00's adjustment
	counted(5)
	produce(
		billingEvent{"p-6", "acct-a", 60, "EUR", "2026-11-30T05:00:00Z"}, // a Berlin day
		billingEvent{"p-7", "acct-b", 70, "EUR", "2026-11-30T22:59:59Z"}, // the same day (23:59:59 in Berlin)
	)
	counted(7)
	time.Sleep(time.Second) // checkpoints and ticks: seals settle
	starts := map[string]int64{}
	var rows []struct {
		Account string    `db:"account_id"`
		Start   time.Time `db:"window_start"`
		Amount  int64     `db:"amount_minor"`
	}
	if err := e.db.Select(&rows, `SELECT account_id, window_start, amount_minor FROM billing_windows`); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		starts[r.Account+"@"+r.Start.UTC().Format(time.RFC3339)] += r.Amount
	}
	want := map[string]int64{
		"acct-a@2026-11-29T10:00:00Z": 10, "acct-b@2026-11-29T11:00:00Z": 20, "acct-a@2026-11-29T13:00:00Z": 30,
		"acct-b@2026-11-29T14:00:00Z": 40, "acct-a@2026-11-29T23:00:00Z": 60, "acct-b@2026-11-29T23:00:00Z": 70,
	}
	if fmt.Sprint(starts) != fmt.Sprint(want) {
		t.Fatalf("windows %v, want %v", starts, want)
	}
	var adj []int64
	if err := e.db.Select(&adj, `SELECT amount_minor FROM window_adjustments WHERE window_start = '2026-11-29 10:00:00'`); err != nil || fmt.Sprint(adj) != "[50]" {
		t.Fatalf("10:00's adjustment: %v (%v)", adj, err)
	}
	after := sealedRows(t, e.db)
	for k, v := range sealedBefore {
		if after[k] != v {
			t.Fatalf("sealed row %s changed: %s, was %s", k, after[k], v)
		}
	}
	var badSeal int
	if err := e.db.Get(&badSeal, `SELECT COUNT(*) FROM billing_windows WHERE closed_at IS NOT NULL AND updated_at <> closed_at`); err != nil || badSeal != 0 {
		t.Fatalf("%d sealed rows written after their seal (%v)", badSeal, err)
	}

	out, code = cli(nil, "status")
	t.Logf("billing status:\n%s", out)
	if code != 0 || !strings.Contains(out, "periods: 1h0m0s, day in Europe/Berlin from 2026-11-29T23:00:00Z; windows close (stored in the ledger;") {
		t.Fatalf("billing status: exit %d\n%s", code, out)
	}
	// compare, its environment without WINDOW_CLOSE_AFTER: the ledger's
	// own settings say windows close, so each window is compared with its
	// adjustment, and a ledger equals itself.
	out, code = cli(map[string]string{"WINDOW_CLOSE_AFTER": "", "BILLING_WINDOW": "1h"}, "compare", "--other-dsn", e.dsn)
	if code != 0 || !strings.Contains(out, "EXACT: ") {
		t.Fatalf("billing compare of the ledger with itself: exit %d\n%s", code, out)
	}
	second.Signal(syscall.SIGTERM)
	_ = second.Wait(t, time.Minute)
	_ = ctx
}

// sealedRows are the sealed billing_windows rows, each with its values and
// times.
func sealedRows(t *testing.T, db *sqlx.DB) map[string]string {
	t.Helper()
	var rows []struct {
		Account string    `db:"account_id"`
		Start   time.Time `db:"window_start"`
		Amount  int64     `db:"amount_minor"`
		Count   int64     `db:"event_count"`
		Closed  time.Time `db:"closed_at"`
		Updated time.Time `db:"updated_at"`
	}
	if err := db.Select(&rows, `SELECT account_id, window_start, amount_minor, event_count, closed_at, updated_at FROM billing_windows WHERE closed_at IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, r := range rows {
		m[r.Account+"@"+r.Start.UTC().Format(time.RFC3339)] = fmt.Sprintf("%d/%d sealed %s updated %s", r.Amount, r.Count, r.Closed.Format(time.RFC3339Nano), r.Updated.Format(time.RFC3339Nano))
	}
	return m
}
