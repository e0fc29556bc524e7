package mysqldriver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/billing/ledger/internal/txsink/driver"
)

// Kinds label billing_mysql_errors_total; codes drive the protocol's and the
// pipeline's reactions: both come from the one table of numbers.
func TestErrorKind(t *testing.T) {
	my := func(n uint16) error { return &mysql.MySQLError{Number: n, Message: "x"} }
	tests := []struct {
		name string
		err  error
		kind string
		ok   bool
	}{
		{"nil", nil, "", false},
		{"lock wait", my(1205), KindLockWaitTimeout, true},
		{"deadlock wrapped", fmt.Errorf("write: %w", my(1213)), KindDeadlock, true},
		{"duplicate", my(1062), KindDuplicateKey, true},
		{"out of range", my(1690), KindOutOfRange, true},
		{"xa nota", my(1397), KindXA, true},
		{"xa rmfail in a join", errors.Join(errors.New("a"), my(1399)), KindXA, true},
		{"xa dupid", my(1440), KindXA, true},
		{"server gone", my(2006), KindConnection, true},
		{"access denied", my(1142), KindOther, true},
		{"bad conn", fmt.Errorf("x: %w", mysql.ErrInvalidConn), KindConnection, true},
		{"packet too large", my(1153), KindTooLarge, true},
		{"constraint", my(4025), KindData, true},
		{"net error", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, KindConnection, true},
		{"deadline is not MySQL", fmt.Errorf("checkpoint timeout: %w", contextDeadline()), "", false},
		{"fenced is not MySQL", errors.New("partition fenced"), "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kind, ok := ErrorKind(tt.err)
			if kind != tt.kind || ok != tt.ok {
				t.Fatalf("ErrorKind = %q, %v; want %q, %v", kind, ok, tt.kind, tt.ok)
			}
		})
	}
}

func TestCode(t *testing.T) {
	my := func(n uint16) error { return &mysql.MySQLError{Number: n, Message: "x"} }
	for _, tt := range []struct {
		err  error
		want driver.Code
	}{
		{my(1397), driver.UnknownXid}, {my(1440), driver.DuplicateXid}, {my(1205), driver.Transient},
		{fmt.Errorf("w: %w", my(1213)), driver.Transient}, {mysql.ErrInvalidConn, driver.Transient},
		{my(1153), driver.TooLarge}, {mysql.ErrPktTooLarge, driver.TooLarge}, {my(1690), driver.Overflow},
		{my(1062), driver.Duplicate}, {my(1366), driver.Data}, {my(4025), driver.Data}, {my(3819), driver.Data},
		{my(1146), driver.Unknown}, {contextDeadline(), driver.Unknown}, {nil, driver.Unknown},
	} {
		if got := Code(tt.err); got != tt.want {
			t.Errorf("Code(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func contextDeadline() error {
	ctx, cancel := contextWithDeadlinePassed()
	defer cancel()
	<-ctx.Done()
	return ctx.Err()
}

func contextWithDeadlinePassed() (context.Context, context.CancelFunc) {
	return context.WithDeadline(context.Background(), time.Unix(0, 0))
}
