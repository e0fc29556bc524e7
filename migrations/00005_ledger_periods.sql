-- The ledger's period settings (issue 18): BILLING_WINDOW, BILLING_TIMEZONE
-- and whether windows close (WINDOW_CLOSE_AFTER set), stored in the ledger
-- when first used, so that an instance whose settings differ refuses to
-- start, and a deliberate change is an operation of its own (billing
-- periods change, package periods) after which no counted event and no
-- sealed row changes meaning.
--
-- One row per definition, in force for the events whose occurred_at is
-- from effective_from on (NULL: from the beginning), until the next row's;
-- a row that keeps the previous row's window and zone changes closing only.
-- The last row's windows_close is the ledger's. Rows are only appended, on
-- the control server (the table exists on every server, like the others).

-- +goose Up
CREATE TABLE ledger_periods (
    seq              INT NOT NULL COMMENT '1, 2, ...: the order of the definitions',
    effective_from   DATETIME(6) NULL COMMENT 'the first occurred_at the definition applies to; NULL: from the beginning',
    billing_window   VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT 'a Go duration (1h0m0s), day or month',
    billing_timezone VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT 'IANA zone of day and month windows; UTC for durations',
    windows_close    BOOLEAN NOT NULL COMMENT 'windows close (WINDOW_CLOSE_AFTER set)',
    recorded_at      DATETIME(6) NOT NULL,
    recorded_by      VARCHAR(255) NOT NULL COMMENT 'the instance that stored the first, or who ran billing periods change',
    PRIMARY KEY (seq)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;

-- +goose Down
DROP TABLE ledger_periods;
