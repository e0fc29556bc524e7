package memdriver

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The changelog's tables (mysqldriver/outbox.go): the outbox in a branch
// and on the pools, the snapshot's scans, and the control server's
// changelog state.

// outboxRow is a changelog_outbox row.
type outboxRow struct {
	driver.OutboxChunk
	body    []byte
	created time.Time
}

func outboxID(checkpoint string, participant, chunk int) rowID {
	return rowID{tOutbox, key(checkpoint, intKey(int64(participant)), intKey(int64(chunk)))}
}

// outboxText is mysqldriver's INSERT INTO changelog_outbox (...) VALUES.
const outboxText = 100

func (t storeTx) WriteOutbox(ctx context.Context, checkpoint string, participant int, blobs [][]byte, counts []int, now time.Time) error {
	c, tx, err := t.begin()
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	if len(blobs) != len(counts) {
		return coded(driver.Unknown, "outbox: %d blobs, %d counts", len(blobs), len(counts))
	}
	if err := checkBytes("checkpoint_id", checkpoint, 64); err != nil {
		return err
	}
	fixed := stmt.ArgBytes(checkpoint) + 3*stmt.ArgBytes(int64(0)) + stmt.ArgBytes(now) + len("(?,?,?,?,?,?)") + 1
	return c.statementsLocked(len(blobs), outboxText, func(i int) int { return fixed + stmt.TextBytes(len(blobs[i])) }, func(start, end int) error {
		for i := start; i < end; i++ {
			if len(blobs[i]) > 16<<20-1 {
				return coded(driver.Data, "Data too long for column 'body' (%d bytes)", len(blobs[i]))
			}
			if err := c.lockLocked(ctx, tx, outboxID(checkpoint, participant, i)); err != nil {
				return err
			}
			if _, ok := c.getLocked(tx, outboxID(checkpoint, participant, i)); ok {
				return coded(driver.Duplicate, "Duplicate entry for key 'PRIMARY' in changelog_outbox")
			}
		}
		for i := start; i < end; i++ {
			r := outboxRow{OutboxChunk: driver.OutboxChunk{Checkpoint: checkpoint, Participant: participant, Chunk: i, Events: counts[i], Bytes: len(blobs[i])},
				body: bytes.Clone(blobs[i]), created: datetime(now)}
			if err := c.fireLocked(tOutbox, r.OutboxChunk); err != nil {
				return err
			}
			c.putLocked(tx, outboxID(checkpoint, participant, i), r)
		}
		return nil
	})
}

func compareChunks(a, b driver.OutboxChunk) int {
	return cmp.Or(strings.Compare(a.Checkpoint, b.Checkpoint), cmp.Compare(a.Participant, b.Participant), cmp.Compare(a.Chunk, b.Chunk))
}

// OutboxIndex lists the committed outbox rows of checkpoints.
func (s *Server) OutboxIndex(ctx context.Context, checkpoints []string) ([]driver.OutboxChunk, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	want := map[string]bool{}
	err := c.statementsLocked(len(checkpoints), 200, func(i int) int { return stmt.ArgBytes(checkpoints[i]) }, func(start, end int) error {
		for _, g := range checkpoints[start:end] {
			want[g] = true
		}
		return nil
	})
	var out []driver.OutboxChunk
	for _, r := range c.rows[tOutbox] {
		if o := r.(outboxRow); want[o.Checkpoint] {
			out = append(out, o.OutboxChunk)
		}
	}
	slices.SortFunc(out, compareChunks)
	return out, err
}

// ReadOutbox reads committed bodies.
func (s *Server) ReadOutbox(ctx context.Context, chunks []driver.OutboxChunk) ([][]byte, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([][]byte, len(chunks))
	for i, ch := range chunks {
		r, ok := c.rows[tOutbox][outboxID(ch.Checkpoint, ch.Participant, ch.Chunk).key]
		if !ok {
			return nil, fmt.Errorf("outbox row %s/%d/%d: gone", ch.Checkpoint, ch.Participant, ch.Chunk)
		}
		out[i] = bytes.Clone(r.(outboxRow).body)
	}
	return out, nil
}

// DeleteOutbox deletes the outbox rows of checkpoints, in one local
// transaction per statement.
func (s *Server) DeleteOutbox(ctx context.Context, checkpoints []string) (int64, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	err := c.statementsLocked(len(checkpoints), 100, func(i int) int { return stmt.ArgBytes(checkpoints[i]) }, func(start, end int) error {
		want := map[string]bool{}
		for _, g := range checkpoints[start:end] {
			want[g] = true
		}
		tx := c.newTxnLocked("outbox delete")
		for k, r := range c.rows[tOutbox] {
			if want[r.(outboxRow).Checkpoint] {
				id := rowID{tOutbox, k}
				if err := c.lockLocked(ctx, tx, id); err != nil {
					c.endTxnLocked(tx, false)
					return err
				}
				c.deleteLocked(tx, id)
				n++
			}
		}
		c.endTxnLocked(tx, true)
		return nil
	})
	return n, err
}

