package mysqldriver

import (
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"
)

// AccessError is a connection or statement the server refused for the
// account: it names the account, the server and the database, so that the
// message says "access denied" and to whom, not what the refusal made
// impossible ("the schema is missing").
type AccessError struct {
	Number   uint16 // ErDBAccessDenied, ErAccessDenied, ErTableAccessDenied or ErColumnAccessDenied (errors.go)
	User     string // the DSN's account
	Addr     string // the DSN's server
	Database string // the DSN's database
	Err      error  // the server's error
}

func (e *AccessError) Error() string {
	var what string
	switch e.Number {
	case ErAccessDenied:
		what = fmt.Sprintf("the server %s refused the MySQL account %q (wrong password, or no such account for this client host)", e.Addr, e.User)
	case ErDBAccessDenied:
		what = fmt.Sprintf("the MySQL account %q may not use database %q on %s (grant it the privileges of docs/operations.md, Database grants)", e.User, e.Database, e.Addr)
	default:
		what = fmt.Sprintf("the MySQL account %q lacks a privilege on database %q on %s (see docs/operations.md, Database grants)", e.User, e.Database, e.Addr)
	}
	return fmt.Sprintf("access denied: %s: %v", what, e.Err)
}

func (e *AccessError) Unwrap() error { return e.Err }

// AccessDenied returns err as an *AccessError naming dsn's account, server
// and database when it is an access refusal (and not one already), and err
// unchanged otherwise. The DSN's password is never part of it.
func AccessDenied(dsn string, err error) error {
	n := DeniedNumber(err)
	var ae *AccessError
	if n == 0 || errors.As(err, &ae) {
		return err
	}
	e := &AccessError{Number: n, Err: err}
	if cfg, perr := mysql.ParseDSN(dsn); perr == nil {
		e.User, e.Addr, e.Database = cfg.User, cfg.Addr, cfg.DBName
	}
	return e
}
