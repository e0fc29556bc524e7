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
