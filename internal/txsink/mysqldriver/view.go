package mysqldriver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/txsink/driver"
)

// View is the read-only view of a ledger's servers (driver.View) over
// pools its caller opened and closes (OpenDB, or Driver.View). It reads
// with the same statements and parsing as the Control and Server that
// write: XA RECOVER is parsed by Server.Recover alone, the decisions and
// the commit position by Control's reads.
type View struct {
	servers []*Server
	control *Control
}

var _ driver.View = (*View)(nil)

// NewView is the view of the servers whose pools are dbs, the control
// server first.
func NewView(dbs ...*sqlx.DB) *View {
	v := &View{}
	for i, db := range dbs {
		v.servers = append(v.servers, &Server{index: i, db: db})
	}
	if len(v.servers) > 0 {
		v.control = &Control{sv: v.servers[0]}
	}
	return v
}

// View is the read-only view of d's servers, over d's pools.
func (d *Driver) View() *View { return &View{servers: d.servers, control: d.control} }

// Servers is the number of servers.
func (v *View) Servers() int { return len(v.servers) }

// Recover runs XA RECOVER on server i (Server.Recover).
func (v *View) Recover(ctx context.Context, i int) ([]driver.Xid, error) {
	if i < 0 || i >= len(v.servers) {
		return nil, fmt.Errorf("mysqldriver: no server %d", i)
	}
	return v.servers[i].Recover(ctx)
}

func (v *View) db() *sqlx.DB { return v.control.sv.db }

// Identity reads ledger_identity without creating it.
func (v *View) Identity(ctx context.Context) (string, []byte, bool, error) {
	var row struct {
		ID     string `db:"ledger_id"`
		Secret []byte `db:"secret"`
	}
	err := v.db().GetContext(ctx, &row, `SELECT ledger_id, secret FROM ledger_identity WHERE singleton = 1`)
	switch {
	case errors.Is(err, sql.ErrNoRows), NoSuchTable(err):
		return "", nil, false, nil
	case err != nil:
		return "", nil, false, fmt.Errorf("read ledger_identity: %w", err)
	}
	return row.ID, row.Secret, true, nil
}

// Positions reads the scope's partition_offsets rows.
func (v *View) Positions(ctx context.Context, s driver.Scope) (map[int32]driver.Position, error) {
	var rows []struct {
		storedRow
		UpdatedAt time.Time `db:"updated_at"`
	}
	err := v.db().SelectContext(ctx, &rows, `SELECT `+storedColumns+`, updated_at FROM partition_offsets
		WHERE consumer_group = ? AND kafka_topic = ?`, s.Group, s.Topic)
	if err != nil {
		return nil, fmt.Errorf("read partition_offsets: %w", err)
	}
	out := make(map[int32]driver.Position, len(rows))
	for _, r := range rows {
		out[r.Partition] = driver.Position{Stored: r.stored(), UpdatedAt: r.UpdatedAt.UTC()}
	}
	return out, nil
}

// Scopes counts the partition_offsets rows per group and topic.
func (v *View) Scopes(ctx context.Context) ([]driver.ScopeRows, error) {
	var rows []struct {
		Group string `db:"consumer_group"`
		Topic string `db:"kafka_topic"`
		N     int    `db:"n"`
	}
	err := v.db().SelectContext(ctx, &rows, `SELECT consumer_group, kafka_topic, COUNT(*) AS n FROM partition_offsets
		GROUP BY consumer_group, kafka_topic ORDER BY consumer_group, kafka_topic`)
	if err != nil {
		return nil, fmt.Errorf("read partition_offsets: %w", err)
	}
	out := make([]driver.ScopeRows, len(rows))
	for i, r := range rows {
		out[i] = driver.ScopeRows{Scope: driver.Scope{Group: r.Group, Topic: r.Topic}, Partitions: r.N}
	}
	return out, nil
}

// LastCommit reads the newest commit row of checkpoint_decisions.
func (v *View) LastCommit(ctx context.Context) (driver.Decision, bool, error) {
	var rows []struct {
		Gtrid   string    `db:"gtrid"`
		Outcome string    `db:"outcome"`
		By      string    `db:"decided_by"`
		At      time.Time `db:"decided_at"`
	}
	err := v.db().SelectContext(ctx, &rows, `SELECT gtrid, outcome, decided_by, decided_at FROM checkpoint_decisions
		WHERE outcome = 'commit' ORDER BY decided_at DESC LIMIT 1`)
	if err != nil {
		return driver.Decision{}, false, fmt.Errorf("read checkpoint_decisions: %w", err)
	}
	if len(rows) == 0 {
		return driver.Decision{}, false, nil
	}
	r := rows[0]
	return driver.Decision{Gtrid: r.Gtrid, Outcome: driver.Outcome(r.Outcome), By: r.By, At: r.At.UTC()}, true, nil
}

// Lookup reads the decision of gtrid (Control.Lookup).
func (v *View) Lookup(ctx context.Context, gtrid string) (driver.Outcome, bool, error) {
	o, found, err := v.control.Lookup(ctx, gtrid)
	if err != nil {
		return "", false, fmt.Errorf("read checkpoint_decisions: %w", err)
	}
	return o, found, nil
}

// CommitLog reads the commit position (CommitPositionQuery, the README's
// query) and counts the unapplied decisions: two statements, so the count
// may be of a moment later than the position.
func (v *View) CommitLog(ctx context.Context) (driver.CommitLogState, bool, error) {
	p, err := ReadCommitPosition(ctx, v.db())
	switch {
	case NoSuchTable(err): // before migration 00006
		return driver.CommitLogState{}, false, nil
	case err != nil:
		return driver.CommitLogState{}, false, err
	}
	c := driver.CommitLogState{CommitPosition: p}
	var oldestUS int64
	if err := v.db().QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(MAX(TIMESTAMPDIFF(MICROSECOND, committed_at, UTC_TIMESTAMP(6))), 0)
		FROM checkpoint_commits WHERE applied_at IS NULL`).Scan(&c.Unapplied, &oldestUS); err != nil {
		return driver.CommitLogState{}, false, fmt.Errorf("count the unapplied commit decisions: %w", err)
	}
	c.OldestUnapplied = max(time.Duration(oldestUS)*time.Microsecond, 0)
	return c, true, nil
}

// Changelog reads the changelog state (Control.Changelog); off on a
// ledger without the changelog's tables.
func (v *View) Changelog(ctx context.Context) (driver.ChangelogState, error) {
	st, err := readChangelog(ctx, v.db())
	if NoSuchTable(err) { // before migration 00007
		return driver.ChangelogState{}, nil
	}
	return st, err
}

// EventTime reads the frontier and the scope's rows (Control.EventTime).
func (v *View) EventTime(ctx context.Context, s driver.Scope) (driver.Frontier, []driver.Stored, error) {
	return v.control.EventTime(ctx, s)
}

// Periods reads ledger_periods (ReadPeriods).
func (v *View) Periods(ctx context.Context) ([]driver.PeriodRow, error) {
	return ReadPeriods(ctx, v.db(), false)
}
