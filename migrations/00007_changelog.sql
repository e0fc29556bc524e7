-- The changelog (issue 20, docs/changelog.md): the outbox every checkpoint
-- writes in its own branches, and the control server's state of the
-- ledger's changelog.
--
-- changelog_outbox holds, on every server, the change events of the rows
-- a checkpoint's branch wrote on that server, packed: one or more rows per
-- branch (participant) and checkpoint, each body a blob of changes in the
-- binary form of package changelog, within the statement budget of the
-- server's max_allowed_packet (at most 1 MiB). It is written in the branch,
-- so it commits or rolls back with the rows it describes; the publisher
-- reads the rows of checkpoints the commit log lists as applied, in
-- commit_seq order, and deletes them once Kafka holds them.
--
-- changelog_state is the control server's one row of the ledger's
-- changelog: the topic prefix, from_seq (the first commit_seq whose
-- checkpoint is guaranteed to have written the outbox: every decision from
-- it on is refused unless its instance runs the changelog, see
-- commit_sequence.changelog), whether rows decided earlier may exist (the
-- publisher then snapshots the tables), the publisher's lease (which
-- instance publishes: liveness only, Kafka's transactional id fences), and
-- a hint of what Kafka holds (published_seq: raised, never lowered; the
-- truth is the progress topic) that bounds the deletion of outbox rows and
-- the pruning of the commit log.
--
-- commit_sequence.changelog is set by the transaction that enables the
-- changelog, under the counter's lock: a decision's UPDATE of the counter
-- then succeeds only for a checkpoint built with the changelog on.

-- +goose Up
CREATE TABLE changelog_outbox (
    checkpoint_id VARBINARY(64) NOT NULL COMMENT 'gtrid of the checkpoint whose branch wrote it',
    participant   SMALLINT NOT NULL COMMENT 'the branch',
    chunk         INT NOT NULL COMMENT 'from 0, per branch',
    events        INT NOT NULL COMMENT 'changes in body',
    body          MEDIUMBLOB NOT NULL COMMENT 'changes, binary form of package changelog',
    created_at    DATETIME(6) NOT NULL,
    PRIMARY KEY (checkpoint_id, participant, chunk)
) ENGINE = InnoDB;

CREATE TABLE changelog_state (
    singleton     TINYINT NOT NULL COMMENT 'always 1: one row',
    topic_prefix  VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    from_seq      BIGINT NOT NULL COMMENT 'every commit_seq from this one on wrote the outbox',
    snapshot      BOOLEAN NOT NULL COMMENT 'rows decided before from_seq may exist',
    published_seq BIGINT NOT NULL COMMENT 'hint: Kafka held every checkpoint up to it',
    published_at  DATETIME(6) NULL,
    publisher     VARBINARY(64) NULL COMMENT 'the instance holding the lease',
    lease_until   DATETIME(6) NULL COMMENT 'control server clock (UTC)',
    enabled_at    DATETIME(6) NOT NULL,
    PRIMARY KEY (singleton)
) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin;

ALTER TABLE commit_sequence
    ADD COLUMN changelog BOOLEAN NOT NULL DEFAULT FALSE COMMENT 'decisions must come from instances running the changelog';

-- +goose Down
ALTER TABLE commit_sequence DROP COLUMN changelog;
DROP TABLE changelog_state;
DROP TABLE changelog_outbox;
