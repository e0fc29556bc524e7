package mysqldriver

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/go-sql-driver/mysql"

	"github.com/billing/ledger/internal/txsink/driver"
)

// Error kinds, the label values of billing_mysql_errors_total.
const (
	KindLockWaitTimeout = "lock_wait_timeout"
	KindDeadlock        = "deadlock"
	KindDuplicateKey    = "duplicate_key"
	KindOutOfRange      = "out_of_range"
	KindXA              = "xa"
	KindConnection      = "connection"
	KindTooLarge        = "too_large"
	KindData            = "data"
	KindOther           = "other"
)

// ErrorKinds lists every kind, in a stable order.
func ErrorKinds() []string {
	return []string{KindLockWaitTimeout, KindDeadlock, KindDuplicateKey, KindOutOfRange, KindXA, KindConnection, KindTooLarge, KindData, KindOther}
}

type class struct {
	kind string
	code driver.Code
}

// numbers is the one home of the server error numbers the service reacts
// to (MySQL and MariaDB share them; MariaDB-only and MySQL-only numbers are
// marked). Numbers not listed are KindOther, driver.Unknown.
var numbers = map[uint16]class{
	1205: {KindLockWaitTimeout, driver.Transient}, // ER_LOCK_WAIT_TIMEOUT
	1213: {KindDeadlock, driver.Transient},        // ER_LOCK_DEADLOCK
	3572: {KindLockWaitTimeout, driver.Transient}, // ER_LOCK_NOWAIT (MySQL 8; MariaDB answers NOWAIT with 1205)
	1022: {KindDuplicateKey, driver.Duplicate},    // ER_DUP_KEY
	1062: {KindDuplicateKey, driver.Duplicate},    // ER_DUP_ENTRY
	1586: {KindDuplicateKey, driver.Duplicate},    // ER_DUP_ENTRY_WITH_KEY_NAME
	1264: {KindOutOfRange, driver.Overflow},       // ER_WARN_DATA_OUT_OF_RANGE
	1690: {KindOutOfRange, driver.Overflow},       // ER_DATA_OUT_OF_RANGE: a BIGINT sum overflowing
	1397: {KindXA, driver.UnknownXid},             // XAER_NOTA
	1398: {KindXA, driver.Unknown},                // XAER_INVAL
	1399: {KindXA, driver.Unknown},                // XAER_RMFAIL: command in the wrong state
	1400: {KindXA, driver.Unknown},                // XAER_OUTSIDE
	1401: {KindXA, driver.Unknown},                // XAER_RMERR
	1402: {KindXA, driver.Transient},              // XA_RBROLLBACK
	1440: {KindXA, driver.DuplicateXid},           // XAER_DUPID
	1613: {KindXA, driver.Transient},              // XA_RBTIMEOUT
	1614: {KindXA, driver.Transient},              // XA_RBDEADLOCK
	1040: {KindConnection, driver.Transient},      // ER_CON_COUNT_ERROR (too many connections)
	1053: {KindConnection, driver.Transient},      // ER_SERVER_SHUTDOWN
	1152: {KindConnection, driver.Transient},      // ER_ABORTING_CONNECTION
	1158: {KindConnection, driver.Transient},      // ER_NET_READ_ERROR
	1159: {KindConnection, driver.Transient},      // ER_NET_READ_INTERRUPTED
	1160: {KindConnection, driver.Transient},      // ER_NET_ERROR_ON_WRITE
	1161: {KindConnection, driver.Transient},      // ER_NET_WRITE_INTERRUPTED
	1290: {KindConnection, driver.Transient},      // ER_OPTION_PREVENTS_STATEMENT (read-only during a failover)
	1836: {KindConnection, driver.Transient},      // ER_READ_ONLY_MODE
	1927: {KindConnection, driver.Transient},      // ER_CONNECTION_KILLED (MariaDB)
	2002: {KindConnection, driver.Transient},      // CR_CONNECTION_ERROR
	2003: {KindConnection, driver.Transient},      // CR_CONN_HOST_ERROR
	2006: {KindConnection, driver.Transient},      // CR_SERVER_GONE_ERROR
	2013: {KindConnection, driver.Transient},      // CR_SERVER_LOST
	4031: {KindConnection, driver.Transient},      // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8)
	1153: {KindTooLarge, driver.TooLarge},         // ER_NET_PACKET_TOO_LARGE
	1048: {KindData, driver.Data},                 // ER_BAD_NULL_ERROR
	1265: {KindData, driver.Data},                 // WARN_DATA_TRUNCATED
	1292: {KindData, driver.Data},                 // ER_TRUNCATED_WRONG_VALUE (a date or time)
	1300: {KindData, driver.Data},                 // ER_INVALID_CHARACTER_STRING
	1366: {KindData, driver.Data},                 // ER_TRUNCATED_WRONG_VALUE_FOR_FIELD (a string the column's character set cannot hold)
	1367: {KindData, driver.Data},                 // ER_ILLEGAL_VALUE_FOR_TYPE
	1406: {KindData, driver.Data},                 // ER_DATA_TOO_LONG
	1411: {KindData, driver.Data},                 // ER_WRONG_VALUE_FOR_TYPE
	1451: {KindData, driver.Data},                 // ER_ROW_IS_REFERENCED_2 (a foreign key an operator added)
	1452: {KindData, driver.Data},                 // ER_NO_REFERENCED_ROW_2
	1644: {KindData, driver.Data},                 // ER_SIGNAL_EXCEPTION (a trigger's SIGNAL)
	3140: {KindData, driver.Data},                 // ER_INVALID_JSON_TEXT (MySQL)
	3819: {KindData, driver.Data},                 // ER_CHECK_CONSTRAINT_VIOLATED (MySQL)
	4025: {KindData, driver.Data},                 // ER_CONSTRAINT_FAILED (MariaDB)
}

