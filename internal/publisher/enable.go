package publisher

import (
	"context"
	"fmt"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/waits"
)

// Enabler is what turning the changelog on reads and writes on the
// control server.
type Enabler interface {
	Changelog(ctx context.Context) (driver.ChangelogState, error)
	EnableChangelog(ctx context.Context, prefix string, at time.Time) (driver.ChangelogState, error)
	SkipChangelogSnapshot(ctx context.Context, from int64) error
	CommitPosition(ctx context.Context) (driver.CommitPosition, error)
}

// Tables is what Enable reads of each server: whether a table holds a
// row.
type Tables interface {
	ScanBalances(ctx context.Context, after *driver.BalanceKey, limit int) ([]driver.BalanceRow, error)
	ScanWindows(ctx context.Context, after *driver.WindowKey, limit int) ([]driver.WindowRow, error)
	ScanAdjustments(ctx context.Context, after *driver.WindowKey, limit int) ([]driver.AdjustmentRow, error)
	ScanEntries(ctx context.Context, after *driver.EntryKey, limit int) ([]driver.EntryRow, error)
}

// Enable turns the ledger's changelog on with prefix, or checks that it is
// on with prefix, at an instance's start. A ledger that holds rows is
// enabled with its snapshot pending (ChangelogState.Snapshot): the
// publisher publishes it before the changes (snapshot.go). On an empty
// ledger it records that no snapshot is needed (SkipChangelogSnapshot)
// when no decision can have written a row between its check and the
// enabling: every decision up to the check applied and the tables empty,
// and the enabling numbered right after them; or, once every decision
// before the enabling is applied, the tables still empty.
//
// Waiting for the decisions to be applied is reported in ws (a decided
// branch on a server that does not answer holds it).
func Enable(ctx context.Context, c Enabler, servers []Tables, prefix string, now time.Time, ws *waits.Set) (driver.ChangelogState, error) {
	st, err := c.Changelog(ctx)
	if err != nil {
		return st, err
	}
	if st.On && st.Prefix != prefix {
		return st, fmt.Errorf("publisher: the ledger's changelog is on with CHANGELOG_TOPIC_PREFIX %q, not %q", st.Prefix, prefix)
	}
	if st.On && !st.Snapshot {
		return st, nil
	}
	pos, err := settled(ctx, c, st.From-1, ws)
	if err != nil {
		return st, err
	}
	empty, err := emptyTables(ctx, servers)
	if err != nil {
		return st, err
	}
	if !st.On {
		if st, err = c.EnableChangelog(ctx, prefix, now); err != nil {
			return st, err
		}
		if st.Prefix != prefix {
			return st, fmt.Errorf("publisher: the ledger's changelog was turned on with CHANGELOG_TOPIC_PREFIX %q, not %q", st.Prefix, prefix)
		}
		if !st.Snapshot || !empty {
			return st, nil
		}
		if st.From != pos.Decided+1 {
			// Decisions came between the check and the enabling: check
			// again once they are applied.
			return Enable(ctx, c, servers, prefix, now, ws)
		}
	}
	if !empty {
		return st, nil // the publisher snapshots the rows
	}
	if err := c.SkipChangelogSnapshot(ctx, st.From); err != nil {
		return st, err
	}
	st.Snapshot = false
	return st, nil
}

// settled waits until every decision up to at least through is applied
// (through < 0: every decision so far), and returns the position. Only
// the recovery of the decided checkpoints (an instance's, on servers that
// answer) ends the wait: it is reported in ws.
func settled(ctx context.Context, c interface {
	CommitPosition(ctx context.Context) (driver.CommitPosition, error)
}, through int64, ws *waits.Set) (driver.CommitPosition, error) {
	var w *waits.Wait
	defer func() {
		if w != nil {
			w.End()
		}
	}()
	for {
		pos, err := c.CommitPosition(ctx)
		if err != nil {
			return pos, err
		}
		if pos.Visible == pos.Decided || pos.Visible >= through && through >= 0 {
			return pos, nil
		}
		if w == nil {
			target := "the decided position"
			if through >= 0 {
				target = fmt.Sprint(through)
			}
			w = ws.Begin(fmt.Sprintf("the commit log's visible position to reach %s (every decided checkpoint before it applied on every server)", target))
		}
		w.Still(fmt.Sprintf("visible %d, decided %d: checkpoint %d not applied yet", pos.Visible, pos.Decided, pos.Visible+1))
		if !sleep(ctx, 50*time.Millisecond) {
			return pos, ctx.Err()
		}
	}
}

func emptyTables(ctx context.Context, servers []Tables) (bool, error) {
	for _, s := range servers {
		b, err := s.ScanBalances(ctx, nil, 1)
		if err != nil {
			return false, err
		}
		w, err := s.ScanWindows(ctx, nil, 1)
		if err != nil {
			return false, err
		}
		a, err := s.ScanAdjustments(ctx, nil, 1)
		if err != nil {
			return false, err
		}
		e, err := s.ScanEntries(ctx, nil, 1)
		if err != nil {
			return false, err
		}
		if len(b)+len(w)+len(a)+len(e) > 0 {
			return false, nil
		}
	}
	return true, nil
}
