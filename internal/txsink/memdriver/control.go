package memdriver

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The control tables. Every method runs under the cluster's lock: one
// local transaction each, serialisable.

// Identity returns the ledger identity, creating it once.
func (s *Server) Identity(ctx context.Context, new func() (string, []byte)) (string, []byte, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.identity == nil {
		id, secret := new()
		c.identity = &identity{id: id, secret: slices.Clone(secret)}
	}
	return c.identity.id, slices.Clone(c.identity.secret), nil
}

// Decide inserts d unless a decision exists and returns the one that holds.
func (s *Server) Decide(ctx context.Context, d driver.Decision) (driver.Outcome, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if code, ok := c.faultLocked("decide"); ok {
		return "", coded(code, "injected decide failure")
	}
	if old, ok := c.decisions[d.Gtrid]; ok {
		return old.Outcome, nil
	}
	c.decisions[d.Gtrid] = d
	return d.Outcome, nil
}

// Lookup returns the decision for gtrid.
func (s *Server) Lookup(ctx context.Context, gtrid string) (driver.Outcome, bool, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	d, ok := s.c.decisions[gtrid]
	return d.Outcome, ok, nil
}

// Commit is the commit point (driver.Control.Commit). An injected
// Transient fault on "commit" applies it and then reports the outcome
// ambiguous, as a connection lost during COMMIT may; any other code fails
// it before anything is written.
func (s *Server) Commit(ctx context.Context, d driver.Decision, scope driver.Scope, cuts []driver.Cut, fence func([]driver.Stored) error) error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	code, faulty := c.faultLocked("commit")
	if faulty && code != driver.Transient {
		return coded(code, "injected commit failure")
	}
	rows := c.partitions[scope]
	var stored []driver.Stored
	for _, cut := range cuts {
		if r, ok := rows[cut.Partition]; ok {
			stored = append(stored, r)
		}
	}
	if err := fence(stored); err != nil {
		return err
	}
	if _, ok := c.decisions[d.Gtrid]; ok {
		return driver.ErrDecided
	}
	for _, cut := range cuts {
		r := rows[cut.Partition]
		r.NextOffset = cut.NextOffset
		rows[cut.Partition] = r
	}
	c.decisions[d.Gtrid] = d
	if faulty {
		return errors.Join(driver.ErrAmbiguous, coded(code, "injected loss of the COMMIT's answer"))
	}
	return nil
}

// Claim raises the partitions' epochs and records owner.
func (s *Server) Claim(ctx context.Context, scope driver.Scope, owner string, partitions []int32, at time.Time) (map[int32]driver.Stored, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	rows := c.partitions[scope]
	if rows == nil {
		rows = map[int32]driver.Stored{}
		c.partitions[scope] = rows
	}
	out := make(map[int32]driver.Stored, len(partitions))
	for _, p := range partitions {
		r, ok := rows[p]
		if !ok {
			r = driver.Stored{Partition: p, NextOffset: driver.StartOffset}
		}
		r.Epoch++
		r.Owner = owner
		rows[p] = r
		out[p] = r
	}
	return out, nil
}

// Positions reads the partitions' rows.
func (s *Server) Positions(ctx context.Context, scope driver.Scope, partitions []int32) (map[int32]driver.Stored, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int32]driver.Stored, len(partitions))
	for _, p := range partitions {
		if r, ok := c.partitions[scope][p]; ok {
			out[p] = r
		}
	}
	return out, nil
}

// Groups lists the groups with positions for topic.
func (s *Server) Groups(ctx context.Context, topic string) ([]string, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for sc, rows := range c.partitions {
		if sc.Topic == topic && len(rows) > 0 {
			out = append(out, sc.Group)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Decided lists up to limit gtrids decided before, oldest first.
func (s *Server) Decided(ctx context.Context, before time.Time, limit int) ([]string, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var ds []driver.Decision
	for _, d := range c.decisions {
		if d.At.Before(before) {
			ds = append(ds, d)
		}
	}
	slices.SortFunc(ds, func(a, b driver.Decision) int { return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.Gtrid, b.Gtrid)) })
	var out []string
	for _, d := range ds[:min(limit, len(ds))] {
		out = append(out, d.Gtrid)
	}
	return out, nil
}

// Forget deletes decisions.
func (s *Server) Forget(ctx context.Context, gtrids []string) (int64, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, g := range gtrids {
		if _, ok := c.decisions[g]; ok {
			delete(c.decisions, g)
			n++
		}
	}
	return n, nil
}

func asCoded(err error, target **driver.CodedError) bool { return errors.As(err, target) }
