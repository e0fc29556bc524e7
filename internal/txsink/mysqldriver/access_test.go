package mysqldriver

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// TestAccessDenied: a refusal is reported as access denied, naming the
// account, the server and the database of the DSN, never its password;
// other errors pass unchanged (issue 22: error 1044 was reported as "the
// schema is missing").
func TestAccessDenied(t *testing.T) {
	const dsn = "billing:s3cret-pw@tcp(db.example:3306)/ledger_7"
	for _, tc := range []struct {
		number uint16
		want   []string
	}{
		{ErDBAccessDenied, []string{"access denied", `account "billing" may not use database "ledger_7" on db.example:3306`, "Database grants", "Error 1044"}},
		{ErAccessDenied, []string{"access denied", `db.example:3306 refused the MySQL account "billing"`, "wrong password", "Error 1045"}},
		{ErTableAccessDenied, []string{"access denied", `account "billing" lacks a privilege on database "ledger_7" on db.example:3306`, "Error 1142"}},
		{ErColumnAccessDenied, []string{"access denied", "lacks a privilege", "Error 1143"}},
	} {
		inner := fmt.Errorf("read partition_offsets: %w", &mysql.MySQLError{Number: tc.number, Message: "Access denied for user 'billing'@'%'"})
		err := AccessDenied(dsn, inner)
		var ae *AccessError
		if !errors.As(err, &ae) || ae.Number != tc.number || !errors.Is(err, inner) {
			t.Fatalf("%d: %T %v", tc.number, err, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%d: %q lacks %q", tc.number, err, w)
			}
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%d: the password is in %q", tc.number, err)
		}
		if again := AccessDenied(dsn, err); again != err {
			t.Errorf("wrapped twice: %v", again)
		}
	}
	for _, err := range []error{nil, errors.New("connection refused"), &mysql.MySQLError{Number: erNoSuchTable, Message: "Table doesn't exist"}} {
		if got := AccessDenied(dsn, err); got != err {
			t.Errorf("AccessDenied(%v) = %v, want it unchanged", err, got)
		}
	}
}

// TestDeniedCreate: only a refused CREATE means "no schema yet"; a
// refused database or login is access denied.
func TestDeniedCreate(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&mysql.MySQLError{Number: ErTableAccessDenied, Message: "CREATE command denied to user 'u'@'h' for table `d`.`goose_db_version`"}, true},
		{fmt.Errorf("init: %w", &mysql.MySQLError{Number: ErTableAccessDenied, Message: "CREATE command denied to user"}), true},
		{&mysql.MySQLError{Number: ErTableAccessDenied, Message: "SELECT command denied to user 'u'@'h' for table `d`.`goose_db_version`"}, false},
		{&mysql.MySQLError{Number: ErDBAccessDenied, Message: "Access denied for user 'u'@'%' to database 'd'"}, false},
		{&mysql.MySQLError{Number: ErAccessDenied, Message: "Access denied for user 'u'@'h' (using password: YES)"}, false},
		{errors.New("connection refused"), false},
	} {
		if got := DeniedCreate(tc.err); got != tc.want {
			t.Errorf("DeniedCreate(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
