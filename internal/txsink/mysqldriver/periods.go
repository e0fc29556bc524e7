package mysqldriver

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The SQL of ledger_periods (migration 00005) on the control server: the
// ledger's period settings, one row per definition (package periods
// decides what they mean and when one is appended).

const periodColumns = `seq, effective_from, billing_window, billing_timezone, windows_close, recorded_at, recorded_by`

type periodRow struct {
	Seq        int          `db:"seq"`
	From       sql.NullTime `db:"effective_from"`
	Window     string       `db:"billing_window"`
	Zone       string       `db:"billing_timezone"`
	Close      bool         `db:"windows_close"`
	RecordedAt time.Time    `db:"recorded_at"`
	RecordedBy string       `db:"recorded_by"`
}

// ReadPeriods reads every definition, in order; with forUpdate, under an
// exclusive lock of the rows read (in q's transaction). A schema without
// the table (before migration 00005) has none.
func ReadPeriods(ctx context.Context, q sqlx.QueryerContext, forUpdate bool) ([]driver.PeriodRow, error) {
	query := `SELECT ` + periodColumns + ` FROM ledger_periods ORDER BY seq`
	if forUpdate {
		query += ` FOR UPDATE`
	}
	var rows []periodRow
	err := sqlx.SelectContext(ctx, q, &rows, query)
	if NoSuchTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read ledger_periods: %w", err)
	}
	var out []driver.PeriodRow
	for _, r := range rows {
		p := driver.PeriodRow{Seq: r.Seq, Window: r.Window, Timezone: r.Zone, Close: r.Close, RecordedAt: r.RecordedAt.UTC(), RecordedBy: r.RecordedBy}
		if r.From.Valid {
			p.From = r.From.Time.UTC()
		}
		out = append(out, p)
	}
	return out, nil
}

// InsertPeriod appends r; with ignore, nothing happens when its seq
// exists (of instances storing the first definition together, one wins).
// It reports whether the row was inserted.
func InsertPeriod(ctx context.Context, ex sqlx.ExecerContext, r driver.PeriodRow, ignore bool) (bool, error) {
	verb := "INSERT"
	if ignore {
		verb = "INSERT IGNORE"
	}
	var from any
	if !r.From.IsZero() {
		from = r.From.UTC()
	}
	res, err := ex.ExecContext(ctx, verb+` INTO ledger_periods (`+periodColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		r.Seq, from, r.Window, r.Timezone, r.Close, r.RecordedAt.UTC(), r.RecordedBy)
	if err != nil {
		return false, fmt.Errorf("store ledger_periods: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// WindowStarts returns up to n of the earliest and up to n of the latest
// distinct window starts of billing_windows on the server, the earliest
// ascending, then the latest descending (a start can be in both), each
// one lookup on the index on window_start: what the period settings check
// on a ledger that has rows and no settings stored (package periods).
func (s *Server) WindowStarts(ctx context.Context, n int) ([]time.Time, error) {
	var out []time.Time
	for _, end := range []struct {
		query string
		bound time.Time
	}{
		{`SELECT MIN(window_start) FROM billing_windows WHERE window_start > ?`, time.Date(999, 12, 31, 0, 0, 0, 0, time.UTC)},
		{`SELECT MAX(window_start) FROM billing_windows WHERE window_start < ?`, time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)},
	} {
		q, bound := end.query, end.bound
		for range n {
			var start sql.NullTime
			if err := s.db.GetContext(ctx, &start, q, bound); err != nil {
				return nil, fmt.Errorf("read billing_windows: %w", err)
			}
			if !start.Valid {
				break
			}
			out = append(out, start.Time.UTC())
			bound = start.Time
		}
	}
	return out, nil
}

// LatestWindowStart is the latest window start of billing_windows on the
// server (zero: no row).
func (s *Server) LatestWindowStart(ctx context.Context) (time.Time, error) {
	var start sql.NullTime
	if err := s.db.GetContext(ctx, &start, `SELECT MAX(window_start) FROM billing_windows`); err != nil {
		return time.Time{}, fmt.Errorf("read billing_windows: %w", err)
	}
	return start.Time.UTC(), nil
}
