package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/testenv"
)

// TestDebeziumSeesPreparedBranches reproduces why tapping the ledger's
// binary log is unsafe (issue 20): Debezium's MySQL connector
// (integration/jvm debezium-capture), reading a ledger database's
// account_balances, emits the rows of an XA branch as soon as the branch is
// prepared, and emits nothing when the branch is then rolled back. A
// consumer of that stream sees money that never committed, and the stream's
// next event of the key no longer follows from the one before.
//
// The server writes a branch's rows to the binary log at XA PREPARE and its
// outcome later as a separate XA COMMIT or XA ROLLBACK (MariaDB 10.5 and
// later, and MySQL 8.4); the test records the binary log position around
// each step and checks that the rows Debezium emitted come from the
// prepare, before any decision.
//
// JVM_TESTS=1 runs it (testenv.JVM). It needs the binary log on in ROW
// format and root (replication privileges).
func TestDebeziumSeesPreparedBranches(t *testing.T) {
	dsn, db := testenv.LedgerDB(t)
	jvm := testenv.JVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	vars := map[string]string{}
	for _, v := range []string{"log_bin", "binlog_format", "binlog_row_image", "version"} {
		var val string
		if err := db.GetContext(ctx, &val, "SELECT @@GLOBAL."+v); err != nil {
			t.Fatal(err)
		}
		vars[v] = val
	}
	t.Logf("server %s: log_bin=%s binlog_format=%s binlog_row_image=%s", vars["version"], vars["log_bin"],
		vars["binlog_format"], vars["binlog_row_image"])
	if vars["log_bin"] != "1" || vars["binlog_format"] != "ROW" {
		t.Fatalf("Debezium needs the binary log on in ROW format (scripts/services.sh starts MariaDB so): log_bin=%s binlog_format=%s",
			vars["log_bin"], vars["binlog_format"])
	}

	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		t.Fatal(err)
	}
	capture := jvm.Start(t, "debezium-capture", "--host", host, "--port", port, "--user", cfg.User,
		"--password", cfg.Passwd, "--database", cfg.DBName, "--tables", "account_balances")
	events := func() []capturedEvent { return parseCaptured(t, capture.Stdout()) }
	// waitFor polls until Debezium emitted an event of account that cond
	// accepts.
	waitFor := func(what, account string, cond func(capturedEvent) bool) capturedEvent {
		t.Helper()
		var found capturedEvent
		testenv.Eventually(t, 2*time.Minute, what, func() (bool, string) {
			if capture.Exited() {
				t.Fatalf("debezium-capture exited:\n%s", capture.Output())
			}
			for _, e := range events() {
				if e.account(t) == account && cond(e) {
					found = e
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d events so far", len(events()))
		})
		return found
	}
	upsert := func(account string, balance int64) {
		t.Helper()
		if _, err := db.ExecContext(ctx, `INSERT INTO account_balances (account_id, currency, balance_minor, event_count, updated_at)
			VALUES (?, 'EUR', ?, 1, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE balance_minor = VALUES(balance_minor)`,
			account, balance); err != nil {
			t.Fatal(err)
		}
	}

	// Debezium streams from the position current when it started, which
	// the test cannot see: write a ping until one is emitted.
	start := time.Now()
	pingCtx, stopPing := context.WithCancel(ctx)
	pingDone := make(chan struct{})
	go func() {
		defer close(pingDone)
		for i := int64(1); ; i++ {
			select {
			case <-pingCtx.Done():
				return
			case <-time.After(time.Second):
			}
			_, _ = db.ExecContext(pingCtx, `INSERT INTO account_balances VALUES ('ping', 'EUR', ?, 1, UTC_TIMESTAMP(6))
				ON DUPLICATE KEY UPDATE balance_minor = VALUES(balance_minor)`, i)
		}
	}()
	defer func() { stopPing(); <-pingDone }()
	waitFor("Debezium streaming (a ping row emitted)", "ping", func(capturedEvent) bool { return true })
	stopPing()
	<-pingDone
	t.Logf("debezium-capture streaming after %s", time.Since(start).Round(100*time.Millisecond))

	upsert("marker", 100)
	waitFor("the marker row's insert", "marker", func(e capturedEvent) bool { return e.Op == "c" })

	// Branch 1: prepared, then rolled back.
	gtridRB, gtridOK := testenv.RandomName("jvmcheck-rb-"), testenv.RandomName("jvmcheck-ok-")
	before1 := binlogPosition(t, db)
	rb := xaBranch(t, db, gtridRB, "INSERT INTO account_balances VALUES ('rolled-back', 'EUR', 111, 1, UTC_TIMESTAMP(6))",
		"UPDATE account_balances SET balance_minor = balance_minor + 1000 WHERE account_id = 'marker'")
	prepared1 := binlogPosition(t, db)
	ghost := waitFor("the rolled-back branch's insert emitted while it is prepared", "rolled-back",
		func(capturedEvent) bool { return true })
	ghostUpdate := waitFor("the rolled-back branch's update emitted while it is prepared", "marker",
		func(e capturedEvent) bool { return e.Op == "u" && e.balance(t, e.After) == 1100 })
	if n := testenv.InDoubt(t, db, gtridRB); n != 1 {
		t.Fatalf("branch %s: %d in XA RECOVER while Debezium emitted its rows, want 1 (prepared, undecided)", gtridRB, n)
	}
	rb.end(t, "XA ROLLBACK")
	rolledBack := binlogPosition(t, db)

	// Branch 2: prepared, then committed.
	ok := xaBranch(t, db, gtridOK, "INSERT INTO account_balances VALUES ('committed', 'EUR', 222, 1, UTC_TIMESTAMP(6))",
		"UPDATE account_balances SET balance_minor = balance_minor + 1 WHERE account_id = 'marker'")
	prepared2 := binlogPosition(t, db)
	committed := waitFor("the committed branch's insert emitted while it is prepared", "committed",
		func(capturedEvent) bool { return true })
	ok.end(t, "XA COMMIT")
	committed2 := binlogPosition(t, db)

	// A last plain commit: once it is emitted, Debezium has read past both
	// outcomes.
	upsert("end", 1)
	waitFor("the end row", "end", func(capturedEvent) bool { return true })
	all := events()
	t.Logf("binary log: branch 1 from %s, prepared by %s, rolled back by %s; branch 2 prepared by %s, committed by %s",
		before1, prepared1, rolledBack, prepared2, committed2)
	for _, e := range all {
		if a := e.account(t); a != "ping" {
			t.Logf("Debezium emitted: %s %s at %s row %d: before %v after %v", e.Op, a, e.position(), e.Row,
				e.balances(t, e.Before), e.balances(t, e.After))
		}
	}

	// What MySQL holds: no rolled-back row, marker 100 + 1.
	var inMySQL []struct {
		Account string `db:"account_id"`
		Balance int64  `db:"balance_minor"`
	}
	if err := db.SelectContext(ctx, &inMySQL, `SELECT account_id, balance_minor FROM account_balances
		WHERE account_id IN ('rolled-back', 'marker', 'committed') ORDER BY account_id`); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(inMySQL) != "[{committed 222} {marker 101}]" {
		t.Fatalf("MySQL holds %v, want [{committed 222} {marker 101}]", inMySQL)
	}

	// The rolled-back branch's rows were emitted, from its prepare (before
	// any decision was written), and nothing took them back.
	if ghost.Op != "c" || ghost.balance(t, ghost.After) != 111 {
		t.Errorf("rolled-back row: Debezium emitted %s %v, want c with balance 111", ghost.Op, ghost.balances(t, ghost.After))
	}
	for _, e := range []capturedEvent{ghost, ghostUpdate} {
		if !(before1.lessEq(e.position()) && e.position().less(prepared1)) {
			t.Errorf("event %s %s at %s: not from branch 1's prepare (binary log %s to %s)", e.Op, e.account(t),
				e.position(), before1, prepared1)
		}
	}
	if !(rolledBack.lessEq(committed.position()) && committed.position().less(prepared2)) {
		t.Errorf("committed row at %s: not from branch 2's prepare (binary log %s to %s)", committed.position(),
			rolledBack, prepared2)
	}
	perAccount := map[string][]capturedEvent{}
	for _, e := range all {
		perAccount[e.account(t)] = append(perAccount[e.account(t)], e)
	}
	if n := len(perAccount["rolled-back"]); n != 1 {
		t.Errorf("rolled-back row: %d events, want 1 (its insert, never retracted)", n)
	}
	if n := len(perAccount["committed"]); n != 1 {
		t.Errorf("committed row: %d events, want 1", n)
	}
	// The marker's stream: 100, then 1100 (never committed), then an
	// update whose before is MySQL's 100 again: a consumer checking that
	// each before equals the previous after finds the chain broken, and one
	// that does not holds 1100 until the next update overwrote it.
	var marker []string
	for _, e := range perAccount["marker"] {
		marker = append(marker, fmt.Sprintf("%s %v->%v", e.Op, e.balances(t, e.Before), e.balances(t, e.After)))
	}
	if want := "c []->[100] | u [100]->[1100] | u [100]->[101]"; strings.Join(marker, " | ") != want {
		t.Errorf("marker's events: %s, want %s", strings.Join(marker, " | "), want)
	}
}

// capturedEvent is one line of debezium-capture.
type capturedEvent struct {
	Table  string         `json:"table"`
	Op     string         `json:"op"`
	File   string         `json:"file"`
	Pos    int64          `json:"pos"`
	Row    int            `json:"row"`
	Before map[string]any `json:"before"`
	After  map[string]any `json:"after"`
}

func parseCaptured(t *testing.T, out string) []capturedEvent {
	t.Helper()
	var evs []capturedEvent
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if !strings.HasSuffix(sc.Text(), "}") {
			continue // a line still being written
		}
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.UseNumber()
		var e capturedEvent
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("debezium-capture line %q: %v", sc.Text(), err)
		}
		evs = append(evs, e)
	}
	return evs
}

