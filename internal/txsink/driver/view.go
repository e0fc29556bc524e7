package driver

import (
	"context"
	"time"
)

// View is a read-only view of one ledger's servers: what the operator's
// tools (billing status, compare, periods show, the verifier) and the
// metrics sampler read of the control tables and of the servers' prepared
// branches. The tables are written only through Control (and the period
// settings by package periods); this is their one way back out, so that
// no tool keeps SQL of its own for them.
//
// Every method is one read (SELECT or XA RECOVER) and changes nothing: an
// account with SELECT on the ledger's database (and XA_RECOVER_ADMIN on
// MySQL 8) runs them all. A table the ledger's schema does not have yet
// (migrated by an older version) reads as nothing stored, not as an error.
type View interface {
	// Servers is the number of the ledger's servers, the control server
	// (0) first.
	Servers() int
	// Recover lists every prepared branch on server i, whichever account,
	// application or ledger prepared it (XA RECOVER).
	Recover(ctx context.Context, server int) ([]Xid, error)
	// Identity reads the ledger's identity; found is false when none is
	// stored (no instance has started on the ledger).
	Identity(ctx context.Context) (id string, secret []byte, found bool, err error)
	// Positions reads the stored position of every partition of the
	// scope that has one (partitions never claimed have none).
	Positions(ctx context.Context, s Scope) (map[int32]Position, error)
	// Scopes lists every group and topic with stored positions, ordered
	// by group then topic.
	Scopes(ctx context.Context) ([]ScopeRows, error)
	// LastCommit reads the newest commit decision kept (found is false
	// when none is: no checkpoint yet, or all older than the decisions'
	// retention).
	LastCommit(ctx context.Context) (d Decision, found bool, err error)
	// Lookup reads the decision of gtrid, if any (as Control.Lookup).
	Lookup(ctx context.Context, gtrid string) (Outcome, bool, error)
	// CommitLog reads where the commit log stands; found is false for a
	// ledger without one.
	CommitLog(ctx context.Context) (c CommitLogState, found bool, err error)
	// EventTime reads the frontier and every partition row of the scope,
	// as committed (as Control.EventTime).
	EventTime(ctx context.Context, s Scope) (Frontier, []Stored, error)
	// Periods reads the ledger's period definitions, in order (none: none
	// stored yet).
	Periods(ctx context.Context) ([]PeriodRow, error)
	// Changelog reads the ledger's changelog state (off, the zero value,
	// also for a ledger from before the changelog's migration).
	Changelog(ctx context.Context) (ChangelogState, error)
	// Layout reads the ledger's layout as stored on the control server:
	// the rows of its highest version, by ordinal (none: none stored yet).
	Layout(ctx context.Context) ([]LayoutRow, error)
	// ServerIdentity reads server i's own identity; found is false on a
	// schema without one (migrated by an older version).
	ServerIdentity(ctx context.Context, server int) (id ServerIdentity, found bool, err error)
}

// LayoutRow is one server's place in a version of the ledger's layout, as
// stored (package shards gives it meaning).
type LayoutRow struct {
	Version    int
	Ordinal    int // 0: the control server
	ServerUUID string
	RecordedAt time.Time
	RecordedBy string
}

// ServerIdentity is what a server's schema says of itself: its random
// UUID (generated when it was migrated) and the ledger that claimed it
// (empty: none yet).
type ServerIdentity struct {
	UUID   string
	Ledger string
}

// Position is a partition's stored row and when a claim or a commit
// decision last wrote it.
type Position struct {
	Stored
	UpdatedAt time.Time
}

// ScopeRows is a group and topic with stored positions, and how many
// partitions have one.
type ScopeRows struct {
	Scope
	Partitions int
}

// CommitLogState is the commit log's position with the decisions not yet
// applied: they hold Visible back until their coordinator or recovery
// marks them.
type CommitLogState struct {
	CommitPosition
	// Unapplied counts the commit decisions whose branches have not all
	// been seen committed, OldestUnapplied is the age of the oldest by the
	// control server's clock (0: none).
	Unapplied       int64
	OldestUnapplied time.Duration
}

// PeriodRow is one definition of the ledger's period settings, as stored
// (package periods gives it meaning).
type PeriodRow struct {
	Seq int
	// From is the first occurred_at the definition applies to; zero: from
	// the beginning.
	From       time.Time
	Window     string // BILLING_WINDOW's text: a duration, day or month
	Timezone   string
	Close      bool // windows close
	RecordedAt time.Time
	RecordedBy string
}
