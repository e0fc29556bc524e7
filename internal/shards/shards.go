package shards

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/billing/ledger/internal/placement"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Layout is the ledger's layout as stored: the servers' UUIDs in order,
// the control server first, and where keys are placed over them. The zero
// Layout is none stored.
type Layout struct {
	Version    int
	Servers    []string
	RecordedAt time.Time
	RecordedBy string
	// Placement places keys on the servers: the modulo placement of a
	// version without slots (version 1), else its slots
	// (ledger_placement). Read sets it; FromRows leaves it zero.
	Placement placement.Placement
	// Move is the state of the move to this version (zero: none was).
	Move mysqldriver.MoveState
}

// Moving says the rows of this version's moved slots are still being
// moved to it (billing shards add runs or was interrupted); no instance
// counts meanwhile.
func (l Layout) Moving() bool { return l.Move.State == mysqldriver.MoveMoving }

// FromRows gives a stored version's rows (by ordinal) their meaning, and
// refuses rows that are not one layout: ordinals other than 0..n-1, a
// server twice.
func FromRows(rows []driver.LayoutRow) (Layout, error) {
	if len(rows) == 0 {
		return Layout{}, nil
	}
	l := Layout{Version: rows[0].Version, RecordedAt: rows[0].RecordedAt, RecordedBy: rows[0].RecordedBy}
	for i, r := range rows {
		if r.Ordinal != i || r.Version != l.Version {
			return Layout{}, fmt.Errorf("ledger_layout version %d: ordinal %d where %d belongs", l.Version, r.Ordinal, i)
		}
		if j := slices.Index(l.Servers, r.ServerUUID); j >= 0 {
			return Layout{}, fmt.Errorf("ledger_layout version %d: server %s at ordinals %d and %d", l.Version, r.ServerUUID, j, i)
		}
		l.Servers = append(l.Servers, r.ServerUUID)
	}
	return l, nil
}

// Rows are what stores l.
func (l Layout) Rows() []driver.LayoutRow {
	out := make([]driver.LayoutRow, len(l.Servers))
	for i, u := range l.Servers {
		out[i] = driver.LayoutRow{Version: l.Version, Ordinal: i, ServerUUID: u, RecordedAt: l.RecordedAt, RecordedBy: l.RecordedBy}
	}
	return out
}

// Describe is l in one line: "version 1: 0 <uuid>, 1 <uuid>".
func (l Layout) Describe() string {
	if l.Version == 0 {
		return "none stored"
	}
	parts := make([]string, len(l.Servers))
	for i, u := range l.Servers {
		parts[i] = fmt.Sprintf("%d %s", i, u)
	}
	return fmt.Sprintf("version %d: %s", l.Version, strings.Join(parts, ", "))
}

// Server is one configured server as a start finds it.
type Server struct {
	// Host is the DSN's address, for messages (never the DSN).
	Host string
	// Identity is the server's ledger_server row; Found is false when it
	// has none.
	Identity driver.ServerIdentity
	Found    bool
	// Control: the server holds a ledger identity (ledger_identity), as
	// only a ledger's control server does.
	Control bool
}

func (s Server) name(i int) string { return fmt.Sprintf("server %d (%s)", i, s.Host) }

