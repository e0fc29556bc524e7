// Package txsink is the exactly-once sink: it runs each checkpoint as one
// global XA transaction over several participants, decides it durably on a
// control server, and resolves whatever a crash leaves in doubt.
//
// # Specification
//
// The protocol's rules are pure functions (rules.go: fence, recoveryStep,
// killVerdict, prunable), and its behaviour is specified by example in the
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
//   - ambiguous_decision.txt: a decision whose COMMIT answer is lost.
//
// # Servers
//
// The protocol runs on servers behind the narrow interfaces of package
// driver: a Server per participating MySQL server (branches on pinned
// connections, XA RECOVER, resolving an xid from elsewhere, sessions and
// KILL) and the Control bookkeeping of the control server (decisions by
// compare-and-set, partition epochs and positions, the ledger identity).
// mysqldriver implements them for MySQL 8.4 and MariaDB 10.11, memdriver in
// memory; drivertest holds both to one contract.
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
//	                  built under), the new next offsets, the commit
//	                  decision
//	      ─▶ Commit:  XA COMMIT every prepared branch
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
// An ambiguous COMMIT of the decision (the connection broke) is settled by
// a compare-and-set abort: it waits for the first transaction's locks and
// tells which won. If neither can be proven in time the error wraps
// ErrOutcomeUnknown, and the caller rereads its positions (Positions,
// which waits for the outcome) instead of guessing.
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
