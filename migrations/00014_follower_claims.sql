-- A live move begins without fencing the instances that follow it.
-- follower_epoch is the epoch of the partition's last claim by an instance
-- that reads the move's cursor at every decision and places keys by it
-- (this version on; mysqldriver.Control.Claim sets it with the epoch). The
-- begin of a move (billing shards add or remove) raises the epoch only of
-- the rows where it is not the epoch: those claimed last by an instance of
-- a version before, which would place keys by the old layout while rows
-- move (mysqldriver.Control.QuiesceUnfollowing). Such an instance stops at
-- its next claim; one that follows the cursor counts on through the begin.

-- +goose Up
ALTER TABLE partition_offsets
    ADD COLUMN follower_epoch BIGINT NULL COMMENT 'the epoch of the last claim by an instance that follows the live move''s cursor; NULL: none';

-- +goose Down
ALTER TABLE partition_offsets DROP COLUMN follower_epoch;
