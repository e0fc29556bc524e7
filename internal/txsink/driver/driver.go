// Package driver is the contract between the service and the servers it
// runs on: what the exactly-once protocol (package txsink) needs from an XA
// resource manager (Server, Conn) and from the control server's bookkeeping
// (Control), and what the pipeline reads and writes in the ledger's tables
// (the store: StoreTx in a checkpoint's branches, Store on a server's
// pools; ledger.go). The store lives beside the protocol rather than in a
// package of its own because its writes run inside the protocol's
// branches, on the connections the protocol pins: a Conn carries both,
// one implementation serves both, and one conformance suite holds both.
//
// Implementations:
//
//   - txsink/mysqldriver: MySQL 8.4 and MariaDB 10.11, where every server
//     quirk and every statement lives (MariaDB's prepared branches attached
//     to their connection, XAER_NOTA, error numbers, prepared statements,
//     the SQL of every table);
//   - txsink/memdriver: in memory, faithful to the same contract (row
//     locks, visibility, overflow, statement sizes), for tests of the
//     protocol and the pipeline that run in milliseconds without servers.
//
// Both pass the conformance suite in txsink/drivertest, so the in-memory
// implementation cannot drift from the real servers.
package driver

import (
	"context"
	"errors"
	"time"
)

// Xid names an XA branch: global transaction id, branch qualifier (each at
// most 64 bytes) and format id.
type Xid struct {
	Format uint32
	Gtrid  string
	Bqual  string
}

// Verb is an XA statement run on a branch's own connection.
type Verb string

// The verbs, in the order of a branch's life.
const (
	Start    Verb = "START"
	End      Verb = "END"
	Prepare  Verb = "PREPARE"
	Commit   Verb = "COMMIT"
	Rollback Verb = "ROLLBACK"
)

// Server is one XA resource manager (a MySQL server).
type Server interface {
	// Conn opens a connection that carries one branch at a time.
	Conn(ctx context.Context) (Conn, error)
	// Recover lists every prepared branch on the server, whichever account
	// or application prepared it (XA RECOVER).
	Recover(ctx context.Context) ([]Xid, error)
	// Resolve commits (commit true) or rolls back a prepared branch from a
	// connection of its own. An error with code UnknownXid means no
	// prepared branch by that xid can be resolved from there: it was
	// resolved already, or it is attached to the live connection that
	// prepared it (see AttachesPrepared).
	Resolve(ctx context.Context, x Xid, commit bool) error
	// Session describes the server connection id as far as this account
	// can see it.
	Session(ctx context.Context, id uint64) (Session, error)
	// Kill ends a connection (its unprepared transaction rolls back, its
	// prepared branch stays prepared and is detached).
	Kill(ctx context.Context, id uint64) error
	// Uptime is how long the server has run: connection ids start again
	// from 1 when it starts.
	Uptime(ctx context.Context) (time.Duration, error)
	// MaxStatementBytes bounds one statement's text on this server.
	MaxStatementBytes() int
	// Code classifies an error this server or its connections returned.
	Code(err error) Code
}

// Session is what a server says of one of its connections.
type Session struct {
	// Exists: the connection is open (and visible to this account).
	Exists bool
	// OwnUser: it runs as the account this driver connects with.
	OwnUser bool
	// TxKnown: the server says whether the connection holds a transaction
	// (it may need a privilege to). InTx is then whether it holds one, and
	// TxAge how long ago that transaction started (by the server's clock).
	TxKnown bool
	InTx    bool
	TxAge   time.Duration
}

// Conn is a connection pinned to one branch at a time.
type Conn interface {
	// ID is the server's id of the connection.
	ID() uint64
	// XA runs an XA statement for x on this connection.
	XA(ctx context.Context, verb Verb, x Xid) error
	// Close gives the connection back: reusable when its last branch ended
	// cleanly, else it is dropped, which rolls back a branch not yet
	// prepared and leaves a prepared one prepared.
	Close(reusable bool)
	// Store is the ledger's tables in the branch the connection holds
	// (ledger.go).
	Store() StoreTx
}

