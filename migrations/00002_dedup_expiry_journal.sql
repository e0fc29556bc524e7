-- The dedup keys' expiry journal, which replaces the expires_at index of
-- dedup_keys.
--
-- Every checkpoint that writes dedup keys also writes, in the same XA
-- branch, rows here listing them (up to 16,384 ids per row, each id preceded
-- by its length in one byte) under their common expiry. The janitor reads
-- the expired journal rows, deletes the keys they list by primary key (only
-- if still expired: an id re-inserted later has a later expiry and its own
-- journal row), then the journal row. One journal row per thousands of keys
-- costs far less than a secondary index entry per key: that index was 8-24%
-- of the service's throughput (docs/performance.md).

-- +goose Up
CREATE TABLE dedup_expiry (
    seq        BIGINT NOT NULL AUTO_INCREMENT,
    expires_at DATETIME(6) NOT NULL,
    event_ids  MEDIUMBLOB NOT NULL,
    PRIMARY KEY (seq),
    KEY dedup_expiry_due (expires_at)
) ENGINE = InnoDB;

-- Keys stored before this migration get a journal row each.
INSERT INTO dedup_expiry (expires_at, event_ids)
SELECT expires_at, CONCAT(CHAR(LENGTH(event_id)), event_id) FROM dedup_keys;

ALTER TABLE dedup_keys DROP INDEX dedup_keys_expiry;

-- +goose Down
ALTER TABLE dedup_keys ADD INDEX dedup_keys_expiry (expires_at);
DROP TABLE dedup_expiry;
