-- The ledger: result tables (the public contract), dedup keys, and the
-- exactly-once bookkeeping (partition offsets with owner epochs, checkpoint
-- decisions). Applied to every MySQL server the service writes to; the control
-- tables are used on the control server (MYSQL_DSN) only.
--
-- Identifiers are VARBINARY: the contract limits them in bytes, and binary
-- comparison keeps 'a' and 'a ' (PAD SPACE collations) or 'A' and 'a' apart.

-- +goose Up
CREATE TABLE account_balances (
    account_id    VARBINARY(64) NOT NULL,
    currency      CHAR(3) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    balance_minor BIGINT NOT NULL,
    event_count   BIGINT NOT NULL,
    updated_at    DATETIME(6) NOT NULL,
    PRIMARY KEY (account_id, currency)
) ENGINE = InnoDB;

CREATE TABLE billing_windows (
    account_id   VARBINARY(64) NOT NULL,
    currency     CHAR(3) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    window_start DATETIME(6) NOT NULL COMMENT 'UTC, aligned to the Unix epoch',
    amount_minor BIGINT NOT NULL,
    event_count  BIGINT NOT NULL,
    updated_at   DATETIME(6) NOT NULL,
    PRIMARY KEY (account_id, currency, window_start)
) ENGINE = InnoDB;

CREATE TABLE dead_letters (
    id              BIGINT NOT NULL AUTO_INCREMENT,
    kafka_topic     VARCHAR(249) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kafka_partition INT NOT NULL,
    kafka_offset    BIGINT NOT NULL,
    reason          VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    detail          VARCHAR(512) NOT NULL,
    event_id        VARBINARY(128) NULL COMMENT 'when the payload named one',
    record_key      VARBINARY(1024) NULL,
    payload         MEDIUMBLOB NOT NULL COMMENT 'at most the first 1 MiB',
    payload_size    INT NOT NULL,
    checkpoint_id   VARBINARY(64) NOT NULL,
    created_at      DATETIME(6) NOT NULL,
    reinjected_at   DATETIME(6) NULL,
    PRIMARY KEY (id),
    UNIQUE KEY dead_letters_record (kafka_topic, kafka_partition, kafka_offset),
    KEY dead_letters_reason (reason, created_at)
) ENGINE = InnoDB;

-- Dedup state: one row per event id seen within the TTL. expires_at is
-- first arrival (processing time) + DEDUP_TTL; rows past it are deleted in
-- small batches by the janitor.
CREATE TABLE dedup_keys (
    event_id    VARBINARY(128) NOT NULL,
    fingerprint BINARY(16) NOT NULL,
    expires_at  DATETIME(6) NOT NULL,
    PRIMARY KEY (event_id),
    KEY dedup_keys_expiry (expires_at)
) ENGINE = InnoDB;

-- The authoritative input position. A partition's row is raised to a new
-- epoch by every instance that is assigned it; a checkpoint decision only
-- commits while the epochs it was built under still hold (fencing).
CREATE TABLE partition_offsets (
    consumer_group  VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kafka_topic     VARCHAR(249) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kafka_partition INT NOT NULL,
    next_offset     BIGINT NOT NULL,
    owner           VARBINARY(64) NOT NULL,
    epoch           BIGINT NOT NULL,
    updated_at      DATETIME(6) NOT NULL,
    PRIMARY KEY (consumer_group, kafka_topic, kafka_partition)
) ENGINE = InnoDB;

-- One row per decided checkpoint, inserted at most once (the primary key is
-- the compare-and-set): 'commit' by the coordinator together with the new
-- offsets, or 'abort' by a recoverer that found the branches undecided.
CREATE TABLE checkpoint_decisions (
    gtrid      VARBINARY(64) NOT NULL,
    outcome    ENUM('commit', 'abort') CHARACTER SET ascii NOT NULL,
    decided_by VARBINARY(64) NOT NULL,
    decided_at DATETIME(6) NOT NULL,
    PRIMARY KEY (gtrid),
    KEY checkpoint_decisions_age (decided_at)
) ENGINE = InnoDB;

-- +goose Down
DROP TABLE checkpoint_decisions;
DROP TABLE partition_offsets;
DROP TABLE dedup_keys;
DROP TABLE dead_letters;
DROP TABLE billing_windows;
DROP TABLE account_balances;