// Outcome is a checkpoint's decision.
type Outcome string

// The two outcomes.
const (
	Committed Outcome = "commit"
	Aborted   Outcome = "abort"
)

// Decision is one row of the decision table: the outcome of a checkpoint,
// by its gtrid, inserted at most once.
type Decision struct {
	Gtrid   string
	Outcome Outcome
	By      string // the instance that decided
	At      time.Time
	// Changelog: a commit decision of a checkpoint built with the
	// changelog on (its branches wrote their changes to the outbox).
	// Commit refuses one without it while the ledger's changelog is on
	// (ErrChangelogOn).
	Changelog bool
}

// Scope names whose positions are stored: a consumer group on a topic.
type Scope struct {
	Group, Topic string
}

// Stored is a partition's stored position and owner, and its event time.
type Stored struct {
	Partition  int32
	NextOffset int64
	Epoch      int64
	Owner      string
	// Watermark is the latest event time of the records below NextOffset
	// (zero: none yet); CaughtUp says NextOffset had reached the end of
	// the partition's log when it was written.
	Watermark time.Time
	CaughtUp  bool
}

// Cut is a partition's new position, written by a commit decision, with
// its event time: the stored watermark is raised to Watermark (it never
// goes back; zero leaves it), CaughtUp replaces the stored flag.
type Cut struct {
	Partition  int32
	NextOffset int64
	Watermark  time.Time
	CaughtUp   bool
}

// Frontier is the ledger's closing frontier, one per ledger on the control
// server: windows starting before Closed are closed, those starting before
// Sealed are sealed (see package pipeline). Zero instants mean none. Both
// only grow, and only through commit decisions.
type Frontier struct {
	Closed, Sealed time.Time
}

// FrontierChange is what a commit decision does with the frontier: Check
// is given the stored frontier, read under the decision's lock, and may
// refuse the commit; then each instant of the stored frontier is raised to
// Raise's (never lowered).
type FrontierChange struct {
	Check func(Frontier) error
	Raise Frontier
}

// CommitRecord is one row of the commit log: a commit decision, numbered
// in the order the decisions committed (Seq, from 1, without gaps), with
// whether every branch of its checkpoint has committed (Applied).
type CommitRecord struct {
	Seq   int64
	Gtrid string
	// CommittedAt is the control server's clock at the decision; Age is
	// the time since then by that same clock, when the record was read.
	CommittedAt time.Time
	Age         time.Duration
	Applied     bool
	// SealedBefore is the frontier's Sealed instant after the decision
	// (zero: the decision did not lock the frontier, or nothing is sealed).
	SealedBefore time.Time
}

// CommitPosition is where the commit log stands, read in one snapshot.
type CommitPosition struct {
	// Visible is the largest s such that every commit decision numbered s
	// or less is applied (0: none). It only grows.
	Visible int64
	// Decided is the last sequence number allocated (0: none).
	Decided int64
	// RetainedFrom is the lowest sequence number still in the log
	// (Decided+1 when the log is empty): the records below it were pruned.
	RetainedFrom int64
	// SealedBefore is the Sealed frontier recorded by decision Visible
	// (zero: none): every window starting before it is sealed, and every
	// write to it applied.
	SealedBefore time.Time
}

