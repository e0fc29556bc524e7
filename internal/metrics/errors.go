package metrics

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/go-sql-driver/mysql"
)

// MySQL error kinds, the label values of billing_mysql_errors_total.
const (
	KindLockWaitTimeout = "lock_wait_timeout"
	KindDeadlock        = "deadlock"
	KindDuplicateKey    = "duplicate_key"
	KindOutOfRange      = "out_of_range"
	KindXA              = "xa"
	KindConnection      = "connection"
	KindOther           = "other"
)

// ErrorKinds lists every kind, in a stable order.
func ErrorKinds() []string {
	return []string{KindLockWaitTimeout, KindDeadlock, KindDuplicateKey, KindOutOfRange, KindXA, KindConnection, KindOther}
}

// mysqlKinds maps server error numbers (MySQL and MariaDB share these) to
// kinds; numbers not listed are "other".
var mysqlKinds = map[uint16]string{
	1205: KindLockWaitTimeout, // ER_LOCK_WAIT_TIMEOUT
	1213: KindDeadlock,        // ER_LOCK_DEADLOCK
	1022: KindDuplicateKey,    // ER_DUP_KEY
	1062: KindDuplicateKey,    // ER_DUP_ENTRY
	1586: KindDuplicateKey,    // ER_DUP_ENTRY_WITH_KEY_NAME
	1264: KindOutOfRange,      // ER_WARN_DATA_OUT_OF_RANGE
	1690: KindOutOfRange,      // ER_DATA_OUT_OF_RANGE
	1397: KindXA,              // XAER_NOTA
	1398: KindXA,              // XAER_INVAL
	1399: KindXA,              // XAER_RMFAIL
	1400: KindXA,              // XAER_OUTSIDE
	1401: KindXA,              // XAER_RMERR
	1402: KindXA,              // XA_RBROLLBACK
	1440: KindXA,              // XAER_DUPID
	1613: KindXA,              // XA_RBTIMEOUT
	1614: KindXA,              // XA_RBDEADLOCK
	1040: KindConnection,      // ER_CON_COUNT_ERROR (too many connections)
	1053: KindConnection,      // ER_SERVER_SHUTDOWN
	1152: KindConnection,      // ER_ABORTING_CONNECTION
	1158: KindConnection,      // ER_NET_READ_ERROR
	1159: KindConnection,      // ER_NET_READ_INTERRUPTED
	1160: KindConnection,      // ER_NET_ERROR_ON_WRITE
	1161: KindConnection,      // ER_NET_WRITE_INTERRUPTED
	1927: KindConnection,      // ER_CONNECTION_KILLED (MariaDB)
	2002: KindConnection,      // CR_CONNECTION_ERROR
	2003: KindConnection,      // CR_CONN_HOST_ERROR
	2006: KindConnection,      // CR_SERVER_GONE_ERROR
	2013: KindConnection,      // CR_SERVER_LOST
	4031: KindConnection,      // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8)
}

// ErrorKind classifies err for billing_mysql_errors_total. A server error
// (*mysql.MySQLError anywhere in the chain) is classified by its number; a
// broken connection (driver.ErrBadConn, mysql.ErrInvalidConn, a network
// error, an unexpected EOF) is "connection". Anything else, including a
// context deadline, is not a MySQL error: ok is false.
func ErrorKind(err error) (kind string, ok bool) {
	if err == nil {
		return "", false
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		if k, ok := mysqlKinds[me.Number]; ok {
			return k, true
		}
		return KindOther, true
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return KindConnection, true
	}
	// context.DeadlineExceeded satisfies net.Error: rule it out first.
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return "", false
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return KindConnection, true
	}
	return "", false
}
