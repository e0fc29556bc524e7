// Package ledgerstatus reads where a ledger stands, without changing
// anything: the positions stored per partition against the topic's log,
// the last committed checkpoint, the XA branches in doubt and the dead
// letters not re-injected, the commit log's position. `billing status`
// prints a [Report]; the metrics
// sampler (internal/metrics) exports the same quantities, computed by the
// same functions, so that the command and the dashboards always agree.
//
// Every statement here is a SELECT or XA RECOVER: an account with SELECT
// on the ledger's database (and, on MySQL 8, XA_RECOVER_ADMIN) can run
// them.
package ledgerstatus

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/billing/ledger/internal/deadletters"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Stored is a partition's row of partition_offsets.
type Stored struct {
	NextOffset int64 // txsink.StartOffset (-2): consume from the start of the log
	Owner      string
	Epoch      int64
	UpdatedAt  time.Time
}

// Positions reads partition_offsets for one group and topic. Partitions
// never claimed have no row.
func Positions(ctx context.Context, control *sql.DB, group, topic string) (map[int32]Stored, error) {
	rows, err := control.QueryContext(ctx, `SELECT kafka_partition, next_offset, owner, epoch, updated_at FROM partition_offsets
		WHERE consumer_group = ? AND kafka_topic = ?`, group, topic)
	if err != nil {
		return nil, fmt.Errorf("read partition_offsets: %w", err)
	}
	defer rows.Close()
	out := map[int32]Stored{}
	for rows.Next() {
		var p int32
		var s Stored
		var owner []byte
		if err := rows.Scan(&p, &s.NextOffset, &owner, &s.Epoch, &s.UpdatedAt); err != nil {
			return nil, fmt.Errorf("read partition_offsets: %w", err)
		}
		s.Owner = string(owner)
		out[p] = s
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read partition_offsets: %w", err)
	}
	return out, nil
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
	// Ledger is "this" when the branch qualifier carries this ledger's id
	// (ledger_identity), "other" when it does not, "" when the ledger's id
	// is not known (a schema without it).
	Ledger string `json:"ledger,omitempty"`
}

// Mine reports whether the branch may be this ledger's: it carries the
// ledger's id, or the id is unknown.
func (b Branch) Mine() bool { return b.Ledger != "other" }

// LedgerID returns the id of the ledger whose control server db is
// (ledger_identity.ledger_id), "" when the schema or the row does not have
// one yet. Each branch qualifier carries it.
func LedgerID(ctx context.Context, control *sql.DB) (string, error) {
	var id string
	err := control.QueryRowContext(ctx, `SELECT ledger_id FROM ledger_identity WHERE singleton = 1`).Scan(&id)
	switch {
	case errors.Is(err, sql.ErrNoRows), mysqldriver.NoSuchTable(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("read ledger_identity: %w", err)
	}
	return id, nil
}

// InDoubt lists the service's prepared branches on one server (server is
// its index, 0 = MYSQL_DSN), marking which are this ledger's when ledgerID
// (LedgerID) is known. Its data column is the gtrid followed by the bqual.
func InDoubt(ctx context.Context, db *sql.DB, server int, ledgerID string) ([]Branch, error) {
	rows, err := db.QueryContext(ctx, "XA RECOVER")
	if err != nil {
		return nil, fmt.Errorf("XA RECOVER on server %d: %w", server, err)
	}
	defer rows.Close()
	var out []Branch
	for rows.Next() {
		var format, glen, blen int64
		var data []byte
		if err := rows.Scan(&format, &glen, &blen, &data); err != nil {
			return nil, fmt.Errorf("XA RECOVER on server %d: %w", server, err)
		}
		if format != txsink.FormatID || glen < 0 || blen < 0 || int(glen+blen) > len(data) {
			continue
		}
		b := Branch{Server: server, Gtrid: string(data[:glen]), Bqual: string(data[glen : glen+blen])}
		if id, ok := txsink.ParseGlobalID(b.Gtrid); ok {
			b.Instance, b.Checkpoint, b.Created = id.Instance, id.Checkpoint, id.Created
		}
		if ledgerID != "" {
			b.Ledger = "other"
			if strings.Contains(b.Bqual, ledgerID) {
				b.Ledger = "this"
			}
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("XA RECOVER on server %d: %w", server, err)
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
func LastCommit(ctx context.Context, control *sql.DB) (*Decision, error) {
	var d Decision
	var gtrid, by []byte
	err := control.QueryRowContext(ctx, `SELECT gtrid, outcome, decided_by, decided_at FROM checkpoint_decisions
		WHERE outcome = 'commit' ORDER BY decided_at DESC LIMIT 1`).Scan(&gtrid, &d.Outcome, &by, &d.DecidedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint_decisions: %w", err)
	}
	d.Gtrid, d.DecidedBy = string(gtrid), string(by)
	return &d, nil
}

// DecisionOf returns the outcome decided for gtrid ("commit" or "abort"),
// or "" when none is recorded.
func DecisionOf(ctx context.Context, control *sql.DB, gtrid string) (string, error) {
	var o string
	err := control.QueryRowContext(ctx, `SELECT outcome FROM checkpoint_decisions WHERE gtrid = ?`, gtrid).Scan(&o)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read checkpoint_decisions: %w", err)
	}
	return o, nil
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
// error, for a schema without a commit log (before migration 00006).
func CommitLogOf(ctx context.Context, control *sql.DB) (*CommitLog, error) {
	p, err := mysqldriver.ReadCommitPosition(ctx, control)
	switch {
	case mysqldriver.NoSuchTable(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	c := &CommitLog{VisibleSeq: p.Visible, DecidedSeq: p.Decided, RetainedFrom: p.RetainedFrom}
	if !p.SealedBefore.IsZero() {
		t := p.SealedBefore.UTC()
		c.SealedBefore = &t
	}
	var oldestUS int64
	if err := control.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(MAX(TIMESTAMPDIFF(MICROSECOND, committed_at, UTC_TIMESTAMP(6))), 0)
		FROM checkpoint_commits WHERE applied_at IS NULL`).Scan(&c.Unapplied, &oldestUS); err != nil {
		return nil, fmt.Errorf("count the unapplied commit decisions: %w", err)
	}
	c.OldestUnappliedSeconds = max(float64(oldestUS)/1e6, 0)
	return c, nil
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
