package integration_test

// What a platform team runs the service with (issue 11, and items 10-12 of
// issue 9): `billing status`, health probes an orchestrator can act on
// (standby members ready, startup answered, a wedged pipeline failing
// liveness), the metrics the alert rules and the dashboard use, the
// re-injection checks and audit, and a blue/green rebuild of a ledger.
// Helpers are prefixed with st so that they never collide with the other
// test files of the package.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/ledgerstatus"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
)

// stMerge returns the union of maps, later ones winning.
func stMerge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}

// stStatus runs `billing status --json` and decodes the report; it fails
// the test unless the command exits 0.
func stStatus(t *testing.T, e *opsEnv, extra map[string]string) *ledgerstatus.Report {
	t.Helper()
	r, code, out := stTryStatus(t, e, extra)
	if code != 0 || r == nil {
		t.Fatalf("billing status --json: exit %d\n%s", code, out)
	}
	return r
}

// stTryStatus runs `billing status --json` and returns the report (nil
// when none was printed), the exit status and the output.
func stTryStatus(t *testing.T, e *opsEnv, extra map[string]string) (*ledgerstatus.Report, int, string) {
	t.Helper()
	out, code := e.cli(t, extra, "status", "--json")
	// The JSON report is on stdout; the harness merges stderr into the
	// same output: the report starts with a '{' alone on a line.
	start := strings.Index(out, "{\n")
	if start < 0 {
		return nil, code, out
	}
	var r ledgerstatus.Report
	if err := json.NewDecoder(strings.NewReader(out[start:])).Decode(&r); err != nil {
		t.Fatalf("decode the report: %v\n%s", err, out)
	}
	return &r, code, out
}

// stVal is a number of the report, -1 when it is unknown (nil).
func stVal(v *int64) int64 {
	if v == nil {
		return -1
	}
	return *v
}

// stInstance returns the instance id a JSON-logging service printed in its
// "starting" line.
func stInstance(t *testing.T, p *testenv.Process) string {
	t.Helper()
	for _, line := range strings.Split(p.Output(), "\n") {
		var l struct {
			Msg      string `json:"msg"`
			Instance string `json:"instance"`
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "starting" && l.Instance != "" {
			return l.Instance
		}
	}
	t.Fatalf("no \"starting\" log line with an instance id:\n%s", p.Output())
	return ""
}

// stReady waits until /readyz of addr answers 200 with a body containing
// want.
func stReady(t *testing.T, p *testenv.Process, addr, want string) {
	t.Helper()
	testenv.Eventually(t, 2*time.Minute, addr+"/readyz answers 200 "+want, func() (bool, string) {
		if p.Exited() {
			t.Fatalf("service exited:\n%s", p.Output())
		}
		code, body := opsGet("http://" + addr + "/readyz")
		return code == 200 && strings.Contains(body, want), fmt.Sprintf("%d %s", code, body)
	})
}

func stProduce(t *testing.T, e *opsEnv, values ...string) []*kgo.Record {
	t.Helper()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		var ev opsEvent
		_ = json.Unmarshal([]byte(v), &ev)
		recs[i] = &kgo.Record{Topic: e.topic, Key: []byte(ev.Account), Value: []byte(v)}
	}
	testenv.Produce(t, e.brokers, e.topic, recs...)
	return recs
}

func stEvent(id, account string, amount int64) string {
	b, _ := json.Marshal(opsEvent{ID: id, Account: account, Amount: amount, Currency: "EUR", At: "2026-11-29T10:00:00Z"})
	return string(b)
}