func (e capturedEvent) position() binlogPos { return binlogPos{e.File, e.Pos} }

// account: account_id of the event's row (binary.handling.mode hex).
func (e capturedEvent) account(t *testing.T) string {
	t.Helper()
	r := e.After
	if r == nil {
		r = e.Before
	}
	s, _ := r["account_id"].(string)
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("account_id %q: %v", s, err)
	}
	return string(b)
}

func (e capturedEvent) balance(t *testing.T, r map[string]any) int64 {
	t.Helper()
	n, ok := r["balance_minor"].(json.Number)
	if !ok {
		t.Fatalf("balance_minor in %v", r)
	}
	v, err := n.Int64()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// balances: [] for no row, [balance] for one.
func (e capturedEvent) balances(t *testing.T, r map[string]any) []int64 {
	if r == nil {
		return []int64{}
	}
	return []int64{e.balance(t, r)}
}

// binlogPos is a position in the binary log.
type binlogPos struct {
	File string
	Pos  int64
}

func (p binlogPos) String() string { return fmt.Sprintf("%s:%d", p.File, p.Pos) }

// less: files are numbered with a fixed width, so their names order them.
func (p binlogPos) less(q binlogPos) bool {
	return p.File < q.File || p.File == q.File && p.Pos < q.Pos
}

func (p binlogPos) lessEq(q binlogPos) bool { return !q.less(p) }

// binlogPosition is the server's current binary log position: SHOW BINARY
// LOG STATUS on MySQL 8.4 (which removed SHOW MASTER STATUS), SHOW MASTER
// STATUS on MariaDB (which has no SHOW BINARY LOG STATUS).
func binlogPosition(t *testing.T, db *sqlx.DB) binlogPos {
	t.Helper()
	for _, q := range []string{"SHOW BINARY LOG STATUS", "SHOW MASTER STATUS"} {
		rows, err := db.Query(q)
		if err != nil {
			continue
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if !rows.Next() {
			t.Fatalf("%s: no row (binary log off?)", q)
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		var p binlogPos
		p.File = string(vals[0])
		if _, err := fmt.Sscan(string(vals[1]), &p.Pos); err != nil {
			t.Fatalf("%s: position %q: %v", q, vals[1], err)
		}
		return p
	}
	t.Fatal("neither SHOW BINARY LOG STATUS nor SHOW MASTER STATUS answered")
	return binlogPos{}
}

// preparedBranch is an XA branch left prepared on its own connection.
type preparedBranch struct {
	conn  *sql.Conn
	gtrid string
	done  bool
}

// xaBranch runs stmts in an XA branch and prepares it. The branch is
// rolled back when the test ends if end was not called: a prepared branch
// outlives its connection and would hold its locks.
func xaBranch(t *testing.T, db *sqlx.DB, gtrid string, stmts ...string) *preparedBranch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := &preparedBranch{conn: conn, gtrid: gtrid}
	t.Cleanup(func() {
		if !b.done {
			_, _ = conn.ExecContext(context.Background(), "XA ROLLBACK '"+gtrid+"'")
		}
		conn.Close()
	})
	xid := "'" + gtrid + "'" // RandomName: letters, digits and dashes
	for _, s := range append(append([]string{"XA START " + xid}, stmts...), "XA END "+xid, "XA PREPARE "+xid) {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			t.Fatalf("branch %s: %s: %v", gtrid, s, err)
		}
	}
	return b
}

// end decides the branch: stmt is XA COMMIT or XA ROLLBACK.
func (b *preparedBranch) end(t *testing.T, stmt string) {
	t.Helper()
	if _, err := b.conn.ExecContext(context.Background(), stmt+" '"+b.gtrid+"'"); err != nil {
		t.Fatalf("branch %s: %s: %v", b.gtrid, stmt, err)
	}
	b.done = true
}
