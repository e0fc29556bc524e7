package integration_test

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// opsCreateTableUser creates a throwaway account with privileges granted
// table by table on one database (plus XA_RECOVER_ADMIN on MySQL 8) and
// returns its DSN; it is dropped after the test.
func opsCreateTableUser(t *testing.T, admin *sql.DB, adminCfg *mysql.Config, perTable map[string][]string) string {
	t.Helper()
	user, pass := testenv.RandomName("u_"), testenv.RandomName("pw_")
	// The names are generated, the tables come from the declaration and
	// the database from testenv.NewDatabase: quoting is safe.
	stmts := []string{fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", user, pass)}
	for table, privs := range perTable {
		stmts = append(stmts, fmt.Sprintf("GRANT %s ON `%s`.`%s` TO '%s'@'%%'", strings.Join(privs, ", "), adminCfg.DBName, table, user))
	}
	var version string
	if err := admin.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.ToLower(version), "mariadb") {
		stmts = append(stmts, fmt.Sprintf("GRANT XA_RECOVER_ADMIN ON *.* TO '%s'@'%%'", user))
	}
	t.Cleanup(func() { _, _ = admin.Exec(fmt.Sprintf("DROP USER IF EXISTS '%s'@'%%'", user)) })
	for _, s := range stmts {
		if _, err := admin.Exec(s); err != nil {
			t.Fatalf("%s: %v", strings.Replace(s, pass, "…", 1), err)
		}
	}
	cfg := adminCfg.Clone()
	cfg.User, cfg.Passwd = user, pass
	return cfg.FormatDSN()
}

// everyFeature turns on every feature that needs privileges of its own,
// the changelog included (its topics named after the test's topic).
func everyFeature(e *opsEnv) map[string]string {
	return map[string]string{"WINDOW_CLOSE_AFTER": "30m", "LEDGER_ENTRIES": "true", "LEDGER_ENTRIES_RETENTION": "2s", "DEDUP_CLEANUP_INTERVAL": "200ms",
		"CHANGELOG_TOPIC_PREFIX": "cl-" + e.topic}
}

