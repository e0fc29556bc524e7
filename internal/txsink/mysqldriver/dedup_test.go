package mysqldriver

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/stmt/stmttest"
	"github.com/billing/ledger/internal/txsink/driver"
)

// stmtQuerier is a stmttest.Execer that also answers queries with no rows,
// refusing any over its budget as the Execer does.
type stmtQuerier struct{ *stmttest.Execer }

func (q stmtQuerier) Select(ctx context.Context, dest any, query string, args ...any) error {
	_, err := q.Exec(ctx, query, args...)
	return err
}

// Property (statements bounded in bytes): with ids of the longest legal
// size and a statement budget far below any server's, every statement of
// the claim, the lookup, the locking read, the unclaim and the replacement, as
// the driver sends it, stays within the budget (the Execer refuses any
// that does not), and each key appears in them.
func TestDedupStatementsStayWithinBudget(t *testing.T) {
	const budget = 24 << 10
	ctx := context.Background()
	now := time.Now().UTC()
	long := make([]driver.DedupKey, 3000)
	ids := make([]string, len(long))
	for i := range long {
		long[i] = driver.DedupKey{ID: fmt.Sprintf("%0128d", i), ExpiresAt: now}
		ids[i] = long[i].ID
	}
	for _, c := range []struct {
		name string
		run  func(x *stmttest.Execer) error
	}{
		{"claim", func(x *stmttest.Execer) error { _, err := claimKeys(ctx, x, 2, slices.Clone(long)); return err }},
		{"lookup", func(x *stmttest.Execer) error { _, err := lookupKeys(ctx, stmtQuerier{x}, 1, ids); return err }},
		{"locking read", func(x *stmttest.Execer) error { _, err := lockKeys(ctx, stmtQuerier{x}, 1, ids); return err }},
		{"unclaim", func(x *stmttest.Execer) error { return unclaimKeys(ctx, x, 2, slices.Clone(ids)) }},
		{"replace", func(x *stmttest.Execer) error { return replaceKeys(ctx, x, 2, slices.Clone(long), now) }},
	} {
		x := &stmttest.Execer{Budget: budget}
		if err := c.run(x); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if n := len(x.Statements()); n < 2 {
			t.Errorf("%s: %d statement(s) for 3000 ids of 128 bytes: the budget did not cut them", c.name, n)
		}
		seen := map[string]bool{}
		for _, s := range x.Statements() {
			for _, a := range s.Args {
				if v, ok := a.(string); ok {
					seen[v] = true
				}
			}
		}
		for _, id := range ids {
			if !seen[id] {
				t.Fatalf("%s: id %s in no statement", c.name, id[len(id)-8:])
			}
		}
	}
}
