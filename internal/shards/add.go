package shards

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/placement"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// AddOptions configure Add.
type AddOptions struct {
	// By names who adds (recorded with the move).
	By string
	// Recover resolves the branches a checkpoint left in doubt (a
	// txsink.Sink's recovery over the ledger's servers), and InDoubt
	// counts those left: the move waits until every decided checkpoint
	// is applied and no branch is in doubt (a prepared branch of a
	// checkpoint the fence keeps from deciding still holds the locks of
	// rows to move, until recovery rolls it back), which a coordinator
	// killed leaves to recovery. Nil: the move only waits for the commit
	// log.
	Recover func(ctx context.Context) error
	InDoubt func(ctx context.Context) (int, error)
	// Batch is how many rows of a table are read at once (1000 when 0).
	Batch int
	// Attempts bounds the starts of one table's move on transient errors
	// (120 when 0, about two minutes).
	Attempts int
	// Log receives progress; slog.Default() when nil.
	Log *slog.Logger
	// Failpoints are armed by tests to stop the move at its steps (the
	// Fail* names); nil arms none.
	Failpoints *failpoint.Set
}

// The failpoints of a move, in its order (BILLING_FAILPOINTS of billing
// shards add).
const (
	FailAfterFence  = "shards-add-after-fence"  // the new layout stored, the instances fenced
	FailAfterSettle = "shards-add-after-settle" // every checkpoint decided before the fence applied
	FailBeforeCopy  = "shards-add-before-copy"  // a batch of rows read, not yet written to the new server
	FailAfterBatch  = "shards-add-after-batch"  // a batch of rows moved (written, then deleted)
	FailBeforeDone  = "shards-add-before-done"  // every row moved, the move not recorded done
	FailAfterDone   = "shards-add-after-done"   // the move recorded done
)

// AddReport is what a move did.
type AddReport struct {
	Layout    Layout // the new layout
	Slots     int    // slots moved to the new server
	RowsMoved int64  // rows moved by this run (a resumed move counts its own)
	Resumed   bool   // the move had begun before this run
}

