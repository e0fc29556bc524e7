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
// the claim, the lookup, the journal, the unclaim and the replacement, as
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
		{"claim", func(x *stmttest.Execer) error { _, err := claimKeys(ctx, x, slices.Clone(long)); return err }},
		{"lookup", func(x *stmttest.Execer) error { _, err := lookupKeys(ctx, stmtQuerier{x}, ids); return err }},
		{"journal", func(x *stmttest.Execer) error { return journalKeys(ctx, x, now, ids) }},
		{"unclaim", func(x *stmttest.Execer) error { return unclaimKeys(ctx, x, slices.Clone(ids)) }},
		{"replace", func(x *stmttest.Execer) error { return replaceKeys(ctx, x, slices.Clone(long), now) }},
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
				switch v := a.(type) {
				case string:
					seen[v] = true
				case []byte:
					for _, id := range mustDecode(t, c.name, v) {
						seen[string(id)] = true
					}
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

// mustDecode decodes a journal blob; other byte arguments (fingerprints)
// decode to nothing.
func mustDecode(t *testing.T, name string, b []byte) [][]byte {
	if name != "journal" {
		return nil
	}
	ids, err := DecodeJournal(b)
	if err != nil {
		t.Fatalf("journal blob: %v", err)
	}
	return ids
}
