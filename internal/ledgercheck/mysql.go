package ledgercheck

import (
	"context"
	"database/sql"
	"fmt"
	"time"

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

// ReadActual reads account_balances, billing_windows, window_adjustments
// and dead_letters from every server in dbs (row Shard = index in dbs) and
// returns their union; with entries, it also summarises ledger_entries
// (see Entries). Each server is read in one read-only REPEATABLE READ
// transaction, so its tables come from one consistent snapshot; different servers are read
// one after the other and are not mutually consistent while the service is
// still writing. If topic is not empty only dead letters of that Kafka topic
// are read. Any query error fails the whole read.
func ReadActual(ctx context.Context, dbs []*sqlx.DB, topic string, entries bool) (*Actual, error) {
	return ReadActualProgress(ctx, dbs, topic, entries, nil)
}

// ReadActualProgress is ReadActual calling rows (when not nil) with the
// number of rows read so far, as it goes, for a progress display of a
// large ledger. rows is called from the reading goroutine.
func ReadActualProgress(ctx context.Context, dbs []*sqlx.DB, topic string, entries bool, rows func(n int64)) (*Actual, error) {
	act := &Actual{}
	if entries {
		act.Entries = &Entries{Timely: map[WindowKey]Sum{}, Late: map[WindowKey]Sum{}}
	}
	var n int64
	seen := func() {
		if n++; rows != nil && n%1024 == 0 {
			rows(n)
		}
	}
	defer func() {
		if rows != nil {
			rows(n)
		}
	}()
	for i, db := range dbs {
		if err := readShard(ctx, db, i, topic, act, seen); err != nil {
			return nil, fmt.Errorf("server %d: %w", i, err)
		}
	}
	return act, nil
}

func readShard(ctx context.Context, db *sqlx.DB, shard int, topic string, act *Actual, seen func()) (err error) {
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
		seen()
	}
	if err := closeRows(rows); err != nil {
		return fmt.Errorf("read account_balances: %w", err)
	}

	type window struct {
		AccountID   []byte     `db:"account_id"`
		Currency    string     `db:"currency"`
		WindowStart time.Time  `db:"window_start"`
		AmountMinor int64      `db:"amount_minor"`
		EventCount  int64      `db:"event_count"`
		ClosedAt    *time.Time `db:"closed_at"`
		UpdatedAt   time.Time  `db:"updated_at"`
	}
	for _, t := range []struct {
		table, closed string
		into          *[]ActualWindow
	}{
		{"billing_windows", "closed_at", &act.Windows},
		{"window_adjustments", "NULL AS closed_at", &act.Adjustments},
	} {
		rows, err = tx.QueryxContext(ctx,
			`SELECT account_id, currency, window_start, amount_minor, event_count, `+t.closed+`, updated_at FROM `+t.table)
		if err != nil {
			return fmt.Errorf("read %s: %w", t.table, err)
		}
		for rows.Next() {
			var w window
			if err := rows.StructScan(&w); err != nil {
				_ = rows.Close()
				return fmt.Errorf("read %s: %w", t.table, err)
			}
			aw := ActualWindow{WindowRow: WindowRow{string(w.AccountID), w.Currency, w.WindowStart.UTC(), w.AmountMinor, w.EventCount},
				Shard: shard, ClosedAt: w.ClosedAt, UpdatedAt: w.UpdatedAt.UTC()}
			if aw.ClosedAt != nil {
				c := aw.ClosedAt.UTC()
				aw.ClosedAt = &c
			}
			*t.into = append(*t.into, aw)
			seen()
		}
		if err := closeRows(rows); err != nil {
			return fmt.Errorf("read %s: %w", t.table, err)
		}
	}

	// The verifier reads dead_letters with its own statement, as every
	// other table: it checks the driver's writes, so it shares none of
	// its SQL.
	var dls []struct {
		Topic     string `db:"kafka_topic"`
		Partition int32  `db:"kafka_partition"`
		Offset    int64  `db:"kafka_offset"`
		Reason    string `db:"reason"`
	}
	q, args := `SELECT kafka_topic, kafka_partition, kafka_offset, reason FROM dead_letters`, []any(nil)
	if topic != "" {
		q, args = q+` WHERE kafka_topic = ?`, append(args, topic)
	}
	if err := sqlx.SelectContext(ctx, tx, &dls, q+` ORDER BY kafka_topic, kafka_partition, kafka_offset`, args...); err != nil {
		return fmt.Errorf("read dead_letters: %w", err)
	}
	for _, d := range dls {
		act.DeadLetters = append(act.DeadLetters, DeadLetterRow{shard, d.Topic, d.Partition, d.Offset, d.Reason})
	}
	if act.Entries != nil {
		if err := readEntries(ctx, tx, topic, act.Entries); err != nil {
			return fmt.Errorf("read ledger_entries: %w", err)
		}
	}
	return nil
}

