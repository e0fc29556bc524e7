package txsink

import (
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The protocol's rules, as pure functions: no I/O, no clock. The Sink
// gathers their inputs from the servers and acts on their answers; the
// scenario files in testdata/ specify them by example.

// fence decides whether a checkpoint built by owner under the epochs of
// cuts may commit, given the partitions' rows as stored (locked) at the
// commit point: only if every cut's partition is stored, owned by owner, at
// the epoch the cut was built under. A claim by anyone since (a successor,
// or this very process restarted) raised the epoch, so a zombie's
// checkpoint can never commit after its partitions moved.
func fence(owner string, cuts []PartitionCut, stored []driver.Stored) error {
	byPartition := make(map[int32]driver.Stored, len(stored))
	for _, s := range stored {
		byPartition[s.Partition] = s
	}
	for _, c := range cuts {
		s, ok := byPartition[c.Partition]
		if !ok {
			return &FencedError{Partition: c.Partition, HeldEpoch: c.Epoch}
		}
		if s.Epoch != c.Epoch || s.Owner != owner {
			return &FencedError{Partition: c.Partition, HeldEpoch: c.Epoch, StoredEpoch: s.Epoch, StoredOwner: s.Owner}
		}
	}
	return nil
}

// frontierCheck decides whether a checkpoint that wrote open windows
// starting at openFrom and later (zero: none) may commit, given the
// ledger's frontier as stored (locked) at the commit point: only if none
// of those windows has been closed since the checkpoint read the frontier.
// A window closes when a commit decision raises Closed past its start;
// from then on its events belong in adjustments, and a checkpoint that
// still wrote to it as open must be replayed against the new frontier.
func frontierCheck(openFrom time.Time, stored driver.Frontier) error {
	if openFrom.IsZero() || !stored.Closed.After(openFrom) {
		return nil
	}
	return &FrontierMovedError{OpenFrom: openFrom, Closed: stored.Closed}
}

// step is what recovery does with one of the ledger's prepared branches.
type step int

const (
	// stepCommit: a commit decision exists; roll the branch forward.
	stepCommit step = iota
	// stepRollback: an abort decision exists; roll it back.
	stepRollback
	// stepAbort: undecided and old enough: insert an abort decision by
	// compare-and-set, then follow whichever decision holds.
	stepAbort
	// stepWait: undecided and young: its coordinator may still decide it.
	stepWait
)

func (s step) String() string {
	return [...]string{"commit", "rollback", "abort", "wait"}[s]
}

// recoveryStep is the rule for an in-doubt branch of age age, given the
// decision found for its checkpoint (decided false when there is none).
// The decision record alone says what happened; the absence of a branch
// from XA RECOVER is never taken as proof of anything. Waiting for young
// branches is for liveness only: a coordinator that comes late finds an
// abort decision and aborts.
func recoveryStep(decided bool, outcome driver.Outcome, age, minAge time.Duration) step {
	switch {
	case decided && outcome == driver.Committed:
		return stepCommit
	case decided:
		return stepRollback
	case age < minAge:
		return stepWait
	default:
		return stepAbort
	}
}

// killVerdict is the rule for ending the connection named in the
// qualifier of a branch that is still listed in XA RECOVER, old enough,
// and that the server refuses to resolve from elsewhere (on MariaDB: still
// attached to a live connection, its coordinator frozen or cut off). Only a
// connection that can be this branch's holder is ended:
//
//   - it exists and runs as this service's own account;
//   - the server has not restarted since the branch was created (after a
//     restart connection ids begin again at 1, and the branch is detached
//     anyway);
//   - where the server says so, it holds a transaction that began at least
//     minAge ago: a connection that is idle, or whose transaction is
//     younger than any checkpoint may live, is not holding this branch.
//
// It returns "" when the connection may be ended, or why not.
func killVerdict(s driver.Session, uptime, age, minAge time.Duration) string {
	switch {
	case age < minAge:
		return "branch younger than the minimum age"
	case !s.Exists:
		return "no such connection"
	case !s.OwnUser:
		return "connection of another account"
	case uptime < age:
		return "server restarted since the branch was created"
	case s.TxKnown && !s.InTx:
		return "connection holds no transaction"
	case s.TxKnown && s.TxAge < minAge:
		return "connection's transaction is younger than the minimum age"
	}
	return ""
}

// prunable is the rule for deleting a decision row: only once no branch of
// its checkpoint is in doubt on any server. remaining is the set of gtrids
// still in doubt after a recovery pass that reached every server.
func prunable(gtrid string, remaining map[string]bool) bool {
	return !remaining[gtrid]
}

// complete reports whether a recovery pass that left remaining in doubt
// listed every server (an unreachable server is a key starting with '?').
func complete(remaining map[string]bool) bool {
	for g := range remaining {
		if len(g) > 0 && g[0] == '?' {
			return false
		}
	}
	return true
}

// appliedAfter is the rule for marking commit decisions applied after a
// recovery pass: of unapplied, the commit decisions found not applied
// before the pass listed any server, those with no branch in doubt on any
// server (not in remaining), provided the pass listed every server.
//
// Absence from XA RECOVER is not proof of a commit in general (NOTES.md,
// trap 1: a branch may have been rolled back, or never prepared). Here it
// is, because of what a commit decision already proves:
//
//   - a coordinator decides commit only after XA PREPARE succeeded on every
//     branch that wrote (Txn.Prepare), so each branch was prepared, durably,
//     before the decision, hence before the commit log was read, hence
//     before the pass listed the servers;
//   - a prepared branch survives its connection and a server restart, and
//     leaves XA RECOVER only by XA COMMIT or XA ROLLBACK, and after it has
//     been committed or rolled back on the server;
//   - a branch of the ledger is rolled back only under an abort decision
//     that won, and the decision is one row per gtrid: this one says commit.
//
// So a branch of such a checkpoint that the listing does not show has
// committed, and its rows are visible to any later read. The order
// matters: a checkpoint decided after the commit log was read may have
// prepared a branch after that server was listed, which is why decisions
// found later are left to the next pass, and a pass that could not list a
// server marks nothing.
func appliedAfter(unapplied []string, remaining map[string]bool) []string {
	if !complete(remaining) {
		return nil
	}
	var out []string
	for _, g := range unapplied {
		if !remaining[g] {
			out = append(out, g)
		}
	}
	return out
}

// commitLogPruneBound is the rule for pruning the commit log: the highest
// sequence number through which it may be deleted (0: none), given the
// oldest records, in order, the visible position, and the first number a
// reader of the ledger still needs (0: none; the changelog's publisher
// needs every record above what Kafka holds, to find the checkpoints to
// publish and the outbox rows to delete). Only a prefix goes, so that the
// retained records stay one range and a reader can tell from the lowest
// retained number whether it missed any; only applied records below the
// visible position (the record at it keeps the sealed frontier the
// position reports), below what a reader needs, and only those older than
// retention by the control server's clock.
func commitLogPruneBound(oldest []driver.CommitRecord, visible, needed int64, retention time.Duration) int64 {
	var through int64
	for i, r := range oldest {
		if r.Seq >= visible || needed > 0 && r.Seq >= needed || !r.Applied || r.Age < retention || i > 0 && r.Seq != oldest[i-1].Seq+1 {
			break
		}
		through = r.Seq
	}
	return through
}
