package periods_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/periods"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func open(t *testing.T) (*mysqldriver.Driver, *sqlx.DB, string) {
	t.Helper()
	dsn, db := testenv.LedgerDB(t)
	d, err := mysqldriver.Open(context.Background(), []string{dsn}, mysqldriver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d, db, dsn
}

func settings(t *testing.T, window, zone string, close bool) periods.Settings {
	t.Helper()
	p, err := periods.ParsePeriod(window, zone)
	if err != nil {
		t.Fatal(err)
	}
	return periods.Settings{Period: p, Close: close}
}

func mismatch(t *testing.T, err error, want ...string) {
	t.Helper()
	var me *periods.MismatchError
	if !errors.As(err, &me) {
		t.Fatalf("%v: want a MismatchError", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%q does not say %q", err, w)
		}
	}
}

// The first instance stores its settings; one whose settings differ is
// refused, naming each setting; of instances starting together with
// different settings exactly one stores its own.
func TestEnsureStoresTheFirstAndRefusesOthers(t *testing.T) {
	ctx := context.Background()
	d, db, _ := open(t)
	log := testenv.Logger()
	berlin := settings(t, "month", "Europe/Berlin", true)
	stored, err := periods.Ensure(ctx, d, berlin, 48*time.Hour, "instance a", log)
	if err != nil || len(stored) != 1 || !stored.Current().Equal(berlin) || stored[0].RecordedBy != "instance a" {
		t.Fatalf("first start: %+v, %v", stored, err)
	}
	_, err = periods.Ensure(ctx, d, settings(t, "day", "Europe/Berlin", true), time.Hour, "instance b", log)
	mismatch(t, err, "BILLING_WINDOW is month in the ledger, day here")
	_, err = periods.Ensure(ctx, d, settings(t, "month", "UTC", false), 0, "instance b", log)
	mismatch(t, err, "BILLING_TIMEZONE is Europe/Berlin in the ledger, UTC here", "WINDOW_CLOSE_AFTER is set (windows close) in the ledger, empty (windows never close) here")
	if again, err := periods.Ensure(ctx, d, berlin, time.Hour, "instance c", log); err != nil || len(again) != 1 {
		t.Fatalf("the same settings (another WINDOW_CLOSE_AFTER): %+v, %v", again, err)
	}
	var n int
	if err := db.Get(&n, `SELECT COUNT(*) FROM ledger_periods`); err != nil || n != 1 {
		t.Fatalf("%d rows (%v)", n, err)
	}

	d2, _, _ := open(t)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			s := settings(t, []string{"1h", "day"}[i%2], "UTC", false)
			_, errs[i] = periods.Ensure(ctx, d2, s, 0, "racer", log)
		})
	}
	wg.Wait()
	refused := 0
	for _, err := range errs {
		var me *periods.MismatchError
		switch {
		case errors.As(err, &me):
			refused++
		case err != nil:
			t.Fatal(err)
		}
	}
	if refused != 4 {
		t.Fatalf("%d of 8 racing instances refused, want the 4 of the other window", refused)
	}
}

// A ledger of an older version has rows and no settings stored: the first
// instance's settings are stored unless its rows show otherwise, as far as
// they can: window starts that are not starts of its period, windows that
// closed for an instance without closing. A ledger of days started with
// hours cannot be told apart (every day starts on an hour): stored.
func TestEnsureChecksTheRowsOfALedgerWithoutSettings(t *testing.T) {
	ctx := context.Background()
	row := func(db *sqlx.DB, start string) {
		if _, err := db.Exec(`INSERT INTO billing_windows (account_id, currency, window_start, amount_minor, event_count, updated_at) VALUES ('a', 'EUR', ?, 1, 1, UTC_TIMESTAMP(6))`, start); err != nil {
			t.Fatal(err)
		}
	}
	d, db, _ := open(t)
	row(db, "2026-11-29 13:00:00")
	row(db, "2026-11-29 14:00:00")
	_, err := periods.Ensure(ctx, d, settings(t, "day", "UTC", false), 0, "i", testenv.Logger())
	mismatch(t, err, "no period settings stored yet", "window starting at 2026-11-29T13:00:00Z, which is not a window start of day in UTC")
	if s, err := periods.Read(ctx, mysqldriver.NewView(db)); err != nil || len(s) != 0 {
		t.Fatalf("stored after a refusal: %+v, %v", s, err)
	}
	if _, err := db.Exec(`UPDATE window_frontier SET closed_before = '2026-11-29 13:00:00'`); err != nil {
		t.Fatal(err)
	}
	_, err = periods.Ensure(ctx, d, settings(t, "1h", "UTC", false), 0, "i", testenv.Logger())
	mismatch(t, err, "windows of this ledger have closed", "WINDOW_CLOSE_AFTER is empty")
	if s, err := periods.Ensure(ctx, d, settings(t, "1h", "UTC", true), time.Hour, "i", testenv.Logger()); err != nil || len(s) != 1 {
		t.Fatalf("the settings the rows agree with: %+v, %v", s, err)
	}

	d2, db2, _ := open(t)
	row(db2, "2026-11-28 00:00:00")
	row(db2, "2026-11-29 00:00:00")
	if s, err := periods.Ensure(ctx, d2, settings(t, "1h", "UTC", false), 0, "i", testenv.Logger()); err != nil || len(s) != 1 {
		t.Fatalf("days started with hours (cannot be told): %+v, %v", s, err)
	}
}