// The entry column of a version's retraction (migration 00011,
// docs/corrections.md), and what an entry counts: -1 a retraction, 1
// any other.
const (
	entryRetraction = 1
	entrySign       = `CASE entry WHEN 1 THEN -1 ELSE 1 END`
)

// readEntries adds one server's ledger_entries to en: the rows one by one
// for the digest (nothing is kept per row), and the sums per window and
// lateness from the server. Ids are counted distinct per server; an event
// id is placed on one server (its account's), so the sum over servers is
// the number of distinct ids.
func readEntries(ctx context.Context, tx *sqlx.Tx, topic string, en *Entries) error {
	where, args := "", []any{}
	if topic != "" {
		where, args = " WHERE kafka_topic = ?", []any{topic}
	}
	// Per event id, what its entries count: 1 an event counted, 0 one
	// cancelled (or never counted), a retraction counting -1.
	var n struct {
		Count      int64 `db:"n"`
		Distinct   int64 `db:"d"`
		Unbalanced int64 `db:"u"`
	}
	if err := tx.GetContext(ctx, &n, `SELECT COALESCE(SUM(s), 0) AS n, COALESCE(SUM(s = 1), 0) AS d, COALESCE(SUM(s NOT IN (0, 1)), 0) AS u FROM
		(SELECT event_id, SUM(`+entrySign+`) AS s FROM ledger_entries`+where+` GROUP BY event_id) AS ids`, args...); err != nil {
		return err
	}
	en.Count += n.Count
	en.DistinctIDs += n.Distinct
	en.Unbalanced += n.Unbalanced
	rows, err := tx.QueryxContext(ctx, `SELECT event_id, account_id, currency, amount_minor, occurred_at, entry FROM ledger_entries`+where, args...)
	if err != nil {
		return err
	}
	for rows.Next() {
		var e struct {
			EventID  []byte    `db:"event_id"`
			Account  []byte    `db:"account_id"`
			Currency string    `db:"currency"`
			Amount   int64     `db:"amount_minor"`
			Occurred time.Time `db:"occurred_at"`
			Entry    int       `db:"entry"`
		}
		if err := rows.StructScan(&e); err != nil {
			_ = rows.Close()
			return err
		}
		if e.Entry == entryRetraction {
			// It takes back the entry it retracts: that entry's digest.
			en.Digest -= EntryDigest(Event{EventID: string(e.EventID), AccountID: string(e.Account), AmountMinor: -e.Amount, Currency: e.Currency, OccurredAt: e.Occurred})
			continue
		}
		en.Digest += EntryDigest(Event{EventID: string(e.EventID), AccountID: string(e.Account), AmountMinor: e.Amount, Currency: e.Currency, OccurredAt: e.Occurred})
	}
	if err := closeRows(rows); err != nil {
		return err
	}
	// Each window's entries sum to its row, which fits 64 bits.
	rows, err = tx.QueryxContext(ctx, `SELECT account_id, currency, window_start, late, CAST(SUM(amount_minor) AS SIGNED) AS amount, CAST(SUM(`+entrySign+`) AS SIGNED) AS n
		FROM ledger_entries`+where+` GROUP BY account_id, currency, window_start, late`, args...)
	if err != nil {
		return err
	}
	for rows.Next() {
		var g struct {
			Account  []byte    `db:"account_id"`
			Currency string    `db:"currency"`
			Start    time.Time `db:"window_start"`
			Late     bool      `db:"late"`
			Amount   int64     `db:"amount"`
			Count    int64     `db:"n"`
		}
		if err := rows.StructScan(&g); err != nil {
			_ = rows.Close()
			return err
		}
		m := en.Timely
		if g.Late {
			m = en.Late
		}
		k := WindowKey{string(g.Account), g.Currency, g.Start.UTC().UnixMicro()}
		s := m[k]
		m[k] = Sum{s.Amount + g.Amount, s.Count + g.Count}
	}
	return closeRows(rows)
}

// closeRows reports an iteration error, else the error of closing rows.
func closeRows(rows *sqlx.Rows) error {
	if err := rows.Err(); err != nil {
		_ = rows.Close()
		return err
	}
	return rows.Close()
}
