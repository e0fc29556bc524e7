package shards

import (
	"context"
	"fmt"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Report is what billing shards status shows: the stored layout, the
// configured servers as they identify themselves, how they differ from
// the layout, and what is moving (nothing, until moves exist).
type Report struct {
	// Version is the stored layout's (0: none stored yet: no instance of
	// this version has started on the ledger).
	Version    int       `json:"layout_version"`
	RecordedAt time.Time `json:"recorded_at,omitzero"`
	RecordedBy string    `json:"recorded_by,omitempty"`
	// Layout is the stored layout's servers, by ordinal.
	Layout []string `json:"layout"`
	// Servers are the configured servers, in the configured order.
	Servers []ServerReport `json:"servers"`
	// Differences: how the configured list differs from the layout (an
	// instance configured so refuses to start); none: it is the layout.
	Differences []string `json:"differences"`
	Moving      string   `json:"moving"`
	// Cursor is the live move's (driver.MoveCursor): MovedBelow,
	// FrozenBelow and AnnouncedBelow as Go-quoted keys.
	Cursor CursorReport `json:"move_cursor"`
}

// CursorReport is the live move's cursor, for status.
type CursorReport struct {
	Version     int    `json:"version"`
	Moving      bool   `json:"moving"`
	MovedBelow  string `json:"moved_below,omitempty"`
	FrozenBelow string `json:"frozen_below,omitempty"`
	// AnnouncedBelow: a step announced, not yet frozen (its drain).
	AnnouncedBelow string `json:"announced_below,omitempty"`
	Mover          string `json:"mover,omitempty"`
}

// ServerReport is one configured server.
type ServerReport struct {
	Place int    `json:"place"`
	Host  string `json:"host"`
	UUID  string `json:"server_uuid"`
	// Ordinal is the server's ordinal in the stored layout (-1: not in it).
	Ordinal int                     `json:"ordinal"`
	Ledger  string                  `json:"ledger_id"`
	Tables  []mysqldriver.TableRows `json:"tables"`
}

// Status reads the report of d's servers (named by hosts). It reads only.
func Status(ctx context.Context, d *mysqldriver.Driver, hosts []string) (*Report, error) {
	stored, servers, err := Read(ctx, d, hosts)
	if err != nil {
		return nil, err
	}
	ledger, _, _, err := d.View().Identity(ctx)
	if err != nil {
		return nil, err
	}
	cur, err := d.Control().MoveCursor(ctx)
	if err != nil {
		return nil, err
	}
	r := &Report{Version: stored.Version, RecordedAt: stored.RecordedAt, RecordedBy: stored.RecordedBy, Layout: stored.Servers,
		Differences: Compare(ledger, stored, servers), Moving: moving(stored, cur),
		Cursor: CursorReport{Version: cur.Version, Moving: cur.Moving, Mover: cur.Mover}}
	if cur.Moving {
		r.Cursor.MovedBelow = printable(cur.MovedBelow)
		if cur.Frozen() {
			r.Cursor.FrozenBelow = printable(cur.FrozenBelow)
		}
		if cur.Announced() {
			r.Cursor.AnnouncedBelow = printable(cur.AnnouncedBelow)
		}
	}
	if r.Layout == nil {
		r.Layout = []string{}
	}
	if r.Differences == nil {
		r.Differences = []string{}
	}
	for i, s := range servers {
		tables, err := d.Server(i).TableRowEstimates(ctx)
		if err != nil {
			return nil, fmt.Errorf("server %d: %w", i, err)
		}
		ordinal := -1
		for j, u := range stored.Servers {
			if s.Found && u == s.Identity.UUID {
				ordinal = j
			}
		}
		r.Servers = append(r.Servers, ServerReport{Place: i, Host: s.Host, UUID: s.Identity.UUID, Ordinal: ordinal, Ledger: s.Identity.Ledger, Tables: tables})
	}
	return r, nil
}

// moving says what is moving, for status.
func moving(l Layout, cur driver.MoveCursor) string {
	switch {
	case l.Moving():
		at := "keys from the first"
		if cur.Version == l.Version && cur.MovedBelow != "" {
			at = "keys below " + printable(cur.MovedBelow) + " moved"
		}
		if cur.Version == l.Version && cur.Frozen() {
			at += ", a step up to " + printable(cur.FrozenBelow) + " under way"
		}
		if cur.Version == l.Version && cur.Announced() {
			at += ", a step up to " + printable(cur.AnnouncedBelow) + " announced"
		}
		return fmt.Sprintf("the rows of the slots that change server to layout version %d, begun %s by %s: %d rows moved so far, %s; the instances count meanwhile (resume an interrupted move by running its command again)",
			l.Version, l.Move.StartedAt.Format(time.RFC3339), l.Move.StartedBy, l.Move.RowsMoved, at)
	case l.Move.Version > 0:
		return fmt.Sprintf("nothing moving (the move to layout version %d moved %d rows, done %s)", l.Version, l.Move.RowsMoved, l.Move.FinishedAt.Time.UTC().Format(time.RFC3339))
	}
	return "nothing moving"
}

func slotsOf(l Layout, ordinal int) int {
	n := 0
	for _, o := range l.Placement.Owners() {
		if o == ordinal {
			n++
		}
	}
	return n
}
