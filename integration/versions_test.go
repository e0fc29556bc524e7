package integration_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/testenv"
)

// versionedEvent is a record of the contract with its version fields.
type versionedEvent struct {
	ID        string `json:"event_id"`
	Revision  int64  `json:"revision,omitempty"`
	Cancelled bool   `json:"cancelled,omitempty"`
	Account   string `json:"account_id,omitempty"`
	Amount    int64  `json:"amount_minor,omitempty"`
	Currency  string `json:"currency,omitempty"`
	At        string `json:"occurred_at,omitempty"`
}

// versionedWorkload is n events of which about a third get versions:
// amendments (some to another account or currency), cancellations,
// versions sent before lower ones, and repeats of versions, each record
// under a key of its own so that the versions of one event spread over
// the partitions. The ledger must count each event's highest revision.
func versionedWorkload(prefix string, n int) *workload {
	rng := rand.New(rand.NewPCG(7, uint64(n)))
	w := &workload{want: map[string]total{}}
	base := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	content := func(id string, rev int64) versionedEvent {
		amount := int64(rng.IntN(2000) - 500)
		if amount == 0 {
			amount = 1 // the record omits a zero amount_minor
		}
		return versionedEvent{ID: id, Revision: rev, Account: fmt.Sprintf("acct-%d", rng.IntN(30)), Amount: amount,
			Currency: []string{"EUR", "USD"}[rng.IntN(2)], At: base.Add(time.Duration(rng.IntN(3*3600)) * time.Second).Format(time.RFC3339)}
	}
	var pending []versionedEvent
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		versions := []versionedEvent{content(id, 0)}
		if rng.IntN(3) == 0 {
			for rev := int64(1); rev <= int64(1+rng.IntN(3)); rev++ {
				v := content(id, rev)
				if rng.IntN(4) == 0 {
					v = versionedEvent{ID: id, Revision: rev, Cancelled: true}
				}
				versions = append(versions, v)
			}
			rng.Shuffle(len(versions), func(i, j int) { versions[i], versions[j] = versions[j], versions[i] })
		}
		highest := versions[0]
		for _, v := range versions {
			if v.Revision > highest.Revision {
				highest = v
			}
		}
		if !highest.Cancelled {
			k := highest.Account + "/" + highest.Currency
			t := w.want[k]
			t.amount += highest.Amount
			t.count++
			w.want[k] = t
			w.events++
		}
		if rng.IntN(5) == 0 {
			versions = append(versions, versions[rng.IntN(len(versions))]) // a repeat of a version
		}
		pending = append(pending, versions...)
		// Versions of one event arrive some records apart, in later
		// checkpoints and on other partitions.
		if i%40 == 39 {
			rng.Shuffle(len(pending), func(i, j int) { pending[i], pending[j] = pending[j], pending[i] })
			for j, v := range pending {
				b, _ := json.Marshal(v)
				w.records = append(w.records, &kgo.Record{Key: []byte(fmt.Sprintf("%s-%d-%d", v.ID, v.Revision, j)), Value: b})
			}
			pending = nil
		}
	}
	for j, v := range pending {
		b, _ := json.Marshal(v)
		w.records = append(w.records, &kgo.Record{Key: []byte(fmt.Sprintf("%s-%d-%d", v.ID, v.Revision, j)), Value: b})
	}
	return w
}

// Versions of events spread over four partitions and two instances, one
// of which is killed (SIGKILL) twice and started again: every event counts
// its highest revision, exactly, and nothing is a dead letter. With
// windows that close, amendments and cancellations take their
// retractions from closed windows' adjustments (and move events into
// closed windows): the balances are exact and equal the windows plus the
// adjustments.
func TestVersionsOnTwoInstancesWithKills(t *testing.T) {
	for _, closing := range []bool{false, true} {
		t.Run(fmt.Sprintf("closing=%v", closing), func(t *testing.T) { versionsWithKills(t, closing) })
	}
}