// scan returns up to limit committed rows of table tb after the key after
// accepts (after returns whether a row is past the bound), in key order.
func scan[R any](c *Cluster, tb table, limit int, past func(R) bool, cmpRows func(a, b R) int) []R {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []R
	for _, r := range c.rows[tb] {
		if row := r.(R); past(row) {
			out = append(out, row)
		}
	}
	slices.SortFunc(out, cmpRows)
	return out[:min(len(out), limit)]
}

func compareBalanceKeys(a, b driver.BalanceKey) int {
	return cmp.Or(strings.Compare(a.Account, b.Account), strings.Compare(a.Currency, b.Currency))
}

func compareEntryKeys(a, b driver.EntryKey) int {
	return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset), cmp.Compare(a.Kind, b.Kind))
}

func entryKey(e driver.EntryRow) driver.EntryKey {
	return driver.EntryKey{Topic: e.Topic, Partition: e.Partition, Offset: e.Offset, Kind: e.Kind}
}

func (s *Server) ScanBalances(ctx context.Context, after *driver.BalanceKey, limit int) ([]driver.BalanceRow, error) {
	return scan(s.c, tBalances, limit, func(r driver.BalanceRow) bool { return after == nil || compareBalanceKeys(r.BalanceKey, *after) > 0 },
		func(a, b driver.BalanceRow) int { return compareBalanceKeys(a.BalanceKey, b.BalanceKey) }), nil
}

func (s *Server) ScanWindows(ctx context.Context, after *driver.WindowKey, limit int) ([]driver.WindowRow, error) {
	return scan(s.c, tWindows, limit, func(r driver.WindowRow) bool { return after == nil || compareWindowKeys(r.WindowKey, *after) > 0 },
		func(a, b driver.WindowRow) int { return compareWindowKeys(a.WindowKey, b.WindowKey) }), nil
}

func (s *Server) ScanAdjustments(ctx context.Context, after *driver.WindowKey, limit int) ([]driver.AdjustmentRow, error) {
	return scan(s.c, tAdjustments, limit, func(r driver.AdjustmentRow) bool { return after == nil || compareWindowKeys(r.WindowKey, *after) > 0 },
		func(a, b driver.AdjustmentRow) int { return compareWindowKeys(a.WindowKey, b.WindowKey) }), nil
}

func (s *Server) ScanEntries(ctx context.Context, after *driver.EntryKey, limit int) ([]driver.EntryRow, error) {
	return scan(s.c, tEntries, limit, func(r driver.EntryRow) bool { return after == nil || compareEntryKeys(entryKey(r), *after) > 0 },
		func(a, b driver.EntryRow) int { return compareEntryKeys(entryKey(a), entryKey(b)) }), nil
}

// changelogState is the control server's changelog_state row and the
// counter's flag.
type changelogState struct {
	on         bool
	state      driver.ChangelogState
	leaseUntil time.Time
}

func (c *Cluster) changelogLocked() driver.ChangelogState {
	if !c.changelog.on {
		return driver.ChangelogState{}
	}
	st := c.changelog.state
	if !c.changelog.leaseUntil.IsZero() {
		st.LeaseLeft = c.changelog.leaseUntil.Sub(c.opts.Now())
	}
	return st
}

func (s *Server) Changelog(ctx context.Context) (driver.ChangelogState, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.changelogLocked(), nil
}

func (s *Server) EnableChangelog(ctx context.Context, prefix string, at time.Time) (driver.ChangelogState, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.changelog.on {
		c.changelog = changelogState{on: true, state: driver.ChangelogState{On: true, Prefix: prefix, From: c.lastSeq + 1, Snapshot: true,
			Published: c.lastSeq, EnabledAt: datetime(at)}}
	}
	return c.changelogLocked(), nil
}

func (s *Server) SkipChangelogSnapshot(ctx context.Context, from int64) error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changelog.on && c.changelog.state.From == from {
		c.changelog.state.Snapshot = false
	}
	return nil
}

func (s *Server) DisableChangelog(ctx context.Context) error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.changelog = changelogState{}
	return nil
}

func (s *Server) LeaseChangelog(ctx context.Context, owner string, ttl time.Duration) (bool, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if code, ok := c.faultLocked("lease"); ok {
		return false, coded(code, "injected lease failure")
	}
	cl := &c.changelog
	if !cl.on {
		return false, nil
	}
	now := c.opts.Now()
	if ttl <= 0 {
		if cl.state.Publisher == owner {
			cl.state.Publisher, cl.leaseUntil = "", time.Time{}
		}
		return false, nil
	}
	if cl.state.Publisher != owner && cl.state.Publisher != "" && cl.leaseUntil.After(now) {
		return false, nil
	}
	cl.state.Publisher, cl.leaseUntil = owner, now.Add(ttl)
	return true, nil
}

func (s *Server) ChangelogPublished(ctx context.Context, seq int64) error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changelog.on && seq > c.changelog.state.Published {
		c.changelog.state.Published, c.changelog.state.PublishedAt = seq, datetime(c.opts.Now())
	}
	return nil
}
