-- The commit log: a position in commit order for readers of the ledger
-- (issue 18, item 4; docs/periods.md, "Reading in commit order").
--
-- checkpoint_commits holds, on the control server, one row per commit
-- decision, written by the decision's own local transaction. commit_seq is
-- allocated from the counter row of commit_sequence, which every decision
-- locks last (after the partition rows and the frontier row) and holds
-- until it commits: so sequence numbers are in commit order, without gaps
-- (a decision that rolls back gives its number back). An AUTO_INCREMENT
-- would not do: it is allocated at insert, not at commit, and a reader
-- could see number 8 committed while 7 is still to come.
--
-- A decision commits before its branches' XA COMMIT, so a row says its
-- checkpoint's results are visible only once applied_at is set: by the
-- coordinator after every branch committed, by recovery otherwise, or by
-- the decision itself when no branch was prepared. The visible position is
-- the largest s such that every row numbered s or less is applied.
-- sealed_before is the closing frontier's sealed_before after the
-- decision (NULL when the decision did not lock the frontier): at the
-- visible position, every window starting before it is completely sealed
-- and visible. committed_at is the control server's UTC_TIMESTAMP(6).
-- Rows are pruned from the lowest number up, only below the visible
-- position and once older than COMMIT_LOG_RETENTION.
--
-- window_adjustments.checkpoint_id is the gtrid of the checkpoint that
-- last wrote the row (every upsert sets it), so that "adjustments changed
-- since position p" is a join with checkpoint_commits. Rows written before
-- this migration have none. billing_windows and account_balances get no
-- such column: each upsert would move an entry of a secondary index on
-- the hot path, while sealed windows are read through the frontier and
-- adjustments are written for late events only.

-- +goose Up
CREATE TABLE commit_sequence (
    singleton TINYINT NOT NULL COMMENT 'always 1: one row',
    last_seq  BIGINT NOT NULL COMMENT 'the last commit_seq allocated',
    PRIMARY KEY (singleton)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;

INSERT INTO commit_sequence (singleton, last_seq) VALUES (1, 0);

CREATE TABLE checkpoint_commits (
    commit_seq    BIGINT NOT NULL COMMENT 'in commit order, from 1, no gaps',
    checkpoint_id VARBINARY(64) NOT NULL COMMENT 'the gtrid, as in checkpoint_decisions and the result rows',
    committed_at  DATETIME(6) NOT NULL COMMENT 'control server clock (UTC) at the decision',
    applied_at    DATETIME(6) NULL COMMENT 'set once every branch of the checkpoint has committed',
    sealed_before DATETIME(6) NULL COMMENT 'window_frontier.sealed_before after the decision',
    PRIMARY KEY (commit_seq),
    UNIQUE KEY checkpoint_commits_checkpoint (checkpoint_id),
    KEY checkpoint_commits_unapplied (applied_at)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;

ALTER TABLE window_adjustments
    ADD COLUMN checkpoint_id VARBINARY(64) NULL COMMENT 'gtrid of the checkpoint that last wrote the row';
ALTER TABLE window_adjustments
    ADD KEY window_adjustments_checkpoint (checkpoint_id);

-- +goose Down
ALTER TABLE window_adjustments DROP KEY window_adjustments_checkpoint;
ALTER TABLE window_adjustments DROP COLUMN checkpoint_id;
DROP TABLE checkpoint_commits;
DROP TABLE commit_sequence;
