package txsink

import (
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"
)

// MySQL and MariaDB error numbers the protocol reacts to.
const (
	erDupEntry              = 1062 // ER_DUP_ENTRY
	erUnknownSystemVariable = 1193 // ER_UNKNOWN_SYSTEM_VARIABLE
	erLockWaitTimeout       = 1205 // ER_LOCK_WAIT_TIMEOUT
	erLockDeadlock          = 1213 // ER_LOCK_DEADLOCK
	erXAERNota              = 1397 // XAER_NOTA: unknown xid
	erXAERRmfail            = 1399 // XAER_RMFAIL: command not allowed in the branch's state
	erDataOutOfRange        = 1690 // ER_DATA_OUT_OF_RANGE: BIGINT overflow in an upsert
)

func mysqlCode(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// IsOverflow reports whether err is the server refusing a value out of the
// column's range (a BIGINT sum overflowing).
func IsOverflow(err error) bool { return mysqlCode(err) == erDataOutOfRange }

// IsDuplicateKey reports whether err is a unique-key violation.
func IsDuplicateKey(err error) bool { return mysqlCode(err) == erDupEntry }

// IsLockConflict reports whether err is a lock wait timeout or a deadlock:
// another transaction (often another instance's prepared branch) holds rows
// this one needs. The checkpoint aborts and replays.
func IsLockConflict(err error) bool {
	c := mysqlCode(err)
	return c == erLockWaitTimeout || c == erLockDeadlock
}

var (
	// ErrFenced means a partition of the checkpoint is no longer owned by
	// this instance at the epoch the checkpoint was built under: another
	// instance was assigned it since. Nothing of the checkpoint commits.
	ErrFenced = errors.New("txsink: partition fenced by a newer owner")

	// ErrAborted means the checkpoint's decision is abort: a recoverer
	// decided it first, or the coordinator gave up before deciding.
	ErrAborted = errors.New("txsink: checkpoint aborted")

	// ErrOutcomeUnknown means the decision could not be made durable nor
	// proven either way within the deadline (the control server is
	// unreachable). The caller must neither assume commit nor abort: it
	// rereads its positions from MySQL, which waits for the outcome.
	ErrOutcomeUnknown = errors.New("txsink: checkpoint outcome unknown")
)

// FencedError names the partition that failed the fence check. It wraps
// ErrFenced.
type FencedError struct {
	Partition   int32
	HeldEpoch   int64
	StoredEpoch int64
	StoredOwner string
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("partition %d fenced: held at epoch %d, stored epoch %d owned by %q", e.Partition, e.HeldEpoch, e.StoredEpoch, e.StoredOwner)
}

func (e *FencedError) Unwrap() error { return ErrFenced }

// PhaseError says in which phase of the protocol a checkpoint failed.
type PhaseError struct {
	Phase string // "start", "write", "prepare", "decide", "commit", "abort"
	Err   error
}

func (e *PhaseError) Error() string { return e.Phase + ": " + e.Err.Error() }
func (e *PhaseError) Unwrap() error { return e.Err }
