-- The ledger's layout, stored in the ledger: which servers hold it, in
-- which order (accounts and event ids are placed by hash over that order),
-- so that an instance configured with another list (MYSQL_DSN and
-- MYSQL_SHARD_DSNS: a server missing, added, reordered, or another
-- ledger's) refuses to start instead of placing rows where no reader
-- looks (package shards).
--
-- ledger_server holds one row on every server: the schema's own identity,
-- a UUID generated here, at migration (UUID(), on MySQL and MariaDB alike:
-- unique across servers and time), so that it survives a new password,
-- host name or alias, and is one per database (several ledgers may share a
-- MySQL server; @@server_uuid is the server's, and MariaDB has none).
-- ledger_id is empty until the ledger whose control server lists the
-- server claims it, at its first start (then the control server's
-- ledger_identity.ledger_id).
--
-- ledger_layout holds, on the control server, the servers' UUIDs in order,
-- one row per server and layout version; the highest version is the
-- ledger's layout. Version 1 is stored by the first instance that starts
-- (an existing ledger adopts the list it runs with). Rows are only
-- appended (the table exists on every server, like the others).

-- +goose Up
CREATE TABLE ledger_server (
    singleton   TINYINT NOT NULL COMMENT 'always 1: one row',
    server_uuid CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT 'UUID(), generated at migration',
    ledger_id   CHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '' COMMENT 'the ledger that claimed the server; empty: none yet',
    created_at  DATETIME(6) NOT NULL,
    PRIMARY KEY (singleton)
) ENGINE = InnoDB DEFAULT CHARACTER SET = ascii;

INSERT INTO ledger_server (singleton, server_uuid, ledger_id, created_at) VALUES (1, UUID(), '', UTC_TIMESTAMP(6));

CREATE TABLE ledger_layout (
    version     INT NOT NULL COMMENT '1, 2, ...: the highest is the ledger''s layout',
    ordinal     INT NOT NULL COMMENT 'the server''s place: 0 is the control server',
    server_uuid CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT 'ledger_server.server_uuid of that server',
    recorded_at DATETIME(6) NOT NULL,
    recorded_by VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL COMMENT 'the instance that stored it',
    PRIMARY KEY (version, ordinal)
) ENGINE = InnoDB DEFAULT CHARACTER SET = ascii;

-- +goose Down
DROP TABLE ledger_layout;
DROP TABLE ledger_server;