// billing periods change, planned and applied: the new period from the
// first of its window starts after the latest watermark; every partition
// fenced, so that a checkpoint prepared before cannot commit after; a dry
// run changes nothing.
func TestApplyTakesEffectAfterTheWatermarkAndFences(t *testing.T) {
	ctx := context.Background()
	d, db, dsn := open(t)
	if _, err := periods.Ensure(ctx, d, settings(t, "1h", "UTC", false), 0, "i", testenv.Logger()); err != nil {
		t.Fatal(err)
	}
	sink, sd, err := mysqldriver.OpenSink(ctx, []string{dsn}, mysqldriver.Options{},
		txsink.Config{Branches: 1, Group: "g", Topic: "t", StepTimeout: 10 * time.Second, Logger: testenv.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close(); sd.Close() })
	pos, err := sink.Claim(ctx, []int32{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	watermark := time.Date(2026, 11, 29, 13, 5, 0, 0, time.UTC)
	tx := sink.Begin(1)
	if err := tx.Decide(ctx, []txsink.PartitionCut{{Partition: 0, Epoch: pos[0].Epoch, NextOffset: 10, Watermark: watermark}}, nil, nil); err != nil {
		t.Fatal(err)
	}
	epochs := func() []int64 {
		var e []int64
		if err := db.Select(&e, `SELECT epoch FROM partition_offsets ORDER BY kafka_partition`); err != nil {
			t.Fatal(err)
		}
		return e
	}
	before := epochs()
	day := "day"
	plan, def, err := periods.Apply(ctx, d, periods.Change{Window: &day}, "operator", true)
	if want := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC); err != nil || !plan.From.Equal(want) || !plan.PeriodChanged() || def.Seq != 2 {
		t.Fatalf("dry run: %+v %+v %v; want day from %v", plan, def, err, want)
	}
	if s, _ := periods.Read(ctx, mysqldriver.NewView(db)); len(s) != 1 || epochs()[0] != before[0] {
		t.Fatalf("the dry run changed the ledger: %+v, epochs %v (were %v)", s, epochs(), before)
	}

	// A checkpoint prepared before the change, its coordinator slow.
	slow := sink.Begin(2)
	if err := slow.Each(ctx, []int{0}, func(ctx context.Context, b *txsink.Branch) error {
		return b.Write(func(st driver.StoreTx) error {
			return st.WriteBalances(ctx, []driver.Balance{{BalanceKey: driver.BalanceKey{Account: "late", Currency: "EUR"}, Amount: 1, Count: 1}}, time.Now())
		})
	}); err != nil {
		t.Fatal(err)
	}
	if err := slow.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := periods.Apply(ctx, d, periods.Change{Window: &day}, "operator", false); err != nil {
		t.Fatal(err)
	}
	err = slow.Decide(ctx, []txsink.PartitionCut{{Partition: 1, Epoch: pos[1].Epoch, NextOffset: 3, Watermark: time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)}}, nil, nil)
	if !errors.Is(err, txsink.ErrFenced) {
		t.Fatalf("a checkpoint prepared before the change decided after it: %v", err)
	}
	_ = slow.Abort(ctx)
	after := epochs()
	for i := range after {
		if after[i] != before[i]+1 {
			t.Fatalf("epochs %v, were %v: not every partition fenced", after, before)
		}
	}
	s, err := periods.Read(ctx, mysqldriver.NewView(db))
	if err != nil || len(s) != 2 || s[1].RecordedBy != "operator" {
		t.Fatalf("stored %+v, %v", s, err)
	}
	sched, err := s.Schedule()
	if err != nil {
		t.Fatal(err)
	}
	if got := sched.Start(watermark); !got.Equal(time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)) {
		t.Errorf("the watermark's event is now in %v", got)
	}
	if got := sched.Start(time.Date(2026, 12, 3, 17, 0, 0, 0, time.UTC)); !got.Equal(time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("a later event is in %v, want its day", got)
	}
	if got := sched.End(time.Date(2026, 11, 29, 23, 0, 0, 0, time.UTC)); !got.Equal(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("the last hour ends at %v", got)
	}
	var _ event.Windows = sched
}