// Compare lists how the configured servers differ from the stored layout
// of the ledger whose identity is ledger (each a sentence; none: they
// agree). With no layout stored it lists what forbids storing the
// configured list as the ledger's: a server without an identity or listed
// twice, another ledger's server, a control server in a shard's place.
func Compare(ledger string, stored Layout, configured []Server) []string {
	var diffs []string
	seen := map[string]int{}
	for i, s := range configured {
		switch {
		case !s.Found:
			diffs = append(diffs, s.name(i)+" has no server identity (ledger_server): run billing migrate on it")
			continue
		case s.Identity.Ledger != "" && s.Identity.Ledger != ledger:
			diffs = append(diffs, fmt.Sprintf("%s belongs to another ledger (%s), not to this one (%s)", s.name(i), s.Identity.Ledger, ledger))
		case i > 0 && s.Control && stored.Version == 0:
			diffs = append(diffs, s.name(i)+" holds a ledger identity: it is a ledger's control server, which must come first (MYSQL_DSN)")
		}
		if j, ok := seen[s.Identity.UUID]; ok {
			diffs = append(diffs, fmt.Sprintf("%s is the same database as %s (server %s)", s.name(i), configured[j].name(j), s.Identity.UUID))
			continue
		}
		seen[s.Identity.UUID] = i
		if stored.Version == 0 {
			continue
		}
		switch j := slices.Index(stored.Servers, s.Identity.UUID); {
		case j < 0 && i >= len(stored.Servers) && !s.Control && (s.Identity.Ledger == "" || s.Identity.Ledger == ledger):
			// A server listed after the ledger's, to be added (billing
			// shards add): the instance places nothing on it until then.
		case j < 0:
			diffs = append(diffs, fmt.Sprintf("%s (server %s) is not one of the ledger's servers", s.name(i), s.Identity.UUID))
		case j != i:
			diffs = append(diffs, fmt.Sprintf("%s is the ledger's server %d: the list is in another order", s.name(i), j))
		}
	}
	for j, u := range stored.Servers {
		if _, ok := seen[u]; !ok {
			diffs = append(diffs, fmt.Sprintf("the ledger's server %d (server %s) is missing from the list: add its DSN to MYSQL_SHARD_DSNS, in the layout's place", j, u))
		}
	}
	return diffs
}

// Covers lists why an instance whose configured servers are uuids, in
// order, cannot place keys by the stored layout (none: it can): the
// layout's servers must come first, in its order; servers after them are
// the ones billing shards add will add.
func Covers(stored Layout, uuids []string) []string {
	var diffs []string
	for j, u := range stored.Servers {
		switch i := slices.Index(uuids, u); {
		case i < 0:
			diffs = append(diffs, fmt.Sprintf("the ledger's server %d (server %s) is not configured: add it to MYSQL_SHARD_DSNS, in the layout's place (the ledger grew by billing shards add)", j, u))
		case i != j:
			diffs = append(diffs, fmt.Sprintf("the ledger's server %d (server %s) is configured as server %d: the list is in another order", j, u, i))
		}
	}
	return diffs
}

// MismatchError refuses a configured list of servers that is not the
// ledger's layout (or, on a ledger with none stored yet, cannot be). The
// service exits with status 4 on it.
type MismatchError struct {
	Stored      Layout
	Differences []string
}

func (e *MismatchError) Error() string {
	var b strings.Builder
	b.WriteString("the configured servers (MYSQL_DSN, then MYSQL_SHARD_DSNS) are not the ledger's layout")
	if e.Stored.Version > 0 {
		fmt.Fprintf(&b, " (stored in ledger_layout, %s)", e.Stored.Describe())
	}
	b.WriteString(": ")
	b.WriteString(strings.Join(e.Differences, "; "))
	b.WriteString("; configure the ledger's servers in the ledger's order (billing shards status shows it; a server's identity survives a new password or host name); " +
		"a server is added to a ledger by billing shards add (docs/production.md, Growing)")
	return b.String()
}

// runsOf is a slot placement as runs of one owner (none: modulo).
func runsOf(p placement.Placement) []mysqldriver.PlacementRun {
	var out []mysqldriver.PlacementRun
	for s, o := range p.Owners() {
		if n := len(out); n > 0 && out[n-1].Ordinal == o && out[n-1].Last == s-1 {
			out[n-1].Last = s
			continue
		}
		out = append(out, mysqldriver.PlacementRun{First: s, Last: s, Ordinal: o})
	}
	return out
}

// placementOf is the placement of a version of servers servers stored as
// runs (none: modulo). The runs must cover the slots from 0 without a gap.
func placementOf(servers int, runs []mysqldriver.PlacementRun) (placement.Placement, error) {
	if len(runs) == 0 {
		return placement.Modulo(servers)
	}
	var owner []int
	for _, r := range runs {
		if r.First != len(owner) || r.Last < r.First {
			return placement.Placement{}, fmt.Errorf("ledger_placement: run [%d, %d] where slot %d belongs", r.First, r.Last, len(owner))
		}
		for range r.Last - r.First + 1 {
			owner = append(owner, r.Ordinal)
		}
	}
	return placement.FromSlots(servers, owner)
}
