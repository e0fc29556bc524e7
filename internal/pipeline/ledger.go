package pipeline

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/stmt"
)

// The result tables' SQL. Every statement is portable between MySQL 8.4 and
// MariaDB 10.11: upserts use VALUES() in ON DUPLICATE KEY UPDATE (MySQL 8.4
// warns 1287 and accepts it; its row alias does not exist on MariaDB).

// execer runs statements inside a branch (txsink.Branch), each within its
// server's statement budget (package stmt).
type execer = stmt.Execer

// upsertSQL returns the ON DUPLICATE KEY UPDATE clause that adds a delta to
// the given columns or, for absolute values read under a row lock, sets
// them.
func upsertSQL(absolute bool, cols ...string) string {
	var b strings.Builder
	b.WriteString(" ON DUPLICATE KEY UPDATE ")
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		if absolute {
			fmt.Fprintf(&b, "%s = VALUES(%s)", c, c)
		} else {
			fmt.Fprintf(&b, "%s = %s + VALUES(%s)", c, c, c)
		}
	}
	b.WriteString(", updated_at = VALUES(updated_at)")
	return b.String()
}

// Worst-case bytes of a result row besides its account id: the currency,
// two BIGINTs, one or two DATETIMEs and the tuple's text.
const resultRowBytes = 6*32 + 16

// writeBalances writes delta rows with an adding upsert and absolute rows
// (seeded under a row lock) with a setting one.
func writeBalances(ctx context.Context, ex execer, rows []balanceRow, now time.Time) error {
	for _, abs := range []bool{false, true} {
		var part []balanceRow
		for _, r := range rows {
			if r.absolute == abs {
				part = append(part, r)
			}
		}
		err := stmt.Insert(ctx, ex, len(part),
			`INSERT INTO account_balances (account_id, currency, balance_minor, event_count, updated_at) VALUES `,
			"(?,?,?,?,?)", upsertSQL(abs, "balance_minor", "event_count"),
			func(i int) int { return stmt.ArgBytes(part[i].account) + resultRowBytes },
			func(i int) []any {
				r := part[i]
				return []any{r.account, r.currency, r.amount, r.count, now}
			})
		if err != nil {
			return err
		}
	}
	return nil
}

// writeWindows is writeBalances for billing_windows.
func writeWindows(ctx context.Context, ex execer, rows []windowRow, now time.Time) error {
	for _, abs := range []bool{false, true} {
		var part []windowRow
		for _, r := range rows {
			if r.absolute == abs {
				part = append(part, r)
			}
		}
		err := stmt.Insert(ctx, ex, len(part),
			`INSERT INTO billing_windows (account_id, currency, window_start, amount_minor, event_count, updated_at) VALUES `,
			"(?,?,?,?,?,?)", upsertSQL(abs, "amount_minor", "event_count"),
			func(i int) int { return stmt.ArgBytes(part[i].account) + resultRowBytes },
			func(i int) []any {
				r := part[i]
				return []any{r.account, r.currency, time.Unix(r.start, 0).UTC(), r.amount, r.count, now}
			})
		if err != nil {
			return err
		}
	}
	return nil
}

// readBalances locks and reads the stored balances of keys (seeding).
//
// Every locking statement here names the primary key: when the list covers
// much of a small table the optimizer prefers a full scan, and a locking
// scan waits on every row another branch of the same checkpoint has locked,
// a wait InnoDB cannot see as a deadlock (the branches are separate
// transactions): the checkpoint then hangs until the lock wait times out.
func readBalances(ctx context.Context, q dedup.Querier, keys []balanceKey) (map[balanceKey]total, error) {
	out := make(map[balanceKey]total, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	err := stmt.Split(len(keys), 256, q.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(keys[i].account) + 32 }, func(start, end int) error {
		part := keys[start:end]
		args := make([]any, 0, 2*len(part))
		for _, k := range part {
			args = append(args, k.account, k.currency)
		}
		var rows []struct {
			Account  []byte `db:"account_id"`
			Currency string `db:"currency"`
			Amount   int64  `db:"balance_minor"`
			Count    int64  `db:"event_count"`
		}
		q2 := `SELECT account_id, currency, balance_minor, event_count FROM account_balances FORCE INDEX (PRIMARY) WHERE (account_id, currency) IN (` +
			strings.Repeat("(?,?),", len(part)-1) + `(?,?)) FOR UPDATE`
		if err := q.Select(ctx, &rows, q2, args...); err != nil {
			return err
		}
		for _, r := range rows {
			out[balanceKey{string(r.Account), r.Currency}] = total{amount: r.Amount, count: r.Count, exists: true}
		}
		return nil
	})
	return out, err
}

// readWindows locks and reads the stored window sums of keys (seeding).
func readWindows(ctx context.Context, q dedup.Querier, keys []windowKey) (map[windowKey]total, error) {
	out := make(map[windowKey]total, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	err := stmt.Split(len(keys), 256, q.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(keys[i].account) + 80 }, func(start, end int) error {
		part := keys[start:end]
		args := make([]any, 0, 3*len(part))
		for _, k := range part {
			args = append(args, k.account, k.currency, time.Unix(k.start, 0).UTC())
		}
		var rows []struct {
			Account  []byte    `db:"account_id"`
			Currency string    `db:"currency"`
			Start    time.Time `db:"window_start"`
			Amount   int64     `db:"amount_minor"`
			Count    int64     `db:"event_count"`
		}
		q2 := `SELECT account_id, currency, window_start, amount_minor, event_count FROM billing_windows FORCE INDEX (PRIMARY) WHERE (account_id, currency, window_start) IN (` +
			strings.Repeat("(?,?,?),", len(part)-1) + `(?,?,?)) FOR UPDATE`
		if err := q.Select(ctx, &rows, q2, args...); err != nil {
			return err
		}
		for _, r := range rows {
			out[windowKey{string(r.Account), r.Currency, r.Start.Unix()}] = total{amount: r.Amount, count: r.Count, exists: true}
		}
		return nil
	})
	return out, err
}