// Control is the control server's bookkeeping. Each method is one local
// transaction.
type Control interface {
	// Identity returns the ledger's identity, creating it with new the
	// first time: every caller, concurrent or later, gets the same.
	Identity(ctx context.Context, new func() (id string, secret []byte)) (id string, secret []byte, err error)
	// Decide inserts d unless a decision for d.Gtrid exists, and returns
	// the outcome that holds.
	Decide(ctx context.Context, d Decision) (Outcome, error)
	// Lookup returns the decision for gtrid, if any.
	Lookup(ctx context.Context, gtrid string) (Outcome, bool, error)
	// Commit is the commit point. It locks the rows of the cuts'
	// partitions, passes them (every one it found) to fence, and unless
	// fence refuses, writes the cuts (next offsets and event time; owner
	// and epoch unchanged) and inserts d; all or nothing. With a frontier
	// change (nil: the frontier is neither read nor locked), the frontier
	// is then locked and passed to its Check, and raised unless Check
	// refuses. With keys (nil: the checkpoint claimed no dedup key), the
	// generations' state is then read under a shared lock, held to the
	// COMMIT, and the decision refused with ErrKeysMoved unless *keys is
	// still the current generation: no decision commits keys claimed under
	// a generation after RotateKeys moved on from it. Then the move's
	// cursor (MoveCursor) is read under a shared lock, held to the
	// COMMIT, and passed to layout, whose error refuses the decision: no
	// decision commits between a step's freeze and its end unless layout
	// allows it. Last, it locks the commit log's counter and appends the
	// decision to the commit log under the next sequence number, applied
	// at once when applied is true (no branch was prepared), and returns
	// that number. Every commit decision takes the counter last and holds
	// it until it commits, so sequence numbers are in commit order: once
	// a reader sees number s, every smaller one has committed. It returns
	// fence's or Check's error, ErrKeysMoved, ErrDecided when a decision
	// for d.Gtrid exists, ErrChangelogOn when the ledger's changelog is on
	// and d.Changelog is not, or an error wrapping ErrAmbiguous when the
	// outcome of the transaction's COMMIT is unknown.
	Commit(ctx context.Context, d Decision, s Scope, cuts []Cut, fence func([]Stored) error, f *FrontierChange, keys *Generation, layout func(MoveCursor) error, applied bool) (int64, error)
	// MoveCursor reads the live move's cursor as committed (no lock).
	MoveCursor(ctx context.Context) (MoveCursor, error)
	// AwaitStep records that instance waits for the step cur announces,
	// with no checkpoint in flight (the mover freezes once each instance
	// counting has said so); a cur that announces none records
	// that the instance stopped: it waits for every step.
	AwaitStep(ctx context.Context, instance string, cur MoveCursor) error
	// MarkApplied records that every branch of the checkpoints of gtrids
	// has committed (those already applied, or not in the log, are left).
	MarkApplied(ctx context.Context, gtrids []string) (int64, error)
	// Commits lists up to limit records of the commit log from sequence
	// number from on (only those not applied, with unapplied), in order.
	Commits(ctx context.Context, from int64, unapplied bool, limit int) ([]CommitRecord, error)
	// CommitPosition reads the commit log's position in one snapshot.
	CommitPosition(ctx context.Context) (CommitPosition, error)
	// ForgetCommits deletes the records numbered through and below.
	ForgetCommits(ctx context.Context, through int64) (int64, error)
	// EventTime reads the frontier and every partition row of the scope,
	// as committed (no locks).
	EventTime(ctx context.Context, s Scope) (Frontier, []Stored, error)
	// Claim raises each partition's epoch (creating its row at epoch 1,
	// next offset StartOffset), records owner, and returns the rows.
	Claim(ctx context.Context, s Scope, owner string, partitions []int32, at time.Time) (map[int32]Stored, error)
	// Positions reads the partitions' rows, waiting for any commit decision
	// in progress on them.
	Positions(ctx context.Context, s Scope, partitions []int32) (map[int32]Stored, error)
	// Groups lists the groups with positions stored for topic.
	Groups(ctx context.Context, topic string) ([]string, error)
	// Decided lists up to limit gtrids decided before.
	Decided(ctx context.Context, before time.Time, limit int) ([]string, error)
	// Forget deletes the decisions of gtrids.
	Forget(ctx context.Context, gtrids []string) (int64, error)

	// KeyGenerations reads the generations of dedup keys, as committed,
	// with the control server's clock (KeyGenerations.Now).
	KeyGenerations(ctx context.Context) (KeyGenerations, error)
	// RegisterKeyLifetime raises the registered key lifetime to d (it
	// never lowers it).
	RegisterKeyLifetime(ctx context.Context, d time.Duration) error
	// RotateKeys makes generation from+1 current, if from still is and
	// every generation up to from+1-KeyTables has been emptied (its table
	// is from+1's), recording Since from the control server's clock once
	// the state is locked (every decision under from has committed) and
	// PreviousSince from the old Since. It never waits for a lock: a state
	// another transaction holds (a decision, an emptying) makes it report
	// false, as does a state that moved on; the caller tries again later.
	RotateKeys(ctx context.Context, from Generation) (bool, error)
	// HoldKeyGenerations runs fn with the generations' state, read under a
	// shared lock held until fn returns: meanwhile no RotateKeys or
	// MarkKeysEmptied succeeds (commit decisions go on), so the tables fn
	// empties cannot be taken by a newer generation while it does.
	HoldKeyGenerations(ctx context.Context, fn func(KeyGenerations) error) error
	// MarkKeysEmptied records that generation g's table was emptied, if g
	// follows Emptied; like RotateKeys it never waits for a lock and
	// reports false when it changed nothing.
	MarkKeysEmptied(ctx context.Context, g Generation) (bool, error)

	// Changelog reads the ledger's changelog state (off: the zero value).
	Changelog(ctx context.Context) (ChangelogState, error)
	// EnableChangelog turns the ledger's changelog on with prefix unless
	// it is on, and returns the state that holds (whose prefix may be
	// another). Enabling takes the commit log's counter: From is the next
	// number, and every later commit decision must carry Changelog.
	EnableChangelog(ctx context.Context, prefix string, at time.Time) (ChangelogState, error)
	// SkipChangelogSnapshot records that the ledger held no row decided
	// before from (the enabling of that From): no snapshot is needed.
	SkipChangelogSnapshot(ctx context.Context, from int64) error
	// DisableChangelog turns the ledger's changelog off.
	DisableChangelog(ctx context.Context) error
	// LeaseChangelog takes or renews the publisher's lease for owner, for
	// ttl by the control server's clock, unless another owner holds an
	// unexpired one; it reports whether owner holds it. ttl 0 releases
	// owner's lease.
	LeaseChangelog(ctx context.Context, owner string, ttl time.Duration) (bool, error)
	// ChangelogPublished raises the published hint to seq (never lowers it).
	ChangelogPublished(ctx context.Context, seq int64) error
}

