// Package txsink is the exactly-once sink: it runs each checkpoint as one
// global XA transaction over several participants, decides it durably on a
// control server, and resolves whatever a crash leaves in doubt.
//
// # Specification
//
// The protocol's rules are pure functions (rules.go: fence, recoveryStep,
// killVerdict, prunable, appliedAfter, commitLogPruneBound), and its
// behaviour is specified by example in the
// scenario files of testdata/, one rule per file, run over in-memory
// servers in milliseconds (scenario_test.go):
//
//   - crash_at_each_step.txt: a checkpoint commits everywhere or nowhere,
//     whichever step its coordinator dies at;
//   - slow_coordinator.txt: recovery racing a slow or frozen coordinator;
//   - fencing.txt: zombies and concurrent claims;
//   - forged_and_foreign.txt: branches of other accounts and applications,
//     forged or replayed;
//   - shared_shard.txt: two ledgers sharing a server;
//   - restart.txt: a server restart;
//   - ambiguous_decision.txt: a decision whose COMMIT answer is lost;
//   - frontier.txt: watermarks written with the offsets, and the closing
//     frontier checked and raised by the decision;
//   - commit_log.txt: the commit log in commit order, applied marking
//     after a crash at each step, the visible position, pruning;
//   - changelog.txt: with the ledger's changelog on, decisions
//     of checkpoints built without it refused at the commit point, and the
//     commit log pruned only at or below what the changelog's publisher
//     recorded Kafka holds.
//
// # Servers
//
// The protocol runs on servers behind the narrow interfaces of package
// driver: a Server per participating MySQL server (branches on pinned
// connections, XA RECOVER, resolving an xid from elsewhere, sessions and
// KILL) and the Control bookkeeping of the control server (decisions by
// compare-and-set, partition epochs and positions, the closing frontier,
// the commit log, the ledger identity).
// mysqldriver implements them for MySQL 8.4 and MariaDB 10.11, memdriver in
// memory; drivertest holds both to one contract. The same connections
// carry the ledger's tables (driver.StoreTx): the pipeline writes them in
// a checkpoint's branches through Branch.Write and Branch.Read, which the
// protocol only counts (a branch that wrote nothing is rolled back, not
// prepared).
//
// # Participants and branches
//
// A participant is one connection slot on one server: Branches per server,
// servers in the order given to New (the first is the control server).
// Route places a key (an account id, an event id) on a participant by hash;
// the server depends only on the key and the number of servers. A
// checkpoint starts a branch on a participant the first time it uses it
// (Txn.Each), on a connection pinned to that participant for the branch's
// whole life. A connection that ended a branch cleanly is kept for the
// participant's next checkpoint; any other is dropped, so that no
// connection in an XA state is ever reused.
//
// # Protocol
//
//	Begin ─▶ Each (statements in branches, in parallel)
//	      ─▶ Prepare: XA END + XA PREPARE on every branch that wrote
//	                  (read-only branches are rolled back, not prepared)
//	      ─▶ Decide:  one local transaction on the control server: the
//	                  fence over the checkpoint's partitions (this instance
//	                  still holds each at the epoch the checkpoint was
//	                  built under), the new next offsets and watermarks,
//	                  optionally the closing frontier (checked, raised),
//	                  the move's cursor (checked: layout.go), the commit
//	                  decision, its commit log record
//	      ─▶ Commit:  XA COMMIT every prepared branch, then mark the record
//	                  applied
//	or    ─▶ Abort:   an abort decision for prepared branches, then XA ROLLBACK
//
// The decision row's primary key is the gtrid: whoever inserts first (the
// coordinator's commit, a recoverer's abort) decides, once. A prepared
// branch is rolled back only under an abort decision that won, and
// committed only under a commit decision. Offsets move only inside the
// commit decision's transaction, under the fence, so a checkpoint built by
// an instance that has since lost a partition can never commit, and a
// partition never moves forward without its results.
//
// With the offsets the decision writes each partition's watermark (event
// time, raised, never lowered) and whether it was caught up, and, when the
// pipeline closes windows, it checks and raises the ledger's closing
// frontier under the same transaction (FrontierChange, frontierCheck): a
// checkpoint that wrote to a window closed since it read the frontier is
// refused with ErrFrontierMoved. So event time is exactly as durable as the
// offsets, and the frontier moves only with a commit.
//
// An ambiguous COMMIT of the decision (the connection broke) is settled by
// a compare-and-set abort: it waits for the first transaction's locks and
// tells which won. If neither can be proven in time the error wraps
// ErrOutcomeUnknown, and the caller rereads its positions (Positions,
// which waits for the outcome) instead of guessing.
//
// While the ledger grows (a live move of rows to a new server, package
// shards), keys are placed by the move's cursor, and the decision reads
// the cursor under a shared lock that each step of the mover takes
// exclusively: a checkpoint that placed a key the cursor froze or passed
// since its Begin is refused (ErrLayoutMoved) and built again, so no
// checkpoint commits a row on a server the move has already read or will
// never read (layout.go; TestLayoutCheck, TestSinkFollowsALiveMove).
//
// # Commit log
//
// Readers of the result tables need a position that moves only forward in
// commit order; the rows' own times (updated_at, closed_at) are when a
// checkpoint attempt began, on its instance's clock, and a row becomes
// visible only at XA COMMIT, seconds or a recovery pass later. So every
// commit decision appends a record to the commit log (checkpoint_commits),
// inside the decision's transaction, numbered from a counter row that
// every decision locks last, after the partition rows and the frontier
// row, and holds until it commits: numbers are in commit order, with no
// gap (driver.Control.Commit). With it the record keeps the sealed
// frontier the decision left.
//
// A decision commits before its branches, so a record is applied only
// once every branch has committed: the coordinator marks it after its last
// XA COMMIT (best effort); Recover marks the commit decisions it found
// unapplied before listing the servers and of which no branch is left in
// doubt on any server (appliedAfter, which argues why absence from XA
// RECOVER proves the commit here); a checkpoint that prepared no branch is
// applied in its decision. The visible position (CommitPosition) is the
// largest number up to which every record is applied, read in one
// statement: a reader that reads the rows of checkpoints numbered up to it
// sees them all, and one that stores it and reads from there next time
// misses none and sees none twice. Records are pruned oldest first, only
// below the visible position and once older than a retention
// (PruneCommitLog, commitLogPruneBound), never above the changelog's
// published hint while the ledger's changelog is on; the lowest retained
// number tells a reader whether it fell behind.
//
// # The changelog's guard
//
// With the ledger's changelog on, every checkpoint's branches
// write its changes to an outbox, and the decision's UPDATE of the commit
// log's counter refuses a checkpoint of a sink built without the changelog
// (Config.Changelog, ErrChangelogOn): the enabling set the flag under that
// very lock, so every decision numbered from the enabling's "from" on
// wrote its changes.
//
// # Xids
//
// Gtrids and branch qualifiers are described with GlobalID and Qualifier.
// They are never reused, stay under 64 bytes, and carry the ledger's
// identity and a MAC under its secret: XA RECOVER lists every prepared
// branch on a server, other applications' and other ledgers' too, and any
// account can start a branch with any xid. Recovery touches only branches
// whose MAC proves them this ledger's.
//
// # Recovery
//
// Recover runs at start, before partitions are resumed, and periodically:
// recoveryStep says what to do with each of the ledger's branches in doubt
// (by the decision record, never by a branch's absence), and killVerdict
// whether the connection holding one may be ended (MariaDB keeps a prepared
// branch attached to the live connection that prepared it). Decision rows
// are pruned only once no branch of their checkpoint is in doubt on any
// server (prunable).
//
// # Failpoints
//
// The Fail* names mark every gap between two protocol steps; tests arm them
// (package failpoint) to kill the process exactly there.
package txsink
