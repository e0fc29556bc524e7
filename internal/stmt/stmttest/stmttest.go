// Package stmttest renders statements the way go-sql-driver/mysql sends
// them with client-side interpolation (the service's sessions interpolate;
// see mysqldriver.OpenDB), so that tests can hold the bounds of package
// stmt to the bytes a server receives. It is the one copy of the driver's
// escaping rules in the tests.
//
// Escaping follows the server's default mode: NUL, newline, carriage
// return, backslash, both quotes and Ctrl-Z get a backslash. Under
// NO_BACKSLASH_ESCAPES the driver doubles single quotes only, which is
// never longer.
package stmttest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"time"
)

// escaped is the length of b with the driver's backslash escapes.
func escaped[T string | []byte](b T) int {
	n := len(b)
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case 0, '\n', '\r', '\\', '\'', '"', 0x1a:
			n++
		}
	}
	return n
}

// Arg is the length of v as the driver interpolates it: quoted, escaped,
// _binary before byte strings, NULL for nil, numbers in decimal.
func Arg(v any) int {
	switch x := v.(type) {
	case nil:
		return len("NULL")
	case string:
		return len("''") + escaped(x)
	case []byte:
		if x == nil {
			return len("NULL")
		}
		return len("_binary''") + escaped(x)
	case time.Time:
		if x.IsZero() {
			return len("'0000-00-00'")
		}
		return len("''") + len(x.UTC().Format("2006-01-02 15:04:05.999999"))
	case bool:
		return 1
	default:
		return len(fmt.Sprint(x))
	}
}

// Statement is the length of query as sent: every ? replaced by its
// argument (the service's statements have no ? inside literals or
// comments).
func Statement(query string, args []any) int {
	n := len(query) - strings.Count(query, "?")
	for _, a := range args {
		n += Arg(a)
	}
	return n
}

// Execer is a stmt.Execer that runs nothing: it refuses any statement
// whose text as sent exceeds Budget (as the server would refuse a packet
// over its max_allowed_packet) and records every statement it accepts.
type Execer struct {
	Budget int

	mu         sync.Mutex
	statements []Executed
}

// Executed is one statement an Execer accepted.
type Executed struct {
	Query string
	Args  []any
	Bytes int // as sent
}

// OverBudgetError is a statement larger than the Execer's budget.
type OverBudgetError struct{ Bytes, Budget int }

func (e *OverBudgetError) Error() string {
	return fmt.Sprintf("statement of %d bytes as sent exceeds the budget of %d", e.Bytes, e.Budget)
}

// Exec checks the statement's size and records it.
func (x *Execer) Exec(_ context.Context, query string, args ...any) (sql.Result, error) {
	n := Statement(query, args)
	if n > x.Budget {
		return nil, &OverBudgetError{Bytes: n, Budget: x.Budget}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	// The caller may reuse args for its next statement: keep a copy.
	x.statements = append(x.statements, Executed{Query: query, Args: append([]any(nil), args...), Bytes: n})
	return result(0), nil
}

// MaxStatementBytes is the budget.
func (x *Execer) MaxStatementBytes() int { return x.Budget }

// Statements are the statements accepted so far, in order.
func (x *Execer) Statements() []Executed {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]Executed(nil), x.statements...)
}

type result int64

func (r result) LastInsertId() (int64, error) { return 0, nil }
func (r result) RowsAffected() (int64, error) { return int64(r), nil }
