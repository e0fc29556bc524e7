package integration_test

// Production-operations tests (issue 5): graceful shutdown under load,
// metrics and health endpoints, dead-letter reinjection, least-privilege
// grants, MySQL over TLS. Helpers here are prefixed with ops so that they
// never collide with the other test files of the package.

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/mysqlconn"
	"github.com/billing/ledger/internal/testcert"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// opsEnv is testEnv (ledger_test.go) with the settings the operations tests
// need: longer timeouts (a graceful shutdown under load must fit them),
// JSON logs that the tests parse, and fast metric sampling.
type opsEnv struct {
	*testEnv
	group string
}

func newOpsEnv(t *testing.T, partitions int) *opsEnv {
	t.Helper()
	e := newTestEnv(t, partitions)
	return &opsEnv{testEnv: e, group: "g-" + e.topic}
}

// producer is a client producing to e's topic, and a context of five
// minutes for the test's produces; both end with the test.
func (e *opsEnv) producer(t *testing.T) (context.Context, *kgo.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(e.topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return ctx, cl
}

func (e *opsEnv) env(extra map[string]string) map[string]string {
	env := e.serviceEnv(map[string]string{
		"MYSQL_SHARD_DSNS":        "",
		"CHECKPOINT_INTERVAL":     "200ms",
		"CHECKPOINT_TIMEOUT":      "10s",
		"CHECKPOINT_MAX_RECORDS":  "2000",
		"KAFKA_MAX_POLL_RECORDS":  "500",
		"KAFKA_SESSION_TIMEOUT":   "10s",
		"KAFKA_REBALANCE_TIMEOUT": "30s",
		"MYSQL_LOCK_WAIT_TIMEOUT": "5s",
		"RECOVERY_INTERVAL":       "2s",
		"SHUTDOWN_TIMEOUT":        "20s",
		"METRICS_SAMPLE_INTERVAL": "1s",
		"LOG_FORMAT":              "json",
		"LOG_LEVEL":               "info",
		"BILLING_FAILPOINTS":      "",
	})
	maps.Copy(env, extra)
	return env
}

// cli runs a billing subcommand to completion and returns its output and
// exit status.
func (e *opsEnv) cli(t *testing.T, extra map[string]string, args ...string) (string, int) {
	t.Helper()
	p := testenv.Start(t, "billing "+strings.Join(args, " "), e.bin, e.env(extra), args...)
	err := p.Wait(t, 2*time.Minute)
	var ee *exec.ExitError
	switch {
	case err == nil:
		return p.Output(), 0
	case errors.As(err, &ee):
		return p.Output(), ee.ExitCode()
	default:
		t.Fatalf("billing %v: %v", args, err)
		return "", -1
	}
}

func opsFreeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func opsGet(url string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// opsMetric returns the sum of the samples of a metric whose series match
// the label filter (a substring of the label set, empty for all), and how
// many series matched.
func opsMetric(body, name, filter string) (float64, int) {
	var sum float64
	var n int
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || strings.HasPrefix(line, "#") {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') || !strings.Contains(rest, filter) {
			continue
		}
		f := strings.Fields(rest)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		sum += v
		n++
	}
	return sum, n
}

// opsEvent is a billing event as the producer writes it.
type opsEvent struct {
	ID       string `json:"event_id"`
	Account  string `json:"account_id"`
	Amount   int64  `json:"amount_minor"`
	Currency string `json:"currency"`
	At       string `json:"occurred_at"`
}

type opsTotal struct{ amount, count int64 }

// opsProduced is one record as written: where it landed and what it says.
type opsProduced struct {
	partition int32
	offset    int64
	ev        opsEvent
}

// opsExpected is the ledger the records imply: each event id counts once
// (the repeats in these tests are exact duplicates, so which copy counts
// does not matter).
func opsExpected(recs []opsProduced, below map[int32]int64) (map[string]opsTotal, int64) {
	seen := map[string]bool{}
	want := map[string]opsTotal{}
	var n int64
	for _, r := range recs {
		if below != nil && r.offset >= below[r.partition] {
			continue
		}
		if seen[r.ev.ID] {
			continue
		}
		seen[r.ev.ID] = true
		k := r.ev.Account + "/" + r.ev.Currency
		t := want[k]
		t.amount += r.ev.Amount
		t.count++
		want[k] = t
		n++
	}
	return want, n
}

// opsLedger reads account_balances.
func opsLedger(t *testing.T, db *sqlx.DB) map[string]opsTotal {
	t.Helper()
	var rows []struct {
		Account  []byte `db:"account_id"`
		Currency string `db:"currency"`
		Amount   int64  `db:"balance_minor"`
		Count    int64  `db:"event_count"`
	}
	if err := db.Select(&rows, `SELECT account_id, currency, balance_minor, event_count FROM account_balances`); err != nil {
		t.Fatal(err)
	}
	m := map[string]opsTotal{}
	for _, r := range rows {
		m[string(r.Account)+"/"+r.Currency] = opsTotal{r.Amount, r.Count}
	}
	return m
}

func opsCompare(t *testing.T, what string, got, want map[string]opsTotal) {
	t.Helper()
	var diffs []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] {
			diffs = append(diffs, fmt.Sprintf("%s: got %+v want %+v", k, got[k], want[k]))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: got %+v, want no row", k, g))
		}
	}
	if len(diffs) > 0 {
		t.Fatalf("%s: %d balances differ:\n%s", what, len(diffs), strings.Join(diffs[:min(len(diffs), 20)], "\n"))
	}
}

// opsPositions reads partition_offsets.next_offset per partition; a
// partition never checkpointed (-2) has consumed nothing. The positions
// are the decision's, which commits before the checkpoint's branches do:
// so it then waits (up to opsApplyWait) for the commit log to show every
// decision taken so far applied, so that a caller who sees a position
// also sees the rows of the checkpoints behind it.
func opsPositions(t *testing.T, e *opsEnv) map[int32]int64 {
	t.Helper()
	pos := opsReadPositions(t, e)
	ctx := context.Background()
	decided, err := mysqldriver.ReadCommitPosition(ctx, e.db)
	if err != nil {
		return pos // no commit log yet: no decision either
	}
	for deadline := time.Now().Add(opsApplyWait); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if p, err := mysqldriver.ReadCommitPosition(ctx, e.db); err == nil && p.Visible >= decided.Decided {
			break
		}
	}
	return pos
}

// opsApplyWait bounds opsPositions' wait for the branches of decisions
// already taken to commit (a stopped or killed instance leaves them to
// recovery: the caller then sees positions ahead of rows, as a reader of
// partition_offsets without the commit log would).
const opsApplyWait = 10 * time.Second

