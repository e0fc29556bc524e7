package ledgerstatus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/billing/ledger/internal/deadletters"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Stored is a partition's stored position (partition_offsets).
type Stored = driver.Position

// Positions reads the stored positions of one group and topic. Partitions
// never claimed have none.
func Positions(ctx context.Context, v driver.View, group, topic string) (map[int32]Stored, error) {
	return v.Positions(ctx, driver.Scope{Group: group, Topic: topic})
}

// Lag is the number of records of a partition not yet committed to the
// ledger: the log's end (its last stable offset, what a read_committed
// consumer can reach) minus the stored next offset, or minus the log's
// start for a partition stored as txsink.StartOffset. Never negative.
func Lag(next, logStart, logEnd int64) int64 {
	if next == txsink.StartOffset {
		next = logStart
	}
	return max(logEnd-next, 0)
}

// LagOf computes Lag for each partition of pos from the listed end and
// start offsets of topic. starts is needed only for partitions stored as
// txsink.StartOffset. A partition whose offsets are missing is left out
// and reported in the error.
func LagOf(topic string, pos map[int32]int64, ends, starts kadm.ListedOffsets) (map[int32]int64, error) {
	lag := make(map[int32]int64, len(pos))
	var errs []error
	for p, next := range pos {
		end, ok := ends.Lookup(topic, p)
		if !ok || end.Err != nil {
			errs = append(errs, fmt.Errorf("partition %d: no end offset (%v)", p, end.Err))
			continue
		}
		var start int64
		if next == txsink.StartOffset {
			st, ok := starts.Lookup(topic, p)
			if !ok || st.Err != nil {
				errs = append(errs, fmt.Errorf("partition %d: no start offset (%v)", p, st.Err))
				continue
			}
			start = st.Offset
		}
		lag[p] = Lag(next, start, end.Offset)
	}
	return lag, errors.Join(errs...)
}

// Branch is a prepared XA branch of this service (format id
// txsink.FormatID) listed by XA RECOVER. XA RECOVER is server-wide: on a
// server that several ledgers share, their branches are all listed; Ledger
// tells them apart.
type Branch struct {
	Server     int       `json:"server"`
	Gtrid      string    `json:"gtrid"`
	Bqual      string    `json:"bqual"`
	Instance   string    `json:"instance,omitempty"` // from the gtrid
	Checkpoint uint64    `json:"checkpoint,omitempty"`
	Created    time.Time `json:"created"` // zero when the gtrid does not parse
	// Ledger is "this" when the branch's xid is this ledger's (its
	// identity with a valid MAC under the ledger's secret, as recovery
	// decides: txsink.Identity.Parse), "other" when it is not, "" when the
	// ledger's identity is not known (none stored yet).
	Ledger string `json:"ledger,omitempty"`
}

// Mine reports whether the branch may be this ledger's: its xid is, or
// the ledger's identity is unknown.
func (b Branch) Mine() bool { return b.Ledger != "other" }

// Identity reads the ledger's identity (ledger_identity), nil when none is
// stored yet. Each branch qualifier carries its id, and a MAC under its
// secret.
func Identity(ctx context.Context, v driver.View) (*txsink.Identity, error) {
	id, secret, found, err := v.Identity(ctx)
	if err != nil || !found {
		return nil, err
	}
	return &txsink.Identity{ID: id, Secret: secret}, nil
}

// InDoubt lists the service's prepared branches on server (its index, 0 =
// MYSQL_DSN), marking which are this ledger's when its identity (Identity)
// is known.
func InDoubt(ctx context.Context, v driver.View, server int, ledger *txsink.Identity) ([]Branch, error) {
	xids, err := v.Recover(ctx, server)
	if err != nil {
		return nil, fmt.Errorf("XA RECOVER on server %d: %w", server, err)
	}
	var out []Branch
	for _, x := range xids {
		if x.Format != txsink.FormatID {
			continue
		}
		b := Branch{Server: server, Gtrid: x.Gtrid, Bqual: x.Bqual}
		if id, ok := txsink.ParseGlobalID(b.Gtrid); ok {
			b.Instance, b.Checkpoint, b.Created = id.Instance, id.Checkpoint, id.Created
		}
		if ledger != nil {
			b.Ledger = "other"
			if _, _, ok := ledger.Parse(x); ok {
				b.Ledger = "this"
			}
		}
		out = append(out, b)
	}
	return out, nil
}

// Decision is a row of checkpoint_decisions.
type Decision struct {
	Gtrid     string    `json:"gtrid"`
	Outcome   string    `json:"outcome"`
	DecidedBy string    `json:"decided_by"`
	DecidedAt time.Time `json:"decided_at"`
}

// LastCommit returns the newest commit decision of the ledger, nil when
// there is none (no checkpoint yet, or all older than DECISION_RETENTION).
func LastCommit(ctx context.Context, v driver.View) (*Decision, error) {
	d, found, err := v.LastCommit(ctx)
	if err != nil || !found {
		return nil, err
	}
	return &Decision{Gtrid: d.Gtrid, Outcome: string(d.Outcome), DecidedBy: d.By, DecidedAt: d.At}, nil
}

// DecisionOf returns the outcome decided for gtrid ("commit" or "abort"),
// or "" when none is recorded.
func DecisionOf(ctx context.Context, v driver.View, gtrid string) (string, error) {
	o, _, err := v.Lookup(ctx, gtrid)
	return string(o), err
}

