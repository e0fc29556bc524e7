// Package stmt bounds the SQL statements the service builds, in rows and in
// bytes.
//
// A MySQL server refuses any packet larger than its max_allowed_packet
// (error 1153), and go-sql-driver/mysql refuses one larger than its own
// limit before sending it. A multi-row statement whose rows carry input
// (dead-letter payloads, event ids, account ids) can reach either limit
// with perfectly legal input: a statement that fails for its size fails
// again on every replay and stalls the partition. So every multi-row
// statement is cut by [Split] into statements whose worst-case size stays
// under a budget derived from the server's limit ([Budget]).
//
// Sizes are worst cases of the statement's text as the driver sends it
// with client-side interpolation: every string or byte argument may double
// when escaped, plus its quotes and introducer. Server-side prepared
// statements send arguments unescaped, so the same bound holds for them.
package stmt

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// MaxRows is the most rows one statement holds, however small: large
// enough to amortise a round trip, small enough for short lock lists.
const MaxRows = 1000

// MinPacket is the smallest max_allowed_packet the service works with: it
// leaves a budget for a dead letter with a useful payload prefix and for
// full batches of small rows.
const MinPacket = 128 << 10

// Budget is the share of a server's max_allowed_packet (the smaller of the
// server's and the client's) that one statement may use: half, leaving room
// for the protocol's own framing and for an estimate that is off.
func Budget(maxAllowedPacket int) int { return maxAllowedPacket / 2 }

// Overhead of one argument beyond its payload: quotes, an introducer such
// as _binary, a separating comma.
const argOverhead = 12

// ArgBytes is the most bytes v can take in a statement's text.
func ArgBytes(v any) int {
	switch x := v.(type) {
	case nil:
		return argOverhead
	case string:
		return TextBytes(len(x))
	case []byte:
		return TextBytes(len(x))
	case time.Time:
		return len("'9999-12-31 23:59:59.999999'") + argOverhead
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, bool:
		return 20 + argOverhead
	default:
		return len(fmt.Sprint(x))*2 + argOverhead
	}
}

// TextBytes is the most bytes a string or byte value of n bytes can take in
// a statement's text: every byte escaped, and its quotes and introducer.
func TextBytes(n int) int { return 2*n + argOverhead }

// FitText is the inverse of TextBytes: the longest string or byte value
// whose text takes at most room bytes (0 when not even an empty one fits).
// A value cut to FitText(room) never makes a row larger than the room it
// was cut for: callers that cut a value to fit a statement (a dead letter's
// payload prefix) size the value and the row with this one pair.
func FitText(room int) int { return max(0, (room-argOverhead)/2) }

// Fixed is the text of a statement of head and tail besides its rows: what
// Insert gives Split as fixed.
func Fixed(head, tail string) int { return len(head) + len(tail) }

// Room is what one row may take of budget when it is alone in a statement
// of head and tail: a row within Room never makes Split fail.
func Room(budget int, head, tail string) int { return budget - Fixed(head, tail) }

// RowBytes is the most bytes a row of args and its tuple text ("(?,?,?)")
// can take.
func RowBytes(tuple string, args ...any) int {
	n := len(tuple) + 1
	for _, a := range args {
		n += ArgBytes(a)
	}
	return n
}

// TooLargeError reports a single row that does not fit the budget even
// alone. Every row the service builds is bounded below the budget by
// construction (values are cut with FitText and the bounds of their
// columns), so this error is a bug; the checkpointer isolates the record
// responsible rather than replaying the checkpoint forever.
type TooLargeError struct {
	Row, Bytes, Budget int
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("stmt: row %d needs up to %d bytes, over the statement budget of %d", e.Row, e.Bytes, e.Budget)
}

// Split cuts rows 0..n-1 into consecutive ranges [start, end) of at most
// MaxRows rows whose worst-case size, fixed (the statement's text without
// rows) plus rowBytes of each row, stays within budget, and calls fn for
// each range in order. It stops at fn's first error. A row that does not
// fit alone is a *TooLargeError.
func Split(n, fixed, budget int, rowBytes func(i int) int, fn func(start, end int) error) error {
	start, size := 0, fixed
	for i := 0; i < n; i++ {
		rb := rowBytes(i)
		if fixed+rb > budget {
			return &TooLargeError{Row: i, Bytes: fixed + rb, Budget: budget}
		}
		if i > start && (i-start == MaxRows || size+rb > budget) {
			if err := fn(start, i); err != nil {
				return err
			}
			start, size = i, fixed
		}
		size += rb
	}
	if start < n {
		return fn(start, n)
	}
	return nil
}

// Execer runs statements on one server (a checkpoint's branch, a pool)
// within that server's budget.
type Execer interface {
	Exec(ctx context.Context, query string, args ...any) (sql.Result, error)
	MaxStatementBytes() int
}

// preparer runs a statement through a server-side prepared statement kept
// with the connection (mysqldriver.Conn.ExecPrepared).
type preparer interface {
	ExecPrepared(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Insert runs multi-row statements of n rows, head + tuple per row + tail,
// as few as ex's budget allows: rowBytes(i) bounds row i's text, args(i)
// gives its arguments. Full statements (MaxRows rows), whose text is the
// same every time, run prepared where ex can.
func Insert(ctx context.Context, ex Execer, n int, head, tuple, tail string, rowBytes func(i int) int, args func(i int) []any) error {
	var b strings.Builder
	return Split(n, Fixed(head, tail), ex.MaxStatementBytes(), rowBytes, func(start, end int) error {
		b.Reset()
		b.WriteString(head)
		var all []any
		for i := start; i < end; i++ {
			if i > start {
				b.WriteByte(',')
			}
			b.WriteString(tuple)
			all = append(all, args(i)...)
		}
		b.WriteString(tail)
		exec := ex.Exec
		if p, ok := ex.(preparer); ok && end-start == MaxRows {
			exec = p.ExecPrepared
		}
		_, err := exec(ctx, b.String(), all...)
		return err
	})
}
