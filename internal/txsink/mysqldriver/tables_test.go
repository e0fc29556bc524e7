package mysqldriver_test

import (
	"context"
	"database/sql"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// readTables reads the ledger's tables whole, for the conformance suite.
func readTables(ctx context.Context, db *sqlx.DB) (driver.Tables, error) {
	var t driver.Tables
	for g, table := range mysqldriver.KeyTableNames {
		var keys []struct {
			ID          []byte    `db:"event_id"`
			Fingerprint []byte    `db:"fingerprint"`
			ExpiresAt   time.Time `db:"expires_at"`
		}
		if err := db.SelectContext(ctx, &keys, `SELECT event_id, fingerprint, expires_at FROM `+table+` ORDER BY event_id`); err != nil {
			return t, err
		}
		for _, k := range keys {
			d := driver.DedupKey{ID: string(k.ID), ExpiresAt: k.ExpiresAt.UTC()}
			copy(d.Fingerprint[:], k.Fingerprint)
			t.Keys[g] = append(t.Keys[g], d)
		}
	}
	var journal []struct {
		Seq       int64     `db:"seq"`
		ExpiresAt time.Time `db:"expires_at"`
		IDs       []byte    `db:"event_ids"`
	}
	if err := db.SelectContext(ctx, &journal, `SELECT seq, expires_at, event_ids FROM dedup_expiry ORDER BY seq`); err != nil {
		return t, err
	}
	for _, j := range journal {
		ids, err := mysqldriver.DecodeJournal(j.IDs)
		if err != nil {
			return t, err
		}
		r := driver.JournalRow{Seq: j.Seq, ExpiresAt: j.ExpiresAt.UTC()}
		for _, id := range ids {
			r.IDs = append(r.IDs, string(id))
		}
		t.Journal = append(t.Journal, r)
	}
	var sums []struct {
		Account  []byte       `db:"account_id"`
		Currency string       `db:"currency"`
		Start    sql.NullTime `db:"window_start"`
		Amount   int64        `db:"amount"`
		Count    int64        `db:"event_count"`
		Updated  time.Time    `db:"updated_at"`
		Closed   sql.NullTime `db:"closed_at"`
		Ckpt     []byte       `db:"checkpoint_id"`
	}
	if err := db.SelectContext(ctx, &sums, `SELECT account_id, currency, NULL AS window_start, balance_minor AS amount, event_count, updated_at, NULL AS closed_at, NULL AS checkpoint_id
		FROM account_balances ORDER BY account_id, currency`); err != nil {
		return t, err
	}
	for _, r := range sums {
		t.Balances = append(t.Balances, driver.BalanceRow{BalanceKey: driver.BalanceKey{Account: string(r.Account), Currency: r.Currency},
			Amount: r.Amount, Count: r.Count, UpdatedAt: r.Updated.UTC()})
	}
	sums = sums[:0]
	if err := db.SelectContext(ctx, &sums, `SELECT account_id, currency, window_start, amount_minor AS amount, event_count, updated_at, closed_at, NULL AS checkpoint_id
		FROM billing_windows ORDER BY account_id, currency, window_start`); err != nil {
		return t, err
	}
	for _, r := range sums {
		t.Windows = append(t.Windows, driver.WindowRow{WindowKey: driver.WindowKey{Account: string(r.Account), Currency: r.Currency, Start: r.Start.Time.UTC()},
			Amount: r.Amount, Count: r.Count, UpdatedAt: r.Updated.UTC(), ClosedAt: utc(r.Closed)})
	}
	sums = sums[:0]
	if err := db.SelectContext(ctx, &sums, `SELECT account_id, currency, window_start, amount_minor AS amount, event_count, updated_at, NULL AS closed_at, checkpoint_id
		FROM window_adjustments ORDER BY account_id, currency, window_start`); err != nil {
		return t, err
	}
	for _, r := range sums {
		t.Adjustments = append(t.Adjustments, driver.AdjustmentRow{WindowKey: driver.WindowKey{Account: string(r.Account), Currency: r.Currency, Start: r.Start.Time.UTC()},
			Amount: r.Amount, Count: r.Count, UpdatedAt: r.Updated.UTC(), Checkpoint: string(r.Ckpt)})
	}
	if err := readEntries(ctx, db, &t); err != nil {
		return t, err
	}
	return t, readDeadLetters(ctx, db, &t)
}

func utc(t sql.NullTime) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time.UTC()
}