func opsReadPositions(t *testing.T, e *opsEnv) map[int32]int64 {
	t.Helper()
	var rows []struct {
		Partition int32 `db:"kafka_partition"`
		Next      int64 `db:"next_offset"`
	}
	err := e.db.Select(&rows, `SELECT kafka_partition, next_offset FROM partition_offsets WHERE consumer_group = ? AND kafka_topic = ?`, e.group, e.topic)
	if mysqldriver.NoSuchTable(err) { // no table yet
		return map[int32]int64{}
	}
	if err != nil {
		t.Fatal(err)
	}
	pos := map[int32]int64{}
	for _, r := range rows {
		pos[r.Partition] = max(r.Next, 0)
	}
	return pos
}

func opsSum(m map[int32]int64) int64 {
	var s int64
	for _, v := range m {
		s += v
	}
	return s
}

// opsStoppedCounted parses the "stopped" log line of a JSON-logging
// service and returns the events it counted.
func opsStoppedCounted(t *testing.T, out string) int64 {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		var l struct {
			Msg     string `json:"msg"`
			Counted *int64 `json:"counted"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "stopped" && l.Counted != nil {
			return *l.Counted
		}
	}
	t.Fatalf("no \"stopped\" log line in the output")
	return 0
}

// TestShutdownWhileStartingExitsZero: a SIGTERM that lands while the
// service starts (connecting, migrating, reading its stored positions and
// groups, joining the group) is a clean stop, exit 0, like one later.
// Before, a signal during the read of the stored groups made the service
// exit 1 with "stored groups: context canceled", and an orchestrator's
// rolling restart reported a failed container; and a signal during the
// first start's migrations cut a migration file in the middle, so that
// every later start failed with goose's "partial migration error" (the
// subtests share one database: each later one starts on what the earlier
// left). The signal is sent at the log line of each start-up phase, so
// that it lands in each of them or in the step right after, whatever the
// machine's speed.
func TestShutdownWhileStartingExitsZero(t *testing.T) {
	e := newOpsEnv(t, 1)
	points := []string{"configured", "ledger clock measured", "period settings", `"msg":"starting"`, "partitions assigned"}
	for _, at := range points {
		t.Run("at "+at, func(t *testing.T) {
			svc := testenv.Start(t, "billing stopped at "+at, e.bin, e.env(nil))
			if !svc.WaitOutput(context.Background(), at, time.Minute) {
				t.Fatalf("no %q in the output:\n%s", at, svc.Output())
			}
			svc.Signal(syscall.SIGTERM)
			if err := svc.Wait(t, time.Minute); err != nil {
				t.Fatalf("SIGTERM at %q: %v, want exit 0:\n%s", at, err, svc.Output())
			}
		})
	}
}

// TestGracefulShutdownUnderLoad: SIGTERM while records are being produced
// and consumed. The service exits 0 within SHUTDOWN_TIMEOUT, leaves the
// consumer group (no member remains, long before the session timeout could
// have expired one), and the ledger matches the offsets it committed
// exactly: every event below the stored cut counted once, none above it.
// Restarted, it finishes the topic and the ledger is exact for everything
// produced; the two runs' counted totals add up to the distinct events.
// /metrics, /readyz (including "idle" once caught up) and the lag metric
// are checked along the way.
func TestGracefulShutdownUnderLoad(t *testing.T) {
	const (
		partitions = 4
		total      = 20000
		batch      = 100
	)
	e := newOpsEnv(t, partitions)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	addr := opsFreeAddr(t)
	svc := testenv.Start(t, "billing-1", e.bin, e.env(map[string]string{"HTTP_ADDR": addr, "KAFKA_SESSION_TIMEOUT": "45s"}))
	testenv.Eventually(t, 2*time.Minute, "/readyz answers 200 (partitions assigned)", func() (bool, string) {
		if svc.Exited() {
			t.Fatalf("service exited early:\n%s", svc.Output())
		}
		code, body := opsGet("http://" + addr + "/readyz")
		return code == 200, fmt.Sprintf("%d %s", code, body)
	})

	// Producer: 20,000 records (every 25th an exact duplicate of an
	// earlier event, same key) at about 1,000 records/s, started once the
	// service consumes, so that the SIGTERM below lands while it runs.
	var (
		mu       sync.Mutex
		produced []opsProduced
	)
	prodDone := make(chan error, 1)
	go func() {
		prodDone <- func() error {
			cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.DefaultProduceTopic(e.topic))
			if err != nil {
				return err
			}
			defer cl.Close()
			base := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
			var evs []opsEvent
			for i := 0; i < total; i += batch {
				recs := make([]*kgo.Record, 0, batch)
				for j := i; j < i+batch; j++ {
					ev := opsEvent{ID: fmt.Sprintf("gs-%d", j), Account: fmt.Sprintf("acct-%02d", j%50),
						Amount: int64(j%23*10 - 50), Currency: []string{"EUR", "USD"}[j%2], At: base.Add(time.Duration(j) * time.Second).Format(time.RFC3339)}
					if j%25 == 24 {
						ev = evs[j-1-(j/25)%23] // an exact repeat, of varying accounts
					}
					evs = append(evs, ev)
					b, _ := json.Marshal(ev)
					recs = append(recs, &kgo.Record{Key: []byte(ev.Account), Value: b})
				}
				if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
					return err
				}
				mu.Lock()
				for k, r := range recs {
					produced = append(produced, opsProduced{r.Partition, r.Offset, evs[i+k]})
				}
				mu.Unlock()
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(100 * time.Millisecond):
				}
			}
			return nil
		}()
	}()

	testenv.Eventually(t, 2*time.Minute, "first run makes progress", func() (bool, string) {
		if svc.Exited() {
			t.Fatalf("service exited early:\n%s", svc.Output())
		}
		n := opsSum(opsPositions(t, e))
		return n >= 2000, fmt.Sprintf("%d records committed", n)
	})
	if code, body := opsGet("http://" + addr + "/healthz"); code != 200 {
		t.Fatalf("/healthz = %d %s", code, body)
	}
	_, metrics := opsGet("http://" + addr + "/metrics")
	for _, name := range []string{"billing_records_consumed_total", "billing_events_counted_total", "billing_checkpoints_total"} {
		if v, n := opsMetric(metrics, name, ""); n == 0 || v <= 0 {
			t.Errorf("metric %s = %v (%d series), want > 0", name, v, n)
		}
	}
	if _, n := opsMetric(metrics, "billing_dead_letters_total", `reason="invalid_currency"`); n != 1 {
		t.Errorf("billing_dead_letters_total{reason=\"invalid_currency\"} not pre-registered")
	}

	// SIGTERM under load.
	mu.Lock()
	inFlight := len(produced) < total
	mu.Unlock()
	t.Logf("SIGTERM with %d records committed, producer still running: %v", opsSum(opsPositions(t, e)), inFlight)
	svc.Signal(syscall.SIGTERM)
	if err := svc.Wait(t, 20*time.Second+40*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v, want status 0\n%s", err, svc.Output())
	}
	counted1 := opsStoppedCounted(t, svc.Output())

	// The member left the group: with a 45s session timeout, only a
	// LeaveGroup can have removed it this fast.
	adm := kadmClient(t, e.brokers)
	testenv.Eventually(t, 10*time.Second, "group has no members", func() (bool, string) {
		gs, err := adm.DescribeGroups(ctx, e.group)
		if err != nil {
			return false, err.Error()
		}
		g := gs[e.group]
		return g.Err == nil && len(g.Members) == 0, fmt.Sprintf("state %s, %d members, err %v", g.State, len(g.Members), g.Err)
	})

	if err := <-prodDone; err != nil {
		t.Fatalf("producer: %v", err)
	}
	mu.Lock()
	all := slices.Clone(produced)
	mu.Unlock()
	// Offsets are dense (no transactions): a partition's records are at
	// 0..n-1, so next_offset is also the number of records below the cut.
	perPart := map[int32][]int64{}
	for _, r := range all {
		perPart[r.partition] = append(perPart[r.partition], r.offset)
	}
	for p, offs := range perPart {
		slices.Sort(offs)
		if offs[0] != 0 || offs[len(offs)-1] != int64(len(offs)-1) {
			t.Fatalf("partition %d: offsets not dense from 0 (%d records, last %d)", p, len(offs), offs[len(offs)-1])
		}
	}
	cut := opsPositions(t, e)
	wantCut, nCut := opsExpected(all, cut)
	t.Logf("cut: %v (%d records, %d distinct events)", cut, opsSum(cut), nCut)
	for p, next := range cut {
		if next > int64(len(perPart[p])) {
			t.Fatalf("partition %d: next_offset %d beyond the %d records produced", p, next, len(perPart[p]))
		}
	}
	opsCompare(t, "ledger at the shutdown cut", opsLedger(t, e.db), wantCut)
	if counted1 != nCut {
		t.Errorf("first run counted %d events, the cut holds %d distinct events", counted1, nCut)
	}

	// Restart: the rest of the topic, exactly.
	svc2 := testenv.Start(t, "billing-2", e.bin, e.env(map[string]string{"HTTP_ADDR": addr, "READY_MAX_CHECKPOINT_AGE": "2s"}))
	testenv.Eventually(t, 3*time.Minute, "second run consumes everything", func() (bool, string) {
		if svc2.Exited() {
			t.Fatalf("service exited early:\n%s", svc2.Output())
		}
		n := opsSum(opsPositions(t, e))
		return n == int64(len(all)), fmt.Sprintf("%d of %d records committed", n, len(all))
	})
	wantAll, nAll := opsExpected(all, nil)
	// The decision moves the offsets; the results become visible at XA
	// COMMIT a moment later: wait for every event to show, then compare
	// exactly (a surplus would show as well).
	testenv.Eventually(t, 30*time.Second, "the last checkpoint's results are visible", func() (bool, string) {
		var n int64
		for _, tot := range opsLedger(t, e.db) {
			n += tot.count
		}
		return n >= nAll, fmt.Sprintf("%d of %d events", n, nAll)
	})
	opsCompare(t, "ledger after the restart", opsLedger(t, e.db), wantAll)

	// Caught up: every owned partition's lag is 0, and once the last
	// checkpoint is older than READY_MAX_CHECKPOINT_AGE the instance is
	// still ready, as idle.
	testenv.Eventually(t, 30*time.Second, "lag metric reaches 0 on every partition, dedup_keys sampled", func() (bool, string) {
		_, body := opsGet("http://" + addr + "/metrics")
		v, n := opsMetric(body, "billing_consumer_lag_records", "")
		_, rows := opsMetric(body, "billing_dedup_keys_estimate", `server="0"`)
		// The test's account (root) may read the purge history.
		_, purge := opsMetric(body, "billing_mysql_purge_history_length", `server="0"`)
		_, foreign := opsMetric(body, "billing_xa_foreign_branches_in_doubt", `server="0"`)
		return n == partitions && v == 0 && rows == 1 && purge == 1 && foreign == 1,
			fmt.Sprintf("%d lag series, sum %v; %d dedup_keys estimate, %d purge history, %d foreign branches series", n, v, rows, purge, foreign)
	})
	testenv.Eventually(t, 30*time.Second, "/readyz says idle", func() (bool, string) {
		code, body := opsGet("http://" + addr + "/readyz")
		return code == 200 && strings.Contains(body, "idle"), fmt.Sprintf("%d %s", code, body)
	})
	svc2.Signal(syscall.SIGTERM)
	if err := svc2.Wait(t, time.Minute); err != nil {
		t.Fatalf("second run exit: %v\n%s", err, svc2.Output())
	}
	if counted2 := opsStoppedCounted(t, svc2.Output()); counted1+counted2 != nAll {
		t.Errorf("runs counted %d + %d events, want %d distinct events", counted1, counted2, nAll)
	}
}

func kadmClient(t *testing.T, brokers []string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// opsBalance reads one account's balance and count (zero when absent).
func opsBalance(t *testing.T, db *sqlx.DB, account, currency string) opsTotal {
	t.Helper()
	var r opsTotal
	err := db.QueryRow(`SELECT balance_minor, event_count FROM account_balances WHERE account_id = ? AND currency = ?`, account, currency).Scan(&r.amount, &r.count)
	if errors.Is(err, sql.ErrNoRows) {
		return opsTotal{}
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func opsDeadLetters(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var reasons []string
	if err := db.Select(&reasons, `SELECT reason FROM dead_letters ORDER BY id`); err != nil {
		if mysqldriver.NoSuchTable(err) {
			return nil
		}
		t.Fatal(err)
	}
	return reasons
}

// TestDeadLetterReinjectCountsOnce: a record dead-lettered for an invalid
// currency is listed, shown (payload exported), refused for reinjection as
// is (it would not decode), reinjected with a corrected payload and counted
// once. Reinjecting it again is refused; forcing it produces a copy that
// the pipeline drops as a duplicate, and a forced, different payload is
// dead-lettered as a conflict: the event still counts exactly once.
func TestDeadLetterReinjectCountsOnce(t *testing.T) {
	e := newOpsEnv(t, 1)
	ctx, cl := e.producer(t)
	bad := `{"event_id":"dl-b","account_id":"acct-b","amount_minor":250,"currency":"eur","occurred_at":"2026-11-29T10:00:00Z"}`
	fixed := strings.Replace(bad, `"eur"`, `"EUR"`, 1)
	conflicting := strings.Replace(fixed, `250`, `999`, 1)
	recs := []*kgo.Record{
		{Key: []byte("acct-a"), Value: []byte(`{"event_id":"dl-a","account_id":"acct-a","amount_minor":100,"currency":"EUR","occurred_at":"2026-11-29T10:00:00Z"}`)},
		{Key: []byte("acct-b"), Value: []byte(bad)},
		{Key: []byte("acct-c"), Value: []byte(`{"event_id":"dl-c","account_id":"acct-c","amount_minor":7,"currency":"USD","occurred_at":"2026-11-29T10:00:00Z"}`)},
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	badOffset := recs[1].Offset

	svc := testenv.Start(t, "billing", e.bin, e.env(nil))
	waitConsumed := func(n int64) {
		t.Helper()
		testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%d records committed", n), func() (bool, string) {
			if svc.Exited() {
				t.Fatalf("service exited:\n%s", svc.Output())
			}
			got := opsSum(opsPositions(t, e))
			return got == n, fmt.Sprintf("%d", got)
		})
	}
	// The decision moves the offsets; the results become visible at XA
	// COMMIT a moment later: wait for them, then check exactly.
	visible := func(what string, cond func() (bool, string)) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, what, cond)
	}
	waitConsumed(3)
	visible("the dead letter", func() (bool, string) {
		got := opsDeadLetters(t, e.db)
		return slices.Equal(got, []string{"invalid_currency"}), fmt.Sprint(got)
	})
	if got := opsBalance(t, e.db, "acct-b", "EUR"); got != (opsTotal{}) {
		t.Fatalf("dead-lettered event counted: %+v", got)
	}
	var id int64
	if err := e.db.Get(&id, `SELECT id FROM dead_letters WHERE kafka_offset = ?`, badOffset); err != nil {
		t.Fatal(err)
	}
	ID := strconv.FormatInt(id, 10)

	out, code := e.cli(t, nil, "deadletters", "list", "--reason", "invalid_currency")
	if code != 0 || !regexp.MustCompile(`(?m)^`+ID+`\s.*invalid_currency\s+`+regexp.QuoteMeta(e.topic)+`/0/`+strconv.FormatInt(badOffset, 10)+`\s`).MatchString(out) {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	exported := filepath.Join(t.TempDir(), "payload.json")
	out, code = e.cli(t, nil, "deadletters", "show", ID, "--payload-out", exported)
	if code != 0 || !strings.Contains(out, "(verbatim)") || !strings.Contains(out, bad) {
		t.Fatalf("show: exit %d\n%s", code, out)
	}
	if b, err := os.ReadFile(exported); err != nil || string(b) != bad {
		t.Fatalf("exported payload %q, %v", b, err)
	}

	// As is, it would be dead-lettered again: refused, and not marked.
	out, code = e.cli(t, nil, "deadletters", "reinject", ID)
	if code != 1 || !strings.Contains(out, "does not decode") || !strings.Contains(out, "invalid_currency") {
		t.Fatalf("reinject of the invalid payload: exit %d\n%s", code, out)
	}
	fixedFile := filepath.Join(t.TempDir(), "fixed.json")
	if err := os.WriteFile(fixedFile, []byte(fixed), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code = e.cli(t, nil, "deadletters", "reinject", ID, "--payload-file", fixedFile)
	if code != 0 || !strings.Contains(out, "reinjected dead letter "+ID) {
		t.Fatalf("reinject: exit %d\n%s", code, out)
	}
	waitConsumed(4)
	visible("the reinjected event", func() (bool, string) {
		got := opsBalance(t, e.db, "acct-b", "EUR")
		return got.count > 0, fmt.Sprintf("%+v", got)
	})
	if got := opsBalance(t, e.db, "acct-b", "EUR"); got != (opsTotal{250, 1}) {
		t.Fatalf("after reinject: acct-b %+v, want 250 once", got)
	}

	// Twice: refused.
	out, code = e.cli(t, nil, "deadletters", "reinject", ID, "--payload-file", fixedFile)
	if code != 1 || !strings.Contains(out, "already reinjected") {
		t.Fatalf("second reinject: exit %d, want 1 (already reinjected)\n%s", code, out)
	}
	out, _ = e.cli(t, nil, "deadletters", "list", "--pending")
	if regexp.MustCompile(`(?m)^` + ID + `\s`).MatchString(out) {
		t.Fatalf("list --pending still shows the reinjected row:\n%s", out)
	}

	// Forced: the copy is produced but dropped as a duplicate.
	out, code = e.cli(t, nil, "deadletters", "reinject", ID, "--payload-file", fixedFile, "--force")
	if code != 0 || !strings.Contains(out, "WARNING") || !strings.Contains(out, "already counted") {
		t.Fatalf("forced reinject: exit %d\n%s", code, out)
	}
	// Forced with different content: dead-lettered as a conflict.
	if err := os.WriteFile(fixedFile, []byte(conflicting), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code = e.cli(t, nil, "deadletters", "reinject", ID, "--payload-file", fixedFile, "--force")
	if code != 0 {
		t.Fatalf("forced conflicting reinject: exit %d\n%s", code, out)
	}
	waitConsumed(6)
	visible("the conflicting copy's dead letter", func() (bool, string) {
		got := opsDeadLetters(t, e.db)
		return slices.Equal(got, []string{"invalid_currency", "conflicting_duplicate"}), fmt.Sprint(got)
	})
	if got := opsBalance(t, e.db, "acct-b", "EUR"); got != (opsTotal{250, 1}) {
		t.Fatalf("after forced reinjects: acct-b %+v, want 250 once", got)
	}
	opsCompare(t, "ledger", opsLedger(t, e.db), map[string]opsTotal{
		"acct-a/EUR": {100, 1}, "acct-b/EUR": {250, 1}, "acct-c/USD": {7, 1},
	})
	svc.Signal(syscall.SIGTERM)
	if err := svc.Wait(t, time.Minute); err != nil {
		t.Fatalf("exit: %v", err)
	}
}

// TestReinjectAnAmendment: an amendment (revision 1) of a counted event,
// dead-lettered for an invalid currency, is re-injected corrected without
// --force (the tool judges it as the pipeline would: a higher revision
// amends) and replaces the counted version; a lower revision is then
// refused, saying the pipeline would drop it as stale.
func TestReinjectAnAmendment(t *testing.T) {
	e := newOpsEnv(t, 1)
	ctx, cl := e.producer(t)
	original := `{"event_id":"am-1","account_id":"acct-m","amount_minor":250,"currency":"EUR","occurred_at":"2026-11-29T10:00:00Z"}`
	bad := `{"event_id":"am-1","revision":1,"account_id":"acct-m","amount_minor":300,"currency":"eur","occurred_at":"2026-11-29T10:00:00Z"}`
	recs := []*kgo.Record{{Key: []byte("acct-m"), Value: []byte(original)}, {Key: []byte("acct-m"), Value: []byte(bad)}}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	svc := testenv.Start(t, "billing", e.bin, e.env(nil))
	counted := func(what string, want opsTotal) {
		t.Helper()
		testenv.Eventually(t, 2*time.Minute, what, func() (bool, string) {
			if svc.Exited() {
				t.Fatalf("service exited:\n%s", svc.Output())
			}
			got := opsBalance(t, e.db, "acct-m", "EUR")
			return got == want, fmt.Sprintf("%+v", got)
		})
	}
	testenv.Eventually(t, 2*time.Minute, "both records committed", func() (bool, string) {
		if svc.Exited() {
			t.Fatalf("service exited:\n%s", svc.Output())
		}
		got := opsSum(opsPositions(t, e))
		return got == 2, fmt.Sprint(got)
	})
	counted("the original", opsTotal{250, 1})
	var id int64
	testenv.Eventually(t, 30*time.Second, "the amendment's dead letter", func() (bool, string) {
		err := e.db.Get(&id, `SELECT id FROM dead_letters WHERE kafka_offset = ? AND reason = 'invalid_currency'`, recs[1].Offset)
		return err == nil, fmt.Sprint(err)
	})
	ID := strconv.FormatInt(id, 10)
	file := func(payload string) string {
		p := filepath.Join(t.TempDir(), "p.json")
		if err := os.WriteFile(p, []byte(payload), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	out, code := e.cli(t, nil, "deadletters", "reinject", ID, "--payload-file", file(strings.Replace(bad, `"eur"`, `"EUR"`, 1)))
	if code != 0 || strings.Contains(out, "WARNING") {
		t.Fatalf("reinject of the corrected amendment: exit %d, want 0 without a warning\n%s", code, out)
	}
	counted("the amendment in place of the original", opsTotal{300, 1})

	// A dead letter of revision 0 with other content, against revision 1
	// counted: refused as stale.
	stale := strings.Replace(original, `"EUR"`, `"eur"`, 1)
	r := &kgo.Record{Key: []byte("acct-m"), Value: []byte(stale)}
	if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 2*time.Minute, "the stale version's dead letter", func() (bool, string) {
		err := e.db.Get(&id, `SELECT id FROM dead_letters WHERE kafka_offset = ?`, r.Offset)
		return err == nil, fmt.Sprint(err)
	})
	out, code = e.cli(t, nil, "deadletters", "reinject", strconv.FormatInt(id, 10), "--payload-file", file(original))
	if code != 1 || !strings.Contains(out, "drops revision 0 as stale") {
		t.Fatalf("reinject of a lower revision: exit %d, want 1 (stale)\n%s", code, out)
	}
	if got := opsBalance(t, e.db, "acct-m", "EUR"); got != (opsTotal{300, 1}) {
		t.Fatalf("after the refusal: %+v, want 300 once", got)
	}
	svc.Signal(syscall.SIGTERM)
	if err := svc.Wait(t, time.Minute); err != nil {
		t.Fatalf("exit: %v", err)
	}
}

// opsAdmin opens the admin DSN on the test's database.
func opsAdmin(t *testing.T, dsn string) (*sql.DB, *mysql.Config) {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, cfg
}

// opsCreateUser creates a throwaway account with the given privileges on
// one database (plus XA_RECOVER_ADMIN on MySQL 8, where XA RECOVER needs
// it) and returns its name and password; it is dropped after the test.
func opsCreateUser(t *testing.T, admin *sql.DB, database string, privileges string) (string, string) {
	t.Helper()
	user := "u_" + strings.ReplaceAll(strconv.FormatInt(time.Now().UnixNano(), 36), "-", "")
	pass := "pw-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	// Identifiers are generated above (alphanumerics), database comes from
	// testenv.NewDatabase (t_ + hex): quoting is safe.
	stmts := []string{
		fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", user, pass),
		fmt.Sprintf("GRANT %s ON `%s`.* TO '%s'@'%%'", privileges, database, user),
	}
	var version string
	if err := admin.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.ToLower(version), "mariadb") {
		stmts = append(stmts, fmt.Sprintf("GRANT XA_RECOVER_ADMIN ON *.* TO '%s'@'%%'", user))
	}
	for _, s := range stmts {
		if _, err := admin.Exec(s); err != nil {
			t.Fatalf("%s: %v", strings.Replace(s, pass, "…", 1), err)
		}
	}
	t.Cleanup(func() { _, _ = admin.Exec(fmt.Sprintf("DROP USER IF EXISTS '%s'@'%%'", user)) })
	return user, pass
}

// TestLeastPrivilegeGrants: the grants documented in docs/operations.md
// are enough and each is needed. The schema is migrated by an admin
// (`billing migrate`); the service then runs as an account with only
// SELECT, INSERT, UPDATE, DELETE and DROP (TRUNCATE of the dedup key
// tables whose keys have all expired) on its database (+ XA_RECOVER_ADMIN
// on MySQL 8), its password from MYSQL_PASSWORD_FILE: it counts a few
// events and that account can run XA RECOVER. An account without DELETE,
// or without DROP, is stopped at start with a message naming the missing
// privilege, and the service account cannot migrate a fresh database (the
// decision to keep CREATE and ALTER out of it) and is told what to do.
func TestLeastPrivilegeGrants(t *testing.T) {
	e := newOpsEnv(t, 2)
	admin, adminCfg := opsAdmin(t, e.dsn)
	database := adminCfg.DBName

	out, code := e.cli(t, nil, "migrate")
	if code != 0 {
		t.Fatalf("billing migrate as admin: exit %d\n%s", code, out)
	}

	const service = "SELECT, INSERT, UPDATE, DELETE, DROP"
	user, pass := opsCreateUser(t, admin, database, service)
	userCfg := adminCfg.Clone()
	userCfg.User, userCfg.Passwd = user, ""
	pwFile := filepath.Join(t.TempDir(), "mysql-password")
	if err := os.WriteFile(pwFile, []byte(pass+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// With /metrics on, so that the sampler runs as this account.
	userEnv := map[string]string{"MYSQL_DSN": userCfg.FormatDSN(), "MYSQL_PASSWORD_FILE": pwFile, "HTTP_ADDR": opsFreeAddr(t)}

	var recs []*kgo.Record
	want := map[string]opsTotal{}
	for i := range 40 {
		ev := opsEvent{ID: fmt.Sprintf("lp-%d", i), Account: fmt.Sprintf("acct-%d", i%4), Amount: int64(i), Currency: "EUR", At: "2026-11-29T10:00:00Z"}
		b, _ := json.Marshal(ev)
		recs = append(recs, &kgo.Record{Key: []byte(ev.Account), Value: b})
		w := want[ev.Account+"/EUR"]
		w.amount += ev.Amount
		w.count++
		want[ev.Account+"/EUR"] = w
	}
	ctx, cl := e.producer(t)
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	svc := testenv.Start(t, "billing as "+user, e.bin, e.env(userEnv))
	testenv.Eventually(t, 2*time.Minute, "events counted by the least-privilege account", func() (bool, string) {
		if svc.Exited() {
			t.Fatalf("service exited:\n%s", svc.Output())
		}
		n := opsSum(opsPositions(t, e))
		return n == int64(len(recs)), fmt.Sprintf("%d records committed", n)
	})
	opsCompare(t, "ledger", opsLedger(t, e.db), want)
	if strings.Contains(svc.Output(), pass) {
		t.Fatal("the service logged the password read from MYSQL_PASSWORD_FILE")
	}
	// Without PROCESS the purge history is not sampled, said once (the
	// sampler runs every second: wait for a few rounds).
	testenv.Eventually(t, 30*time.Second, "the sampler says once that PROCESS is missing", func() (bool, string) {
		return strings.Count(svc.Output(), "lacks PROCESS") == 1, ""
	})
	time.Sleep(3 * time.Second)
	if n := strings.Count(svc.Output(), "lacks PROCESS"); n != 1 {
		t.Errorf("the missing PROCESS privilege was said %d times, want once:\n%s", n, svc.Output())
	}

	userCfg.Passwd = pass
	udb, err := sql.Open("mysql", userCfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer udb.Close()
	rows, err := udb.Query("XA RECOVER")
	if err != nil {
		t.Fatalf("XA RECOVER as the service account: %v", err)
	}
	rows.Close()
	svc.Signal(syscall.SIGTERM)
	if err := svc.Wait(t, time.Minute); err != nil {
		t.Fatalf("exit: %v\n%s", err, svc.Output())
	}

	// One grant short: refused at start, naming what is missing.
	for _, c := range []struct{ grants, missing string }{{"SELECT, INSERT, UPDATE, DROP", "DELETE"}, {"SELECT, INSERT, UPDATE, DELETE", "DROP"}} {
		short, shortPass := opsCreateUser(t, admin, database, c.grants)
		shortCfg := adminCfg.Clone()
		shortCfg.User, shortCfg.Passwd = short, shortPass
		p := testenv.Start(t, "billing without "+c.missing, e.bin, e.env(map[string]string{"MYSQL_DSN": shortCfg.FormatDSN()}))
		if err := p.Wait(t, 2*time.Minute); err == nil {
			t.Fatalf("service without %s kept running or exited 0:\n%s", c.missing, p.Output())
		}
		if out := p.Output(); !strings.Contains(out, "lacks "+c.missing+" on") || !strings.Contains(out, "docs/operations.md") || strings.Contains(out, shortPass) {
			t.Fatalf("want a clear error naming %s (and no password):\n%s", c.missing, out)
		}
	}

	// The DML-only account cannot create the schema of a fresh database.
	fresh := testenv.NewDatabase(t)
	freshCfg, _ := mysql.ParseDSN(fresh)
	dml, dmlPass := opsCreateUser(t, admin, freshCfg.DBName, service)
	freshCfg.User, freshCfg.Passwd = dml, dmlPass
	out, code = e.cli(t, map[string]string{"MYSQL_DSN": freshCfg.FormatDSN()}, "migrate")
	if code != 1 || !strings.Contains(out, "billing migrate") || !strings.Contains(out, "CREATE") {
		t.Fatalf("migrate as the DML-only account: exit %d, want 1 with advice\n%s", code, out)
	}
}

// TestMySQLTLSPrivateServer starts a private MariaDB (mariadbd from PATH,
// its own datadir and port) that serves TLS with a certificate generated
// here and refuses plaintext (require_secure_transport). A connection with
// MYSQL_TLS=true and MYSQL_TLS_CA_FILE succeeds and is encrypted; one
// without TLS, or trusting only the system roots, fails. `billing migrate`
// through the same variables (password from MYSQL_PASSWORD_FILE) works.
func TestMySQLTLSPrivateServer(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test: skipped in -short mode")
	}
	mariadbd, err1 := exec.LookPath("mariadbd")
	installDB, err2 := exec.LookPath("mariadb-install-db")
	if err1 != nil || err2 != nil {
		t.Skip("needs mariadbd and mariadb-install-db in PATH (package mariadb-server; `make services` installs it)")
	}
	certs := testcert.New(t, "mariadb")
	dir, err := os.MkdirTemp("", "mtls") // short: the socket path must fit 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	addr := opsFreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	const pass = "tls-Pass-1"
	initSQL := filepath.Join(dir, "init.sql")
	if err := os.WriteFile(initSQL, []byte(`CREATE DATABASE IF NOT EXISTS tlsdb;
CREATE USER IF NOT EXISTS 'tlsuser'@'%' IDENTIFIED BY '`+pass+`' REQUIRE SSL;
GRANT ALL ON tlsdb.* TO 'tlsuser'@'%';
`), 0o600); err != nil {
		t.Fatal(err)
	}
	userLine := ""
	if os.Geteuid() == 0 {
		userLine = "user = root\n"
	}
	cnf := filepath.Join(dir, "my.cnf")
	if err := os.WriteFile(cnf, []byte(`[mariadbd]
`+userLine+`datadir = `+filepath.Join(dir, "data")+`
socket = `+filepath.Join(dir, "sock")+`
pid-file = `+filepath.Join(dir, "pid")+`
log-error = `+filepath.Join(dir, "error.log")+`
tmpdir = `+dir+`
bind-address = 127.0.0.1
port = `+port+`
skip-name-resolve
innodb_buffer_pool_size = 32M
transaction-isolation = REPEATABLE-READ
ssl-ca = `+certs.CAFile+`
ssl-cert = `+certs.ServerCertFile+`
ssl-key = `+certs.ServerKeyFile+`
require_secure_transport = ON
init-file = `+initSQL+`
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(installDB, "--defaults-file="+cnf, "--auth-root-authentication-method=socket", "--skip-test-db").CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	srv := exec.Command(mariadbd, "--defaults-file="+cnf)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = srv.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = srv.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("mariadbd error log:\n%s", b)
		}
	})

	dsn := "tlsuser:" + pass + "@tcp(" + addr + ")/tlsdb?timeout=5s"
	open := func(o mysqlconn.Options, dsn string) error {
		dsns, err := o.Apply([]string{dsn})
		if err != nil {
			return err
		}
		db, err := sql.Open("mysql", dsns[0])
		if err != nil {
			return err
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var name, cipher string
		if err := db.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Ssl_cipher'").Scan(&name, &cipher); err != nil {
			return err
		}
		if cipher == "" {
			return errors.New("connected without TLS")
		}
		return nil
	}
	verified := mysqlconn.Options{TLS: mysqlconn.TLSVerify, CAFile: certs.CAFile}
	testenv.Eventually(t, time.Minute, "private MariaDB answers over TLS", func() (bool, string) {
		select {
		case <-exited:
			t.Fatal("mariadbd exited")
		default:
		}
		err := open(verified, dsn)
		return err == nil, fmt.Sprint(err)
	})
	if err := open(mysqlconn.Options{TLS: mysqlconn.TLSOff}, dsn); err == nil {
		t.Error("a plaintext connection was accepted")
	}
	if err := open(mysqlconn.Options{TLS: mysqlconn.TLSVerify}, dsn); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("TLS trusting only the system roots: want a certificate error, got %v", err)
	}
	if err := open(mysqlconn.Options{TLS: mysqlconn.TLSVerify, CAFile: testcert.New(t, "other").CAFile}, dsn); err == nil {
		t.Error("TLS with another CA was accepted")
	}

	// The binary, configured by environment variables only.
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte(pass+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := testenv.Binary(t, billingPkg)
	p := testenv.Start(t, "billing migrate over TLS", bin, map[string]string{
		"KAFKA_BROKERS":       "127.0.0.1:1", // not contacted by migrate
		"MYSQL_DSN":           "tlsuser@tcp(" + addr + ")/tlsdb",
		"MYSQL_SHARD_DSNS":    "",
		"MYSQL_PASSWORD_FILE": pwFile,
		"MYSQL_TLS":           "true",
		"MYSQL_TLS_CA_FILE":   certs.CAFile,
		"LOG_FORMAT":          "json",
	}, "migrate")
	if err := p.Wait(t, 2*time.Minute); err != nil {
		t.Fatalf("billing migrate over TLS: %v\n%s", err, p.Output())
	}
	if strings.Contains(p.Output(), pass) {
		t.Fatal("migrate logged the password")
	}
	db, err := sql.Open("mysql", func() string { d, _ := verified.Apply([]string{dsn}); return d[0] }())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'tlsdb' AND TABLE_NAME = 'account_balances'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("schema not created over TLS: %d, %v", n, err)
	}
}

