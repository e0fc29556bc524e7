package driver

import (
	"errors"
	"time"

	"github.com/billing/ledger/internal/stmt"
)

// The changelog's part of the store (docs/changelog.md): the
// outbox a checkpoint's branches write (StoreTx.WriteOutbox), what the
// publisher reads and deletes of it and the snapshot's scans of the
// tables (Store), and the ledger's changelog state on the control server
// (Control).

// ErrChangelogOn refuses a commit decision of a checkpoint built without
// the changelog while the ledger's changelog is on (Decision.Changelog):
// its changes would be missing from the changelog.
var ErrChangelogOn = errors.New("driver: the ledger's changelog is on and this checkpoint did not write it")

// ChangelogState is the ledger's changelog as the control server keeps
// it; the zero value (On false) is off.
type ChangelogState struct {
	On     bool
	Prefix string
	// From is the first commit_seq whose checkpoint is guaranteed to have
	// written the outbox (decided after the changelog was enabled).
	From int64
	// Snapshot: rows decided before From may exist, so the publisher
	// snapshots the tables before their changes.
	Snapshot bool
	// Published is a hint of what Kafka holds: every checkpoint up to it
	// is published (From-1 at first). It only grows; Kafka's progress
	// topic is the truth.
	Published   int64
	PublishedAt time.Time
	// Publisher holds the lease until LeaseLeft from now (by the control
	// server's clock; not above zero: expired).
	Publisher string
	LeaseLeft time.Duration
	EnabledAt time.Time
}

// OutboxChunk is one row of changelog_outbox, without its body.
type OutboxChunk struct {
	Checkpoint  string
	Participant int
	Chunk       int
	Events      int
	Bytes       int // of the body
}

// EntryKey is the primary key of ledger_entries.
type EntryKey struct {
	Topic     string
	Partition int32
	Offset    int64
	Kind      EntryKind
}

// outboxRowText bounds the text of a one-row INSERT into changelog_outbox
// besides the body: the statement, a checkpoint id of 64 bytes escaped,
// three integers and an instant.
const outboxRowText = 640

// MaxOutboxBlob is the largest body one outbox row carries on a server
// whose statement budget is budget: a row of it alone stays within the
// budget, and no row exceeds 1 MiB (the publisher reads a few at a time).
func MaxOutboxBlob(budget int) int {
	return max(1, min(1<<20, stmt.FitText(budget-outboxRowText)))
}