func readEntries(ctx context.Context, db *sqlx.DB, t *driver.Tables) error {
	var rows []struct {
		Topic      string    `db:"kafka_topic"`
		Partition  int32     `db:"kafka_partition"`
		Offset     int64     `db:"kafka_offset"`
		Kind       int8      `db:"entry"`
		EventID    []byte    `db:"event_id"`
		Account    []byte    `db:"account_id"`
		Currency   string    `db:"currency"`
		Amount     int64     `db:"amount_minor"`
		OccurredAt time.Time `db:"occurred_at"`
		Window     time.Time `db:"window_start"`
		Late       bool      `db:"late"`
		Revision   int64     `db:"revision"`
		Checkpoint []byte    `db:"checkpoint_id"`
		Created    time.Time `db:"created_at"`
	}
	if err := db.SelectContext(ctx, &rows, `SELECT kafka_topic, kafka_partition, kafka_offset, entry, event_id, account_id, currency, amount_minor,
		occurred_at, window_start, late, revision, checkpoint_id, created_at FROM ledger_entries ORDER BY kafka_topic, kafka_partition, kafka_offset, entry`); err != nil {
		return err
	}
	for _, r := range rows {
		t.Entries = append(t.Entries, driver.EntryRow{Topic: r.Topic, Checkpoint: string(r.Checkpoint), CreatedAt: r.Created.UTC(),
			Entry: driver.Entry{Partition: r.Partition, Offset: r.Offset, Kind: driver.EntryKind(r.Kind), EventID: string(r.EventID), Account: string(r.Account), Currency: r.Currency,
				Amount: r.Amount, OccurredAt: r.OccurredAt.UTC(), WindowStart: r.Window.UTC(), Late: r.Late, Revision: r.Revision}})
	}
	return nil
}

func readDeadLetters(ctx context.Context, db *sqlx.DB, t *driver.Tables) error {
	var rows []struct {
		ID         int64     `db:"id"`
		Topic      string    `db:"kafka_topic"`
		Partition  int32     `db:"kafka_partition"`
		Offset     int64     `db:"kafka_offset"`
		Reason     string    `db:"reason"`
		Detail     string    `db:"detail"`
		EventID    []byte    `db:"event_id"`
		Key        []byte    `db:"record_key"`
		Payload    []byte    `db:"payload"`
		Size       int       `db:"payload_size"`
		SHA        []byte    `db:"payload_sha256"`
		Checkpoint []byte    `db:"checkpoint_id"`
		Created    time.Time `db:"created_at"`
	}
	if err := db.SelectContext(ctx, &rows, `SELECT id, kafka_topic, kafka_partition, kafka_offset, reason, detail, event_id, record_key, payload,
		payload_size, payload_sha256, checkpoint_id, created_at FROM dead_letters ORDER BY id`); err != nil {
		return err
	}
	for _, r := range rows {
		d := driver.DeadLetterRow{ID: r.ID, Topic: r.Topic, Checkpoint: string(r.Checkpoint), CreatedAt: r.Created.UTC(),
			DeadLetter: driver.DeadLetter{Partition: r.Partition, Offset: r.Offset, Reason: r.Reason, Detail: r.Detail, EventID: string(r.EventID),
				Key: r.Key, Payload: r.Payload, Size: r.Size}}
		copy(d.SHA256[:], r.SHA)
		t.DeadLetters = append(t.DeadLetters, d)
	}
	return nil
}

// storeLegacy stores keys ids in dedup_keys with one journal row listing
// them (each id preceded by its length in one byte), as the version before
// generations wrote them.
func storeLegacy(ctx context.Context, db *sql.DB, expires time.Time, ids []string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	var blob []byte
	for _, id := range ids {
		if _, err := tx.ExecContext(ctx, `INSERT INTO dedup_keys (event_id, fingerprint, expires_at) VALUES (?, ?, ?)`, id, make([]byte, 16), expires); err != nil {
			return err
		}
		blob = append(append(blob, byte(len(id))), id...)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO dedup_expiry (expires_at, event_ids) VALUES (?, ?)`, expires, blob); err != nil {
		return err
	}
	return tx.Commit()
}