// TestErrorsNameTheCause (issue 22): a missing topic made the service
// wait silently (/readyz said GROUP_ID_NOT_FOUND); an account refused a
// database was told "the schema is missing"; compare needed KAFKA_BROKERS,
// called a ledger of another topic EXACT about dead letters it skipped,
// and exited 1 like a mismatch when it could not read a ledger. Each case
// here checks the message and the exit status.
func TestErrorsNameTheCause(t *testing.T) {
	e := newOpsEnv(t, 1)
	admin, adminCfg := opsAdmin(t, e.dsn)

	// The topic does not exist: the service stops at start, naming it.
	missing := "missing-" + e.topic
	p := testenv.Start(t, "billing without its topic", e.bin, e.env(map[string]string{"KAFKA_TOPIC": missing}))
	if err := p.Wait(t, time.Minute); err == nil {
		t.Fatalf("the service ran without its topic:\n%s", p.Output())
	}
	if out := p.Output(); !strings.Contains(out, fmt.Sprintf(`KAFKA_TOPIC \"%s\" does not exist on the brokers`, missing)) || !strings.Contains(out, "create it first") {
		t.Errorf("want an error naming the missing topic:\n%s", out)
	}

	// An account that may not use the database: access denied, with the
	// account and the database, not "the schema is missing".
	if out, code := e.cli(t, nil, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}
	elsewhere := testenv.NewDatabase(t)
	elseCfg, _ := mysql.ParseDSN(elsewhere)
	user, pass := opsCreateUser(t, admin, elseCfg.DBName, "SELECT")
	denied := adminCfg.Clone()
	denied.User, denied.Passwd = user, pass // granted on elsewhere only
	p = testenv.Start(t, "billing denied its database", e.bin, e.env(map[string]string{"MYSQL_DSN": denied.FormatDSN()}))
	if err := p.Wait(t, time.Minute); err == nil {
		t.Fatalf("the service ran on a database its account may not use:\n%s", p.Output())
	}
	out := p.Output()
	for _, want := range []string{"access denied", fmt.Sprintf(`account \"%s\" may not use database \"%s\"`, user, adminCfg.DBName), "Error 1044"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refusal lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "schema is missing") {
		t.Errorf("an access refusal reported as a missing schema:\n%s", out)
	}
	wrongPw := stWrongPassword(t, e.dsn)
	out, code := e.cli(t, map[string]string{"MYSQL_DSN": wrongPw}, "migrate")
	if code != 1 || !strings.Contains(out, "access denied") || !strings.Contains(out, "refused the MySQL account") || strings.Contains(out, "not-") {
		t.Errorf("migrate with a wrong password: exit %d, want 1 and access denied (no password)\n%s", code, out)
	}

	// A ledger with an event and a dead letter, compared with itself by a
	// command that has neither KAFKA_BROKERS nor KAFKA_TOPIC: its dead
	// letters are compared (of every topic), and it says so.
	stProduce(t, e, stEvent("ec-1", "acct-1", 5), `not json`)
	svc := testenv.Start(t, "billing", e.bin, e.env(nil))
	testenv.Eventually(t, time.Minute, "2 records committed", func() (bool, string) {
		n := opsSum(opsPositions(t, e))
		return n == 2, fmt.Sprint(n)
	})
	svc.Signal(syscall.SIGTERM)
	if err := svc.Wait(t, time.Minute); err != nil {
		t.Fatalf("exit: %v", err)
	}
	stdout, stderr, code := stRunClean(t, e.bin, map[string]string{"MYSQL_DSN": e.dsn}, "compare", "--other-dsn", e.dsn)
	if code != 0 || !strings.Contains(stdout, "dead letters of every topic (KAFKA_TOPIC is not set)") || !strings.Contains(stdout, "EXACT: 1 balances, 1 windows, 1 dead letters, 1 events") {
		t.Errorf("compare without Kafka settings: exit %d, want 0, every topic, 1 dead letter\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	// Against an empty ledger: MISMATCH, 1.
	empty := testenv.NewDatabase(t)
	if out, code := e.cli(t, map[string]string{"MYSQL_DSN": empty}, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}
	stdout, stderr, code = stRunClean(t, e.bin, map[string]string{"MYSQL_DSN": e.dsn, "KAFKA_TOPIC": e.topic}, "compare", "--other-dsn", empty)
	if code != 1 || !strings.Contains(stdout, "MISMATCH") || !strings.Contains(stdout, "dead letters of topic "+e.topic) {
		t.Errorf("compare with an empty ledger: exit %d, want 1 and MISMATCH\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	// A ledger it cannot read: 3, access denied, no verdict.
	stdout, stderr, code = stRunClean(t, e.bin, map[string]string{"MYSQL_DSN": e.dsn}, "compare", "--other-dsn", wrongPw)
	if code != 3 || !strings.Contains(stderr, "could not compare") || !strings.Contains(stderr, "access denied") || strings.Contains(stdout, "EXACT") || strings.Contains(stdout, "MISMATCH") {
		t.Errorf("compare with an unreadable ledger: exit %d, want 3\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	// billing-verify the same way.
	verify := testenv.Binary(t, "github.com/billing/ledger/cmd/billing-verify")
	expected := filepath.Join(t.TempDir(), "expected.json")
	if err := os.WriteFile(expected, []byte(`{"version":1,"window":"1h","balances":[],"windows":[],"dead_letters":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code = stRunClean(t, verify, nil, "-dsn", wrongPw, "-expected", expected)
	if code != 3 || !strings.Contains(stderr, "could not compare") || !strings.Contains(stderr, "access denied") {
		t.Errorf("billing-verify with a wrong password: exit %d, want 3 and access denied\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
}

// TestLogsAnOperatorCanRead (issue 22): at info level a replay logged
// nothing between "partitions assigned" and "stopped"; assignments were Go
// structs, durations nanoseconds, a standby's revoke "partitions":null.
// Here an owner and a standby share a one-partition topic: the owner logs
// progress lines while it works, its assignment in words, and a summary at
// shutdown; the standby's shutdown logs no empty revoke; no duration is a
// bare number.
func TestLogsAnOperatorCanRead(t *testing.T) {
	e := newOpsEnv(t, 1)
	env := e.env(map[string]string{"LOG_PROGRESS_INTERVAL": "200ms", "CHECKPOINT_MAX_RECORDS": "100", "KAFKA_MAX_POLL_RECORDS": "50"})
	owner := testenv.Start(t, "billing-owner", e.bin, env)
	if !owner.WaitOutput(context.Background(), `"msg":"partitions assigned"`, time.Minute) {
		t.Fatalf("no assignment:\n%s", owner.Output())
	}
	standby := testenv.Start(t, "billing-standby", e.bin, env)
	if !standby.WaitOutput(context.Background(), `"msg":"starting"`, time.Minute) {
		t.Fatalf("the standby did not start:\n%s", standby.Output())
	}
	var values []string
	for i := range 3000 {
		values = append(values, stEvent(fmt.Sprintf("lg-%d", i), fmt.Sprintf("acct-%d", i%7), 1))
	}
	stProduce(t, e, values...)
	testenv.Eventually(t, 2*time.Minute, "3000 records committed", func() (bool, string) {
		n := opsSum(opsPositions(t, e))
		return n == 3000, fmt.Sprint(n)
	})
	for _, p := range []*testenv.Process{standby, owner} {
		p.Signal(syscall.SIGTERM)
		if err := p.Wait(t, time.Minute); err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
	}
	out := owner.Output()
	if !strings.Contains(out, `"msg":"partitions assigned","partitions":[0],"positions":"p0 from the start (epoch`) {
		t.Errorf("the assignment is not in words:\n%s", out)
	}
	if !regexp.MustCompile(`"msg":"progress","partitions":1,"counted":\d+,"consumed":\d+,"records_per_second":\d+,"behind":\d+,"positions":"p0 \d+/\d+"`).MatchString(out) {
		t.Errorf("no progress line while the owner worked:\n%s", out)
	}
	if !regexp.MustCompile(`"msg":"stopped","counted":3000,.*"dead_letters":0,.*"ran_for":"[0-9.]+m?s"`).MatchString(out) {
		t.Errorf("no summary at shutdown:\n%s", out)
	}
	if !strings.Contains(out, `"msg":"partitions revoked","partitions":[0],"committed":"p0 at 3000"`) {
		t.Errorf("the revocation lacks its committed position:\n%s", out)
	}
	if strings.Contains(standby.Output(), `"partitions":null`) || strings.Contains(standby.Output(), `"msg":"partitions revoked"`) {
		t.Errorf("the standby logged an empty revoke:\n%s", standby.Output())
	}
	if m := regexp.MustCompile(`"(duration|ran_for|next_attempt_in|catch_up_in)":\d`).FindString(out + standby.Output()); m != "" {
		t.Errorf("a duration logged as a bare number: %s", m)
	}
}

// TestReinjectSeveral: `billing deadletters reinject` takes several IDs;
// each is checked on its own, a refusal does not stop the others, and the
// exit status says whether all were re-injected.
func TestReinjectSeveral(t *testing.T) {
	e := newOpsEnv(t, 1)
	ev := func(id string, amount int64) string {
		b, _ := json.Marshal(opsEvent{ID: id, Account: "acct-o", Amount: amount, Currency: "EUR", At: "2026-11-29T10:00:00Z"})
		return string(b)
	}
	recs := stProduce(t, e, ev("rs-1", 9223372036854775807), ev("rs-2", 1), `not json`)
	svc := testenv.Start(t, "billing", e.bin, e.env(nil))
	testenv.Eventually(t, time.Minute, "two dead letters", func() (bool, string) {
		got := opsDeadLetters(t, e.db)
		return len(got) == 2, fmt.Sprint(got)
	})
	idOf := func(off int64) string {
		var id int64
		if err := e.db.Get(&id, `SELECT id FROM dead_letters WHERE kafka_offset = ?`, off); err != nil {
			t.Fatal(err)
		}
		return strconv.FormatInt(id, 10)
	}
	overflow, bad := idOf(recs[1].Offset), idOf(recs[2].Offset)
	out, code := e.cli(t, nil, "deadletters", "reinject", overflow, bad, "999999", "--by", "ops")
	for _, want := range []string{"reinjected dead letter " + overflow, "reinjected 1 of 3 dead letters", bad + ": refused: the payload does not decode", "999999: refused: no dead letter 999999"} {
		if !strings.Contains(out, want) {
			t.Errorf("reinject of three lacks %q:\n%s", want, out)
		}
	}
	if code != 1 {
		t.Errorf("reinject with two refusals: exit %d, want 1\n%s", code, out)
	}
	var marked int
	if err := e.db.Get(&marked, `SELECT COUNT(*) FROM dead_letters WHERE reinjected_by = 'ops'`); err != nil || marked != 1 {
		t.Errorf("%d rows marked re-injected (%v), want 1", marked, err)
	}
	if out, code := e.cli(t, nil, "deadletters", "reinject", overflow, bad, "--payload-file", "x.json"); code != 2 || !strings.Contains(out, "--payload-file takes one dead letter ID") {
		t.Errorf("--payload-file with two IDs: exit %d, want 2\n%s", code, out)
	}
	svc.Signal(syscall.SIGTERM)
	if err := svc.Wait(t, time.Minute); err != nil {
		t.Fatalf("exit: %v", err)
	}
}
