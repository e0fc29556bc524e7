-- Ledger identity, character sets pinned in the schema, and the audit
-- columns of dead letters.
--
-- ledger_identity holds one row on the control server: a random id and a
-- random secret that the service generates at its first start and then
-- keeps for the life of the ledger. The id is part of every XA branch
-- qualifier, so that recovery touches only this ledger's branches even on a
-- shard server that other ledgers share (a hash of the database's name
-- could collide across servers). The secret keys a MAC in the qualifier:
-- XA RECOVER shows any account every prepared branch, and any account may
-- start a branch with any xid, but only an account that can read this table
-- can make one that recovery takes for the ledger's own.
--
-- Every column holding text derived from input is utf8mb4 (or binary) in
-- the schema itself: a database created with another default character set
-- (latin1, say) must still store any valid UTF-8, emoji included.
-- Identifiers stay VARBINARY; topic names and reasons are ASCII by
-- construction. Consumer group ids are any string Kafka accepts, so the
-- group becomes VARBINARY like the other identifiers.
--
-- Dead letters gain the SHA-256 of the whole record value (the stored
-- payload is a bounded prefix; the hash finds the record again in Kafka),
-- and who re-injected what: the operator's name, whether the checks were
-- overridden, and where the re-injected record landed.

-- +goose Up
CREATE TABLE ledger_identity (
    singleton  TINYINT NOT NULL COMMENT 'always 1: one row',
    ledger_id  CHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT '16 lower hex digits, random',
    secret     BINARY(32) NOT NULL COMMENT 'random; keys the MAC in every branch qualifier',
    created_at DATETIME(6) NOT NULL,
    PRIMARY KEY (singleton)
) ENGINE = InnoDB DEFAULT CHARACTER SET = ascii;

ALTER TABLE dead_letters
    MODIFY detail VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    ADD COLUMN payload_sha256 BINARY(32) NULL COMMENT 'SHA-256 of the whole record value' AFTER payload_size,
    ADD COLUMN reinjected_by VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL COMMENT 'who re-injected it',
    ADD COLUMN reinjected_forced BOOLEAN NULL COMMENT 'the checks were overridden (--force)',
    ADD COLUMN reinjected_partition INT NULL COMMENT 'where the re-injected record was written',
    ADD COLUMN reinjected_offset BIGINT NULL,
    ADD COLUMN reinjected_sha256 BINARY(32) NULL COMMENT 'SHA-256 of the re-injected value',
    DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;

ALTER TABLE partition_offsets
    MODIFY consumer_group VARBINARY(255) NOT NULL;

-- Tables without text columns of their own still get a default that can
-- hold any text, so that a column added later by hand does not inherit
-- latin1.
ALTER TABLE account_balances DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;
ALTER TABLE billing_windows DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;
ALTER TABLE dedup_keys DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;
ALTER TABLE dedup_expiry DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;
ALTER TABLE partition_offsets DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;
ALTER TABLE checkpoint_decisions DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;

-- +goose Down
ALTER TABLE partition_offsets
    MODIFY consumer_group VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL;
ALTER TABLE dead_letters
    DROP COLUMN reinjected_sha256,
    DROP COLUMN reinjected_offset,
    DROP COLUMN reinjected_partition,
    DROP COLUMN reinjected_forced,
    DROP COLUMN reinjected_by,
    DROP COLUMN payload_sha256;
DROP TABLE ledger_identity;
