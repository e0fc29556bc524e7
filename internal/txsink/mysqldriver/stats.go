package mysqldriver

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// What the metrics sample of a server besides the ledger's view: the
// server's own counters in information_schema (package metrics' Sampler).

// PurgeHistory returns the undo history of the server db is a pool of not
// yet purged (the same counter in MySQL 8 and MariaDB; reading it needs
// PROCESS: NeedsProcess).
func PurgeHistory(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, `SELECT COUNT FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len'`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("purge history: %w", err)
	}
	return n, nil
}

// Stats is a server's counters, on a pool of it.
type Stats struct{ db *sqlx.DB }

// NewStats returns the counters of the server db is a pool of.
func NewStats(db *sqlx.DB) Stats { return Stats{db} }

// PurgeHistory is the server's undo history not yet purged.
func (s *Server) PurgeHistory(ctx context.Context) (int64, error) { return PurgeHistory(ctx, s.db.DB) }

// DedupRows estimates the rows of the server's key tables (Stats.DedupRows).
func (s *Server) DedupRows(ctx context.Context) (int64, error) { return Stats{s.db}.DedupRows(ctx) }

// PurgeHistory is the server's undo history not yet purged.
func (s Stats) PurgeHistory(ctx context.Context) (int64, error) { return PurgeHistory(ctx, s.db.DB) }

// DedupRows returns InnoDB's estimate of the rows in the dedup key tables
// of the ledger's database, every generation's (dedup_keys, dedup_keys_g1,
// dedup_keys_g2; information_schema.TABLES.TABLE_ROWS: cheap, no scan,
// approximate: MariaDB keeps it live, MySQL 8.4 caches it).
func (s Stats) DedupRows(ctx context.Context) (int64, error) {
	var n sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT SUM(TABLE_ROWS) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()
		AND TABLE_NAME IN ('dedup_keys', 'dedup_keys_g1', 'dedup_keys_g2')`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("dedup_keys size: %w", err)
	}
	return n.Int64, nil
}
