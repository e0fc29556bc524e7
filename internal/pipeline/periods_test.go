package pipeline

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
)

// Billing periods that close (issue 14): the tests of windows that close on
// the watermark, calendar periods, idle partitions, restarts and
// rebalances, ledger entries and their retention. The rules are in
// eventtime.go.

// storedWindow is a billing_windows or window_adjustments row.
type storedWindow struct {
	Account  string     `db:"account_id"`
	Currency string     `db:"currency"`
	Start    time.Time  `db:"window_start"`
	Amount   int64      `db:"amount_minor"`
	Count    int64      `db:"event_count"`
	Closed   *time.Time `db:"closed_at"`
	Updated  time.Time  `db:"updated_at"`
}

func (r storedWindow) key() string {
	return fmt.Sprintf("%s/%s@%s", r.Account, r.Currency, r.Start.UTC().Format(time.RFC3339))
}

func windowRows(t *testing.T, db *sqlx.DB, table string) map[string]storedWindow {
	t.Helper()
	closed := "closed_at"
	if table == "window_adjustments" {
		closed = "NULL AS closed_at"
	}
	var rows []storedWindow
	if err := db.Select(&rows, `SELECT account_id, currency, window_start, amount_minor, event_count, `+closed+`, updated_at FROM `+table); err != nil {
		t.Fatal(err)
	}
	m := map[string]storedWindow{}
	for _, r := range rows {
		m[r.key()] = r
	}
	return m
}

type entryRow struct {
	Partition int32     `db:"kafka_partition"`
	Offset    int64     `db:"kafka_offset"`
	EventID   string    `db:"event_id"`
	Account   string    `db:"account_id"`
	Currency  string    `db:"currency"`
	Amount    int64     `db:"amount_minor"`
	Occurred  time.Time `db:"occurred_at"`
	Start     time.Time `db:"window_start"`
	Late      bool      `db:"late"`
}

func entries(t *testing.T, db *sqlx.DB) []entryRow {
	t.Helper()
	var rows []entryRow
	if err := db.Select(&rows, `SELECT kafka_partition, kafka_offset, event_id, account_id, currency, amount_minor, occurred_at, window_start, late
		FROM ledger_entries ORDER BY kafka_partition, kafka_offset`); err != nil {
		t.Fatal(err)
	}
	return rows
}

// waitFor waits up to a minute for cond.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, time.Minute, what, func() (bool, string) { return cond(), "" })
}

