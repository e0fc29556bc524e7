package memdriver

import (
	"context"
	"slices"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The reads of billing_windows' window starts that the period settings
// make on a ledger's servers (mysqldriver's Server.WindowStarts and
// LatestWindowStart), on the committed rows.

// windowStartsLocked are the distinct window starts of the committed
// billing_windows rows, ascending.
func (c *Cluster) windowStartsLocked() []time.Time {
	var out []time.Time
	for _, r := range c.rows[tWindows] {
		out = append(out, r.(driver.WindowRow).Start.UTC())
	}
	slices.SortFunc(out, time.Time.Compare)
	return slices.CompactFunc(out, time.Time.Equal)
}

// WindowStarts returns up to n of the earliest and up to n of the latest
// distinct window starts, the earliest ascending, then the latest
// descending (a start can be in both).
func (s *Server) WindowStarts(ctx context.Context, n int) ([]time.Time, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	all := c.windowStartsLocked()
	out := slices.Clone(all[:min(n, len(all))])
	for i := len(all) - 1; i >= max(len(all)-n, 0); i-- {
		out = append(out, all[i])
	}
	return out, nil
}

// LatestWindowStart is the latest window start (zero: no row).
func (s *Server) LatestWindowStart(ctx context.Context) (time.Time, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	all := c.windowStartsLocked()
	if len(all) == 0 {
		return time.Time{}, nil
	}
	return all[len(all)-1], nil
}