// classify returns the kind and code of err; ok is false when err is not a
// MySQL error at all (nil, a context's end, a bug).
func classify(err error) (c class, ok bool) {
	if err == nil {
		return class{}, false
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		if c, ok := numbers[me.Number]; ok {
			return c, true
		}
		return class{KindOther, driver.Unknown}, true
	}
	if errors.Is(err, mysql.ErrPktTooLarge) {
		return class{KindTooLarge, driver.TooLarge}, true
	}
	if errors.Is(err, sqldriver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return class{KindConnection, driver.Transient}, true
	}
	// context.DeadlineExceeded satisfies net.Error: rule it out first.
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return class{}, false
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return class{KindConnection, driver.Transient}, true
	}
	return class{}, false
}

// Code classifies err for the protocol and the pipeline (driver.Code).
func Code(err error) driver.Code {
	c, _ := classify(err)
	return c.code
}

// ErrorKind classifies err for billing_mysql_errors_total. A server error
// (*mysql.MySQLError anywhere in the chain) is classified by its number; a
// broken connection (driver.ErrBadConn, mysql.ErrInvalidConn, a network
// error, an unexpected EOF) is "connection". Anything else, including a
// context deadline, is not a MySQL error: ok is false.
func ErrorKind(err error) (kind string, ok bool) {
	c, ok := classify(err)
	return c.kind, ok
}

func number(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// Numbers the driver and the service react to beyond classification (the
// kinds and codes above are what billing_mysql_errors_total and the
// protocol see; these refusals and absences are classified as KindOther,
// driver.Unknown there, and named here so that no other file compares an
// error number: access.go, periods' and the read-only view's "no table
// yet", the migrations' "may not create the schema").
const (
	erUnknownSystemVariable = 1193 // ER_UNKNOWN_SYSTEM_VARIABLE
	erSpecificAccessDenied  = 1227 // ER_SPECIFIC_ACCESS_DENIED_ERROR (PROCESS missing)
	erNoSuchTable           = 1146 // ER_NO_SUCH_TABLE: a schema older than the table's migration
	erTableExists           = 1050 // ER_TABLE_EXISTS_ERROR
	erDupFieldName          = 1060 // ER_DUP_FIELDNAME: a column that exists
	erDupKeyName            = 1061 // ER_DUP_KEYNAME: a key that exists
	erMultiplePriKey        = 1068 // ER_MULTIPLE_PRI_KEY
	erCantDropFieldOrKey    = 1091 // ER_CANT_DROP_FIELD_OR_KEY: a DROP of what is gone

	ErDBAccessDenied     = 1044 // ER_DBACCESS_DENIED_ERROR: the account may not use the database
	ErAccessDenied       = 1045 // ER_ACCESS_DENIED_ERROR: wrong password, or no such account for this host
	ErTableAccessDenied  = 1142 // ER_TABLEACCESS_DENIED_ERROR: a privilege on a table is missing
	ErColumnAccessDenied = 1143 // ER_COLUMNACCESS_DENIED_ERROR
)

// NeedsProcess reports a statement refused for lack of a server-wide
// privilege, PROCESS for information_schema's InnoDB tables.
func NeedsProcess(err error) bool { return number(err) == erSpecificAccessDenied }

// NoSuchTable reports a statement on a table the schema does not have yet
// (a ledger migrated by an older version).
func NoSuchTable(err error) bool { return number(err) == erNoSuchTable }

// SchemaExists reports a migration statement refused because its result
// exists: a table, a column, a key, a primary key, a singleton row
// (ER_DUP_ENTRY), or a DROP of what is gone; the replay of a migration cut
// in the middle takes such a statement as done (package migrations).
func SchemaExists(err error) bool {
	switch number(err) {
	case erTableExists, erDupFieldName, erDupKeyName, erMultiplePriKey, erCantDropFieldOrKey:
		return true
	}
	c, ok := classify(err)
	return ok && c.kind == KindDuplicateKey
}

// DeniedNumber returns the number of an access refusal anywhere in err's
// chain (ErDBAccessDenied, ErAccessDenied, ErTableAccessDenied or
// ErColumnAccessDenied), 0 when err is not one.
func DeniedNumber(err error) uint16 {
	switch n := number(err); n {
	case ErDBAccessDenied, ErAccessDenied, ErTableAccessDenied, ErColumnAccessDenied:
		return n
	}
	return 0
}

// Denied reports a missing privilege on a database, table or column (a
// refused login, ErAccessDenied, is not one).
func Denied(err error) bool {
	switch DeniedNumber(err) {
	case ErDBAccessDenied, ErTableAccessDenied, ErColumnAccessDenied:
		return true
	}
	return false
}

// DeniedCreate reports the one refusal that means "no schema yet, and this
// account may not create it": a CREATE refused on a table (goose found no
// version table and may not make one). Any other refusal is access denied,
// whatever the schema holds.
func DeniedCreate(err error) bool {
	var me *mysql.MySQLError
	return DeniedNumber(err) == ErTableAccessDenied && errors.As(err, &me) && strings.HasPrefix(me.Message, "CREATE command denied")
}
