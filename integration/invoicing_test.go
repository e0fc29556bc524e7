package integration_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Issue 18, item 4: invoicing reads that cannot miss a row. The contract's
// invoicing queries (docs/contract.md, "Invoicing"; the README's before
// the docs moved), extracted from the page as written (so that the
// documentation cannot drift from what is tested), run by an invoicer
// that follows the visible position of the commit log, against
// checkpoints that commit long after they started:
//
//   - held lock: another session holds a lock on an adjustment row; the
//     checkpoint that updates it waits, and commits after an invoice run
//     that started after the checkpoint did;
//   - branch in doubt: the instance is killed after its commit decision,
//     before XA COMMIT; an invoice run happens while the branch is in
//     doubt; a successor's recovery commits it;
//   - sealing over several checkpoints: more than 10,000 rows of one
//     window are sealed 10,000 per checkpoint; "completely sealed" must not
//     be reported before the last row is sealed and visible.
//
// Alongside, the invoicer of the old README (adjustments by updated_at
// since the time of the last run, and a period taken as sealed by its
// rows' closed_at) is run on the same ledger: the test requires it to miss
// money (or read a partial period), which shows that each case is one
// where times cannot be trusted, and that the commit position fixes it.
func TestInvoicingQueriesOfTheREADME(t *testing.T) {
	q := readmeSQL(t)
	if got, want := normalSQL(q["commit-position"]), normalSQL(mysqldriver.CommitPositionQuery); got != want {
		t.Fatalf("the documented commit position query is not the one the service runs (mysqldriver.CommitPositionQuery):\n%s\nwant:\n%s", got, want)
	}
	t.Run("held lock", func(t *testing.T) { invoicingHeldLock(t, q) })
	t.Run("branch in doubt", func(t *testing.T) { invoicingInDoubt(t, q) })
	t.Run("sealing over several checkpoints", func(t *testing.T) { invoicingSealing(t, q) })
}

// invoicingDoc is the page whose invoicing queries the test runs.
const invoicingDoc = "../docs/contract.md"

// readmeSQL returns the invoicing page's SQL blocks that follow a marker
// "<!-- sql: NAME -->", by name.
func readmeSQL(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(invoicingDoc)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- sql: ([a-z-]+) -->\n```sql\n(.*?)```")
	out := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = strings.TrimSuffix(strings.TrimSpace(m[2]), ";")
	}
	for _, name := range []string{"commit-position", "closed-period", "adjustments-since", "adjustments-all"} {
		if out[name] == "" {
			t.Fatalf("%s has no SQL block marked %q", invoicingDoc, name)
		}
	}
	return out
}

// normalSQL drops comments and collapses white space.
func normalSQL(s string) string {
	s = regexp.MustCompile(`--[^\n]*`).ReplaceAllString(s, "")
	return strings.Join(strings.Fields(strings.TrimSuffix(strings.TrimSpace(s), ";")), " ")
}

// position is the README's commit position.
type position struct {
	Visible  int64        `db:"visible_seq"`
	Decided  int64        `db:"decided_seq"`
	Retained int64        `db:"retained_from"`
	Sealed   sql.NullTime `db:"sealed_before"`
}

