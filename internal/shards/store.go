package shards

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Read returns the ledger's stored layout (the zero Layout: none) and what
// each of d's servers says of itself, hosts naming them (Host, index by
// index).
func Read(ctx context.Context, d *mysqldriver.Driver, hosts []string) (Layout, []Server, error) {
	rows, err := d.View().Layout(ctx)
	if err != nil {
		return Layout{}, nil, err
	}
	stored, err := FromRows(rows)
	if err != nil {
		return Layout{}, nil, err
	}
	if stored, err = withPlacement(ctx, d, stored); err != nil {
		return Layout{}, nil, err
	}
	servers := make([]Server, d.Len())
	for i := range servers {
		db := d.Server(i).DB()
		id, found, err := mysqldriver.ReadServerIdentity(ctx, db)
		if err != nil {
			return Layout{}, nil, fmt.Errorf("server %d: %w", i, err)
		}
		_, _, control, err := mysqldriver.NewView(db).Identity(ctx)
		if err != nil {
			return Layout{}, nil, fmt.Errorf("server %d: %w", i, err)
		}
		servers[i] = Server{Host: hosts[i], Identity: id, Found: found, Control: control}
	}
	return stored, servers, nil
}

// Ensure is the start of an instance on d's servers (named by hosts): it
// returns the ledger's identity and layout, storing d's list as the
// layout (and claiming every server for the ledger) when none is stored,
// and refuses (MismatchError) a list that differs from the stored one. It
// runs before anything else reads or writes the ledger: on a list whose
// first server is not the control server, the ledger's identity is not
// created there. newIdentity makes the identity of a new ledger; by names
// who stores (the instance).
func Ensure(ctx context.Context, d *mysqldriver.Driver, hosts []string, newIdentity func() (string, []byte), by string, log *slog.Logger) (string, Layout, error) {
	stored, servers, err := Read(ctx, d, hosts)
	if err != nil {
		return "", Layout{}, err
	}
	ledger, _, found, err := d.View().Identity(ctx)
	if err != nil {
		return "", Layout{}, err
	}
	if !found {
		// A new ledger, unless a server of the list belongs to one: then
		// the first is not its control server, and must not become one.
		if why := notTheControlServer(stored, servers); why != "" {
			return "", Layout{}, &MismatchError{Stored: stored, Differences: []string{why}}
		}
		if ledger, _, err = d.Control().Identity(ctx, newIdentity); err != nil {
			return "", Layout{}, fmt.Errorf("ledger identity: %w", err)
		}
	}
	if diffs := Compare(ledger, stored, servers); len(diffs) > 0 {
		return "", Layout{}, &MismatchError{Stored: stored, Differences: diffs}
	}
	if stored.Version > 0 {
		return ledger, stored, nil
	}
	// No layout stored: claim every server, then store the list. Of
	// instances doing so together, one layout wins and the others compare
	// with it, as every later start does.
	for i := range servers {
		if err := mysqldriver.ClaimServer(ctx, d.Server(i).DB(), ledger); err != nil {
			return "", Layout{}, fmt.Errorf("server %d: %w", i, err)
		}
	}
	first := Layout{Version: 1, RecordedAt: time.Now().UTC().Truncate(time.Microsecond), RecordedBy: by}
	for _, s := range servers {
		first.Servers = append(first.Servers, s.Identity.UUID)
	}
	added, err := mysqldriver.InsertLayout(ctx, d.Server(0).DB(), first.Rows())
	if err != nil {
		return "", Layout{}, err
	}
	if stored, servers, err = Read(ctx, d, hosts); err != nil {
		return "", Layout{}, err
	}
	if diffs := Compare(ledger, stored, servers); len(diffs) > 0 {
		return "", Layout{}, &MismatchError{Stored: stored, Differences: diffs}
	}
	switch {
	case added && found:
		// The ledger ran before its layout was stored: nothing recorded
		// which list it ran with, and rows cannot tell the order.
		log.Warn("stored the configured servers, in order, as the layout of a ledger that already existed: nothing recorded the list it ran with, so check it is this one (billing shards status)",
			"layout", stored.Describe())
	case added:
		log.Info("stored the ledger's layout: the configured servers, in order, are the ledger's from now on (billing shards status)", "layout", stored.Describe())
	}
	return ledger, stored, nil
}

