-- Billing periods that close, adjustments, and ledger entries (issue 14).
--
-- billing_windows.closed_at: set by the checkpoint that seals the window,
-- after the watermark passed its end plus WINDOW_CLOSE_AFTER; the row
-- never changes afterwards. The index on (window_start, closed_at) finds
-- the open rows of the windows to seal without scanning the table, and
-- serves invoicing queries by period.
--
-- window_adjustments: the events whose window was already closed when they
-- were counted, under their own window; same types as billing_windows.
-- For every account and currency, balance = Σ billing_windows +
-- Σ window_adjustments (amounts and event counts).
--
-- ledger_entries (LEDGER_ENTRIES=true): one row per counted event, written
-- in the same XA branch as the aggregates of its account. Indexed by
-- account (tracing a balance) and by age (retention).
--
-- partition_offsets gains each partition's watermark (the latest
-- occurred_at of the records below next_offset) and whether the partition
-- was caught up with its log when that was written; both are written by
-- the commit decision with the offsets.
--
-- window_frontier holds, on the control server, the ledger's closing
-- frontier: windows starting before closed_before are closed (their events
-- go to window_adjustments), windows starting before sealed_before have
-- their rows sealed (closed_at set). Both only grow, and only through
-- commit decisions. One row, created here.

-- The new columns come last and each ALTER does one thing, so that adding
-- a column is instant (MySQL 8.0.29+, MariaDB 10.4+) and adding the index
-- builds it in place without rebuilding a large billing_windows.

-- +goose Up
ALTER TABLE billing_windows
    ADD COLUMN closed_at DATETIME(6) NULL COMMENT 'set when the window was sealed; the row never changes afterwards';
ALTER TABLE billing_windows
    ADD KEY billing_windows_period (window_start, closed_at);

CREATE TABLE window_adjustments (
    account_id   VARBINARY(64) NOT NULL,
    currency     CHAR(3) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    window_start DATETIME(6) NOT NULL COMMENT 'the window of the events, closed when they were counted',
    amount_minor BIGINT NOT NULL,
    event_count  BIGINT NOT NULL,
    updated_at   DATETIME(6) NOT NULL,
    PRIMARY KEY (account_id, currency, window_start)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE ledger_entries (
    kafka_topic     VARCHAR(249) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kafka_partition INT NOT NULL,
    kafka_offset    BIGINT NOT NULL,
    event_id        VARBINARY(128) NOT NULL,
    account_id      VARBINARY(64) NOT NULL,
    currency        CHAR(3) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    amount_minor    BIGINT NOT NULL,
    occurred_at     DATETIME(6) NOT NULL COMMENT 'UTC, truncated to microseconds',
    window_start    DATETIME(6) NOT NULL,
    late            BOOLEAN NOT NULL COMMENT 'counted in window_adjustments: its window was closed',
    checkpoint_id   VARBINARY(64) NOT NULL,
    created_at      DATETIME(6) NOT NULL,
    PRIMARY KEY (kafka_topic, kafka_partition, kafka_offset),
    KEY ledger_entries_account (account_id, currency, window_start),
    KEY ledger_entries_age (created_at)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;

ALTER TABLE partition_offsets
    ADD COLUMN watermark DATETIME(6) NULL COMMENT 'latest occurred_at of the records below next_offset',
    ADD COLUMN caught_up BOOLEAN NOT NULL DEFAULT FALSE COMMENT 'next_offset had reached the end of the log when written';

CREATE TABLE window_frontier (
    singleton     TINYINT NOT NULL COMMENT 'always 1: one row',
    closed_before DATETIME(6) NULL COMMENT 'windows starting before are closed',
    sealed_before DATETIME(6) NULL COMMENT 'windows starting before have closed_at set',
    updated_at    DATETIME(6) NOT NULL,
    PRIMARY KEY (singleton)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;

INSERT INTO window_frontier (singleton, closed_before, sealed_before, updated_at) VALUES (1, NULL, NULL, UTC_TIMESTAMP(6));

-- +goose Down
DROP TABLE window_frontier;
ALTER TABLE partition_offsets DROP COLUMN caught_up, DROP COLUMN watermark;
DROP TABLE ledger_entries;
DROP TABLE window_adjustments;
ALTER TABLE billing_windows DROP KEY billing_windows_period;
ALTER TABLE billing_windows DROP COLUMN closed_at;
