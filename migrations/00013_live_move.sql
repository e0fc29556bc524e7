-- The live move (package shards: billing shards add moves rows while the
-- instances count). ledger_move_cursor, one row on the control server, says
-- how far the move to a layout version went, in the order of the keys
-- (account ids and event ids, as bytes): the rows of the slots that change
-- server whose key is below moved_below are on their new server, the
-- others on their old one; while a step of the move is under way,
-- frozen_below is the end of the keys it moves (from moved_below on), and
-- no checkpoint that wrote one of them commits. Every commit decision
-- reads the row under a shared lock and refuses a checkpoint that placed a
-- key by a cursor that has moved past it (txsink: ErrLayoutMoved); the
-- mover's steps update it. version is the layout version of the move
-- under way or last done (0: none since this migration).
--
-- A move begun before this migration (it fenced the instances; its state
-- is 'moving' in ledger_moves) is taken over with every key frozen: the
-- instances count what the move does not touch, and billing shards add,
-- run again, finishes it.

-- +goose Up
CREATE TABLE ledger_move_cursor (
    singleton    TINYINT NOT NULL COMMENT 'always 1: one row',
    version      INT NOT NULL COMMENT 'ledger_layout.version of the move under way or last done; 0: none',
    moving       BOOLEAN NOT NULL COMMENT 'the move to version is under way',
    moved_below  VARBINARY(129) NOT NULL COMMENT 'keys of moving slots below it are on their new server',
    frozen_below VARBINARY(129) NOT NULL COMMENT 'a step under way moves the keys from moved_below up to it; empty: none',
    mover        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL COMMENT 'the run of billing shards add that holds the move',
    updated_at   DATETIME(6) NOT NULL,
    PRIMARY KEY (singleton)
) ENGINE = InnoDB DEFAULT CHARACTER SET = ascii;

INSERT INTO ledger_move_cursor (singleton, version, moving, moved_below, frozen_below, mover, updated_at)
SELECT 1, COALESCE(MAX(version), 0), COALESCE(MAX(state = 'moving'), FALSE), '',
       CASE WHEN COALESCE(MAX(state = 'moving'), FALSE) THEN REPEAT(X'FF', 129) ELSE '' END, '', UTC_TIMESTAMP(6)
FROM ledger_moves WHERE version = (SELECT MAX(version) FROM ledger_moves);

-- +goose Down
DROP TABLE ledger_move_cursor;
