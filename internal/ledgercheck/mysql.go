package ledgercheck

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/billing/ledger/internal/deadletters"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/mysqlconn"
)

// NormalizeDSN parses a go-sql-driver/mysql DSN and forces the options the
// reader relies on: parseTime=true and loc=UTC (window_start is a UTC
// DATETIME). Other options are kept.
func NormalizeDSN(dsn string) (string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("parse MySQL DSN %q: %w", mysqlconn.Redact(dsn), err)
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	return cfg.FormatDSN(), nil
}

// OpenDB opens a small connection pool to the server and database named by
// dsn (see [NormalizeDSN]) and pings it. The caller closes the pool.
func OpenDB(ctx context.Context, dsn string) (*sqlx.DB, error) {
	norm, err := NormalizeDSN(dsn)
	if err != nil {
		return nil, err
	}
	db, err := sqlx.Open("mysql", norm)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", mysqlconn.Redact(dsn), err)
	}
	db.SetMaxOpenConns(2)
	db.SetConnMaxLifetime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("connect %s: %w", mysqlconn.Redact(dsn), err)
	}
	return db, nil
}

// ReadActual reads account_balances, billing_windows and dead_letters from
// every server in dbs (row Shard = index in dbs) and returns their union.
// Each server is read in one read-only REPEATABLE READ transaction, so its
// three tables come from one consistent snapshot; different servers are read
// one after the other and are not mutually consistent while the service is
// still writing. If topic is not empty only dead letters of that Kafka topic
// are read. Any query error fails the whole read.
func ReadActual(ctx context.Context, dbs []*sqlx.DB, topic string) (*Actual, error) {
	act := &Actual{}
	for i, db := range dbs {
		if err := readShard(ctx, db, i, topic, act); err != nil {
			return nil, fmt.Errorf("server %d: %w", i, err)
		}
	}
	return act, nil
}

func readShard(ctx context.Context, db *sqlx.DB, shard int, topic string, act *Actual) (err error) {
	tx, err := db.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return fmt.Errorf("begin read transaction: %w", err)
	}
	defer func() {
		if rerr := tx.Rollback(); err == nil && rerr != nil {
			err = fmt.Errorf("end read transaction: %w", rerr)
		}
	}()

	type balance struct {
		AccountID    []byte `db:"account_id"`
		Currency     string `db:"currency"`
		BalanceMinor int64  `db:"balance_minor"`
		EventCount   int64  `db:"event_count"`
	}
	rows, err := tx.QueryxContext(ctx,
		`SELECT account_id, currency, balance_minor, event_count FROM account_balances`)
	if err != nil {
		return fmt.Errorf("read account_balances: %w", err)
	}
	for rows.Next() {
		var b balance
		if err := rows.StructScan(&b); err != nil {
			_ = rows.Close()
			return fmt.Errorf("read account_balances: %w", err)
		}
		act.Balances = append(act.Balances, ActualBalance{
			BalanceRow{string(b.AccountID), b.Currency, b.BalanceMinor, b.EventCount}, shard})
	}
	if err := closeRows(rows); err != nil {
		return fmt.Errorf("read account_balances: %w", err)
	}

	type window struct {
		AccountID   []byte    `db:"account_id"`
		Currency    string    `db:"currency"`
		WindowStart time.Time `db:"window_start"`
		AmountMinor int64     `db:"amount_minor"`
		EventCount  int64     `db:"event_count"`
	}
	rows, err = tx.QueryxContext(ctx,
		`SELECT account_id, currency, window_start, amount_minor, event_count FROM billing_windows`)
	if err != nil {
		return fmt.Errorf("read billing_windows: %w", err)
	}
	for rows.Next() {
		var w window
		if err := rows.StructScan(&w); err != nil {
			_ = rows.Close()
			return fmt.Errorf("read billing_windows: %w", err)
		}
		act.Windows = append(act.Windows, ActualWindow{
			WindowRow{string(w.AccountID), w.Currency, w.WindowStart.UTC(), w.AmountMinor, w.EventCount}, shard})
	}
	if err := closeRows(rows); err != nil {
		return fmt.Errorf("read billing_windows: %w", err)
	}

	dls, err := deadletters.Positions(ctx, tx, topic)
	if err != nil {
		return err
	}
	for _, d := range dls {
		act.DeadLetters = append(act.DeadLetters, DeadLetterRow{shard, d.Topic, d.Partition, d.Offset, d.Reason})
	}
	return nil
}

// closeRows reports an iteration error, else the error of closing rows.
func closeRows(rows *sqlx.Rows) error {
	if err := rows.Err(); err != nil {
		_ = rows.Close()
		return err
	}
	return rows.Close()
}
