package mysqldriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The SQL of ledger_server (on every server) and ledger_layout (on the
// control server), migration 00010: each server's own identity and the
// ledger's layout (package shards decides what they mean and when they are
// written).

type layoutRow struct {
	Version    int       `db:"version"`
	Ordinal    int       `db:"ordinal"`
	ServerUUID string    `db:"server_uuid"`
	RecordedAt time.Time `db:"recorded_at"`
	RecordedBy string    `db:"recorded_by"`
}

// ReadLayout reads the rows of the highest layout version, by ordinal. A
// schema without the table (before migration 00010) has none.
func ReadLayout(ctx context.Context, q sqlx.QueryerContext) ([]driver.LayoutRow, error) {
	return readLayout(ctx, q, `(SELECT MAX(version) FROM ledger_layout)`)
}

// ReadLayoutVersion reads the rows of one layout version, by ordinal
// (none: no such version).
func ReadLayoutVersion(ctx context.Context, q sqlx.QueryerContext, version int) ([]driver.LayoutRow, error) {
	return readLayout(ctx, q, `?`, version)
}

func readLayout(ctx context.Context, q sqlx.QueryerContext, version string, args ...any) ([]driver.LayoutRow, error) {
	var rows []layoutRow
	err := sqlx.SelectContext(ctx, q, &rows, `SELECT version, ordinal, server_uuid, recorded_at, recorded_by FROM ledger_layout
		WHERE version = `+version+` ORDER BY ordinal`, args...)
	if NoSuchTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read ledger_layout: %w", err)
	}
	out := make([]driver.LayoutRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, driver.LayoutRow{Version: r.Version, Ordinal: r.Ordinal, ServerUUID: r.ServerUUID, RecordedAt: r.RecordedAt.UTC(), RecordedBy: r.RecordedBy})
	}
	return out, nil
}

// InsertLayout stores one layout version, every row in one statement: of
// instances storing the same version together, one wins whole and the
// others insert nothing. It reports whether rows were inserted (false:
// the version exists).
func InsertLayout(ctx context.Context, ex sqlx.ExecerContext, rows []driver.LayoutRow) (bool, error) {
	if len(rows) == 0 {
		return false, errors.New("store ledger_layout: no server")
	}
	query := `INSERT INTO ledger_layout (version, ordinal, server_uuid, recorded_at, recorded_by) VALUES `
	args := make([]any, 0, 5*len(rows))
	for i, r := range rows {
		if i > 0 {
			query += ", "
		}
		query += "(?, ?, ?, ?, ?)"
		args = append(args, r.Version, r.Ordinal, r.ServerUUID, r.RecordedAt.UTC(), r.RecordedBy)
	}
	if _, err := ex.ExecContext(ctx, query, args...); err != nil {
		if Code(err) == driver.Duplicate {
			return false, nil
		}
		return false, fmt.Errorf("store ledger_layout: %w", err)
	}
	return true, nil
}

// ReadServerIdentity reads the server's ledger_server row; found is false
// when it has none (a schema before migration 00010).
func ReadServerIdentity(ctx context.Context, q sqlx.QueryerContext) (driver.ServerIdentity, bool, error) {
	var row struct {
		UUID   string `db:"server_uuid"`
		Ledger string `db:"ledger_id"`
	}
	err := sqlx.GetContext(ctx, q, &row, `SELECT server_uuid, ledger_id FROM ledger_server WHERE singleton = 1`)
	if NoSuchTable(err) || errors.Is(err, sql.ErrNoRows) {
		return driver.ServerIdentity{}, false, nil
	}
	if err != nil {
		return driver.ServerIdentity{}, false, fmt.Errorf("read ledger_server: %w", err)
	}
	return driver.ServerIdentity{UUID: row.UUID, Ledger: row.Ledger}, true, nil
}

// ClaimServer records ledger as the server's ledger unless one is (the
// first claim holds); the caller reads back which one does.
func ClaimServer(ctx context.Context, ex sqlx.ExecerContext, ledger string) error {
	if _, err := ex.ExecContext(ctx, `UPDATE ledger_server SET ledger_id = ? WHERE singleton = 1 AND ledger_id = ''`, ledger); err != nil {
		return fmt.Errorf("claim ledger_server: %w", err)
	}
	return nil
}

// Layout reads the ledger's layout (ReadLayout on the control server).
func (v *View) Layout(ctx context.Context) ([]driver.LayoutRow, error) {
	return ReadLayout(ctx, v.db())
}

// ServerIdentity reads server i's ledger_server row.
func (v *View) ServerIdentity(ctx context.Context, i int) (driver.ServerIdentity, bool, error) {
	if i < 0 || i >= len(v.servers) {
		return driver.ServerIdentity{}, false, fmt.Errorf("mysqldriver: no server %d", i)
	}
	return ReadServerIdentity(ctx, v.servers[i].db)
}

// TableRows is InnoDB's estimate of a table's rows.
type TableRows struct {
	Table string `json:"table"`
	Rows  int64  `json:"rows_estimate"`
}

// TableRowEstimates returns InnoDB's estimate of the rows of every table
// of the server's ledger database but goose's (its versions, its lock), by
// name
// (information_schema.TABLES.TABLE_ROWS, as DedupRows: cheap, no scan,
// approximate).
func (s *Server) TableRowEstimates(ctx context.Context) ([]TableRows, error) {
	var rows []struct {
		Table string        `db:"TABLE_NAME"`
		Rows  sql.NullInt64 `db:"TABLE_ROWS"`
	}
	err := s.db.SelectContext(ctx, &rows, `SELECT TABLE_NAME, TABLE_ROWS FROM information_schema.TABLES
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_TYPE = 'BASE TABLE' AND TABLE_NAME NOT LIKE 'goose\_%' ORDER BY TABLE_NAME`)
	if err != nil {
		return nil, fmt.Errorf("table sizes: %w", err)
	}
	out := make([]TableRows, len(rows))
	for i, r := range rows {
		out[i] = TableRows{Table: r.Table, Rows: r.Rows.Int64}
	}
	return out, nil
}
