package memdriver

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// viewState is what only the read-only view reads: when each partition row
// was last written, and the ledger's period definitions (written by
// package periods on MySQL, here by StorePeriods).
type viewState struct {
	updated map[driver.Scope]map[int32]time.Time
	periods []driver.PeriodRow
	// layout is every stored version's rows; identity is the server's own
	// (ledger_server on MySQL), none until SetServerIdentity.
	layout   []driver.LayoutRow
	identity *driver.ServerIdentity
}

// StoreLayout stores one layout version's rows, as package shards stores
// them on MySQL; false, storing nothing, when the version exists.
func (c *Cluster) StoreLayout(rows ...driver.LayoutRow) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range rows {
		if slices.ContainsFunc(c.view.layout, func(o driver.LayoutRow) bool { return o.Version == r.Version }) {
			return false
		}
	}
	c.view.layout = append(c.view.layout, rows...)
	return true
}

// SetServerIdentity gives the server its identity, as migration 00010
// does on MySQL.
func (c *Cluster) SetServerIdentity(uuid string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.view.identity = &driver.ServerIdentity{UUID: uuid}
}

// ClaimServer records ledger as the server's ledger unless one is.
func (c *Cluster) ClaimServer(ledger string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.view.identity != nil && c.view.identity.Ledger == "" {
		c.view.identity.Ledger = ledger
	}
}

// touchLocked records that a claim or a decision wrote the partition row at
// at (partition_offsets.updated_at).
func (c *Cluster) touchLocked(s driver.Scope, partition int32, at time.Time) {
	if c.view.updated == nil {
		c.view.updated = map[driver.Scope]map[int32]time.Time{}
	}
	if c.view.updated[s] == nil {
		c.view.updated[s] = map[int32]time.Time{}
	}
	c.view.updated[s][partition] = at.UTC()
}

// StorePeriods appends period definitions to the ledger's, as package
// periods stores them on MySQL (its first start, billing periods change).
func (c *Cluster) StorePeriods(rows ...driver.PeriodRow) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.view.periods = append(c.view.periods, rows...)
	slices.SortStableFunc(c.view.periods, func(a, b driver.PeriodRow) int { return cmp.Compare(a.Seq, b.Seq) })
}

// View is the read-only view (driver.View) of a ledger on in-memory
// servers, the control server first.
type View struct {
	servers []*Server
}

var _ driver.View = (*View)(nil)

// NewView is the view of a ledger on servers, the control server first.
func NewView(servers ...*Server) *View { return &View{servers: servers} }

func (v *View) control() *Cluster { return v.servers[0].c }

// Servers is the number of servers.
func (v *View) Servers() int { return len(v.servers) }

// Recover lists server i's prepared branches (Server.Recover).
func (v *View) Recover(ctx context.Context, i int) ([]driver.Xid, error) {
	if i < 0 || i >= len(v.servers) {
		return nil, fmt.Errorf("memdriver: no server %d", i)
	}
	return v.servers[i].Recover(ctx)
}

// Identity reads the ledger identity without creating it.
func (v *View) Identity(ctx context.Context) (string, []byte, bool, error) {
	c := v.control()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.identity == nil {
		return "", nil, false, nil
	}
	return c.identity.id, slices.Clone(c.identity.secret), true, nil
}

// Positions reads the scope's partition rows.
func (v *View) Positions(ctx context.Context, s driver.Scope) (map[int32]driver.Position, error) {
	c := v.control()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[int32]driver.Position{}
	for p, r := range c.partitions[s] {
		out[p] = driver.Position{Stored: r, UpdatedAt: c.view.updated[s][p]}
	}
	return out, nil
}

// Scopes counts the partition rows per group and topic.
func (v *View) Scopes(ctx context.Context) ([]driver.ScopeRows, error) {
	c := v.control()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []driver.ScopeRows
	for s, rows := range c.partitions {
		if len(rows) > 0 {
			out = append(out, driver.ScopeRows{Scope: s, Partitions: len(rows)})
		}
	}
	slices.SortFunc(out, func(a, b driver.ScopeRows) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Topic, b.Topic))
	})
	return out, nil
}

// LastCommit reads the newest commit decision.
func (v *View) LastCommit(ctx context.Context) (driver.Decision, bool, error) {
	c := v.control()
	c.mu.Lock()
	defer c.mu.Unlock()
	var last driver.Decision
	found := false
	for _, d := range c.decisions {
		if d.Outcome == driver.Committed && (!found || d.At.After(last.At)) {
			last, found = d, true
		}
	}
	return last, found, nil
}

// Lookup reads the decision of gtrid (Server.Lookup).
func (v *View) Lookup(ctx context.Context, gtrid string) (driver.Outcome, bool, error) {
	return v.servers[0].Lookup(ctx, gtrid)
}

// Changelog reads the changelog state (Server.Changelog).
func (v *View) Changelog(ctx context.Context) (driver.ChangelogState, error) {
	return v.servers[0].Changelog(ctx)
}

// CommitLog reads the commit position and the unapplied decisions.
func (v *View) CommitLog(ctx context.Context) (driver.CommitLogState, bool, error) {
	p, err := v.servers[0].CommitPosition(ctx)
	if err != nil {
		return driver.CommitLogState{}, false, err
	}
	c := v.control()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := driver.CommitLogState{CommitPosition: p}
	now := c.opts.Now().UTC()
	for _, r := range c.commits {
		if !r.applied {
			out.Unapplied++
			out.OldestUnapplied = max(out.OldestUnapplied, now.Sub(r.at))
		}
	}
	return out, true, nil
}

// EventTime reads the frontier and the scope's rows (Server.EventTime).
func (v *View) EventTime(ctx context.Context, s driver.Scope) (driver.Frontier, []driver.Stored, error) {
	return v.servers[0].EventTime(ctx, s)
}

// Periods reads the ledger's period definitions.
func (v *View) Periods(ctx context.Context) ([]driver.PeriodRow, error) {
	c := v.control()
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.view.periods), nil
}

// Layout reads the rows of the highest stored layout version, by ordinal.
func (v *View) Layout(ctx context.Context) ([]driver.LayoutRow, error) {
	c := v.control()
	c.mu.Lock()
	defer c.mu.Unlock()
	latest := 0
	for _, r := range c.view.layout {
		latest = max(latest, r.Version)
	}
	var out []driver.LayoutRow
	for _, r := range c.view.layout {
		if r.Version == latest {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b driver.LayoutRow) int { return cmp.Compare(a.Ordinal, b.Ordinal) })
	return out, nil
}

// ServerIdentity reads server i's own identity.
func (v *View) ServerIdentity(ctx context.Context, i int) (driver.ServerIdentity, bool, error) {
	if i < 0 || i >= len(v.servers) {
		return driver.ServerIdentity{}, false, fmt.Errorf("memdriver: no server %d", i)
	}
	c := v.servers[i].c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.view.identity == nil {
		return driver.ServerIdentity{}, false, nil
	}
	return *c.view.identity, true, nil
}