// notTheControlServer says why the first of servers, which holds no ledger
// identity, is not a new ledger's control server but is listed where an
// existing ledger's belongs (empty: it may be a new ledger's).
func notTheControlServer(stored Layout, servers []Server) string {
	first := servers[0]
	if first.Identity.Ledger != "" || stored.Version > 0 {
		return fmt.Sprintf("%s is a shard server of ledger %s (it holds no ledger identity): the control server must come first (MYSQL_DSN)",
			first.name(0), first.Identity.Ledger)
	}
	for i, s := range servers[1:] {
		switch {
		case s.Control:
			return fmt.Sprintf("%s holds no ledger identity, and %s is a control server (it holds one): the control server must come first (MYSQL_DSN)",
				first.name(0), s.name(i+1))
		case s.Identity.Ledger != "":
			return fmt.Sprintf("%s holds no ledger identity, and %s belongs to ledger %s: its control server must come first (MYSQL_DSN)",
				first.name(0), s.name(i+1), s.Identity.Ledger)
		}
	}
	return ""
}

// Hosts are the addresses of dsns (Host).
func Hosts(dsns []string) []string {
	out := make([]string, len(dsns))
	for i, dsn := range dsns {
		out[i] = Host(dsn)
	}
	return out
}

// Host is the address of dsn, for messages: never its password.
func Host(dsn string) string {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "<unparseable DSN>"
	}
	if cfg.DBName != "" {
		return cfg.Addr + "/" + cfg.DBName
	}
	return cfg.Addr
}

// ReadVersion reads one stored layout version with its placement (the
// zero Layout: no such version).
func ReadVersion(ctx context.Context, d *mysqldriver.Driver, version int) (Layout, error) {
	rows, err := mysqldriver.ReadLayoutVersion(ctx, d.Server(0).DB(), version)
	if err != nil {
		return Layout{}, err
	}
	l, err := FromRows(rows)
	if err != nil {
		return Layout{}, err
	}
	return withPlacement(ctx, d, l)
}

// withPlacement reads the placement of a stored layout and the state of
// the move to it.
func withPlacement(ctx context.Context, d *mysqldriver.Driver, l Layout) (Layout, error) {
	if l.Version == 0 {
		return l, nil
	}
	db := d.Server(0).DB()
	runs, err := mysqldriver.ReadPlacement(ctx, db, l.Version)
	if err != nil {
		return Layout{}, err
	}
	if l.Placement, err = placementOf(len(l.Servers), runs); err != nil {
		return Layout{}, fmt.Errorf("layout version %d: %w", l.Version, err)
	}
	m, found, err := mysqldriver.ReadMove(ctx, db, l.Version)
	if err != nil {
		return Layout{}, err
	}
	if found {
		l.Move = m
	}
	return l, nil
}

// Verify says whether an instance whose configured servers are uuids can
// still place keys by the ledger's layout: a *MismatchError when a server
// it was not given was added since (the instance must stop: it cannot
// reach the rows moved there).
func Verify(ctx context.Context, d *mysqldriver.Driver, uuids []string) error {
	rows, err := d.View().Layout(ctx)
	if err != nil {
		return err
	}
	stored, err := FromRows(rows)
	if err != nil {
		return err
	}
	if diffs := Covers(stored, uuids); len(diffs) > 0 {
		return &MismatchError{Stored: stored, Differences: diffs}
	}
	return nil
}

// UUIDs are the configured servers' identities, in order.
func UUIDs(servers []Server) []string {
	out := make([]string, len(servers))
	for i, s := range servers {
		out[i] = s.Identity.UUID
	}
	return out
}
