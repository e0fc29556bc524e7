package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// grantChecks are statements that touch no row but need the privileges the
// service uses on each table: the server checks privileges before it
// evaluates WHERE 1=0. The INSERT checks copy the table into itself (no
// column list to keep in sync with the schema), so they also need SELECT,
// which the service account has on every table. The migrations create every
// table on every server, so every server is checked alike.
var grantChecks = []struct{ privilege, table, sql string }{
	{"SELECT", "account_balances", `SELECT COUNT(*) FROM account_balances WHERE 1=0`},
	{"INSERT", "account_balances", `INSERT INTO account_balances SELECT * FROM account_balances WHERE 1=0`},
	{"UPDATE", "account_balances", `UPDATE account_balances SET event_count = 0 WHERE 1=0`},
	{"SELECT", "billing_windows", `SELECT COUNT(*) FROM billing_windows WHERE 1=0`},
	{"INSERT", "billing_windows", `INSERT INTO billing_windows SELECT * FROM billing_windows WHERE 1=0`},
	{"UPDATE", "billing_windows", `UPDATE billing_windows SET event_count = 0 WHERE 1=0`},
	{"INSERT", "dead_letters", `INSERT INTO dead_letters SELECT * FROM dead_letters WHERE 1=0`},
	{"SELECT", "dedup_keys", `SELECT COUNT(*) FROM dedup_keys WHERE 1=0`},
	{"INSERT", "dedup_keys", `INSERT INTO dedup_keys SELECT * FROM dedup_keys WHERE 1=0`},
	{"UPDATE", "dedup_keys", `UPDATE dedup_keys SET event_id = event_id WHERE 1=0`},
	{"DELETE", "dedup_keys", `DELETE FROM dedup_keys WHERE 1=0`},
	{"SELECT", "dedup_expiry", `SELECT COUNT(*) FROM dedup_expiry WHERE 1=0`},
	{"INSERT", "dedup_expiry", `INSERT INTO dedup_expiry SELECT * FROM dedup_expiry WHERE 1=0`},
	{"DELETE", "dedup_expiry", `DELETE FROM dedup_expiry WHERE 1=0`},
	{"SELECT", "partition_offsets", `SELECT COUNT(*) FROM partition_offsets WHERE 1=0`},
	{"INSERT", "partition_offsets", `INSERT INTO partition_offsets SELECT * FROM partition_offsets WHERE 1=0`},
	{"UPDATE", "partition_offsets", `UPDATE partition_offsets SET epoch = 0 WHERE 1=0`},
	{"SELECT", "checkpoint_decisions", `SELECT COUNT(*) FROM checkpoint_decisions WHERE 1=0`},
	{"INSERT", "checkpoint_decisions", `INSERT INTO checkpoint_decisions SELECT * FROM checkpoint_decisions WHERE 1=0`},
	{"DELETE", "checkpoint_decisions", `DELETE FROM checkpoint_decisions WHERE 1=0`},
	{"SELECT", "ledger_identity", `SELECT COUNT(*) FROM ledger_identity WHERE 1=0`},
	{"INSERT", "ledger_identity", `INSERT INTO ledger_identity SELECT * FROM ledger_identity WHERE 1=0`},
	{"SELECT", "ledger_periods", `SELECT COUNT(*) FROM ledger_periods WHERE 1=0`},
	{"INSERT", "ledger_periods", `INSERT INTO ledger_periods SELECT * FROM ledger_periods WHERE 1=0`},
}

// preflight checks, on every server, that the account has every privilege
// the service needs, so that a missing grant stops the service at start
// with a message naming it, instead of failing every checkpoint later. No
// row is read or written.
func preflight(ctx context.Context, servers *mysqldriver.Driver) error {
	for i := range servers.Len() {
		db := servers.Server(i).DB()
		for _, c := range grantChecks {
			if _, err := db.ExecContext(ctx, c.sql); err != nil {
				if denied(err) {
					return fmt.Errorf("server %d: access denied: the MySQL account %s lacks %s on %s: %w (the service needs SELECT, INSERT, UPDATE and DELETE on its database, see docs/operations.md)",
						i, accountOf(ctx, db.DB), c.privilege, c.table, err)
				}
				return fmt.Errorf("server %d: checking %s on %s: %w", i, c.privilege, c.table, err)
			}
		}
		rows, err := db.QueryContext(ctx, "XA RECOVER")
		if err != nil {
			return fmt.Errorf("server %d: XA RECOVER failed: %w (on MySQL 8 the account needs XA_RECOVER_ADMIN, see docs/operations.md)", i, err)
		}
		_ = rows.Close()
	}
	return nil
}

// denied reports a missing privilege on a database, table or column.
func denied(err error) bool { return mysqldriver.Denied(err) }

// accountOf names the account a server sees and the database in use, for
// a refusal's message: 'billing'@'%' on database "billing".
func accountOf(ctx context.Context, db *sql.DB) string {
	var user, database sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT CURRENT_USER(), DATABASE()").Scan(&user, &database); err != nil {
		return "(unknown: " + err.Error() + ")"
	}
	return fmt.Sprintf("%s on database %q", user.String, database.String)
}
