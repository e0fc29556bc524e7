package publisher

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/billing/ledger/internal/waits"
)

// Backlog watches, on every instance, how far the changelog's publishing
// is behind the commit log: the checkpoints decided and not published (by
// MySQL's hint), and the age of the oldest of them. At Max checkpoints
// behind it holds the checkpoints (Hold): the outbox is the durable
// backlog, and it is bounded rather than dropped.
type Backlog struct {
	control  Control
	max      int64
	interval time.Duration
	log      *slog.Logger
	waits    *waits.Set
	held     *waits.Wait // while checkpoints are held

	mu       sync.Mutex
	behind   int64
	lag      time.Duration
	measured bool
	err      error
}

// NewBacklog returns a watcher of the backlog bounded by max checkpoints,
// measured every interval; while it holds the checkpoints, that wait is
// reported in ws.
func NewBacklog(control Control, max int64, interval time.Duration, log *slog.Logger, ws *waits.Set) *Backlog {
	return &Backlog{control: control, max: max, interval: interval, log: log, waits: ws}
}

// Run measures until ctx ends.
func (b *Backlog) Run(ctx context.Context) {
	for {
		if err := b.Measure(ctx); err != nil && ctx.Err() == nil {
			b.log.Warn("cannot measure the changelog's backlog", "err", err)
		}
		if !sleep(ctx, b.interval) {
			return
		}
	}
}

// Measure reads the backlog once.
func (b *Backlog) Measure(ctx context.Context) error {
	behind, lag, err := measure(ctx, b.control)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.err = err
	if err != nil {
		return err
	}
	b.behind, b.lag, b.measured = behind, lag, true
	switch why := holdReason(behind, b.max); {
	case why != "" && b.held == nil:
		b.held = b.waits.Begin("the changelog's backlog to drain below CHANGELOG_MAX_BACKLOG (checkpoints are held)")
		fallthrough
	case why != "":
		b.held.Still(why)
	case b.held != nil:
		b.held.End()
		b.held = nil
	}
	return nil
}

func measure(ctx context.Context, c Control) (int64, time.Duration, error) {
	st, err := c.Changelog(ctx)
	if err != nil || !st.On {
		return 0, 0, err
	}
	pos, err := c.CommitPosition(ctx)
	if err != nil {
		return 0, 0, err
	}
	behind := max(0, pos.Decided-st.Published)
	if behind == 0 {
		return 0, 0, nil
	}
	recs, err := c.Commits(ctx, st.Published+1, false, 1)
	if err != nil {
		return 0, 0, err
	}
	var lag time.Duration
	if len(recs) > 0 {
		lag = recs[0].Age
	}
	return behind, lag, nil
}

// Behind is the checkpoints decided and not yet published, as last
// measured.
func (b *Backlog) Behind() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.behind
}

// Lag is the age of the oldest checkpoint not yet published (0: none).
func (b *Backlog) Lag() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lag
}

// Hold says why checkpoints must wait ("" when they need not): the
// backlog reached its bound (pipeline.Config.Hold).
func (b *Backlog) Hold() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return holdReason(b.behind, b.max)
}

func holdReason(behind, max int64) string {
	if behind < max {
		return ""
	}
	return fmt.Sprintf("the changelog's backlog is full: %d checkpoints not published (CHANGELOG_MAX_BACKLOG %d); checkpoints wait for Kafka", behind, max)
}