// StartOffset is the next offset of a partition never checkpointed: its
// consumption starts at the beginning of the log.
const StartOffset = -2

// Code classifies errors so that the protocol and the pipeline react alike
// on every server.
type Code int

// The codes.
const (
	// Unknown: anything else (a bug, a timeout of the caller's context).
	Unknown Code = iota
	// UnknownXid: no prepared branch by that xid can be resolved here
	// (XAER_NOTA).
	UnknownXid
	// DuplicateXid: a branch by that xid exists already (XAER_DUPID).
	DuplicateXid
	// Transient: retrying later may succeed (lock wait, deadlock, lost
	// connection, server restarting, too many connections).
	Transient
	// TooLarge: a statement exceeded the server's packet limit.
	TooLarge
	// Overflow: a value exceeded its column's range (a BIGINT sum).
	Overflow
	// Duplicate: a unique key was violated.
	Duplicate
	// Data: the server refused the data itself (a constraint, a value it
	// cannot store); retrying the same data fails again.
	Data
)

var codeNames = [...]string{"unknown", "unknown_xid", "duplicate_xid", "transient", "too_large", "overflow", "duplicate", "data"}

func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return "invalid"
}

var (
	// ErrDecided: a decision for the gtrid exists already.
	ErrDecided = errors.New("driver: checkpoint already decided")
	// ErrAmbiguous: a COMMIT was sent and its outcome is unknown (the
	// connection broke).
	ErrAmbiguous = errors.New("driver: outcome of COMMIT unknown")
)

// CodedError is an error with a code, for drivers whose errors carry none
// of their own (the in-memory one).
type CodedError struct {
	Code Code
	Msg  string
}

func (e *CodedError) Error() string { return e.Msg + " (" + e.Code.String() + ")" }