// Preflight from the schema (issue 18), against MariaDB, with every
// feature on (windows that close, ledger entries and their retention, the
// metrics sampler, the changelog):
//
//   - an account granted exactly what internal/txsink/mysqldriver/privileges.go
//     declares, table by table, runs the service: it counts events, seals
//     a window, writes adjustments and entries, deletes old entries and
//     commits a dead letter. The declaration is enough;
//   - for every table the service writes, an account that may only read
//     that table (and has everything else) is stopped at start, before it
//     writes anything, with a message naming the privilege and the table.
//
// Before, preflight's own list had no window_adjustments, ledger_entries
// or window_frontier: such an account started and then failed every
// checkpoint that closed a window, and every cleanup, forever.
func TestPreflightChecksEveryTableOfTheSchema(t *testing.T) {
	e := newOpsEnv(t, 1)
	admin, adminCfg := opsAdmin(t, e.dsn)
	if out, code := e.cli(t, nil, "migrate"); code != 0 {
		t.Fatalf("billing migrate as admin: exit %d\n%s", code, out)
	}
	declared := map[string][]string{}
	for _, a := range mysqldriver.AllAccess() {
		declared[a.Table] = append(declared[a.Table], a.Privilege)
	}

	t.Run("the declaration is enough", func(t *testing.T) {
		dsn := opsCreateTableUser(t, admin, adminCfg, declared)
		svc := testenv.Start(t, "billing with the declared grants", e.bin, e.env(mergeEnv(everyFeature(e), map[string]string{"MYSQL_DSN": dsn, "HTTP_ADDR": opsFreeAddr(t)})))
		var recs []*kgo.Record
		add := func(id string, amount int64, at string) {
			b, _ := json.Marshal(opsEvent{ID: id, Account: "acct-g", Amount: amount, Currency: "EUR", At: at})
			recs = append(recs, &kgo.Record{Key: []byte("acct-g"), Value: b})
		}
		add("g-1", 10, "2026-11-29T10:05:00Z")
		add("g-2", 20, "2026-11-29T11:30:00Z") // closes 10:00
		add("g-3", 30, "2026-11-29T10:10:00Z") // late: an adjustment
		add("g-4", 40, "2026-11-29T11:40:00Z") // the 10:00 window gets sealed
		recs = append(recs, &kgo.Record{Key: []byte("k"), Value: []byte("not json")})
		testenv.Produce(t, e.brokers, e.topic, recs...)
		testenv.Eventually(t, 2*time.Minute, "events, seal, adjustment and retention", func() (bool, string) {
			if svc.Exited() {
				t.Fatalf("the service exited:\n%s", svc.Output())
			}
			var counted, sealed, adjusted, entries, dead int
			_ = e.db.Get(&counted, `SELECT COALESCE(SUM(event_count), 0) FROM account_balances`)
			_ = e.db.Get(&sealed, `SELECT COUNT(*) FROM billing_windows WHERE closed_at IS NOT NULL`)
			_ = e.db.Get(&adjusted, `SELECT COUNT(*) FROM window_adjustments`)
			_ = e.db.Get(&entries, `SELECT COUNT(*) FROM ledger_entries`)
			_ = e.db.Get(&dead, `SELECT COUNT(*) FROM dead_letters`)
			return counted == 4 && sealed == 1 && adjusted == 1 && entries == 0 && dead == 1,
				fmt.Sprintf("%d counted, %d sealed, %d adjustments, %d entries left, %d dead letters", counted, sealed, adjusted, entries, dead)
		})
		if out := svc.Output(); strings.Contains(out, "denied") {
			t.Errorf("a statement was denied to an account with the declared grants:\n%s", out)
		}
		svc.Signal(syscall.SIGTERM)
		if err := svc.Wait(t, time.Minute); err != nil {
			t.Fatalf("exit: %v\n%s", err, svc.Output())
		}
	})

	var tables []string
	for table, privs := range declared {
		if slices.ContainsFunc(privs, func(p string) bool { return p != mysqldriver.Select }) {
			tables = append(tables, table)
		}
	}
	slices.Sort(tables)
	for _, table := range tables {
		t.Run("read-only "+table, func(t *testing.T) {
			grants := map[string][]string{}
			for tb, privs := range declared {
				grants[tb] = privs
			}
			grants[table] = []string{mysqldriver.Select}
			dsn := opsCreateTableUser(t, admin, adminCfg, grants)
			p := testenv.Start(t, "billing that may only read "+table, e.bin, e.env(mergeEnv(everyFeature(e), map[string]string{"MYSQL_DSN": dsn})))
			if err := p.Wait(t, time.Minute); err == nil {
				t.Fatalf("the service ran or exited 0 without a write privilege on %s:\n%s", table, p.Output())
			}
			out := p.Output()
			if !strings.Contains(out, " on "+table) || !strings.Contains(out, "lacks ") || !strings.Contains(out, "docs/operations.md") {
				t.Fatalf("want a message naming %s and the privilege it lacks:\n%s", table, out)
			}
			if strings.Contains(out, "starting") {
				t.Errorf("the service went past the check of its grants:\n%s", out)
			}
		})
	}
	if len(tables) < 10 {
		t.Fatalf("only %d tables written: %v", len(tables), tables)
	}

	// One that may do everything but delete ledger entries: stopped with
	// the retention, which needs it, and not stopped without.
	t.Run("no DELETE on ledger_entries", func(t *testing.T) {
		grants := map[string][]string{}
		for tb, privs := range declared {
			grants[tb] = slices.DeleteFunc(slices.Clone(privs), func(p string) bool { return tb == "ledger_entries" && p == mysqldriver.Delete })
		}
		dsn := opsCreateTableUser(t, admin, adminCfg, grants)
		p := testenv.Start(t, "billing that may not delete entries", e.bin, e.env(mergeEnv(everyFeature(e), map[string]string{"MYSQL_DSN": dsn})))
		if err := p.Wait(t, time.Minute); err == nil || !strings.Contains(p.Output(), "lacks DELETE on ledger_entries (needed with LEDGER_ENTRIES_RETENTION)") {
			t.Fatalf("want a refusal naming DELETE on ledger_entries and the retention (%v):\n%s", err, p.Output())
		}
		svc := testenv.Start(t, "billing that may not delete entries, without retention", e.bin,
			e.env(mergeEnv(everyFeature(e), map[string]string{"MYSQL_DSN": dsn, "LEDGER_ENTRIES_RETENTION": ""})))
		testenv.Eventually(t, time.Minute, "the service past its checks", func() (bool, string) {
			if svc.Exited() {
				t.Fatalf("the service stopped without the retention:\n%s", svc.Output())
			}
			return strings.Contains(svc.Output(), `"msg":"starting"`), ""
		})
		svc.Signal(syscall.SIGTERM)
		if err := svc.Wait(t, time.Minute); err != nil {
			t.Fatalf("exit: %v\n%s", err, svc.Output())
		}
	})
}

func mergeEnv(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}