func readPosition(t *testing.T, db *sqlx.DB, q map[string]string) position {
	t.Helper()
	p, err := tryPosition(db, q)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tryPosition is readPosition for a ledger the service may not have
// migrated yet.
func tryPosition(db *sqlx.DB, q map[string]string) (position, error) {
	var p position
	if err := db.Get(&p, q["commit-position"]); err != nil {
		return p, fmt.Errorf("the README's commit position query: %w", err)
	}
	return p, nil
}

// waitApplied waits until every commit decision is applied, and at least
// after decisions.
func waitApplied(t *testing.T, db *sqlx.DB, q map[string]string, after int64) position {
	t.Helper()
	var p position
	testenv.Eventually(t, time.Minute, "every decision applied", func() (bool, string) {
		p = readPosition(t, db, q)
		return p.Decided > after && p.Visible == p.Decided, fmt.Sprintf("%+v", p)
	})
	return p
}

// adjustment is a row of window_adjustments as the README's queries
// return it.
type adjustment struct {
	Account  string    `db:"account_id"`
	Currency string    `db:"currency"`
	Start    time.Time `db:"window_start"`
	Amount   int64     `db:"amount_minor"`
	Count    int64     `db:"event_count"`
	Seq      int64     `db:"commit_seq"`
}

func (a adjustment) key() string {
	return a.Account + "/" + a.Currency + "@" + a.Start.UTC().Format(time.RFC3339)
}

// invoicer follows the README: read the position; then the adjustments
// changed since its last position (or all of them, the first time or when
// the log was pruned past it); invoice each row's difference with what it
// invoiced for that row before; store the position.
type invoicer struct {
	db       *sqlx.DB
	q        map[string]string
	last     int64 // visible_seq of the last run; -1 before the first
	invoiced map[string]adjustment
	total    int64 // everything invoiced
}

func newInvoicer(db *sqlx.DB, q map[string]string) *invoicer {
	return &invoicer{db: db, q: q, last: -1, invoiced: map[string]adjustment{}}
}

// run is one invoice run; it returns what it invoiced, by row.
func (iv *invoicer) run(t *testing.T) map[string]int64 {
	t.Helper()
	p := readPosition(t, iv.db, iv.q)
	var rows []adjustment
	var err error
	if iv.last < 0 || iv.last < p.Retained-1 {
		err = iv.db.Select(&rows, iv.q["adjustments-all"], p.Visible) // no commit_seq: left 0
	} else {
		err = iv.db.Select(&rows, iv.q["adjustments-since"], iv.last, p.Visible)
	}
	if err != nil {
		t.Fatalf("the README's adjustments query: %v", err)
	}
	out := map[string]int64{}
	for _, r := range rows {
		if r.Seq > p.Visible || r.Seq != 0 && r.Seq <= iv.last {
			t.Fatalf("row %s of checkpoint %d read at position %d after %d", r.key(), r.Seq, p.Visible, iv.last)
		}
		if d := r.Amount - iv.invoiced[r.key()].Amount; d != 0 {
			out[r.key()] = d
			iv.total += d
		}
		iv.invoiced[r.key()] = r
	}
	iv.last = p.Visible
	return out
}

// timeInvoicer is the old README's: adjustments with updated_at after the
// time of its last run.
type timeInvoicer struct {
	db       *sqlx.DB
	last     time.Time
	invoiced map[string]int64
	total    int64
}

func (iv *timeInvoicer) run(t *testing.T) {
	t.Helper()
	var now time.Time
	if err := iv.db.Get(&now, `SELECT UTC_TIMESTAMP(6)`); err != nil {
		t.Fatal(err)
	}
	var rows []adjustment
	if err := iv.db.Select(&rows, `SELECT account_id, currency, window_start, amount_minor, event_count, 0 AS commit_seq
		FROM window_adjustments WHERE updated_at > ?`, iv.last); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		iv.total += r.Amount - iv.invoiced[r.key()]
		iv.invoiced[r.key()] = r.Amount
	}
	iv.last = now
}

// invoiceEvent is a billing event of account acct-a in EUR.
func invoiceEvent(id string, amount int64, at string) *kgo.Record {
	b, _ := json.Marshal(billingEvent{ID: id, Account: "acct-a", Amount: amount, Currency: "EUR", At: at})
	return &kgo.Record{Key: []byte("acct-a"), Value: b}
}

// closingSettings: hourly windows that close 30 minutes after their end.
var closingSettings = map[string]string{"BILLING_WINDOW": "1h", "WINDOW_CLOSE_AFTER": "30m"}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

const adjustedWindow = "acct-a/EUR@2026-11-29T10:00:00Z"

