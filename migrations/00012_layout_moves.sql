-- Growing the ledger (package shards: billing shards add). A layout
-- version (ledger_layout) places keys by the hash modulo its number of
-- servers unless ledger_placement holds its slots: then a key's server is
-- the owner of slot hash mod slots (package placement), the slots given as
-- runs [first_slot, last_slot] of one owner (the server's ordinal in that
-- version). ledger_moves holds the state of the move to a version: while
-- it is 'moving', rows of the slots that change owner are being moved and
-- no instance counts (they were fenced when the move began); 'done' once
-- every row is on its new server. A version without a row in ledger_moves
-- was never moved to (version 1). Both tables are read and written on the
-- control server only (they exist on every server, like the others).

-- +goose Up
CREATE TABLE ledger_placement (
    version    INT NOT NULL COMMENT 'ledger_layout.version',
    first_slot INT NOT NULL,
    last_slot  INT NOT NULL COMMENT 'inclusive',
    ordinal    INT NOT NULL COMMENT 'the owning server''s ordinal in that version',
    PRIMARY KEY (version, first_slot)
) ENGINE = InnoDB DEFAULT CHARACTER SET = ascii;

CREATE TABLE ledger_moves (
    version     INT NOT NULL COMMENT 'the layout version moved to',
    state       VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT 'moving or done',
    started_at  DATETIME(6) NOT NULL,
    started_by  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    finished_at DATETIME(6) NULL,
    rows_moved  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (version)
) ENGINE = InnoDB DEFAULT CHARACTER SET = ascii;

-- +goose Down
DROP TABLE ledger_moves;
DROP TABLE ledger_placement;
