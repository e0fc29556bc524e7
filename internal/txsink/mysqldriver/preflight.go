package mysqldriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// grantCheck is a statement that touches no row but needs one privilege on
// one table: the server checks privileges before it evaluates WHERE 1=0.
// The INSERT check copies the table into itself (no column list to keep in
// sync with the schema), so it also needs SELECT, which the declaration
// gives every table the service writes; the UPDATE check sets a column to
// itself (its first, from information_schema: an account that sees no
// column of the table lacks the privilege anyway).
func grantCheck(ctx context.Context, db *sql.DB, a TableAccess) (string, error) {
	switch a.Privilege {
	case Select:
		return `SELECT COUNT(*) FROM ` + a.Table + ` WHERE 1=0`, nil
	case Insert:
		return `INSERT INTO ` + a.Table + ` SELECT * FROM ` + a.Table + ` WHERE 1=0`, nil
	case Update:
		var col string
		err := db.QueryRowContext(ctx, `SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION LIMIT 1`, a.Table).Scan(&col)
		if errors.Is(err, sql.ErrNoRows) {
			return "", errNoColumn
		}
		if err != nil {
			return "", err
		}
		return "UPDATE " + a.Table + " SET `" + col + "` = `" + col + "` WHERE 1=0", nil
	case Delete:
		return `DELETE FROM ` + a.Table + ` WHERE 1=0`, nil
	case Drop:
		return dropCheck(ctx, db, a.Table)
	}
	return "", fmt.Errorf("no check for the privilege %s", a.Privilege)
}

// errNoColumn: the account sees no column of the table.
var errNoColumn = errors.New("the account sees no column of the table")

// errNoDrop: the account's grants hold no DROP on the table.
var errNoDrop = errors.New("no DROP privilege on the table in the account's grants (information_schema)")

// dropCheck checks DROP on table, which no statement can prove without
// dropping or emptying something: it looks for the privilege in
// information_schema's views of the current account's grants, global, on
// the database (the grant's database may be a pattern, as in
// `billing_shard1`.* where _ matches any character) or on the table, and
// returns a statement that succeeds when one was found, else errNoDrop.
// A DROP that reaches the account only through a role is not seen: the
// check then refuses to start, naming the privilege (grant it to the
// account itself).
func dropCheck(ctx context.Context, db *sql.DB, table string) (string, error) {
	const grantee = `CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''', SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''')`
	var n int
	err := db.QueryRowContext(ctx, `SELECT
		(SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES WHERE GRANTEE = `+grantee+` AND PRIVILEGE_TYPE = 'DROP') +
		(SELECT COUNT(*) FROM information_schema.SCHEMA_PRIVILEGES WHERE GRANTEE = `+grantee+` AND PRIVILEGE_TYPE = 'DROP' AND DATABASE() LIKE TABLE_SCHEMA) +
		(SELECT COUNT(*) FROM information_schema.TABLE_PRIVILEGES WHERE GRANTEE = `+grantee+` AND PRIVILEGE_TYPE = 'DROP'
			AND TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?)`, table).Scan(&n)
	if err != nil {
		return "", err
	}
	if n == 0 {
		return "", errNoDrop
	}
	return `SELECT 1`, nil
}

// preflight checks, on every server, that the account has every privilege
// that needs (Access of the configuration's features: the
// store's declaration of what the service reads and writes) and may run XA RECOVER, so that a
// missing grant stops the service at start, before it reads or writes
// anything, with a message naming the privilege and the table, instead of
// failing every checkpoint or cleanup later. The migrations create every
// table on every server, so every server is checked alike. No row is read
// or written.
func Preflight(ctx context.Context, dsns []string, lockWait time.Duration, needs []TableAccess) error {
	for i, dsn := range dsns {
		if err := preflightServer(ctx, dsn, lockWait, needs); err != nil {
			return fmt.Errorf("server %d: %w", i, err)
		}
	}
	return nil
}

func preflightServer(ctx context.Context, dsn string, lockWait time.Duration, needs []TableAccess) error {
	db, err := OpenDB(dsn, lockWait, 1)
	if err != nil {
		return err
	}
	defer db.Close()
	for _, a := range needs {
		q, err := grantCheck(ctx, db.DB, a)
		if err == nil {
			_, err = db.ExecContext(ctx, q)
		}
		if err != nil {
			if Denied(err) || errors.Is(err, errNoColumn) || errors.Is(err, errNoDrop) {
				return fmt.Errorf("access denied: the MySQL account %s lacks %s on %s%s: %w (the service needs SELECT, INSERT, UPDATE, DELETE and DROP on its database, see docs/operations.md)",
					accountOf(ctx, db.DB), a.Privilege, a.Table, neededBy(a.Feature), err)
			}
			return fmt.Errorf("checking %s on %s: %w", a.Privilege, a.Table, err)
		}
	}
	rows, err := db.QueryContext(ctx, "XA RECOVER")
	if err != nil {
		return fmt.Errorf("XA RECOVER failed: %w (on MySQL 8 the account needs XA_RECOVER_ADMIN, see docs/operations.md)", err)
	}
	_ = rows.Close()
	return nil
}

// neededBy names the setting that needs a privilege, if one does.
func neededBy(f Feature) string {
	if f == FeatureAlways {
		return ""
	}
	return " (needed with " + string(f) + ")"
}

// accountOf names the account a server sees and the database in use, for
// a refusal's message: 'billing'@'%' on database "billing".
func accountOf(ctx context.Context, db *sql.DB) string {
	var user, database sql.NullString
	if err := db.QueryRowContext(ctx, "SELECT CURRENT_USER(), DATABASE()").Scan(&user, &database); err != nil {
		return "(unknown: " + err.Error() + ")"
	}
	return fmt.Sprintf("%s on database %q", user.String, database.String)
}
