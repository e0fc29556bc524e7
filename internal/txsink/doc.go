// Package txsink is the exactly-once sink: it runs each checkpoint as one
// global XA transaction over several MySQL participants, decides it durably
// on a control server, and resolves whatever a crash leaves in doubt.
//
// # Participants and branches
//
// A participant is one connection slot on one server: Branches per server,
// servers in the order of their DSNs (the first is the control server).
// Route places a key (an account id, an event id) on a participant by hash;
// the server depends only on the key and the number of servers. A checkpoint
// starts a branch on a participant the first time it uses it (Txn.Each), on
// a connection pinned to that participant for the branch's whole life (XA
// statements go as plain text; go-sql-driver/mysql has no XA API). A
// connection that ended a branch cleanly is kept for the participant's next
// checkpoint; any other is discarded, so no connection in an XA state is
// ever reused.
//
// # Protocol
//
//	Begin ─▶ Each (statements in branches, in parallel)
//	      ─▶ Prepare: XA END + XA PREPARE on every branch that wrote
//	                  (read-only branches are rolled back, not prepared)
//	      ─▶ Decide:  one local transaction on the control server:
//	                  lock the checkpoint's partition rows, check that this
//	                  instance still holds each at the epoch the checkpoint
//	                  was built under (fencing), write the new next offsets,
//	                  INSERT the commit decision
//	      ─▶ Commit:  XA COMMIT every prepared branch
//	or    ─▶ Abort:   an abort decision for prepared branches, then XA ROLLBACK
//
// The decision row's primary key is the gtrid: whoever inserts first (the
// coordinator's commit, a recoverer's abort) decides, once. A prepared
// branch is rolled back only under an abort decision that won, and committed
// only under a commit decision. Offsets move only inside the commit
// decision's transaction, under the epoch check, so a checkpoint built by an
// instance that has since lost a partition can never commit, and a partition
// never moves forward without its results.
//
// An ambiguous COMMIT of the decision (the connection broke) is settled by
// a compare-and-set abort: it waits for the first transaction's locks and
// tells which won. If neither can be proven in time the error wraps
// ErrOutcomeUnknown, and the caller rereads its positions (Positions, with a
// shared lock that waits for the outcome) instead of guessing.
//
// # Xids
//
// gtrid = "blg1-<instance>-<checkpoint>-<created>" (instance random per
// Open, checkpoint a counter per attempt, created in Unix milliseconds, all
// lower hex); bqual = "p<participant>-c<connection id>-s<scope>"; formatID
// "blg". They are never reused, stay under 64 bytes, and parse back from XA
// RECOVER, which lists every prepared branch on a server, other
// applications' too, and other ledgers' of this very service. The scope, a
// hash of the control database's name, keeps recovery to the branches whose
// decisions it can read: another ledger's branch, decided commit in that
// ledger's database, would look undecided here and be rolled back.
//
// # Recovery
//
// Recover runs at start, before partitions are resumed, and periodically.
// For each of this service's branches in XA RECOVER: a commit decision rolls
// it forward, an abort decision rolls it back, and an undecided branch older
// than the minimum age (CHECKPOINT_TIMEOUT) gets an abort decision by
// compare-and-set, then follows whichever decision won. Younger undecided
// branches are left to their coordinator (liveness only: a late coordinator
// finds the abort and aborts). A branch's absence from XA RECOVER is never
// taken as proof of anything.
//
// On MariaDB a prepared branch stays attached to the connection that
// prepared it while that connection lives, and XA COMMIT or ROLLBACK from any
// other connection answer XAER_NOTA. A frozen or cut-off coordinator would
// keep its branches, and their row locks, forever; so for a listed branch
// that answers XAER_NOTA and is older than the minimum age, recovery ends
// the holding connection (its id is in the bqual; the service's own user may
// kill its own connections) and resolves the branch on the next pass. MySQL
// 8.4 detaches prepared branches by default and never needs this.
//
// Decision rows are pruned (PruneDecisions) only when older than the
// retention and no branch of their checkpoint is in doubt on any server.
//
// # Failpoints
//
// The Fail* names mark every gap between two protocol steps; tests arm them
// (package failpoint) to kill the process exactly there.
package txsink