func versionsWithKills(t *testing.T, closing bool) {
	e := newTestEnv(t, 4)
	w := versionedWorkload("ver", 2400)
	var env map[string]string
	if closing {
		env = map[string]string{"WINDOW_CLOSE_AFTER": "10m"}
	}
	a := e.start(t, "a", env)
	b := e.start(t, "b", env)
	chunks := 6
	size := len(w.records) / chunks
	for i := range chunks {
		end := (i + 1) * size
		if i == chunks-1 {
			end = len(w.records)
		}
		testenv.Produce(t, e.brokers, e.topic, w.records[i*size:end]...)
		if i == 1 || i == 3 {
			time.Sleep(700 * time.Millisecond)
			b.Signal(syscall.SIGKILL)
			_ = b.Wait(t, 30*time.Second)
			b = e.start(t, fmt.Sprintf("b%d", i), env)
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Cleanup(func() {
		if t.Failed() {
			var letters []struct {
				Reason string `db:"reason"`
				Detail string `db:"detail"`
			}
			_ = e.db.Select(&letters, `SELECT reason, detail FROM dead_letters`)
			t.Logf("dead letters: %+v", letters)
		}
	})
	if !closing {
		waitExact(t, e.db, w, 120*time.Second)
	} else {
		waitExactWithAdjustments(t, e.db, w, 120*time.Second)
	}
	if !strings.Contains(a.Output(), "partitions assigned") {
		t.Fatal("a never held partitions")
	}
}

// waitExactWithAdjustments waits until the ledger counts as many events as
// the workload, then checks every balance exactly, that for every account
// and currency the windows plus the adjustments add up to the balance
// (amount and count), that some retraction or late event went to the
// adjustments, and that no dead letter was written.
func waitExactWithAdjustments(t *testing.T, db *sqlx.DB, w *workload, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if _, n := ledger(t, db); n >= w.events {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	got, n := ledger(t, db)
	if n != w.events {
		t.Fatalf("ledger counts %d events, want %d", n, w.events)
	}
	for k, want := range w.want {
		if got[k] != want {
			t.Errorf("%s: got %+v want %+v", k, got[k], want)
		}
	}
	var sums []struct {
		Key    string `db:"k"`
		Amount int64  `db:"amount"`
		Count  int64  `db:"events"`
	}
	if err := db.Select(&sums, `SELECT CONCAT(account_id, '/', currency) AS k, SUM(amount_minor) AS amount, SUM(event_count) AS events FROM
		(SELECT account_id, currency, amount_minor, event_count FROM billing_windows
		 UNION ALL SELECT account_id, currency, amount_minor, event_count FROM window_adjustments) AS s GROUP BY account_id, currency`); err != nil {
		t.Fatal(err)
	}
	for _, s := range sums {
		if b := got[s.Key]; b.amount != s.Amount || b.count != s.Count {
			t.Errorf("%s: windows and adjustments %d over %d, balance %+v", s.Key, s.Amount, s.Count, b)
		}
	}
	var adjusted, negative, dead int64
	_ = db.Get(&adjusted, `SELECT COUNT(*) FROM window_adjustments`)
	_ = db.Get(&negative, `SELECT COUNT(*) FROM window_adjustments WHERE event_count < 0`)
	_ = db.Get(&dead, `SELECT COUNT(*) FROM dead_letters`)
	if adjusted == 0 || dead != 0 {
		t.Fatalf("%d adjustment rows (%d retracting more than they add), %d dead letters", adjusted, negative, dead)
	}
	t.Logf("%d adjustment rows, %d of them retracting more than they add", adjusted, negative)
}

// billing-gen's versions (amendments, cancellations, out of order, sent
// twice, on any partition) beside its repeats, conflicts, overflow cases
// and future records, on four partitions and two instances, one killed,
// with windows that close: billing-verify finds the ledger EXACT (each
// event's highest revision).
func TestVersionsVerifiedEndToEnd(t *testing.T) {
	genBin := testenv.Binary(t, "github.com/billing/ledger/cmd/billing-gen")
	verifyBin := testenv.Binary(t, "github.com/billing/ledger/cmd/billing-verify")
	e := newTestEnv(t, 4)
	settings := map[string]string{"WINDOW_CLOSE_AFTER": "2h"}
	procs := []*testenv.Process{e.start(t, "billing-1", settings), e.start(t, "billing-2", settings)}
	expected := filepath.Join(t.TempDir(), "expected.json")
	gen := testenv.Start(t, "billing-gen", genBin, nil,
		"-brokers", strings.Join(e.brokers, ","), "-topic", e.topic, "-events", "4000", "-rate", "1500",
		"-windows", "24", "-close-after", "2h", "-version-ratio", "0.2",
		"-overflow-cases", "2", "-dup-ratio", "0.05", "-conflict-ratio", "0.01", "-late-ratio", "0.1", "-future-ratio", "0.005",
		"-seed", "34", "-expected", expected, "-progress", "none")
	time.Sleep(time.Second)
	procs[0].Signal(syscall.SIGKILL)
	procs = append(procs, e.start(t, "billing-3", settings))
	if err := gen.Wait(t, 3*time.Minute); err != nil {
		t.Fatalf("billing-gen: %v\n%s", err, gen.Output())
	}
	exp, err := ledgercheck.ReadFile(expected)
	if err != nil {
		t.Fatal(err)
	}
	if exp.Produced.Versions == 0 || exp.SplitExact {
		t.Fatalf("expected ledger: %d versions, split exact %v", exp.Produced.Versions, exp.SplitExact)
	}
	verify := testenv.Start(t, "billing-verify", verifyBin, nil,
		"-dsn", e.dsn, "-expected", expected, "-topic", e.topic, "-wait", "2m", "-interval", "500ms")
	if err := verify.Wait(t, 3*time.Minute); err != nil || !strings.Contains(verify.Output(), "\nEXACT: ") {
		t.Fatalf("billing-verify: %v\n%s", err, verify.Output())
	}
	t.Logf("%d versions; %s", exp.Produced.Versions, strings.TrimSpace(verify.Output()))
	for _, p := range procs {
		p.Signal(syscall.SIGTERM)
	}
}

// With LEDGER_ENTRIES=true the entries explain every version: billing-gen's
// versions on four partitions and two instances, one killed, with windows
// that close; billing-verify finds the ledger EXACT, entries included (one
// net entry per counted event, their digest, each window's and each
// adjustment's entries summing to its row), and each balance is the sum of
// its account's entries, retractions and additions among them.
func TestVersionsExplainedByLedgerEntries(t *testing.T) {
	genBin := testenv.Binary(t, "github.com/billing/ledger/cmd/billing-gen")
	verifyBin := testenv.Binary(t, "github.com/billing/ledger/cmd/billing-verify")
	e := newTestEnv(t, 4)
	settings := map[string]string{"WINDOW_CLOSE_AFTER": "2h", "LEDGER_ENTRIES": "true"}
	procs := []*testenv.Process{e.start(t, "billing-1", settings), e.start(t, "billing-2", settings)}
	expected := filepath.Join(t.TempDir(), "expected.json")
	gen := testenv.Start(t, "billing-gen", genBin, nil,
		"-brokers", strings.Join(e.brokers, ","), "-topic", e.topic, "-events", "3000", "-rate", "1500",
		"-windows", "24", "-close-after", "2h", "-version-ratio", "0.2", "-ledger-entries",
		"-dup-ratio", "0.05", "-late-ratio", "0.1", "-seed", "35", "-expected", expected, "-progress", "none")
	time.Sleep(time.Second)
	procs[0].Signal(syscall.SIGKILL)
	procs = append(procs, e.start(t, "billing-3", settings))
	if err := gen.Wait(t, 3*time.Minute); err != nil {
		t.Fatalf("billing-gen: %v\n%s", err, gen.Output())
	}
	verify := testenv.Start(t, "billing-verify", verifyBin, nil,
		"-dsn", e.dsn, "-expected", expected, "-topic", e.topic, "-wait", "2m", "-interval", "500ms")
	if err := verify.Wait(t, 3*time.Minute); err != nil || !strings.Contains(verify.Output(), "\nEXACT: ") {
		t.Fatalf("billing-verify: %v\n%s", err, verify.Output())
	}
	for _, p := range procs {
		p.Signal(syscall.SIGTERM)
	}
	var kinds []struct {
		Entry int   `db:"entry"`
		N     int64 `db:"n"`
	}
	if err := e.db.Select(&kinds, `SELECT entry, COUNT(*) AS n FROM ledger_entries GROUP BY entry ORDER BY entry`); err != nil {
		t.Fatal(err)
	}
	if len(kinds) != 3 {
		t.Fatalf("entries by kind %+v: want events, retractions and additions", kinds)
	}
	var off []string
	if err := e.db.Select(&off, `SELECT CONCAT(b.account_id, ' ', b.currency) FROM account_balances b LEFT JOIN
		(SELECT account_id, currency, SUM(amount_minor) AS amount, SUM(CASE entry WHEN 1 THEN -1 ELSE 1 END) AS n FROM ledger_entries GROUP BY account_id, currency) s
		ON s.account_id = b.account_id AND s.currency = b.currency
		WHERE NOT (b.balance_minor = COALESCE(s.amount, 0) AND b.event_count = COALESCE(s.n, 0))`); err != nil {
		t.Fatal(err)
	}
	if len(off) != 0 {
		t.Errorf("balances not the sum of their entries: %v", off)
	}
	t.Logf("entries by kind %+v; %s", kinds, strings.TrimSpace(verify.Output()))
}
