package mysqldriver

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/testenv"
)

// txQuerier runs sealWindows' statements in a local transaction.
type txQuerier struct{ tx *sqlx.Tx }

func (q txQuerier) Select(ctx context.Context, dest any, query string, args ...any) error {
	return q.tx.SelectContext(ctx, dest, query, args...)
}
func (q txQuerier) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return q.tx.ExecContext(ctx, query, args...)
}
func (q txQuerier) MaxStatementBytes() int { return stmt.Budget(16 << 20) }

// BenchmarkSealWindow measures sealing the rows of one window (1,000 or
// 10,000 accounts) in a billing_windows table that holds that window alone,
// or 100 windows of the same accounts: the cost follows the rows sealed,
// not the table (the read is a range of the index on window_start). Each
// iteration's transaction is rolled back. Run with MYSQL_DSN set:
//
//	go test -run '^$' -bench BenchmarkSealWindow -benchtime 20x ./internal/txsink/mysqldriver/
func BenchmarkSealWindow(b *testing.B) {
	for _, accounts := range []int{1000, 10000} {
		for _, windows := range []int{1, 100} {
			b.Run(fmt.Sprintf("accounts=%d/windows=%d", accounts, windows), func(b *testing.B) {
				_, db := testenv.LedgerDB(b)
				ctx := context.Background()
				base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
				for w := range windows {
					for lo := 0; lo < accounts; lo += 1000 {
						var q strings.Builder
						q.WriteString(`INSERT INTO billing_windows (account_id, currency, window_start, amount_minor, event_count, updated_at) VALUES `)
						var args []any
						for a := lo; a < min(lo+1000, accounts); a++ {
							if a > lo {
								q.WriteByte(',')
							}
							q.WriteString("(?,'EUR',?,1,1,?)")
							args = append(args, fmt.Sprintf("acct-%06d", a), base.Add(time.Duration(w)*time.Hour), base)
						}
						if _, err := db.ExecContext(ctx, q.String(), args...); err != nil {
							b.Fatal(err)
						}
					}
				}
				// Seal the middle window (the first of one).
				target := base.Add(time.Duration(windows/2) * time.Hour)
				b.ResetTimer()
				for range b.N {
					tx, err := db.BeginTxx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					n, done, err := sealWindows(ctx, txQuerier{tx}, target, target.Add(time.Hour), 2*accounts, base, false)
					b.StopTimer()
					_ = tx.Rollback()
					if err != nil || len(n) != accounts || !done {
						b.Fatalf("sealed %d (done %v): %v", len(n), done, err)
					}
					b.StartTimer()
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*accounts), "µs/row")
			})
		}
	}
}