// CommitLog is where the commit log stands (see txsink's package
// documentation): readers of the result tables follow VisibleSeq.
type CommitLog struct {
	VisibleSeq   int64 `json:"visible_seq"`
	DecidedSeq   int64 `json:"decided_seq"`
	RetainedFrom int64 `json:"retained_from"`
	// Unapplied counts the commit decisions whose branches have not all
	// been seen committed: they hold VisibleSeq back until their
	// coordinator or recovery marks them.
	Unapplied int64 `json:"unapplied"`
	// OldestUnappliedSeconds is the age of the oldest of them by the
	// control server's clock (0: none).
	OldestUnappliedSeconds float64 `json:"oldest_unapplied_seconds"`
	// SealedBefore: every window starting before it is completely sealed
	// and visible; nil when none is.
	SealedBefore *time.Time `json:"sealed_before"`
}

// CommitLogOf reads the commit position (the query the README gives
// readers) and counts the unapplied decisions. It returns nil, and no
// error, for a ledger without a commit log (before migration 00006).
func CommitLogOf(ctx context.Context, v driver.View) (*CommitLog, error) {
	st, found, err := v.CommitLog(ctx)
	if err != nil || !found {
		return nil, err
	}
	c := &CommitLog{VisibleSeq: st.Visible, DecidedSeq: st.Decided, RetainedFrom: st.RetainedFrom,
		Unapplied: st.Unapplied, OldestUnappliedSeconds: max(st.OldestUnapplied.Seconds(), 0)}
	if !st.SealedBefore.IsZero() {
		t := st.SealedBefore.UTC()
		c.SealedBefore = &t
	}
	return c, nil
}

// Changelog is where the ledger's changelog stands (docs/changelog.md).
type Changelog struct {
	On     bool   `json:"on"`
	Prefix string `json:"prefix,omitempty"`
	// From is the first commit_seq the changelog carries as changes;
	// SnapshotPending: the rows decided before it are not yet all
	// published (as op r events).
	From            int64 `json:"from,omitempty"`
	SnapshotPending bool  `json:"snapshot_pending,omitempty"`
	// PublishedSeq is MySQL's hint of what Kafka holds (never ahead of it);
	// Behind the commit decisions after it (null when the commit log is
	// unknown), as the changelog_backlog_checkpoints metric counts them.
	PublishedSeq int64      `json:"published_seq"`
	PublishedAt  *time.Time `json:"published_at,omitempty"`
	Behind       *int64     `json:"behind,omitempty"`
	// Publisher holds the publisher's lease for LeaseLeftSeconds more
	// (not above 0: expired, the next instance to try takes it).
	Publisher        string  `json:"publisher,omitempty"`
	LeaseLeftSeconds float64 `json:"lease_left_seconds,omitempty"`
}

// ChangelogOf reads the changelog's state; cl (nil: unknown) gives how
// far behind it is.
func ChangelogOf(ctx context.Context, v driver.View, cl *CommitLog) (*Changelog, error) {
	st, err := v.Changelog(ctx)
	if err != nil || !st.On {
		return &Changelog{}, err
	}
	c := &Changelog{On: true, Prefix: st.Prefix, From: st.From, SnapshotPending: st.Snapshot, PublishedSeq: st.Published,
		Publisher: st.Publisher, LeaseLeftSeconds: st.LeaseLeft.Seconds()}
	if !st.PublishedAt.IsZero() {
		at := st.PublishedAt.UTC()
		c.PublishedAt = &at
	}
	if cl != nil {
		behind := max(cl.DecidedSeq-st.Published, 0)
		c.Behind = &behind
	}
	return c, nil
}

// Letters counts the dead letters not re-injected on each of the ledger's
// servers, by reason (a nil partitions counts every partition).
type Letters interface {
	Waiting(ctx context.Context, server int, topic string, partitions []int32) ([]Waiting, error)
}

// Counter counts one server's dead letters not re-injected
// (mysqldriver.Letters, memdriver's Server.Letters).
type Counter interface {
	Waiting(ctx context.Context, topic string, partitions []int32) ([]Waiting, error)
}

// ServerLetters counts them on each server, the control server first.
type ServerLetters []Counter

// Waiting counts the dead letters waiting on server i.
func (s ServerLetters) Waiting(ctx context.Context, i int, topic string, partitions []int32) ([]Waiting, error) {
	if i < 0 || i >= len(s) {
		return nil, fmt.Errorf("no server %d", i)
	}
	return s[i].Waiting(ctx, topic, partitions)
}

// Waiting is the number of dead letters of one reason not re-injected.
type Waiting = deadletters.Waiting

// MergeWaiting adds up the counts of several servers, by reason, sorted by
// reason.
func MergeWaiting(lists ...[]Waiting) []Waiting {
	by := map[string]Waiting{}
	for _, l := range lists {
		for _, w := range l {
			m, ok := by[w.Reason]
			if !ok || w.Oldest.Before(m.Oldest) {
				m.Oldest = w.Oldest
			}
			m.Reason = w.Reason
			m.Count += w.Count
			by[w.Reason] = m
		}
	}
	out := make([]Waiting, 0, len(by))
	for _, w := range by {
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b Waiting) int { return strings.Compare(a.Reason, b.Reason) })
	return out
}
