// Package pipeline is the exactly-once billing job: Kafka source → decode →
// TTL dedup → aggregation → two-phase-commit sink into MySQL, checkpointed
// the way Flink checkpoints a streaming job, in one Go process.
//
// # Its specification
//
// The scenario files of testdata/ state the pipeline's rules by example,
// one rule per file (assignment, rebalances and zombies, rewind and
// re-claim, isolation, event time, closing and sealing, dedup, overflow,
// the group-change gate, cleanup, the period settings): each gives the
// records produced, the faults, the clock's moves and the settings, and
// what follows (the ledger's rows, dead letters, positions and epochs,
// the commit log). TestScenarios (scenario_test.go; the harness is
// harness_test.go) runs them as cmd/billing runs the service, on kfake
// and the in-memory drivers (txsink/memdriver), with no server, in
// seconds; the integration tests against Kafka and MariaDB remain the
// proof that the in-memory world is faithful. The files of testdata/source/
// state the source's plan alone (TestSourcePlan, below).
//
// # Stream and table
//
// The result tables (account_balances, billing_windows, window_adjustments,
// ledger_entries, dead_letters) are
// the materialised result of a continuous query over the event stream: each
// checkpoint upserts the change its events make, so the sequence of
// committed checkpoints is the table's changelog. A table row is only ever
// changed by a committed checkpoint, and every input offset is covered by
// exactly one committed checkpoint; hence every event counts once.
//
// # Operators and their state
//
//   - The source (source.go) is a consumer-group member reading
//     read_committed. Its state is each partition's position; the
//     authoritative copy lives in MySQL (partition_offsets) and is written
//     only by committed checkpoints.
//   - The dedup operator (package dedup) is keyed by event id; its state is
//     the dedup_keys table, cached in memory within a budget.
//   - The aggregation operator (aggregate.go) is keyed by (account,
//     currency) and by (account, currency, window); its state is the result
//     tables themselves.
//
// # Checkpoints
//
// A checkpoint starts with a barrier (barrier.go): under one lock, the
// source cuts every assigned partition at its current position and hands
// the records below the cuts to the checkpoint as a snapshot. With a single
// source task the barrier is aligned by construction: nothing of the next
// checkpoint can overtake it. Polling then continues at once while the
// checkpoint runs on its own goroutine (asynchronous snapshot); at most one
// checkpoint is in flight, and fetching pauses when twice
// CheckpointMaxRecords or CheckpointMaxBytes are buffered behind it.
//
// The Checkpointer (checkpointer.go) commits the snapshot as one global XA
// transaction over the participants of package txsink, whose protocol (and
// its specification, the scenario files of txsink/testdata) it follows.
// The state of both operators is snapshotted at the same barrier as the
// input position: dedup claims, aggregate upserts and dead letters all run
// inside the branches.
//
// # The plan and its executor
//
// A checkpoint attempt is a plan and its execution, as etcd-io/raft's Ready
// and Advance. The planner (planner.go) is a pure state machine over the
// snapshot: its ready says what to do next, the executor (executor.go)
// does it against the ledger store (package driver: StoreTx in the
// branches, Store on the servers' pools) and the sink, and hands back what
// it found with advance. The planner never does I/O; the executor never
// decides. The steps are the event time (closing windows only), the dedup
// claims of the ids the cache does not know, the lookups of the ids whose
// claim statement met a stored key (on a pooled connection: under READ
// COMMITTED that reads what an in-branch read would, the committed rows,
// and the claim's row lock already decided which checkpoint owns a
// contested key; of a statement that holds versions, those first, and its
// other ids only if the versions are not all the stored keys it met), the
// classification of every record, the locking reads
// of the risky sums, the aggregation (aggregate.go), the writes of every
// participant with the sealing of closed windows, and the decision (its
// cuts and frontier change); the pure pieces they are built
// from are in plan.go, aggregate.go and eventtime.go. What the
// Checkpointer does after a failed attempt (retry at once, careful, after
// rereading the servers' limits, or isolate) is a pure function of the
// attempt's outcome too (retry.go).
//
// Adding a table means adding a step, or a write of the write step
// (execution.writeRows), and its driver method: an interface method of
// package driver, its statement in mysqldriver, its model in memdriver,
// its test in the conformance suite (txsink/drivertest), and its
// privileges in mysqldriver's declaration of what the service reads and
// writes.
//
// Before each attempt the checkpointer reads where keys are placed
// (txsink.Sink.Refresh: a live move of rows to a new server goes on
// while the pipeline counts) and waits while a step of the move is
// frozen; the attempt places its keys by that layout (txsink.Txn.Route),
// and a decision refused because the move went on since
// (txsink.ErrLayoutMoved) is retried at once (retry.go).
//
// A failure before the decision rolls every branch back; the source then
// discards everything it buffered and rereads its positions from MySQL
// (replay from the last committed checkpoint). After the decision the
// checkpoint is committed, whatever happens: recovery rolls forward the
// branches a crash left prepared. A checkpoint that the server refuses for
// its data, twice, is not replayed forever: the records responsible are
// isolated by trials and dead-lettered (isolate.go); when the trials show
// that no record is responsible (the checkpoint fails without records),
// nothing is, and the failure is reported instead.
//
// # Cleanup
//
// The dedup keys' generations are kept (Keeper: a table whose keys have
// all expired is emptied whole, the next generation made current; package
// dedup has the rules) and, with LedgerEntriesRetention, old ledger
// entries deleted in the background (housekeeping.go), pass after pass
// while work is due, on each server's cleanup pool: connections of their
// own, so that cleanup never takes one a checkpoint needs.
//
// # What it reads and writes
//
// The store declares, table by table and by feature (driver.Feature;
// Config.Features says which a configuration runs), every privilege its
// statements need (mysqldriver/privileges.go): `billing` checks them at start,
// and tests hold the declaration to the migrations and the grant files.
//
// # Rebalances and zombies
//
// The client blocks rebalances while a poll is being processed
// (BlockRebalanceOnPoll), so callbacks and processing alternate. Newly
// assigned partitions are claimed in MySQL (epoch + 1, owner = this
// instance) before they are fetched, from the positions stored there. A
// revoke first checkpoints what is buffered, so the next owner continues
// exactly there. An instance that lost its partitions without knowing it (a
// paused process, a network cut) still holds old epochs: its decision fails
// the epoch check, and nothing it prepared commits. The claims only fence;
// the group's assignment decides who consumes: a partition whose claim was
// taken while this member still holds it (a paused instance woke up and
// claimed it late) is claimed again, never dropped (see the source's plan).
//
// # The source's plan
//
// After an aborted checkpoint the source discards what it buffered and
// rewinds every partition, as the checkpoint does its attempt: a pure plan
// (sourceplan.go) and its executor (Pipeline.rewind). The plan takes the
// rewinding partitions and asks, step by step, for what it needs: their
// positions stored in MySQL (never the group's committed offsets), a
// re-claim of those whose stored epoch or owner is no longer this
// instance's (backing off per partition, from a second to a minute), the
// settings check after it, the log's start offsets for a partition never
// checkpointed; its outcome says where each partition restarts, and which
// keep rewinding after a failed step (the next pass held back, 100 ms
// doubling to 5 s). The executor does the I/O outside the pipeline's lock
// and applies the outcome under it, to the partitions still held at the
// epoch the plan saw. One thing stays serialized: a re-claim raises an
// epoch, which is right only while the group gives the partition to this
// member, so a pass holds Pipeline.ownMu, which the revoke and loss
// callbacks take first. The scenario files of testdata/source/ specify the
// plan by example, without I/O (TestSourcePlan).
//
// # Event time and periods that close
//
// Billing windows are fixed (epoch-aligned, UTC) or calendar days or
// months in a time zone (event.Period). With WindowCloseAfter set, windows
// close on event time: each partition's watermark is written by the commit
// decision with its offset, the topic's watermark combines them (idle
// partitions do not hold it back), and a closing frontier kept by the
// decisions says which windows are closed. An event of a closed window
// counts in window_adjustments; a later checkpoint seals the closed
// windows' rows (closed_at), which then never change. With LedgerEntries
// each counted event gets a ledger_entries row in its account's branch.
// Event time is bounded by processing time: a record dated later than the
// checkpoint's processing time plus MaxEventTimeSkew is an
// event_time_in_future dead letter and no part of any watermark (admit).
// The windows are the ledger's (Config.Window: the schedule stored in the
// ledger, package periods); an instance that finds them changed after a
// claim stops (Config.CheckSettings). See eventtime.go and docs/periods.md.
//
// # Clocks
//
// Every instant one instance writes and another judges (dedup expiries, a
// gtrid's creation time at recovery, processing time) is on
// the ledger's clock, the control server's as each instance measures it
// (Config.Clock, package ledgerclock); the margin between two instances'
// estimates is added where it matters (Config.dedupTTL,
// Config.abortAfter).
//
// # Versions of an event
//
// A record may carry a revision, or be a tombstone (cancelled): records
// with one event id are versions of that event, and the ledger counts its
// highest revision seen (docs/corrections.md). The event's key row keeps
// the counted version (package dedup: Version), so that a later version,
// on any instance, can retract it; its claim locks the row as any claim
// does. A checkpoint with no version but originals (no record with a
// revision or a tombstone, no stored key holding one) takes the path it
// always took; one that has some classifies as versions
// (dedup.ClassifyVersions) and applies each changed event as one item,
// the counted version retracted (from its window, or the window's
// adjustments once the window is closed; from its balance) and the new
// one added, both or neither (versions.go); with LedgerEntries, with the
// entries that explain it at the version's position (the retraction, the
// addition), so that the entries still sum to the sums.
//
// # Dead letters and overflow
//
// A record that cannot be decoded, a conflicting repeat, or an event whose
// amount would overflow a 64-bit sum becomes a dead_letters row committed
// in the same checkpoint as the offsets that passed it: it never blocks the
// partition and is never lost. Overflow is judged per event, in arrival
// order. Most keys are written as an adding upsert of the checkpoint's sum;
// a key whose running sum within the checkpoint leaves the range between 0
// and its final value is first read under a row lock and checked event by
// event (see aggregate). If the server still refuses a sum (error 1690),
// the checkpoint is retried once with every key read that way.
package pipeline