// TestStandbyReadyAndStatus: two instances on a one-partition topic both
// answer /readyz 200, the one without a partition as a standby. `billing
// status` shows the partition's stored position, log end, lag, owner,
// epoch and member, the last checkpoint, no branch in doubt and the dead
// letters waiting by reason; it runs as an account with nothing but SELECT
// (it changes nothing). The metrics carry the new labels and series. When
// the owner stops, the standby takes over, and status shows the new owner
// under a higher epoch.
func TestStandbyReadyAndStatus(t *testing.T) {
	e := newOpsEnv(t, 1)
	fast := map[string]string{"HEALTH_CHECK_INTERVAL": "200ms", "METRICS_SAMPLE_INTERVAL": "300ms"}
	addrs := []string{opsFreeAddr(t), opsFreeAddr(t)}
	svcs := make([]*testenv.Process, 2)
	for i := range svcs {
		svcs[i] = testenv.Start(t, fmt.Sprintf("billing-%d", i+1), e.bin, e.env(stMerge(fast, map[string]string{"HTTP_ADDR": addrs[i]})))
	}
	for i := range svcs {
		stReady(t, svcs[i], addrs[i], "ready")
	}
	// Exactly one owns the partition; the other is a ready standby.
	owner := -1
	testenv.Eventually(t, time.Minute, "one owner and one standby, both ready", func() (bool, string) {
		var standby []int
		var bodies []string
		for i, a := range addrs {
			code, body := opsGet("http://" + a + "/readyz")
			bodies = append(bodies, fmt.Sprintf("%d %s", code, strings.TrimSpace(body)))
			if code != 200 {
				return false, strings.Join(bodies, " | ")
			}
			if strings.Contains(body, "standby") {
				standby = append(standby, i)
			}
		}
		if len(standby) != 1 {
			return false, strings.Join(bodies, " | ")
		}
		owner = 1 - standby[0]
		return true, ""
	})
	standby := 1 - owner

	var values []string
	for i := range 50 {
		values = append(values, stEvent(fmt.Sprintf("st-%d", i), fmt.Sprintf("acct-%d", i%5), int64(i)))
	}
	values = append(values, `{"event_id":"st-bad","account_id":"acct-0",`) // invalid JSON
	stProduce(t, e, values...)
	testenv.Eventually(t, time.Minute, "51 records committed", func() (bool, string) {
		n := opsSum(opsPositions(t, e))
		return n == 51, fmt.Sprint(n)
	})
	testenv.Eventually(t, 30*time.Second, "the dead letter is visible", func() (bool, string) {
		got := opsDeadLetters(t, e.db)
		return len(got) == 1, fmt.Sprint(got)
	})

	// The ledger's id (ledger_identity) tells its branches in doubt from
	// those of other ledgers on the shared test server. A service that does
	// not generate it yet gets one here; one that does keeps its own.
	if _, err := e.db.Exec(`INSERT IGNORE INTO ledger_identity (singleton, ledger_id, secret, created_at) VALUES (1, ?, ?, NOW(6))`,
		fmt.Sprintf("%016x", time.Now().UnixNano()), bytes.Repeat([]byte{7}, 32)); err != nil {
		t.Fatal(err)
	}

	// Status, as an account that may only read.
	admin, adminCfg := opsAdmin(t, e.dsn)
	user, pass := opsCreateUser(t, admin, adminCfg.DBName, "SELECT")
	roCfg := *adminCfg
	roCfg.User, roCfg.Passwd = user, pass
	r := stStatus(t, e, map[string]string{"MYSQL_DSN": roCfg.FormatDSN()})
	ownerID := stInstance(t, svcs[owner])
	if len(r.Partitions) != 1 {
		t.Fatalf("partitions: %+v", r.Partitions)
	}
	p := r.Partitions[0]
	if !p.Claimed || p.Stored != ledgerstatus.StoredAt || stVal(p.StoredOffset) != 51 || stVal(p.LogEnd) != 51 || stVal(p.Lag) != 0 || p.Owner != ownerID || p.Epoch < 1 || p.Member == "" {
		t.Errorf("partition 0 = %+v; want stored 51 = log end, lag 0, owner %s, an epoch and a member", p, ownerID)
	}
	if r.GroupState != "Stable" || len(r.Members) != 2 || stVal(r.TotalLag) != 0 || !r.GroupStored || !r.Complete() {
		t.Errorf("group %s with %d members, total lag %d, stored %v, problems %v; want Stable, 2, 0, stored, none", r.GroupState, len(r.Members), stVal(r.TotalLag), r.GroupStored, r.Problems)
	}
	if r.LastCheckpoint == nil || r.LastCheckpoint.DecidedBy != ownerID || r.LastCheckpoint.AgeSeconds > 120 {
		t.Errorf("last checkpoint = %+v; want one decided by %s, recent", r.LastCheckpoint, ownerID)
	}
	if c := r.CommitLog; c == nil || c.DecidedSeq < 1 || c.VisibleSeq != c.DecidedSeq || c.Unapplied != 0 || c.RetainedFrom != 1 {
		t.Errorf("commit log = %+v; want every decision applied and visible, none pruned", c)
	}
	if len(r.InDoubt) != 0 {
		t.Errorf("branches in doubt on an idle ledger: %+v", r.InDoubt)
	}
	if len(r.DeadLetters) != 1 || r.DeadLetters[0].Reason != "invalid_json" || r.DeadLetters[0].Count != 1 {
		t.Errorf("dead letters waiting = %+v; want invalid_json: 1", r.DeadLetters)
	}
	out, code := e.cli(t, nil, "status")
	for _, want := range []string{"PARTITION", "STORED", "total lag: 0 records", "last committed checkpoint: blg1-", "commit log: visible ", "changelog: off", "branches in doubt: none", "invalid_json  1"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("billing status (exit %d) lacks %q:\n%s", code, want, out)
		}
	}

	// Metrics: labels on lag, the dead letters waiting counted once (by
	// the owner), build info, the Kafka client's and the pools' series.
	testenv.Eventually(t, 30*time.Second, "the owner's samples", func() (bool, string) {
		_, body := opsGet("http://" + addrs[owner] + "/metrics")
		lag, nLag := opsMetric(body, "billing_consumer_lag_records", `group="`+e.group+`",partition="0",topic="`+e.topic+`"`)
		dl, _ := opsMetric(body, "billing_dead_letters_waiting", `reason="invalid_json"`)
		return nLag == 1 && lag == 0 && dl == 1, fmt.Sprintf("lag %v (%d series), dead letters waiting %v", lag, nLag, dl)
	})
	_, body := opsGet("http://" + addrs[standby] + "/metrics")
	if dl, _ := opsMetric(body, "billing_dead_letters_waiting", ""); dl != 0 {
		t.Errorf("the standby reports %v dead letters waiting; only the owner of a partition counts them", dl)
	}
	if _, n := opsMetric(body, "billing_consumer_lag_records", ""); n != 0 {
		t.Errorf("the standby reports lag for %d partitions", n)
	}
	for _, name := range []string{"billing_build_info", "billing_kafka_connects_total", "go_sql_open_connections", "billing_xa_branches_in_doubt", "billing_checkpoint_stall_seconds"} {
		if _, n := opsMetric(body, name, ""); n == 0 {
			t.Errorf("metric %s missing", name)
		}
	}

	// Failover: the owner leaves, the standby claims the partition.
	svcs[owner].Signal(syscall.SIGTERM)
	if err := svcs[owner].Wait(t, time.Minute); err != nil {
		t.Fatalf("owner exit: %v", err)
	}
	stReady(t, svcs[standby], addrs[standby], "idle")
	r2 := stStatus(t, e, nil)
	if p2 := r2.Partitions[0]; p2.Owner != stInstance(t, svcs[standby]) || p2.Epoch <= p.Epoch || stVal(p2.StoredOffset) != 51 {
		t.Errorf("after failover partition 0 = %+v; want owner %s with an epoch above %d", p2, stInstance(t, svcs[standby]), p.Epoch)
	}
	svcs[standby].Signal(syscall.SIGTERM)
	if err := svcs[standby].Wait(t, time.Minute); err != nil {
		t.Fatalf("standby exit: %v", err)
	}

	// Branches in doubt: a prepared branch whose qualifier carries this
	// ledger's id is listed with its age and no decision; one of another
	// ledger on the same server is only counted.
	var ledger txsink.Identity
	if err := e.db.QueryRow(`SELECT ledger_id, secret FROM ledger_identity`).Scan(&ledger.ID, &ledger.Secret); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(`CREATE TABLE xa_probe (id INT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	created := time.Now().Add(-time.Minute)
	gtrid := func(n int) string { return fmt.Sprintf("blg1-0000feed%04x-%x-%x", n, n, created.UnixMilli()) }
	prepare := func(n int, bqual string) {
		t.Helper()
		conn, err := e.db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		xid := fmt.Sprintf("'%s','%s',%d", gtrid(n), bqual, 0x626C67)
		for _, q := range []string{"XA START " + xid, fmt.Sprintf("INSERT INTO xa_probe VALUES (%d)", n), "XA END " + xid, "XA PREPARE " + xid} {
			if _, err := conn.ExecContext(context.Background(), q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		// On MariaDB a prepared branch stays with the connection that
		// prepared it: roll it back there (this cleanup runs before the
		// one closing the connection).
		t.Cleanup(func() {
			if _, err := conn.ExecContext(context.Background(), "XA ROLLBACK "+xid); err != nil {
				t.Errorf("XA ROLLBACK %s: %v", xid, err)
			}
		})
	}
	// This ledger's branch carries a MAC under its secret; one that names
	// its id with a MAC nobody can check (forged by another account) is
	// another's, as for recovery.
	other := txsink.Identity{ID: "0123456789abcdef", Secret: []byte("another ledger")}
	prepare(1, ledger.Xid(gtrid(1), txsink.Qualifier{Participant: 0, Conn: 1, Ledger: ledger.ID}).Bqual)
	prepare(2, other.Xid(gtrid(2), txsink.Qualifier{Participant: 0, Conn: 1, Ledger: other.ID}).Bqual)
	prepare(3, "p0-c1-l"+ledger.ID+"-mx")
	r3 := stStatus(t, e, nil)
	var mine []ledgerstatus.InDoubtEntry
	for _, b := range r3.InDoubt {
		if strings.HasPrefix(b.Gtrid, "blg1-0000feed") {
			mine = append(mine, b)
		}
	}
	if len(mine) != 1 || mine[0].Gtrid != gtrid(1) || mine[0].Ledger != "this" || mine[0].Decision != "" || mine[0].AgeSeconds < 50 {
		t.Errorf("this ledger's branches in doubt = %+v; want %s, about a minute old, undecided", mine, gtrid(1))
	}
	if r3.OtherLedgersInDoubt == nil || *r3.OtherLedgersInDoubt < 2 {
		t.Errorf("the other ledger's branch and the forged one are not counted: %v", r3.OtherLedgersInDoubt)
	}
	for _, b := range r3.InDoubt {
		if b.Gtrid == gtrid(2) || b.Gtrid == gtrid(3) {
			t.Errorf("another ledger's branch (or a forged one) listed as this one's: %+v", b)
		}
	}
}

// TestHealthDuringStartupAndWedge: /healthz and /readyz answer from the
// first second, reporting the startup phase (here a MySQL server that
// accepts connections and never answers holds the start in the migration
// phase). A pipeline whose checkpoints all fail (an armed failpoint) is
// wedged: once records have waited longer than LIVENESS_MAX_CHECKPOINT_AGE,
// /healthz answers 503; killing it, as an orchestrator restarting it
// would, gives the partition to the ready standby, which counts every
// event once.
func TestHealthDuringStartupAndWedge(t *testing.T) {
	e := newOpsEnv(t, 1)

	// A MySQL that never answers the handshake.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	silent := (&mysql.Config{User: "u", Passwd: "p", Net: "tcp", Addr: ln.Addr().String(), DBName: "billing", AllowNativePasswords: true}).FormatDSN()
	addr := opsFreeAddr(t)
	slow := testenv.Start(t, "billing-slow-start", e.bin, e.env(map[string]string{"HTTP_ADDR": addr, "MYSQL_DSN": silent}))
	testenv.Eventually(t, 30*time.Second, "/healthz 200 and /readyz 503 while migrating", func() (bool, string) {
		hc, hb := opsGet("http://" + addr + "/healthz")
		rc, rb := opsGet("http://" + addr + "/readyz")
		return hc == 200 && strings.Contains(hb, "starting: migrating the schema") && rc == 503 && strings.Contains(rb, "starting: migrating the schema"),
			fmt.Sprintf("healthz %d %q, readyz %d %q", hc, hb, rc, rb)
	})
	if _, body := opsGet("http://" + addr + "/metrics"); !strings.Contains(body, "billing_build_info{") {
		t.Errorf("/metrics during startup lacks billing_build_info")
	}
	slow.Signal(syscall.SIGKILL)

	quick := map[string]string{
		"HEALTH_CHECK_INTERVAL":       "200ms",
		"CHECKPOINT_TIMEOUT":          "2s",
		"READY_MAX_CHECKPOINT_AGE":    "2s",
		"LIVENESS_MAX_CHECKPOINT_AGE": "5s",
		"METRICS_SAMPLE_INTERVAL":     "300ms",
	}
	wAddr, sAddr := opsFreeAddr(t), opsFreeAddr(t)
	wedged := testenv.Start(t, "billing-wedged", e.bin, e.env(stMerge(quick, map[string]string{"HTTP_ADDR": wAddr, "BILLING_FAILPOINTS": "before-prepare=error"})))
	stReady(t, wedged, wAddr, "idle")
	standby := testenv.Start(t, "billing-standby", e.bin, e.env(stMerge(quick, map[string]string{"HTTP_ADDR": sAddr})))
	stReady(t, standby, sAddr, "standby")

	var values []string
	for i := range 20 {
		values = append(values, stEvent(fmt.Sprintf("wg-%d", i), fmt.Sprintf("acct-%d", i%4), int64(100+i)))
	}
	stProduce(t, e, values...)
	testenv.Eventually(t, time.Minute, "/healthz of the wedged instance answers 503", func() (bool, string) {
		code, body := opsGet("http://" + wAddr + "/healthz")
		return code == 503 && strings.Contains(body, "wedged: 20 records have waited"), fmt.Sprintf("%d %s", code, body)
	})
	if code, body := opsGet("http://" + wAddr + "/readyz"); code != 503 {
		t.Errorf("/readyz of the wedged instance = %d %s", code, body)
	}
	_, body := opsGet("http://" + wAddr + "/metrics")
	if v, _ := opsMetric(body, "billing_checkpoint_stall_seconds", ""); v <= 5 {
		t.Errorf("billing_checkpoint_stall_seconds = %v, want > 5", v)
	}
	if n := opsSum(opsPositions(t, e)); n != 0 {
		t.Fatalf("the wedged instance committed %d records", n)
	}
	if code, body := opsGet("http://" + sAddr + "/healthz"); code != 200 {
		t.Errorf("/healthz of the standby = %d %s", code, body)
	}

	// The orchestrator restarts the wedged instance: the standby takes
	// over (after the session timeout) and counts everything once.
	wedged.Signal(syscall.SIGKILL)
	testenv.Eventually(t, 2*time.Minute, "the standby commits the 20 records", func() (bool, string) {
		n := opsSum(opsPositions(t, e))
		return n == 20, fmt.Sprint(n)
	})
	want := map[string]opsTotal{}
	for i := range 20 {
		k := fmt.Sprintf("acct-%d/EUR", i%4)
		tot := want[k]
		tot.amount += int64(100 + i)
		tot.count++
		want[k] = tot
	}
	testenv.Eventually(t, 30*time.Second, "the ledger", func() (bool, string) {
		got := opsLedger(t, e.db)
		return maps.Equal(got, want), fmt.Sprint(got)
	})
	standby.Signal(syscall.SIGTERM)
	if err := standby.Wait(t, time.Minute); err != nil {
		t.Fatalf("standby exit: %v", err)
	}
}

// TestReinjectChecksIdentityAndAudits: a corrected payload must keep the
// dead letter's event id and account; a dead letter that names no event id
// needs --force. Each re-injection records who did it, whether it was
// forced, where the record landed and the SHA-256 of what was produced,
// in the row and in the log, and the record at that offset is exactly
// what was produced. The ledger counts each event once.
func TestReinjectChecksIdentityAndAudits(t *testing.T) {
	e := newOpsEnv(t, 1)
	bad := `{"event_id":"ra-1","account_id":"acct-r","amount_minor":40,"currency":"eur","occurred_at":"2026-11-29T10:00:00Z"}`
	noID := `{"account_id":"acct-s","amount_minor":7,"currency":"EUR","occurred_at":"2026-11-29T10:00:00Z"}`
	recs := stProduce(t, e, bad, noID)
	svc := testenv.Start(t, "billing", e.bin, e.env(nil))
	testenv.Eventually(t, time.Minute, "two dead letters", func() (bool, string) {
		if svc.Exited() {
			t.Fatalf("service exited:\n%s", svc.Output())
		}
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
	badID, noIDID := idOf(recs[0].Offset), idOf(recs[1].Offset)
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	type audit struct {
		At        *time.Time `db:"reinjected_at"`
		By        *string    `db:"reinjected_by"`
		Forced    *bool      `db:"reinjected_forced"`
		Partition *int32     `db:"reinjected_partition"`
		Offset    *int64     `db:"reinjected_offset"`
		SHA       []byte     `db:"reinjected_sha256"`
	}
	auditOf := func(id string) audit {
		var a audit
		if err := e.db.Get(&a, `SELECT reinjected_at, reinjected_by, reinjected_forced, reinjected_partition, reinjected_offset, reinjected_sha256 FROM dead_letters WHERE id = ?`, id); err != nil {
			t.Fatal(err)
		}
		return a
	}

	// Another event id, another account: refused, the row untouched.
	for _, tc := range []struct{ payload, why string }{
		{strings.NewReplacer(`"eur"`, `"EUR"`, `ra-1`, `ra-2`).Replace(bad), "event_id ra-2 differs from the dead letter's ra-1"},
		{strings.NewReplacer(`"eur"`, `"EUR"`, `acct-r`, `acct-mallory`).Replace(bad), "account_id acct-mallory differs from the dead letter's acct-r"},
	} {
		out, code := e.cli(t, nil, "deadletters", "reinject", badID, "--payload-file", file("wrong.json", tc.payload))
		if code != 1 || !strings.Contains(out, tc.why) || !strings.Contains(out, "--force") {
			t.Fatalf("reinject with %s: exit %d, want 1 naming it\n%s", tc.why, code, out)
		}
		if a := auditOf(badID); a.At != nil {
			t.Fatalf("a refused re-injection marked the row: %+v", a)
		}
	}

	// The correction: accepted, audited.
	fixed := strings.Replace(bad, `"eur"`, `"EUR"`, 1)
	out, code := e.cli(t, nil, "deadletters", "reinject", badID, "--payload-file", file("fixed.json", fixed), "--by", "alice@ops")
	if code != 0 {
		t.Fatalf("reinject: exit %d\n%s", code, out)
	}
	a := auditOf(badID)
	sum := sha256.Sum256([]byte(fixed))
	if a.At == nil || a.By == nil || *a.By != "alice@ops" || a.Forced == nil || *a.Forced || a.Partition == nil || *a.Partition != 0 || a.Offset == nil || !bytes.Equal(a.SHA, sum[:]) {
		t.Fatalf("audit = %+v; want by alice@ops, not forced, partition 0, an offset, the payload's SHA-256", a)
	}
	if !strings.Contains(out, `"msg":"dead letter re-injected"`) || !strings.Contains(out, `"by":"alice@ops"`) || !strings.Contains(out, fmt.Sprintf(`"offset":%d`, *a.Offset)) {
		t.Errorf("no audit log line:\n%s", out)
	}
	// The record at the recorded offset is what was produced.
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{e.topic: {0: kgo.NewOffset().At(*a.Offset)}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fetches := cl.PollRecords(ctx, 1)
	if errs := fetches.Errors(); len(errs) > 0 || len(fetches.Records()) != 1 {
		t.Fatalf("read back the re-injected record: %v, %d records", errs, len(fetches.Records()))
	}
	if got := fetches.Records()[0]; got.Offset != *a.Offset || sha256.Sum256(got.Value) != sum {
		t.Fatalf("record at %d: %q, want the corrected payload", got.Offset, got.Value)
	}
	out, _ = e.cli(t, nil, "deadletters", "show", badID)
	if !strings.Contains(out, "by alice@ops") || !strings.Contains(out, fmt.Sprintf("%s/0/%d", e.topic, *a.Offset)) {
		t.Errorf("show lacks the audit:\n%s", out)
	}

	// No event id in the dead letter: the payload's cannot be checked.
	fixedNoID := `{"event_id":"ra-s","account_id":"acct-s","amount_minor":7,"currency":"EUR","occurred_at":"2026-11-29T10:00:00Z"}`
	out, code = e.cli(t, nil, "deadletters", "reinject", noIDID, "--payload-file", file("noid.json", fixedNoID))
	if code != 1 || !strings.Contains(out, "names no event id") {
		t.Fatalf("reinject without a known event id: exit %d, want 1\n%s", code, out)
	}
	out, code = e.cli(t, nil, "deadletters", "reinject", noIDID, "--payload-file", file("noid.json", fixedNoID), "--force", "--by", "bob")
	if code != 0 || !strings.Contains(out, "WARNING") {
		t.Fatalf("forced reinject: exit %d\n%s", code, out)
	}
	if a := auditOf(noIDID); a.By == nil || *a.By != "bob" || a.Forced == nil || !*a.Forced || a.Offset == nil {
		t.Fatalf("forced audit = %+v", a)
	}
	if !strings.Contains(out, `"overridden":["identity"]`) {
		t.Errorf("the log does not name the overridden check:\n%s", out)
	}

	testenv.Eventually(t, time.Minute, "both re-injected events counted once", func() (bool, string) {
		got := opsLedger(t, e.db)
		want := map[string]opsTotal{"acct-r/EUR": {40, 1}, "acct-s/EUR": {7, 1}}
		return maps.Equal(got, want), fmt.Sprint(got)
	})
	svc.Signal(syscall.SIGTERM)
	if err := svc.Wait(t, time.Minute); err != nil {
		t.Fatalf("exit: %v", err)
	}
}

// stDocMetrics returns the metrics the operator's docs name (README.md,
// docs/operations.md, docs/production.md, docs/configuration.md,
// docs/contract.md): every billing_*, go_sql_* and
// process_* name, and the billing_kafka_ suffixes listed in the row of
// billing_kafka_*. Table and account names that look alike are not
// metrics; the names the docs give as former names must not be exported.
func stDocMetrics(t *testing.T) (named, former []string) {
	t.Helper()
	notMetrics := map[string]bool{"billing_windows": true, "billing_windows_period": true}
	formerNames := map[string]bool{"billing_dedup_keys_memory": true, "billing_commit_latency_seconds": true}
	seen := map[string]bool{}
	re := regexp.MustCompile(`\b(billing|go_sql|process)_[a-z0-9_]*[a-z0-9]\b`)
	suffix := regexp.MustCompile("`([a-z_]+_total)`")
	for _, doc := range []string{"../README.md", "../docs/operations.md", "../docs/production.md", "../docs/configuration.md", "../docs/contract.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			for _, m := range re.FindAllStringIndex(line, -1) {
				name := line[m[0]:m[1]]
				if strings.HasPrefix(line[m[1]:], "_*") || notMetrics[name] || seen[name] {
					continue // a family (billing_kafka_*, go_sql_*), a table
				}
				seen[name] = true
				if formerNames[name] {
					former = append(former, name)
				} else {
					named = append(named, name)
				}
			}
			if strings.Contains(line, "`billing_kafka_*`") {
				for _, m := range suffix.FindAllStringSubmatch(line, -1) {
					if name := "billing_kafka_" + m[1]; !seen[name] {
						seen[name] = true
						named = append(named, name)
					}
				}
			}
		}
	}
	if len(named) < 30 || len(former) != len(formerNames) || !seen["billing_kafka_fetch_records_total"] {
		t.Fatalf("the docs name %d metrics (%v) and %d former names: the parser lost them", len(named), named, len(former))
	}
	return named, former
}

// TestMetricsUsedByRulesExist scrapes /metrics of a running service that
// has counted events and fails if any metric the alert rules or the
// dashboard read (deploy/prometheus/metrics-used.txt, kept exact by
// deploy/check), or any metric the operator's docs name, does not exist
// (a renamed metric cannot silently blind an alert or mislead a reader),
// or if a name the docs give as a former one is still exported.
func TestMetricsUsedByRulesExist(t *testing.T) {
	b, err := os.ReadFile("../deploy/prometheus/metrics-used.txt")
	if err != nil {
		t.Fatal(err)
	}
	var used []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			used = append(used, l)
		}
	}
	if len(used) < 10 {
		t.Fatalf("metrics-used.txt lists %d metrics", len(used))
	}
	docs, former := stDocMetrics(t)
	used = append(used, docs...)
	e := newOpsEnv(t, 2)
	addr := opsFreeAddr(t)
	svc := testenv.Start(t, "billing", e.bin, e.env(map[string]string{"HTTP_ADDR": addr, "METRICS_SAMPLE_INTERVAL": "300ms"}))
	stReady(t, svc, addr, "ready")
	stProduce(t, e, stEvent("mu-1", "acct-1", 5), stEvent("mu-2", "acct-2", 6), stEvent("mu-1", "acct-1", 5), `not json`)
	testenv.Eventually(t, time.Minute, "4 records committed", func() (bool, string) {
		n := opsSum(opsPositions(t, e))
		return n == 4, fmt.Sprint(n)
	})
	var missing []string
	testenv.Eventually(t, 30*time.Second, "every metric the rules and the dashboard use", func() (bool, string) {
		_, body := opsGet("http://" + addr + "/metrics")
		have := map[string]bool{}
		for _, line := range strings.Split(body, "\n") {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if i := strings.IndexAny(line, "{ "); i > 0 {
				have[line[:i]] = true
			}
		}
		missing = missing[:0]
		for _, name := range used {
			if !have[name] && !have[name+"_bucket"] {
				missing = append(missing, name)
			}
		}
		for _, name := range former {
			if have[name] {
				t.Errorf("%s is exported, but the docs say it was renamed", name)
			}
		}
		return len(missing) == 0, fmt.Sprint("missing: ", missing)
	})
	svc.Signal(syscall.SIGTERM)
	if err := svc.Wait(t, time.Minute); err != nil {
		t.Fatalf("exit: %v", err)
	}
}

// TestBlueGreenRebuild: a second deployment with a new control database
// and a new group replays the topic from the start while the first keeps
// running and producers keep writing. `billing status` against the new
// deployment shows its progress (positions behind the log end, lag > 0;
// here its first checkpoint is held for a while by a failpoint so that the
// progress is seen mid-way), `billing compare` reports a mismatch while it
// is behind and EXACT once it has caught up, and both ledgers equal what
// was produced.
func TestBlueGreenRebuild(t *testing.T) {
	const partitions = 3
	e := newOpsEnv(t, partitions)
	var produced []opsProduced
	// Event times run a minute per event, for 4000 events: all in the past
	// (an event later than now plus MAX_EVENT_TIME_SKEW is a dead letter).
	base := time.Date(2026, 11, 25, 8, 0, 0, 0, time.UTC)
	batch := func(from, to int) []*kgo.Record {
		var recs []*kgo.Record
		for i := from; i < to; i++ {
			ev := opsEvent{ID: fmt.Sprintf("bg-%d", i), Account: fmt.Sprintf("acct-%02d", i%30), Amount: int64(i%19*10 - 40),
				Currency: []string{"EUR", "USD"}[i%2], At: base.Add(time.Duration(i) * time.Minute).Format(time.RFC3339)}
			if i%10 == 9 { // an exact repeat of an earlier event
				ev = produced[len(produced)-5].ev
			}
			b, _ := json.Marshal(ev)
			recs = append(recs, &kgo.Record{Topic: e.topic, Key: []byte(ev.Account), Value: b})
			produced = append(produced, opsProduced{ev: ev})
		}
		return recs
	}
	send := func(recs []*kgo.Record) {
		t.Helper()
		testenv.Produce(t, e.brokers, e.topic, recs...)
	}
	send(batch(0, 3000))
	send([]*kgo.Record{{Topic: e.topic, Key: []byte("acct-00"), Value: []byte(`{"event_id":"bg-bad"`)}})
	logEnd := func() int64 { return int64(len(produced)) + 1 }

	blueAddr := opsFreeAddr(t)
	blue := testenv.Start(t, "billing-blue", e.bin, e.env(map[string]string{"HTTP_ADDR": blueAddr}))
	testenv.Eventually(t, 2*time.Minute, "blue has counted the topic", func() (bool, string) {
		if blue.Exited() {
			t.Fatalf("blue exited:\n%s", blue.Output())
		}
		n := opsSum(opsPositions(t, e))
		return n == logEnd(), fmt.Sprint(n)
	})

	// Green: a new control database, a new group; its first checkpoint is
	// held for 20s after it committed.
	greenDSN := testenv.NewDatabase(t)
	green := map[string]string{"MYSQL_DSN": greenDSN, "KAFKA_GROUP": "green-" + e.group}
	greenSvc := testenv.Start(t, "billing-green", e.bin, e.env(stMerge(green, map[string]string{
		"BILLING_FAILPOINTS": "after-commit=sleep:20s@1", "CHECKPOINT_MAX_RECORDS": "300", "KAFKA_MAX_POLL_RECORDS": "100"})))

	// Meanwhile the producers go on, and blue counts.
	send(batch(3000, 4000))

	var mid *ledgerstatus.Report
	testenv.Eventually(t, time.Minute, "green's status shows a partial replay", func() (bool, string) {
		if greenSvc.Exited() {
			t.Fatalf("green exited:\n%s", greenSvc.Output())
		}
		r, code, out := stTryStatus(t, e, green)
		if code != 0 || r == nil { // before green created its schema
			return false, out
		}
		var stored int64
		for _, p := range r.Partitions {
			if p.Stored == ledgerstatus.StoredAt && stVal(p.StoredOffset) > 0 {
				stored += stVal(p.StoredOffset)
			}
		}
		mid = r
		return stored > 0 && stVal(r.TotalLag) > 0, fmt.Sprintf("stored %d, lag %d", stored, stVal(r.TotalLag))
	})
	var ends, lags int64
	for _, p := range mid.Partitions {
		ends += stVal(p.LogEnd)
		lags += stVal(p.Lag)
		if p.Stored == ledgerstatus.StoredAt && stVal(p.Lag) != stVal(p.LogEnd)-stVal(p.StoredOffset) {
			t.Errorf("partition %d: lag %d is not log end %d - stored %d", p.Partition, stVal(p.Lag), stVal(p.LogEnd), stVal(p.StoredOffset))
		}
	}
	if lags != stVal(mid.TotalLag) || stVal(mid.TotalLag) >= ends {
		t.Errorf("mid-replay status: total lag %d (sum %d) of %d records", stVal(mid.TotalLag), lags, ends)
	}
	out, code := e.cli(t, nil, "compare", "--other-dsn", greenDSN)
	if code != 1 || !strings.Contains(out, "MISMATCH") || !strings.Contains(out, "lost") {
		t.Errorf("compare while green is behind: exit %d, want 1 and MISMATCH\n%s", code, out)
	}

	// Caught up: both at the log end, the ledgers exactly equal, and equal
	// to what was produced.
	for _, d := range []struct {
		name string
		env  map[string]string
	}{{"blue", nil}, {"green", green}} {
		testenv.Eventually(t, 3*time.Minute, d.name+" reaches the log end", func() (bool, string) {
			r := stStatus(t, e, d.env)
			return stVal(r.TotalLag) == 0 && r.LastCheckpoint != nil, fmt.Sprintf("lag %d", stVal(r.TotalLag))
		})
	}
	testenv.Eventually(t, 30*time.Second, "billing compare says EXACT", func() (bool, string) {
		out, code = e.cli(t, nil, "compare", "--other-dsn", greenDSN)
		return code == 0 && strings.Contains(out, "EXACT: "), out
	})
	want, n := opsExpected(produced, nil)
	opsCompare(t, "blue", opsLedger(t, e.db), want)
	greenDB, err := sqlx.Open("mysql", greenDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer greenDB.Close()
	opsCompare(t, "green", opsLedger(t, greenDB), want)
	if !strings.Contains(out, fmt.Sprintf("1 dead letters, %d events", n)) {
		t.Errorf("compare verdict %q does not count the %d events", out, n)
	}
	for _, p := range []*testenv.Process{blue, greenSvc} {
		p.Signal(syscall.SIGTERM)
		if err := p.Wait(t, time.Minute); err != nil {
			t.Fatalf("%s exit: %v", p.Name, err)
		}
	}
}

// stRunClean runs bin with exactly env (and PATH), not the test's
// environment, so that a variable the command must not need (KAFKA_BROKERS
// for compare) cannot leak in from `make test`. It returns stdout, stderr
// and the exit status.
func stRunClean(t *testing.T, bin string, env map[string]string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errb.String(), 0
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	default:
		t.Fatalf("%s %v: %v", bin, args, err)
		return "", "", -1
	}
}

// stWrongPassword returns dsn with another password.
func stWrongPassword(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Passwd = "not-" + cfg.Passwd
	return cfg.FormatDSN()
}

// TestStatusSaysWhatItCannotRead (issue 22): `billing status` with a wrong
// MySQL password printed "total lag: 4333 records", "last committed
// checkpoint: none recorded", "branches in doubt: none", "dead letters not
// re-injected: none" and stored_offset -2, while the truth was lag 0 and
// dead letters pending; a forgotten KAFKA_GROUP exited 0 with the whole
// topic as lag; a missing topic printed no JSON at all. Now: what could not
// be read is "unknown" with the error (access denied, naming the account),
// exit 3; a group without positions in this ledger is said plainly with the
// groups it holds, exit 1; a missing topic still gets a JSON document, exit
// 1.
func TestStatusSaysWhatItCannotRead(t *testing.T) {
	e := newOpsEnv(t, 2)
	var values []string
	for i := range 30 {
		values = append(values, stEvent(fmt.Sprintf("su-%d", i), fmt.Sprintf("acct-%d", i%3), int64(i)))
	}
	values = append(values, `{"event_id":"su-bad"`)
	stProduce(t, e, values...)
	svc := testenv.Start(t, "billing", e.bin, e.env(nil))
	testenv.Eventually(t, time.Minute, "31 records committed", func() (bool, string) {
		if svc.Exited() {
			t.Fatalf("service exited:\n%s", svc.Output())
		}
		n := opsSum(opsPositions(t, e))
		return n == 31, fmt.Sprint(n)
	})
	svc.Signal(syscall.SIGTERM)
	if err := svc.Wait(t, time.Minute); err != nil {
		t.Fatalf("exit: %v", err)
	}
	if r := stStatus(t, e, nil); stVal(r.TotalLag) != 0 || len(r.DeadLetters) != 1 || !r.GroupStored {
		t.Fatalf("the complete report: lag %d, dead letters %v, group stored %v", stVal(r.TotalLag), r.DeadLetters, r.GroupStored)
	}

	// A wrong password: every MySQL part unknown, the log offsets kept.
	wrong := map[string]string{"MYSQL_DSN": stWrongPassword(t, e.dsn)}
	out, code := e.cli(t, wrong, "status")
	if code != 3 {
		t.Errorf("status with a wrong password: exit %d, want 3\n%s", code, out)
	}
	for _, want := range []string{"unknown", "total lag: unknown", "last committed checkpoint: unknown", "branches in doubt: unknown",
		"dead letters not re-injected: unknown", "access denied", "refused the MySQL account", "could not be read"} {
		if !strings.Contains(out, want) {
			t.Errorf("status with a wrong password lacks %q:\n%s", want, out)
		}
	}
	for _, invented := range []string{"none recorded", "branches in doubt: none", "dead letters not re-injected: none", "total lag: 31", "start"} {
		if strings.Contains(out, invented) {
			t.Errorf("status with a wrong password says %q, which it could not know:\n%s", invented, out)
		}
	}
	r, code, out := stTryStatus(t, e, wrong)
	if code != 3 || r == nil {
		t.Fatalf("status --json with a wrong password: exit %d\n%s", code, out)
	}
	if r.TotalLag != nil || r.LastCheckpoint != nil || r.InDoubt != nil || r.DeadLetters != nil || !strings.Contains(r.PositionsError, "access denied") || len(r.Partitions) != 2 {
		t.Errorf("JSON with a wrong password invents values: %+v", r)
	}
	for _, p := range r.Partitions {
		if p.Stored != ledgerstatus.StoredUnknown || p.StoredOffset != nil || p.Lag != nil || stVal(p.LogEnd) < 0 {
			t.Errorf("partition %d = %+v; want stored unknown, no stored offset, no lag, the log end", p.Partition, p)
		}
	}

	// A forgotten KAFKA_GROUP.
	other := map[string]string{"KAFKA_GROUP": "billing-ledger"}
	out, code = e.cli(t, other, "status")
	if code != 1 || !strings.Contains(out, `NOT FOUND: group "billing-ledger" has no positions`) || !strings.Contains(out, fmt.Sprintf("group %q on topic %q (2 partitions)", e.group, e.topic)) {
		t.Errorf("status of a group the ledger does not hold: exit %d, want 1 naming %s\n%s", code, e.group, out)
	}
	if r, code, out := stTryStatus(t, e, other); code != 1 || r == nil || r.GroupStored || len(r.StoredGroups) != 1 || r.StoredGroups[0].Group != e.group {
		t.Errorf("status --json of another group: exit %d, %+v\n%s", code, r, out)
	}

	// A topic the brokers do not know: still a document.
	missing := map[string]string{"KAFKA_TOPIC": "missing-" + e.topic}
	r, code, out = stTryStatus(t, e, missing)
	if code != 1 || r == nil || !r.TopicMissing || !strings.Contains(out, "does not exist on the brokers") {
		t.Errorf("status --json of a missing topic: exit %d, report %+v\n%s", code, r, out)
	}
}
