-- Ledger entries of versions (docs/corrections.md): a version that amends
-- or cancels a counted event writes, at its own Kafka position, a
-- retraction of the counted version (its account, currency, window and
-- the negated amount) and, unless it cancels, an addition of the new one,
-- so that the entries still sum to the balances and windows.
--
-- entry numbers the entries of one position: 0 the event's entry (every
-- row before this migration, and a version that counts as the event
-- itself), 1 a retraction, 2 an addition. revision is the revision the
-- entry counts or takes back (0: an original).
--
-- The primary key takes entry, so the statement rebuilds the table (in
-- place, concurrent reads and writes allowed: ALGORITHM=INPLACE, LOCK=NONE,
-- which MariaDB 10.11 runs and MySQL 8.4 documents for replacing a primary
-- key; no other difference between them here): its time grows with the
-- entries kept (LEDGER_ENTRIES_RETENTION bounds them). The columns' defaults
-- keep every stored row what it was: the event's entry of an original.

-- +goose Up
ALTER TABLE ledger_entries
    ADD COLUMN entry TINYINT NOT NULL DEFAULT 0 COMMENT '0 the event, 1 a retraction of the counted version, 2 the addition of the new one',
    ADD COLUMN revision BIGINT NOT NULL DEFAULT 0 COMMENT 'the revision counted or taken back',
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (kafka_topic, kafka_partition, kafka_offset, entry),
    ALGORITHM = INPLACE, LOCK = NONE;

-- +goose Down
ALTER TABLE ledger_entries
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (kafka_topic, kafka_partition, kafka_offset),
    DROP COLUMN revision,
    DROP COLUMN entry;
