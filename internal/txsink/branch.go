package txsink

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

type branchState int

const (
	branchActive   branchState = iota // XA START done, statements may run
	branchPrepared                    // XA END + XA PREPARE done: durable, in doubt until decided
	branchDone                        // committed or rolled back
)

// Branch is one participant's part of a checkpoint: an XA transaction on a
// connection pinned to it for its whole life. go-sql-driver/mysql has no XA
// API, so XA statements are sent as plain text on that one connection, and
// BeginTx is never called on it.
//
// A Branch is used by one goroutine at a time. Any error inside it dooms the
// whole checkpoint (retrying one statement inside an open branch could drop
// or duplicate rows): the caller aborts and replays.
type Branch struct {
	Participant int
	xid         Xid
	server      *server
	sink        *Sink
	pc          *pinned
	conn        *sqlx.Conn // pc.conn while the branch holds it
	state       branchState
	wrote       bool
}

// pinned is a participant's connection, kept across checkpoints with its
// server-side id (needed in the bqual).
type pinned struct {
	conn *sqlx.Conn
	id   uint64
}

// Exec runs a statement that changes data inside the branch.
func (b *Branch) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	b.wrote = true
	r, err := b.conn.ExecContext(ctx, query, args...)
	if err != nil {
		return nil, &StatementError{Participant: b.Participant, Err: err}
	}
	return r, nil
}

// Select runs a query inside the branch and scans every row into dest.
func (b *Branch) Select(ctx context.Context, dest any, query string, args ...any) error {
	if err := b.conn.SelectContext(ctx, dest, query, args...); err != nil {
		return &StatementError{Participant: b.Participant, Err: err}
	}
	return nil
}

// Query runs a query inside the branch; the caller closes the rows.
func (b *Branch) Query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	rows, err := b.conn.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, &StatementError{Participant: b.Participant, Err: err}
	}
	return rows, nil
}

func (b *Branch) xa(ctx context.Context, verb string) error {
	_, err := b.conn.ExecContext(ctx, "XA "+verb+" "+b.xid.sql())
	return err
}

// prepare ends and prepares the branch. It runs under its own deadline,
// detached from the caller's cancellation: a connection closed by a
// cancelled context half-way through PREPARE would leave the outcome
// unknown for no reason.
func (b *Branch) prepare(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	if err := b.xa(ctx, "END"); err != nil {
		return err
	}
	if err := b.xa(ctx, "PREPARE"); err != nil {
		return err
	}
	b.state = branchPrepared
	return nil
}

// release returns the pinned connection to the pool when the branch ended
// cleanly, and discards it otherwise, so that the pool never hands out a
// connection in an XA state.
func (b *Branch) release(clean bool) {
	if b.conn == nil {
		return
	}
	b.sink.putBack(b.Participant, b.pc, clean)
	b.conn, b.pc = nil, nil
}

// discard marks a connection bad so that Close drops it instead of pooling
// it. The server then rolls back an unprepared branch on it; a prepared one
// stays prepared (and is resolved by the decision).
func discard(c *sqlx.Conn) {
	_ = c.Raw(func(any) error { return driver.ErrBadConn })
}

// StatementError is a failed statement inside a branch. Use errors.As to find
// the participant and errors.Is / *mysql.MySQLError for the cause.
type StatementError struct {
	Participant int
	Err         error
}

func (e *StatementError) Error() string {
	return fmt.Sprintf("participant %d: %v", e.Participant, e.Err)
}

func (e *StatementError) Unwrap() error { return e.Err }

var errBranchState = errors.New("txsink: branch in wrong state")