// closeAndAdjust produces the events that close the window of 10:00 and
// make one adjustment of it (10), waits until it is sealed, applied and
// visible, and runs both invoicers once.
func closeAndAdjust(t *testing.T, e *testEnv, q map[string]string, iv *invoicer, old *timeInvoicer) position {
	t.Helper()
	testenv.Produce(t, e.brokers, e.topic,
		invoiceEvent("i-1", 100, "2026-11-29T10:05:00Z"),
		invoiceEvent("i-2", 1, "2026-11-29T11:30:00Z"),  // 10:00 ends at 11:00 and closes at 11:30
		invoiceEvent("i-3", 10, "2026-11-29T10:10:00Z"), // late: an adjustment of 10:00
	)
	var p position
	testenv.Eventually(t, time.Minute, "the 10:00 window sealed and visible with its adjustment", func() (bool, string) {
		var err error
		if p, err = tryPosition(e.db, q); err != nil {
			return false, err.Error()
		}
		_, n := ledger(t, e.db)
		return n == 3 && p.Visible == p.Decided && p.Sealed.Valid && p.Sealed.Time.After(ts(t, "2026-11-29T10:00:00Z")), fmt.Sprintf("%d events, %+v", n, p)
	})
	var closed []struct {
		Account  string       `db:"account_id"`
		Currency string       `db:"currency"`
		Amount   int64        `db:"amount_minor"`
		Count    int64        `db:"event_count"`
		Closed   sql.NullTime `db:"closed_at"`
	}
	if err := e.db.Select(&closed, q["closed-period"], ts(t, "2026-11-29T10:00:00Z")); err != nil {
		t.Fatalf("the README's closed period query: %v", err)
	}
	if len(closed) != 1 || closed[0].Amount != 100 || closed[0].Count != 1 || !closed[0].Closed.Valid {
		t.Fatalf("the closed period 10:00: %+v, want acct-a with 100 over 1 event", closed)
	}
	if got := iv.run(t); got[adjustedWindow] != 10 || len(got) != 1 {
		t.Fatalf("first invoice run: %v, want the adjustment of 10", got)
	}
	old.run(t)
	if old.total != 10 {
		t.Fatalf("the old invoicer's first run: %d, want 10", old.total)
	}
	return p
}

