package shards

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Remove drains the last of the ledger's servers (d's servers are the
// ledger's layout, in its order; hosts name them) while the instances
// count: a new layout version without it, whose placement gives its slots
// to the others (placement.ShrinkLast), and the move of their rows there,
// step by step along the cursor exactly as Add's (runMove). Instances
// place keys on the drained server until the cursor passes them; once the
// move is done it holds none of the ledger's keyed rows (dead letters and
// the changelog's outbox stay: read them, then drop the database), and
// instances may be configured without it. Only the last server can be
// removed: the others' ordinals, which the slot tables name, stay as they
// are. Run again after an interruption, it resumes.
func Remove(ctx context.Context, d *mysqldriver.Driver, hosts []string, opts AddOptions) (*AddReport, error) {
	opts = opts.withDefaults()
	log := opts.Log
	last := d.Len() - 1
	if last < 1 {
		return nil, errors.New("shards remove: the ledger's only server cannot be removed")
	}
	ledger, stored, servers, cur, err := readMove(ctx, d, hosts)
	if err != nil {
		return nil, fmt.Errorf("shards remove: %w", err)
	}
	rep := &AddReport{}
	drained := servers[last].Identity.UUID
	switch {
	case stored.Moving() && len(stored.Servers) == last && !slices.Contains(stored.Servers, drained):
		// Resume: the moving layout is the configured list without its
		// last server.
		if diffs := Compare(ledger, stored, servers); len(diffs) > 0 {
			return nil, &MismatchError{Stored: stored, Differences: diffs}
		}
		if cur.Version != stored.Version {
			return nil, fmt.Errorf("shards remove: the move's cursor is at layout version %d, the move under way is to version %d", cur.Version, stored.Version)
		}
		rep.Resumed = true
		log.Info("resuming the drain of the ledger's last server", "layout", stored.Describe(), "rows_moved", stored.Move.RowsMoved, "keys_moved_below", printable(cur.MovedBelow))
	case stored.Moving():
		return nil, fmt.Errorf("shards remove: a move to layout version %d is under way: finish it first (billing shards add, run again)", stored.Version)
	case len(stored.Servers) == last && !slices.Contains(stored.Servers, drained) && stored.Move.Version == stored.Version:
		log.Info("the drain of the server is already done", "layout", stored.Describe())
		rep.Layout = stored
		return rep, nil
	default:
		if diffs := Compare(ledger, stored, servers); len(diffs) > 0 || len(stored.Servers) != last+1 {
			return nil, &MismatchError{Stored: stored, Differences: append(diffs, "configure the ledger's servers, the one to remove last")}
		}
		if stored, cur, err = beginRemove(ctx, d, stored, cur, opts.By, log); err != nil {
			return nil, err
		}
	}
	rep.Layout = stored
	return runMove(ctx, d, stored, cur, opts, rep)
}

// beginRemove stores the layout without the last server and the move to
// it, as begin does for an added one (the same fence).
func beginRemove(ctx context.Context, d *mysqldriver.Driver, stored Layout, cur driver.MoveCursor, by string, log *slog.Logger) (Layout, driver.MoveCursor, error) {
	next, _, err := stored.Placement.ShrinkLast()
	if err != nil {
		return Layout{}, cur, err
	}
	l := Layout{Version: stored.Version + 1, Servers: slices.Clone(stored.Servers[:len(stored.Servers)-1]),
		RecordedAt: time.Now().UTC().Truncate(time.Microsecond), RecordedBy: by, Placement: next}
	l.Move = mysqldriver.MoveState{Version: l.Version, State: mysqldriver.MoveMoving, StartedAt: l.RecordedAt, StartedBy: by}
	moving := driver.MoveCursor{Version: l.Version, Moving: true, Mover: by}
	if err := storeMove(ctx, d, stored, l, cur, moving, log); err != nil {
		return Layout{}, cur, fmt.Errorf("shards remove: begin: %w", err)
	}
	log.Info("stored the ledger's layout without its last server; moving its rows to the others while the instances count", "layout", l.Describe())
	return l, moving, nil
}
