package ledgerclock

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// MaxError bounds how far one instance's Now may be from the control
// server's clock: half the round trip of the sample used (at most
// maxHalfTrip) plus the drift of the host's clock until the next
// measurement (well under 10 ms per minute).
const MaxError = 250 * time.Millisecond

// Margin is the most two instances' clocks can differ (2 × MaxError).
const Margin = 2 * MaxError

// maxHalfTrip is the longest half round trip of a usable sample.
const maxHalfTrip = 200 * time.Millisecond

// samples is the number of round trips one measurement takes; the
// shortest wins.
const samples = 5

// Source reads the control server's clock (UTC_TIMESTAMP(6)).
// *mysqldriver.Server is one.
type Source interface {
	UTCTime(ctx context.Context) (time.Time, error)
}

// Clock is the ledger's clock on one instance. The zero value is not
// usable; see New. It is safe for concurrent use.
type Clock struct {
	local  func() time.Time
	anchor atomic.Pointer[anchor]
}

// anchor is one measurement: at the host's reading local (with its
// monotonic reading), the server's clock read server, within ±err.
type anchor struct {
	local, server time.Time
	err           time.Duration
}

// New returns a clock over the host's clock local (time.Now when nil;
// tests skew it). Until the first Sync, Now is the host's clock.
func New(local func() time.Time) *Clock {
	if local == nil {
		local = time.Now
	}
	return &Clock{local: local}
}

// Now is the control server's clock as this instance estimates it, in
// UTC, without a monotonic reading (measure durations with time.Now).
func (c *Clock) Now() time.Time {
	now := c.local()
	a := c.anchor.Load()
	if a == nil {
		return now.UTC().Round(0)
	}
	return a.server.Add(now.Sub(a.local)).UTC()
}

// Offset is how far the control server's clock is ahead of the host's at
// the last measurement, and the measurement's uncertainty; zero before
// the first.
func (c *Clock) Offset() (offset, uncertainty time.Duration) {
	a := c.anchor.Load()
	if a == nil {
		return 0, 0
	}
	return a.server.Sub(a.local.Round(0)), a.err
}

// Sync measures the offset to src: samples round trips, the shortest
// kept. It fails, keeping the previous measurement, when src cannot be
// read or answers too slowly for the estimate to stay within MaxError.
func (c *Clock) Sync(ctx context.Context, src Source) error {
	var best *anchor
	for range samples {
		before := c.local()
		server, err := src.UTCTime(ctx)
		after := c.local()
		if err != nil {
			return fmt.Errorf("read the control server's clock: %w", err)
		}
		half := after.Sub(before) / 2
		if best == nil || half < best.err {
			best = &anchor{local: before.Add(half), server: server.UTC(), err: half}
		}
	}
	if best.err > maxHalfTrip {
		return fmt.Errorf("read the control server's clock: the shortest of %d round trips took %v (at most %v keeps the ledger's clock within %v)",
			samples, 2*best.err, 2*maxHalfTrip, MaxError)
	}
	c.anchor.Store(best)
	return nil
}

// Run measures the offset again every interval until ctx ends, logging a
// failure (the previous measurement stays in use).
func (c *Clock) Run(ctx context.Context, src Source, interval time.Duration, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(ctx, interval)
		if err := c.Sync(sctx, src); err != nil && ctx.Err() == nil {
			log.Warn("cannot measure the ledger's clock again; the last measurement stays in use", "err", err)
		}
		cancel()
	}
}

// Interval is how often Run should measure: the drift of a host's clock
// over it stays far below MaxError.
const Interval = time.Minute
