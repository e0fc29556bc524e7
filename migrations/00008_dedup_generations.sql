-- Generations of dedup keys (issue 21): expiry without a delete per key.
--
-- Keys are written to the table of the current generation; a table is
-- emptied whole (TRUNCATE TABLE) once every key in it has expired, and
-- then taken by a later generation: generation g writes table g mod 3 of
-- dedup_keys, dedup_keys_g1, dedup_keys_g2. A claim inserts into the
-- current generation's table and then reads, under shared locks, the
-- earlier generations that may still hold live keys (package dedup).
--
-- dedup_keys stays as generation 0's table: a ledger that existed before
-- keeps writing and reading it for the first generation, as instances of
-- the version before do during a rolling upgrade, and its keys drain by
-- age with generation 0 (the table is emptied, with the expiry journal
-- dedup_expiry of that version, only once no journal row can be live).
-- No key is moved and nothing is rebuilt.
--
-- dedup_generations holds, on the control server, the state: the current
-- generation and when it became current (and the one before), the last
-- generation whose table was emptied, and the longest key lifetime any
-- instance has registered. Every commit decision that claimed keys reads
-- the current generation under a shared lock and is refused if it moved;
-- a rotation takes the row exclusively (NOWAIT) and records its time
-- after every earlier decision committed. One row, created here; the
-- other servers' rows are not used.

-- +goose Up
CREATE TABLE dedup_keys_g1 (
    event_id    VARBINARY(128) NOT NULL,
    fingerprint BINARY(16) NOT NULL,
    expires_at  DATETIME(6) NOT NULL,
    PRIMARY KEY (event_id)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE dedup_keys_g2 (
    event_id    VARBINARY(128) NOT NULL,
    fingerprint BINARY(16) NOT NULL,
    expires_at  DATETIME(6) NOT NULL,
    PRIMARY KEY (event_id)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE dedup_generations (
    singleton      TINYINT NOT NULL COMMENT 'always 1: one row',
    current_gen    BIGINT NOT NULL COMMENT 'the generation claims write (table: current_gen mod 3)',
    current_since  DATETIME(6) NOT NULL COMMENT 'control server clock (UTC) when current_gen became current',
    previous_since DATETIME(6) NULL COMMENT 'the same for current_gen - 1',
    emptied_gen    BIGINT NOT NULL COMMENT 'every generation up to this one had its table emptied (-1: none)',
    lifetime_us    BIGINT NOT NULL COMMENT 'longest key lifetime (DEDUP_TTL plus the clock margin) registered, microseconds',
    updated_at     DATETIME(6) NOT NULL,
    PRIMARY KEY (singleton)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;

INSERT INTO dedup_generations (singleton, current_gen, current_since, previous_since, emptied_gen, lifetime_us, updated_at)
VALUES (1, 0, UTC_TIMESTAMP(6), NULL, -1, 0, UTC_TIMESTAMP(6));

-- +goose Down
DROP TABLE dedup_generations;
DROP TABLE dedup_keys_g2;
DROP TABLE dedup_keys_g1;