func ts(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func invoicingHeldLock(t *testing.T, q map[string]string) {
	e := newTestEnv(t, 1)
	// A lock wait far shorter than the lock would make the checkpoint
	// replay instead of waiting: it waits up to 20 s here.
	svc := e.start(t, "billing", merge(closingSettings, map[string]string{
		"MYSQL_LOCK_WAIT_TIMEOUT": "20s", "CHECKPOINT_TIMEOUT": "30s", "KAFKA_REBALANCE_TIMEOUT": "40s"}))
	iv, old := newInvoicer(e.db, q), &timeInvoicer{db: e.db, invoiced: map[string]int64{}}
	closeAndAdjust(t, e, q, iv, old)

	ctx := context.Background()
	lock, err := e.db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback() }()
	var held int64
	if err := lock.GetContext(ctx, &held, `SELECT amount_minor FROM window_adjustments
		WHERE account_id = 'acct-a' AND currency = 'EUR' AND window_start = '2026-11-29 10:00:00' FOR UPDATE`); err != nil || held != 10 {
		t.Fatalf("locking the adjustment row: %d, %v", held, err)
	}
	testenv.Produce(t, e.brokers, e.topic, invoiceEvent("i-4", 7, "2026-11-29T10:20:00Z"))
	testenv.Eventually(t, time.Minute, "the checkpoint waiting for the row lock", func() (bool, string) {
		// PROCESSLIST, not INNODB_TRX: InnoDB serves the latter from a
		// cache that frequent reads keep from being refreshed.
		var waiting int
		err := e.db.Get(&waiting, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND COMMAND = 'Query' AND TIME_MS > 300 AND INFO LIKE 'INSERT INTO window_adjustments%'`)
		return err == nil && waiting > 0, fmt.Sprint(waiting, err)
	})
	// The checkpoint began before this run and commits after it.
	if got := iv.run(t); len(got) != 0 {
		t.Fatalf("an invoice run during the lock wait invoiced %v: nothing of the waiting checkpoint is committed", got)
	}
	old.run(t)
	time.Sleep(500 * time.Millisecond)
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the late event counted", func() (bool, string) {
		_, n := ledger(t, e.db)
		return n == 4, fmt.Sprint(n)
	})
	waitApplied(t, e.db, q, 0)
	if got := iv.run(t); got[adjustedWindow] != 7 || len(got) != 1 {
		t.Fatalf("the run after the lock: %v, want the 7 of the late event", got)
	}
	if got := iv.run(t); len(got) != 0 {
		t.Fatalf("another run invoiced %v again", got)
	}
	old.run(t)
	var truth int64
	if err := e.db.Get(&truth, `SELECT SUM(amount_minor) FROM window_adjustments`); err != nil || truth != 17 {
		t.Fatalf("adjustments hold %d (%v), want 17", truth, err)
	}
	if iv.total != truth {
		t.Fatalf("invoiced %d, the adjustments hold %d", iv.total, truth)
	}
	// The checkpoint's updated_at is from before the run it committed
	// after: the old query never sees it.
	if old.total == truth {
		t.Fatalf("the invoicer by updated_at saw the late commit too (%d): the lock did not delay the checkpoint past a run", old.total)
	}
	t.Logf("invoiced %d by the commit position; the invoicer by updated_at invoiced %d", iv.total, old.total)
	svc.Signal(syscall.SIGTERM)
}

func invoicingInDoubt(t *testing.T, q map[string]string) {
	e := newTestEnv(t, 1)
	first := e.start(t, "first", closingSettings)
	iv, old := newInvoicer(e.db, q), &timeInvoicer{db: e.db, invoiced: map[string]int64{}}
	closeAndAdjust(t, e, q, iv, old)
	first.Signal(syscall.SIGTERM)
	if err := first.Wait(t, 30*time.Second); err != nil {
		t.Fatalf("first instance: %v", err)
	}
	before := waitApplied(t, e.db, q, 0)

	// The victim's first decision is that of the late event: killed right
	// after it, its branch is left in doubt, decided commit.
	testenv.Produce(t, e.brokers, e.topic, invoiceEvent("i-4", 7, "2026-11-29T10:20:00Z"))
	victim := e.start(t, "victim", merge(closingSettings, map[string]string{"BILLING_FAILPOINTS": "after-decision=kill@1"}))
	instance := instanceOf(t, victim)
	if err := victim.Wait(t, time.Minute); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("victim ended with %v, want killed after its decision", err)
	}
	if n := testenv.InDoubt(t, e.db, "blg1-"+instance+"-"); n == 0 {
		t.Fatalf("no branch of the victim in doubt: its first decision was not the late event's\n%s", victim.Output())
	}
	p := readPosition(t, e.db, q)
	if p.Decided != before.Decided+1 || p.Visible != before.Decided {
		t.Fatalf("with the victim's checkpoint decided and in doubt: %+v, want decided %d and visible %d", p, before.Decided+1, before.Decided)
	}
	if got := iv.run(t); len(got) != 0 {
		t.Fatalf("an invoice run with the branch in doubt invoiced %v", got)
	}
	old.run(t)
	time.Sleep(500 * time.Millisecond)

	// The successor's recovery commits the branch and marks it applied.
	next := e.start(t, "successor", closingSettings)
	testenv.Eventually(t, time.Minute, "the branch in doubt rolled forward", func() (bool, string) {
		_, n := ledger(t, e.db)
		return n == 4 && testenv.InDoubt(t, e.db, "blg1-"+instance+"-") == 0, fmt.Sprint(n)
	})
	waitApplied(t, e.db, q, before.Decided)
	if got := iv.run(t); got[adjustedWindow] != 7 || len(got) != 1 {
		t.Fatalf("the run after recovery: %v, want the 7 of the late event", got)
	}
	old.run(t)
	var truth int64
	if err := e.db.Get(&truth, `SELECT SUM(amount_minor) FROM window_adjustments`); err != nil || truth != 17 || iv.total != truth {
		t.Fatalf("invoiced %d, the adjustments hold %d (%v), want 17", iv.total, truth, err)
	}
	if old.total == truth {
		t.Fatalf("the invoicer by updated_at saw the recovered commit too (%d)", old.total)
	}
	t.Logf("invoiced %d by the commit position; the invoicer by updated_at invoiced %d", iv.total, old.total)
	next.Signal(syscall.SIGTERM)
}

func invoicingSealing(t *testing.T, q map[string]string) {
	const accounts = 12_000 // sealed 10,000 rows per server and checkpoint
	e := newTestEnv(t, 1)
	// Every checkpoint waits 300 ms between its decision and its XA
	// COMMIT: the decision that raises the sealed frontier is durable that
	// long before the last rows it sealed are visible.
	svc := e.start(t, "billing", merge(closingSettings, map[string]string{
		"CHECKPOINT_MAX_RECORDS": "5000", "KAFKA_MAX_POLL_RECORDS": "5000", "BILLING_FAILPOINTS": "after-decision=sleep:300ms"}))
	recs := make([]*kgo.Record, 0, accounts+1)
	for i := range accounts {
		b, _ := json.Marshal(billingEvent{ID: fmt.Sprintf("s-%d", i), Account: fmt.Sprintf("acct-%05d", i), Amount: int64(i + 1), Currency: "EUR", At: "2026-11-29T10:05:00Z"})
		recs = append(recs, &kgo.Record{Key: []byte("k"), Value: b})
	}
	testenv.Produce(t, e.brokers, e.topic, recs...)
	testenv.Eventually(t, 2*time.Minute, "the window's events counted", func() (bool, string) {
		_, n := ledger(t, e.db)
		return n == accounts, fmt.Sprint(n)
	})
	window := ts(t, "2026-11-29T10:00:00Z")

	// A reader polls while the window closes and is sealed.
	var (
		mu                      sync.Mutex
		polls, partial, premise int
		bad                     string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			var p position
			if err := e.db.Get(&p, q["commit-position"]); err != nil {
				mu.Lock()
				bad = err.Error()
				mu.Unlock()
				return
			}
			var rows []struct {
				Account  string       `db:"account_id"`
				Currency string       `db:"currency"`
				Amount   int64        `db:"amount_minor"`
				Count    int64        `db:"event_count"`
				Closed   sql.NullTime `db:"closed_at"`
			}
			if err := e.db.Select(&rows, q["closed-period"], window); err != nil {
				mu.Lock()
				bad = err.Error()
				mu.Unlock()
				return
			}
			mu.Lock()
			polls++
			if len(rows) > 0 && len(rows) < accounts {
				partial++ // what the old README took for the sealed period
			}
			if p.Sealed.Valid && p.Sealed.Time.After(window) {
				premise++
				var sum int64
				for _, r := range rows {
					sum += r.Amount
				}
				if len(rows) != accounts || sum != accounts*(accounts+1)/2 {
					bad = fmt.Sprintf("position %+v says the window is completely sealed, but the period reads %d rows summing to %d", p, len(rows), sum)
				}
			}
			done := premise > 0 || bad != ""
			mu.Unlock()
			if done {
				return
			}
		}
	})
	testenv.Produce(t, e.brokers, e.topic, invoiceEvent("s-close", 1, "2026-11-29T11:30:00Z"))
	testenv.Eventually(t, 2*time.Minute, "the window reported completely sealed", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return premise > 0 || bad != "", fmt.Sprintf("%d polls, %d partial", polls, partial)
	})
	close(stop)
	wg.Wait()
	if bad != "" {
		t.Fatal(bad)
	}
	if partial == 0 {
		t.Fatalf("no poll of %d saw the window partly sealed: the sealing did not span checkpoints, or was not observed", polls)
	}
	var open int
	if err := e.db.Get(&open, `SELECT COUNT(*) FROM billing_windows WHERE window_start = ? AND closed_at IS NULL`, window); err != nil || open != 0 {
		t.Fatalf("%d open rows of the sealed window (%v)", open, err)
	}
	t.Logf("%d polls: %d saw the period partly sealed (closed_at set on some rows), none was told it was complete before it was", polls, partial)
	svc.Signal(syscall.SIGTERM)
}
