-- The live move without lost work (package shards).
--
-- A move begins without fencing the instances that follow it.
-- partition_offsets.follower_epoch is the epoch of the partition's last
-- claim by an instance that reads the move's cursor at every decision and
-- places keys by it (this version on; mysqldriver.Control.Claim sets it
-- with the epoch). The begin of a move (billing shards add or remove)
-- raises the epoch only of the rows where it is not the epoch: those
-- claimed last by an instance of a version before, which would place keys
-- by the old layout while rows move (mysqldriver.Control.QuiesceUnfollowing).
-- Such an instance stops at its next claim; one that follows the cursor
-- counts on through the begin.
--
-- A step is announced before it freezes its keys.
-- ledger_move_cursor.announced_below is the end of the keys the mover
-- freezes next (empty: none): an instance that reads it before a
-- checkpoint waits for the step, and records in ledger_move_waits that it
-- does, with no checkpoint in flight. The mover freezes once every
-- counting instance has (or after a bound): the checkpoints in
-- flight at the announcement decide first instead of being refused.

-- +goose Up
ALTER TABLE partition_offsets
    ADD COLUMN follower_epoch BIGINT NULL COMMENT 'the epoch of the last claim by an instance that follows the live move''s cursor; NULL: none';

ALTER TABLE ledger_move_cursor
    ADD COLUMN announced_below VARBINARY(129) NOT NULL DEFAULT '' COMMENT 'the step frozen next goes from moved_below up to it; empty: none';

CREATE TABLE ledger_move_waits (
    instance        VARBINARY(64) NOT NULL COMMENT 'the instance (as checkpoint_decisions.decided_by)',
    version         INT NOT NULL COMMENT 'the cursor''s version it read',
    moved_below     VARBINARY(129) NOT NULL COMMENT 'the cursor''s moved_below it read',
    announced_below VARBINARY(129) NOT NULL COMMENT 'the step it waits for',
    waiting_since   DATETIME(6) NOT NULL COMMENT 'control server clock (UTC)',
    PRIMARY KEY (instance)
) ENGINE = InnoDB DEFAULT CHARACTER SET = ascii;

-- +goose Down
DROP TABLE ledger_move_waits;
ALTER TABLE ledger_move_cursor DROP COLUMN announced_below;
ALTER TABLE partition_offsets DROP COLUMN follower_epoch;