// Add adds the last of d's servers (named by hosts) to the ledger whose
// layout the others are, and moves to it its share of the rows: the
// slots the new placement gives it (placement.Grow), with every row of
// their accounts and event ids, dedup keys included (their expiry and
// counted version kept). The move:
//
//  1. stores the new layout version, its slots and the move as begun, in
//     one transaction that raises every partition's epoch
//     (mysqldriver.Control.Quiesce): no checkpoint of a running instance
//     commits after it, and the instance stops at its next check
//     (Verify); a second such transaction fences a claim of a partition
//     that was new meanwhile;
//  2. waits until every checkpoint decided before is applied (recovering
//     those left in doubt), so that no write to a moving row is still on
//     its way;
//  3. moves each table's rows of the moved slots, server by server
//     (mysqldriver.MoveRows: copied, then deleted, batch by batch);
//  4. records the move as done. Instances configured with the new
//     layout's servers, waiting at their start, then count.
//
// Counting stops from 1 to 4. A move interrupted anywhere (a kill, an
// error) is resumed by running Add again with the same servers: every step
// is idempotent, and no row is moved twice (a moved row is gone from its
// old server) or lost (it is deleted only once written to the new one).
func Add(ctx context.Context, d *mysqldriver.Driver, hosts []string, opts AddOptions) (*AddReport, error) {
	if opts.Batch <= 0 {
		opts.Batch = 1000
	}
	if opts.Attempts <= 0 {
		opts.Attempts = 120
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	step := opts.Failpoints.Inject
	log := opts.Log
	n := d.Len() - 1
	if n < 1 {
		return nil, errors.New("shards add: no server to add")
	}
	stored, servers, err := Read(ctx, d, hosts)
	if err != nil {
		return nil, err
	}
	ledger, _, found, err := d.View().Identity(ctx)
	if err != nil {
		return nil, err
	}
	if !found || stored.Version == 0 {
		return nil, errors.New("shards add: the ledger has no stored layout yet: start an instance on it first")
	}
	rep := &AddReport{}
	newSrv := servers[n]
	switch {
	case !stored.Moving() && stored.Move.Version == stored.Version && len(Compare(ledger, stored, servers)) == 0:
		// Run again after it finished (its answer lost, say): done.
		log.Info("the move to the ledger's layout is already done", "layout", stored.Describe())
		rep.Layout, rep.Slots = stored, slotsOf(stored, n)
		return rep, nil
	case stored.Moving():
		// Resume: the configured list must be the moving layout's.
		if diffs := Compare(ledger, stored, servers); len(diffs) > 0 {
			return nil, &MismatchError{Stored: stored, Differences: append(diffs,
				"a move to this layout is under way: run billing shards add again with its servers (the new one last) to resume it")}
		}
		if len(stored.Servers) != n+1 || stored.Servers[n] != newSrv.Identity.UUID {
			return nil, fmt.Errorf("shards add: the move under way adds %s, not this server", stored.Servers[len(stored.Servers)-1])
		}
		rep.Resumed = true
		log.Info("resuming the move to the ledger's new layout", "layout", stored.Describe(), "rows_moved", stored.Move.RowsMoved)
	default:
		if diffs := Compare(ledger, stored, servers[:n]); len(diffs) > 0 {
			return nil, &MismatchError{Stored: stored, Differences: diffs}
		}
		if err := addable(ctx, d, ledger, stored, newSrv, n); err != nil {
			return nil, err
		}
		if stored, err = begin(ctx, d, ledger, stored, newSrv, opts.By, log); err != nil {
			return nil, err
		}
	}
	rep.Layout = stored
	if err := step(FailAfterFence); err != nil {
		return rep, err
	}
	if err := awaitApplied(ctx, d, opts, log); err != nil {
		return rep, err
	}
	if err := step(FailAfterSettle); err != nil {
		return rep, err
	}
	// The slots the new server owns in the new layout, which the old
	// servers held: every row of theirs moves.
	next := stored.Placement
	rep.Slots = slotsOf(stored, n)
	moving := func(key []byte) bool { return next.Server(placement.Hash(string(key))) == n }
	control := d.Server(0).DB()
	for i := 0; i < n; i++ {
		for _, t := range mysqldriver.MovedTables {
			var moved int64
			// A transient error (a lost connection, a server restarted,
			// a lock wait) costs the table's move a new start: it is
			// idempotent.
			for attempt := 1; ; attempt++ {
				m, err := mysqldriver.MoveRows(ctx, d.Server(i), d.Server(n), t.Table, t.Key, moving, opts.Batch, func() error {
					return step(FailBeforeCopy)
				}, func(k int64) error {
					if err := mysqldriver.AddMoved(ctx, control, stored.Version, k); err != nil {
						return err
					}
					rep.RowsMoved += k
					return step(FailAfterBatch)
				})
				moved += m
				if err == nil {
					break
				}
				if mysqldriver.Code(err) != driver.Transient || attempt >= opts.Attempts || ctx.Err() != nil {
					return rep, fmt.Errorf("shards add: server %d: %w", i, err)
				}
				log.Warn("moving rows failed; starting the table again", "from_server", i, "table", t.Table, "attempt", attempt, "err", err)
				select {
				case <-ctx.Done():
					return rep, ctx.Err()
				case <-time.After(time.Second):
				}
			}
			if moved > 0 {
				log.Info("moved rows to the new server", "from_server", i, "table", t.Table, "rows", moved)
			}
		}
	}
	if err := step(FailBeforeDone); err != nil {
		return rep, err
	}
	if err := mysqldriver.FinishMove(ctx, control, stored.Version, time.Now()); err != nil {
		return rep, err
	}
	rep.Layout.Move.State = mysqldriver.MoveDone
	log.Info("the ledger's new layout is complete: start the instances with its servers", "layout", stored.Describe(),
		"slots_moved", rep.Slots, "rows_moved_by_this_run", rep.RowsMoved)
	return rep, step(FailAfterDone)
}

// addable says why the server cannot be added to the ledger (nil: it can).
func addable(ctx context.Context, d *mysqldriver.Driver, ledger string, stored Layout, s Server, n int) error {
	switch {
	case !s.Found:
		return fmt.Errorf("shards add: %s has no server identity (ledger_server): run billing migrate on it first", s.name(n))
	case s.Control:
		return fmt.Errorf("shards add: %s holds a ledger identity: it is a ledger's control server", s.name(n))
	case s.Identity.Ledger != "" && s.Identity.Ledger != ledger:
		return fmt.Errorf("shards add: %s belongs to another ledger (%s)", s.name(n), s.Identity.Ledger)
	case slices.Contains(stored.Servers, s.Identity.UUID):
		return fmt.Errorf("shards add: %s is already the ledger's", s.name(n))
	}
	for _, t := range mysqldriver.MovedTables {
		empty, err := mysqldriver.TableEmpty(ctx, d.Server(n).DB(), t.Table)
		if err != nil {
			return fmt.Errorf("shards add: %s: %w", s.name(n), err)
		}
		if !empty {
			return fmt.Errorf("shards add: %s holds rows in %s: a server is added empty", s.name(n), t.Table)
		}
	}
	for i := 0; i < n; i++ {
		live, err := mysqldriver.LegacyKeysLive(ctx, d.Server(i).DB())
		if err != nil {
			return fmt.Errorf("shards add: server %d: %w", i, err)
		}
		if live {
			return fmt.Errorf("shards add: server %d still holds dedup keys of the version before generations (dedup_expiry), whose expiry cannot move with them: add the server once they expire (at most DEDUP_TTL after the upgrade; billing status shows the generations)", i)
		}
	}
	st, err := d.Control().Changelog(ctx)
	if err != nil {
		return err
	}
	if st.Snapshot {
		return errors.New("shards add: the changelog's snapshot is still being published, reading the tables server by server: add the server once it is done (billing changelog status)")
	}
	return nil
}

// begin stores the new layout and its move as begun, fencing every
// instance, and returns the new layout.
func begin(ctx context.Context, d *mysqldriver.Driver, ledger string, stored Layout, s Server, by string, log *slog.Logger) (Layout, error) {
	next, _, err := stored.Placement.Grow(1)
	if err != nil {
		return Layout{}, err
	}
	if err := mysqldriver.ClaimServer(ctx, d.Server(d.Len()-1).DB(), ledger); err != nil {
		return Layout{}, err
	}
	if id, _, err := mysqldriver.ReadServerIdentity(ctx, d.Server(d.Len()-1).DB()); err != nil {
		return Layout{}, err
	} else if id.Ledger != ledger {
		return Layout{}, fmt.Errorf("shards add: the server was claimed by ledger %s meanwhile", id.Ledger)
	}
	l := Layout{Version: stored.Version + 1, Servers: append(slices.Clone(stored.Servers), s.Identity.UUID),
		RecordedAt: time.Now().UTC().Truncate(time.Microsecond), RecordedBy: by, Placement: next}
	l.Move = mysqldriver.MoveState{Version: l.Version, State: mysqldriver.MoveMoving, StartedAt: l.RecordedAt, StartedBy: by}
	err = d.Control().Quiesce(ctx, func(ctx context.Context, tx *sqlx.Tx, q mysqldriver.Quiesced) error {
		// The layout's rows are the decisions' to read: locked here, so
		// that two adds do not both begin.
		top, err := mysqldriver.LockLayoutVersion(ctx, tx)
		if err != nil {
			return err
		}
		if top != stored.Version {
			return fmt.Errorf("shards add: the ledger's layout became version %d meanwhile", top)
		}
		if added, err := mysqldriver.InsertLayout(ctx, tx, l.Rows()); err != nil {
			return err
		} else if !added {
			return fmt.Errorf("shards add: layout version %d exists", l.Version)
		}
		log.Info("fenced every instance: counting stops until the move is done", "partitions_fenced", q.Fenced)
		return mysqldriver.StartMove(ctx, tx, l.Version, runsOf(next), l.RecordedAt, by)
	})
	if err != nil {
		return Layout{}, fmt.Errorf("shards add: begin: %w", err)
	}
	// A claim of a partition whose row did not exist yet inserted it
	// beside the transaction above, unfenced, and may have checked the
	// layout before it committed: its epoch is raised now.
	if err := d.Control().Quiesce(ctx, func(context.Context, *sqlx.Tx, mysqldriver.Quiesced) error { return nil }); err != nil {
		return Layout{}, fmt.Errorf("shards add: fence again: %w", err)
	}
	log.Info("stored the ledger's new layout; moving rows", "layout", l.Describe(), "slots", next.Slots())
	return l, nil
}

// awaitApplied waits until every decided checkpoint is applied and no
// branch is in doubt, recovering those in doubt.
func awaitApplied(ctx context.Context, d *mysqldriver.Driver, opts AddOptions, log *slog.Logger) error {
	logged := time.Time{}
	for {
		pos, err := d.Control().CommitPosition(ctx)
		if err != nil && mysqldriver.Code(err) != driver.Transient {
			return err
		}
		inDoubt := 0
		if err == nil && opts.InDoubt != nil {
			if inDoubt, err = opts.InDoubt(ctx); err != nil && mysqldriver.Code(err) != driver.Transient {
				return err
			}
		}
		if err == nil && pos.Visible >= pos.Decided && inDoubt == 0 {
			return nil
		}
		if time.Since(logged) >= 10*time.Second {
			log.Info("waiting for the checkpoints decided before the fence to be applied and the branches in doubt resolved",
				"visible", pos.Visible, "decided", pos.Decided, "in_doubt", inDoubt, "err", err)
			logged = time.Now()
		}
		if opts.Recover != nil {
			if err := opts.Recover(ctx); err != nil {
				log.Warn("recovery of checkpoints in doubt failed; trying again", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