// sealedCount is the number of billing_windows rows with closed_at set.
func sealedCount(t *testing.T, db *sqlx.DB) int {
	t.Helper()
	var n int
	if err := db.Get(&n, `SELECT COUNT(*) FROM billing_windows WHERE closed_at IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkSplit checks the contract's sums: for every account and currency,
// the balance is the sum of its windows and adjustments, in amount and
// count; with entries, the entries sum to the balance, and those marked
// late to the adjustments, per window.
func checkSplit(t *testing.T, db *sqlx.DB, withEntries bool) {
	t.Helper()
	type sum struct{ amount, count int64 }
	win, adj, ent, late := map[string]sum{}, map[string]sum{}, map[string]sum{}, map[string]sum{}
	add := func(m map[string]sum, k string, amount int64) {
		s := m[k]
		s.amount += amount
		s.count++
		m[k] = s
	}
	for _, r := range windowRows(t, db, "billing_windows") {
		s := win[r.Account+"/"+r.Currency]
		win[r.Account+"/"+r.Currency] = sum{s.amount + r.Amount, s.count + r.Count}
	}
	adjRows := windowRows(t, db, "window_adjustments")
	for _, r := range adjRows {
		s := adj[r.Account+"/"+r.Currency]
		adj[r.Account+"/"+r.Currency] = sum{s.amount + r.Amount, s.count + r.Count}
	}
	if withEntries {
		for _, e := range entries(t, db) {
			add(ent, e.Account+"/"+e.Currency, e.Amount)
			if e.Late {
				add(late, storedWindow{Account: e.Account, Currency: e.Currency, Start: e.Start}.key(), e.Amount)
			}
		}
	}
	for k, b := range balances(t, db) {
		if got := (sum{win[k].amount + adj[k].amount, win[k].count + adj[k].count}); got != (sum{b.Amount, b.Count}) {
			t.Errorf("%s: balance %d over %d events, windows + adjustments %d over %d", k, b.Amount, b.Count, got.amount, got.count)
		}
		if got := ent[k]; withEntries && got != (sum{b.Amount, b.Count}) {
			t.Errorf("%s: balance %d over %d events, entries %d over %d", k, b.Amount, b.Count, got.amount, got.count)
		}
	}
	if !withEntries {
		return
	}
	for k, r := range adjRows {
		if got := late[k]; got != (sum{r.Amount, r.Count}) {
			t.Errorf("adjustment %s: %d over %d events, its late entries %d over %d", k, r.Amount, r.Count, got.amount, got.count)
		}
		delete(late, k)
	}
	for k := range late {
		t.Errorf("late entries of %s without an adjustment row", k)
	}
}

func closing(after time.Duration, entries bool) func(*Config, *sinkConfig) {
	return func(c *Config, _ *sinkConfig) {
		c.WindowCloseAfter = after
		c.LedgerEntries = entries
	}
}

// A window closes on one partition: once the watermark has passed its end
// plus WINDOW_CLOSE_AFTER, its row is sealed (closed_at), later events of
// it land in window_adjustments under their own window, and the sealed row
// never changes again.
func TestWindowClosesOnOnePartition(t *testing.T) {
	e := newEnv(t, 1)
	start(t, e, closing(30*time.Minute, true))
	produce(t, e,
		ev{"w-1", "acct-c", 100, "EUR", "2026-11-29T10:05:00Z"}.record(""),
		ev{"w-2", "acct-c", 20, "EUR", "2026-11-29T10:59:59Z"}.record(""),
		ev{"w-3", "acct-c", 3, "EUR", "2026-11-29T11:29:59Z"}.record(""), // 10:00 ends at 11:00, closes at 11:30: not yet
		ev{"w-4", "acct-c", 4, "EUR", "2026-11-29T10:30:00Z"}.record(""), // still open
	)
	waitCounted(t, e.db, 4, 0)
	time.Sleep(500 * time.Millisecond) // several checkpoints and ticks: nothing closes
	if n := sealedCount(t, e.db); n != 0 {
		t.Fatalf("%d windows sealed before the watermark reached their closing time", n)
	}
	if a := windowRows(t, e.db, "window_adjustments"); len(a) != 0 {
		t.Fatalf("adjustments before anything closed: %v", a)
	}

	// 11:30 is 10:00's end plus 30 minutes: it closes; the late event after
	// it goes to adjustments (same checkpoint or not).
	produce(t, e,
		ev{"w-5", "acct-c", 5, "EUR", "2026-11-29T11:30:00Z"}.record(""),
		ev{"w-6", "acct-c", 6, "EUR", "2026-11-29T10:45:00Z"}.record(""),
		ev{"w-7", "acct-c", 7, "USD", "2026-11-29T10:01:00Z"}.record(""), // another currency: same window, closed too
	)
	waitCounted(t, e.db, 7, 0)
	waitFor(t, "the 10:00 windows to be sealed", func() bool { return sealedCount(t, e.db) == 1 })
	win := windowRows(t, e.db, "billing_windows")
	closed := win["acct-c/EUR@2026-11-29T10:00:00Z"]
	if closed.Closed == nil || closed.Amount != 124 || closed.Count != 3 || !closed.Updated.Equal(*closed.Closed) {
		t.Fatalf("the closed window: %+v, want 124 over 3 events, sealed", closed)
	}
	if open := win["acct-c/EUR@2026-11-29T11:00:00Z"]; open.Closed != nil || open.Amount != 8 {
		t.Fatalf("the 11:00 window: %+v, want open with 8", open)
	}
	adj := windowRows(t, e.db, "window_adjustments")
	if a := adj["acct-c/EUR@2026-11-29T10:00:00Z"]; a.Amount != 6 || a.Count != 1 || len(adj) != 2 || adj["acct-c/USD@2026-11-29T10:00:00Z"].Amount != 7 {
		t.Fatalf("adjustments: %v, want 6 (EUR) and 7 (USD) under 10:00", adj)
	}

	// More late events: the sealed row stays exactly as it was.
	produce(t, e,
		ev{"w-8", "acct-c", 8, "EUR", "2026-11-29T10:10:00Z"}.record(""),
		ev{"w-9", "acct-c", -9, "EUR", "2026-11-29T10:20:00Z"}.record(""),
		ev{"w-10", "acct-c", 10, "EUR", "2026-11-29T11:10:00Z"}.record(""), // 11:00 is still open
	)
	waitCounted(t, e.db, 10, 0)
	if again := windowRows(t, e.db, "billing_windows")["acct-c/EUR@2026-11-29T10:00:00Z"]; again.Amount != closed.Amount || again.Count != closed.Count ||
		!again.Updated.Equal(closed.Updated) || !again.Closed.Equal(*closed.Closed) {
		t.Fatalf("the sealed row changed: %+v, was %+v", again, closed)
	}
	if a := windowRows(t, e.db, "window_adjustments")["acct-c/EUR@2026-11-29T10:00:00Z"]; a.Amount != 5 || a.Count != 3 {
		t.Fatalf("adjustment of 10:00: %+v, want 5 over 3 events", a)
	}
	if open := windowRows(t, e.db, "billing_windows")["acct-c/EUR@2026-11-29T11:00:00Z"]; open.Amount != 18 || open.Count != 3 {
		t.Fatalf("the open 11:00 window: %+v, want 18 over 3", open)
	}
	checkSplit(t, e.db, true)
	for _, en := range entries(t, e.db) {
		if want := slices.Contains([]string{"w-6", "w-7", "w-8", "w-9"}, en.EventID); en.Late != want {
			t.Errorf("entry %s: late %v, want %v", en.EventID, en.Late, want)
		}
	}
	// The frontier and the watermark are in MySQL with the offsets.
	var wm time.Time
	if err := e.db.Get(&wm, `SELECT watermark FROM partition_offsets WHERE kafka_topic = ?`, e.topic); err != nil || !wm.Equal(ts("2026-11-29T11:30:00Z")) {
		t.Fatalf("stored watermark %v (%v), want 11:30, the latest occurred_at", wm, err)
	}
}

// Calendar days and months in Europe/Berlin across both daylight-saving
// changes of 2026: window starts are local midnights (and firsts of the
// month) in UTC, days of 23 and 25 hours, and a month closes by its own
// local end.
func TestCalendarPeriodsAcrossDaylightSaving(t *testing.T) {
	tests := []struct {
		unit  string
		close time.Duration
		evs   []ev
		// want: window start (UTC) → amount, in billing_windows
		want   map[string]int64
		sealed []string // window starts sealed at the end
		adjust map[string]int64
	}{
		{unit: "day", close: time.Hour, evs: []ev{
			{"d-1", "a", 1, "EUR", "2026-03-28T22:59:59Z"},       // 28 March, 23:59:59 CET
			{"d-2", "a", 2, "EUR", "2026-03-28T23:00:00Z"},       // 29 March, 00:00 CET
			{"d-3", "a", 4, "EUR", "2026-03-29T21:59:59Z"},       // 29 March, 23:59:59 CEST (a day of 23 hours)
			{"d-4", "a", 8, "EUR", "2026-03-29T22:00:00Z"},       // 30 March
			{"d-5", "a", 16, "EUR", "2026-10-25T01:30:00+02:00"}, // 25 October, first 01:30 (CEST)
			{"d-6", "a", 32, "EUR", "2026-10-25T02:30:00+01:00"}, // 25 October, second 02:30 (CET)
			{"d-7", "a", 64, "EUR", "2026-10-25T23:30:00+01:00"}, // 25 October, 23:30 (a day of 25 hours)
			{"d-8", "a", 128, "EUR", "2026-10-26T00:30:00Z"},     // 26 October 01:30 CET: closes 25 October (ended 23:00Z, +1h)
			{"d-9", "a", 256, "EUR", "2026-10-25T12:00:00Z"},     // late: 25 October
		}, want: map[string]int64{
			"2026-03-27T23:00:00Z": 1, "2026-03-28T23:00:00Z": 6, "2026-03-29T22:00:00Z": 8,
			"2026-10-24T22:00:00Z": 112, "2026-10-25T23:00:00Z": 128,
		}, sealed: []string{"2026-03-27T23:00:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", "2026-10-24T22:00:00Z"},
			adjust: map[string]int64{"2026-10-24T22:00:00Z": 256}},
		{unit: "month", close: 24 * time.Hour, evs: []ev{
			{"m-1", "a", 1, "EUR", "2026-02-28T22:59:00Z"},    // February, 23:59 CET
			{"m-2", "a", 2, "EUR", "2026-02-28T23:00:00Z"},    // March, 00:00 CET
			{"m-3", "a", 4, "EUR", "2026-03-31T21:59:59Z"},    // March, 23:59:59 CEST
			{"m-4", "a", 8, "EUR", "2026-03-31T22:00:00Z"},    // April, 00:00 CEST
			{"m-5", "a", 16, "EUR", "2026-10-31T22:30:00Z"},   // October, 23:30 CET
			{"m-6", "a", 32, "EUR", "2026-10-31T23:00:00Z"},   // November
			{"m-7", "a", 64, "EUR", "2026-11-01T22:59:59Z"},   // November: October closes at 1 November 23:00Z, not yet
			{"m-8", "a", 128, "EUR", "2026-10-20T10:00:00Z"},  // October, open
			{"m-9", "a", 256, "EUR", "2026-11-01T23:00:00Z"},  // October closes (ended 31 October 23:00Z, +24h)
			{"m-10", "a", 512, "EUR", "2026-10-31T12:00:00Z"}, // late: October
		}, want: map[string]int64{
			"2026-01-31T23:00:00Z": 1, "2026-02-28T23:00:00Z": 6, "2026-03-31T22:00:00Z": 8,
			"2026-09-30T22:00:00Z": 144, "2026-10-31T23:00:00Z": 352,
		}, sealed: []string{"2026-01-31T23:00:00Z", "2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z", "2026-09-30T22:00:00Z"},
			adjust: map[string]int64{"2026-09-30T22:00:00Z": 512}},
	}
	for _, tt := range tests {
		t.Run(tt.unit, func(t *testing.T) {
			e := newEnv(t, 1)
			p, err := event.Calendar(tt.unit, "Europe/Berlin")
			if err != nil {
				t.Fatal(err)
			}
			start(t, e, func(c *Config, _ *sinkConfig) {
				c.Window, c.WindowCloseAfter, c.LedgerEntries = p, tt.close, true
			})
			var recs []*kgo.Record
			for _, x := range tt.evs {
				recs = append(recs, x.record(""))
			}
			produce(t, e, recs...)
			waitCounted(t, e.db, int64(len(tt.evs)), 0)
			waitFor(t, "the closed periods to be sealed", func() bool { return sealedCount(t, e.db) == len(tt.sealed) })
			got := map[string]int64{}
			var sealed []string
			for _, r := range windowRows(t, e.db, "billing_windows") {
				k := r.Start.UTC().Format(time.RFC3339)
				got[k] = r.Amount
				if r.Closed != nil {
					sealed = append(sealed, k)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("windows %v, want %v", got, tt.want)
			}
			slices.Sort(sealed)
			if fmt.Sprint(sealed) != fmt.Sprint(tt.sealed) {
				t.Errorf("sealed %v, want %v", sealed, tt.sealed)
			}
			adj := map[string]int64{}
			for _, r := range windowRows(t, e.db, "window_adjustments") {
				adj[r.Start.UTC().Format(time.RFC3339)] = r.Amount
			}
			if fmt.Sprint(adj) != fmt.Sprint(tt.adjust) {
				t.Errorf("adjustments %v, want %v", adj, tt.adjust)
			}
			checkSplit(t, e.db, true)
			// Every entry names its own window, as the period computes it.
			for _, en := range entries(t, e.db) {
				if want := p.Start(en.Occurred); !en.Start.Equal(want) {
					t.Errorf("entry %s at %s: window %s, want %s", en.EventID, en.Occurred, en.Start, want)
				}
			}
		})
	}
}

// produceTo writes records to one partition.
func produceTo(t *testing.T, e *env, partition int32, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(e.topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, r := range recs {
		r.Partition = partition
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// An idle partition does not hold the watermark back: one that never had
// an event, and one whose events were all consumed (caught up), while
// another partition's event time moves on.
func TestIdlePartitionDoesNotHoldTheWatermark(t *testing.T) {
	e := newEnv(t, 3)
	start(t, e, closing(10*time.Minute, false))
	// Partition 1 gets one early event and then nothing; partition 2
	// nothing at all; partition 0 moves on.
	produceTo(t, e, 1, ev{"i-1", "acct-1", 1, "EUR", "2026-11-29T08:30:00Z"}.record(""))
	waitCounted(t, e.db, 1, 0)
	produceTo(t, e, 0,
		ev{"i-2", "acct-0", 2, "EUR", "2026-11-29T09:15:00Z"}.record(""),
		ev{"i-3", "acct-0", 3, "EUR", "2026-11-29T12:20:00Z"}.record(""),
	)
	waitCounted(t, e.db, 3, 0)
	// Partition 0's 12:20 - 10 minutes closes every window before 12:00,
	// those of partition 1's account included.
	waitFor(t, "the windows before 12:00 to be sealed", func() bool { return sealedCount(t, e.db) == 2 })
	var caught []bool
	if err := e.db.Select(&caught, `SELECT caught_up FROM partition_offsets WHERE kafka_topic = ? AND kafka_partition IN (0, 1) ORDER BY kafka_partition`, e.topic); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(caught) != "[true true]" {
		t.Errorf("caught_up of partitions 0 and 1 = %v", caught)
	}
	// A late event on the idle partition lands in its adjustment.
	produceTo(t, e, 1, ev{"i-4", "acct-1", 4, "EUR", "2026-11-29T08:40:00Z"}.record(""))
	waitCounted(t, e.db, 4, 0)
	if a := windowRows(t, e.db, "window_adjustments")["acct-1/EUR@2026-11-29T08:00:00Z"]; a.Amount != 4 || a.Count != 1 {
		t.Fatalf("the idle partition's late event: adjustment %+v", a)
	}
	checkSplit(t, e.db, false)
}

// Closing survives a restart and a rebalance: the watermarks and the
// frontier are in MySQL, so a new instance, and two instances sharing the
// partitions, go on exactly where the first stopped: closed windows stay
// sealed and unchanged, their late events land in adjustments, open ones
// take their events, on every partition.
func TestClosingAcrossRestartAndRebalance(t *testing.T) {
	e := newEnv(t, 2)
	accounts := []string{"acct-a", "acct-b", "acct-c", "acct-d"}
	batch := func(prefix, at string, amount int64) []*kgo.Record {
		var recs []*kgo.Record
		for i, a := range accounts {
			recs = append(recs, ev{fmt.Sprintf("%s-%d", prefix, i), a, amount, "EUR", at}.record(""))
		}
		return recs
	}
	first := start(t, e, closing(time.Hour, true))
	produce(t, e, batch("r1", "2026-11-29T09:10:00Z", 1)...)
	produce(t, e, batch("r2", "2026-11-29T11:05:00Z", 2)...) // closes 09:00 on every partition
	waitCounted(t, e.db, 8, 0)
	waitFor(t, "09:00 to be sealed", func() bool { return sealedCount(t, e.db) == len(accounts) })
	before := windowRows(t, e.db, "billing_windows")
	first.stop(t)

	// A new instance: late events of 09:00 go to adjustments; 10:00 and
	// 11:00 are open (the watermark is 11:05).
	second := start(t, e, closing(time.Hour, true))
	produce(t, e, batch("r3", "2026-11-29T09:30:00Z", 4)...)
	produce(t, e, batch("r4", "2026-11-29T10:30:00Z", 8)...)
	waitCounted(t, e.db, 16, 0)

	// A second instance joins: the partitions are shared out (a rebalance),
	// and the frontier moves on: 10:00 closes at 12:00.
	third := start(t, e, closing(time.Hour, true))
	waitFor(t, "both instances to hold a partition", func() bool {
		return second.p.Stats().AssignedParts.Load() == 1 && third.p.Stats().AssignedParts.Load() == 1
	})
	produce(t, e, batch("r5", "2026-11-29T12:00:00Z", 16)...)
	produce(t, e, batch("r6", "2026-11-29T10:59:00Z", 32)...) // late now
	produce(t, e, batch("r7", "2026-11-29T09:59:00Z", 64)...) // late since the first instance
	waitCounted(t, e.db, 28, 0)
	waitFor(t, "10:00 to be sealed", func() bool { return sealedCount(t, e.db) == 2*len(accounts) })

	after := windowRows(t, e.db, "billing_windows")
	adj := windowRows(t, e.db, "window_adjustments")
	for _, a := range accounts {
		k9, k10, k11 := a+"/EUR@2026-11-29T09:00:00Z", a+"/EUR@2026-11-29T10:00:00Z", a+"/EUR@2026-11-29T11:00:00Z"
		if w, b := after[k9], before[k9]; w.Amount != 1 || w.Count != 1 || w.Closed == nil || b.Closed == nil ||
			w.Amount != b.Amount || w.Count != b.Count || !w.Updated.Equal(b.Updated) || !w.Closed.Equal(*b.Closed) {
			t.Errorf("%s changed after it was sealed: %+v, was %+v", k9, w, b)
		}
		if w := after[k10]; w.Amount != 8 || w.Closed == nil {
			t.Errorf("%s: %+v, want 8, sealed", k10, w)
		}
		if w := after[k11]; w.Amount != 2 || w.Closed != nil {
			t.Errorf("%s: %+v, want 2, open", k11, w)
		}
		if x := adj[k9]; x.Amount != 68 || x.Count != 2 {
			t.Errorf("adjustment %s: %+v, want 68 over 2", k9, x)
		}
		if x := adj[k10]; x.Amount != 32 || x.Count != 1 {
			t.Errorf("adjustment %s: %+v, want 32 over 1", k10, x)
		}
	}
	checkSplit(t, e.db, true)
}

// Ledger entries: one per counted event, none for repeats or dead letters,
// each at the Kafka position of its record, summing to the balances.
func TestLedgerEntriesSumToBalances(t *testing.T) {
	e := newEnv(t, 3)
	var recs []*kgo.Record
	for i := range 120 {
		x := ev{fmt.Sprintf("le-%d", i), fmt.Sprintf("acct-%d", i%7), int64(i*13 - 500), "EUR", t0}
		recs = append(recs, x.record(""))
		if i%5 == 0 {
			recs = append(recs, x.record(fmt.Sprintf("elsewhere-%d", i))) // a repeat on another partition
		}
	}
	recs = append(recs,
		ev{"le-1", "acct-1", 999, "EUR", t0}.record(""),                   // a conflicting repeat
		ev{"le-big", "acct-x", math.MaxInt64, "EUR", t0}.record(""),       // counted
		ev{"le-over", "acct-x", 1, "EUR", t0}.record(""),                  // overflow
		&kgo.Record{Key: []byte("acct-1"), Value: []byte(`{"event_id":`)}, // malformed
	)
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(e.topic))
	if err != nil {
		t.Fatal(err)
	}
	res := cl.ProduceSync(context.Background(), recs...)
	cl.Close()
	if err := res.FirstErr(); err != nil {
		t.Fatal(err)
	}
	start(t, e, func(c *Config, _ *sinkConfig) { c.LedgerEntries = true })
	waitCounted(t, e.db, 121, 3)
	got := entries(t, e.db)
	if len(got) != 121 {
		t.Fatalf("%d entries, want 121", len(got))
	}
	// The first record of each counted id is the one counted here (the
	// repeats follow their originals in produce order... but on other
	// partitions, so either copy may win): every entry is at the position
	// of a record with its id and content.
	type pos struct {
		p int32
		o int64
	}
	at := map[pos]*kgo.Record{}
	for _, r := range res {
		at[pos{r.Record.Partition, r.Record.Offset}] = r.Record
	}
	ids := map[string]bool{}
	for _, en := range got {
		r := at[pos{en.Partition, en.Offset}]
		if r == nil {
			t.Fatalf("entry %s at %d/%d: no such record", en.EventID, en.Partition, en.Offset)
		}
		x, err := event.NewDecoder(4096).Decode(r.Value)
		if err != nil || x.EventID != en.EventID || x.AccountID != en.Account || x.AmountMinor != en.Amount || !x.OccurredAt.Equal(en.Occurred) {
			t.Fatalf("entry %+v does not match its record %s (%v)", en, r.Value, err)
		}
		if ids[en.EventID] {
			t.Fatalf("two entries for %s", en.EventID)
		}
		ids[en.EventID] = true
		if en.EventID == "le-over" {
			t.Fatal("an entry for the overflowed event")
		}
	}
	checkSplit(t, e.db, true)
}

// Retention: entries older than LEDGER_ENTRIES_RETENTION are deleted in
// batches; the balances stay, younger entries stay.
func TestLedgerEntriesRetention(t *testing.T) {
	e := newEnv(t, 1)
	in := start(t, e, func(c *Config, _ *sinkConfig) {
		c.LedgerEntries = true
		c.LedgerEntriesRetention = 2 * time.Second
		c.DedupCleanupInterval = 200 * time.Millisecond
		c.DedupCleanupBatch = 3
	})
	var recs []*kgo.Record
	for i := range 20 {
		recs = append(recs, ev{fmt.Sprintf("rt-%d", i), "acct-r", 1, "EUR", t0}.record(""))
	}
	produce(t, e, recs...)
	waitCounted(t, e.db, 20, 0)
	if n := len(entries(t, e.db)); n != 20 {
		t.Fatalf("%d entries before the retention passed, want 20", n)
	}
	waitFor(t, "old entries to be deleted", func() bool { return len(entries(t, e.db)) == 0 })
	produce(t, e, ev{"rt-new", "acct-r", 1, "EUR", t0}.record(""))
	waitCounted(t, e.db, 21, 0)
	if got := entries(t, e.db); len(got) != 1 || got[0].EventID != "rt-new" {
		t.Fatalf("entries after a new event: %+v", got)
	}
	if b := balances(t, e.db)["acct-r/EUR"]; b.Count != 21 {
		t.Fatalf("balance %+v", b)
	}
	_ = in
}

// A checkpoint that seals closed windows while its other branches write to
// the earliest open window: the sealing read must not wait for them (the
// branches are separate transactions; no server would see the deadlock, and
// the checkpoint would fail on the lock wait timeout, again and again).
func TestSealingBesideWritesToTheOpenWindow(t *testing.T) {
	e := newEnv(t, 2)
	in := start(t, e, closing(30*time.Minute, false))
	var recs []*kgo.Record
	for i := range 40 {
		recs = append(recs, ev{fmt.Sprintf("a-%d", i), fmt.Sprintf("acct-%d", i), 1, "EUR", "2026-11-29T10:10:00Z"}.record(""))
	}
	produce(t, e, recs...)
	waitCounted(t, e.db, 40, 0)
	// 11:40 closes 10:00; events of 11:00 keep coming for every account
	// (both branches of the server write 11:00 rows) while 10:00 is
	// sealed.
	stop := make(chan struct{})
	produced := make(chan int64)
	go func() {
		var n int64
		defer func() { produced <- n }()
		for round := 0; ; round++ {
			select {
			case <-stop:
				return
			default:
			}
			var batch []*kgo.Record
			for i := range 40 {
				batch = append(batch, ev{fmt.Sprintf("b-%d-%d", round, i), fmt.Sprintf("acct-%d", i), 1, "EUR", "2026-11-29T11:40:00Z"}.record(""))
			}
			produce(t, e, batch...)
			n += int64(len(batch))
			time.Sleep(30 * time.Millisecond)
		}
	}()
	waitFor(t, "10:00 to be sealed", func() bool { return sealedCount(t, e.db) == 40 })
	time.Sleep(300 * time.Millisecond)
	close(stop)
	n := <-produced
	waitCounted(t, e.db, 40+n, 0)
	if a := in.p.Stats().Aborts.Load(); a != 0 {
		t.Fatalf("%d checkpoint attempts aborted: the sealing waited on the checkpoint's own writes", a)
	}
	checkSplit(t, e.db, false)
}

// Two instances: one writes to a window as open and is slow to decide;
// meanwhile the other closes that window. The slow one's decision is
// refused (the frontier moved), it is built again on the new frontier, and
// its events of the closed window land in adjustments: nothing counts in a
// window after it closed, nothing is lost.
func TestDecisionRefusedWhenItsWindowClosed(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	fp, err := failpoint.Parse("before-prepare=sleep:1500ms@1")
	if err != nil {
		t.Fatal(err)
	}
	open := func(name string, fps *failpoint.Set) (*Checkpointer, txsink.PartitionCut) {
		scfg := sinkConfig{DSNs: []string{e.dsn}, Config: txsink.Config{Branches: 2, Group: "g-" + e.topic, Topic: e.topic,
			StepTimeout: 10 * time.Second, Logger: testenv.Logger(), Failpoints: fps, Instance: name}}
		sink, d := openSink(t, scfg)
		t.Cleanup(func() { sink.Close(); d.Close() })
		cfg := testConfig(e)
		cfg.WindowCloseAfter, cfg.LedgerEntries = 30*time.Minute, true
		c, err := NewCheckpointer(cfg, sink, d.Stores())
		if err != nil {
			t.Fatal(err)
		}
		part := int32(0)
		if name == "fast" {
			part = 1
		}
		pos, err := sink.Claim(ctx, []int32{part})
		if err != nil {
			t.Fatal(err)
		}
		return c, txsink.PartitionCut{Partition: part, Epoch: pos[part].Epoch, NextOffset: 1}
	}
	slow, slowCut := open("slow", fp)
	fast, fastCut := open("fast", nil)
	// Different accounts: the fast one must not wait for the slow one's
	// rows (the balance) to commit.
	rec := func(p int32, id, at string) Record {
		return Record{Partition: p, Offset: 0, Event: event.Event{EventID: id, AccountID: map[int32]string{0: "acct-s", 1: "acct-f"}[p],
			AmountMinor: 7, Currency: "EUR", OccurredAt: ts(at)}}
	}
	done := make(chan error, 1)
	go func() {
		_, err := slow.Checkpoint(ctx, []Record{rec(0, "slow-1", "2026-11-29T10:15:00Z")}, []txsink.PartitionCut{slowCut})
		done <- err
	}()
	time.Sleep(300 * time.Millisecond) // the slow one has written its 10:00 row and sleeps before prepare
	fastCut.Watermark, fastCut.CaughtUp = ts("2026-11-29T11:40:00Z"), true
	if decided, err := fast.Checkpoint(ctx, []Record{rec(1, "fast-1", "2026-11-29T11:40:00Z")}, []txsink.PartitionCut{fastCut}); !decided || err != nil {
		t.Fatalf("the fast checkpoint: %v %v", decided, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the slow checkpoint, built again: %v", err)
	}
	if a := slow.Stats().Aborts.Load(); a != 1 {
		t.Fatalf("%d refused attempts of the slow checkpoint, want 1", a)
	}
	if w := windowRows(t, e.db, "billing_windows"); len(w) != 1 || w["acct-f/EUR@2026-11-29T11:00:00Z"].Amount != 7 {
		t.Fatalf("windows %v: only 11:00 may hold an event", w)
	}
	if a := windowRows(t, e.db, "window_adjustments")["acct-s/EUR@2026-11-29T10:00:00Z"]; a.Amount != 7 || a.Count != 1 {
		t.Fatalf("the slow event's adjustment: %+v", a)
	}
	checkSplit(t, e.db, true)
}
