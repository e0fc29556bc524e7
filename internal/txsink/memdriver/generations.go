package memdriver

import (
	"context"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The dedup keys' generations (driver.KeyGenerations) on the control
// server: each method one serialisable transaction under the cluster's
// lock. HoldKeyGenerations models the shared lock the real servers hold
// while a table is emptied: rotations and records of emptied tables, which
// never wait for the row (NOWAIT), are refused meanwhile.

// KeyGenerations reads the state, with the server's clock.
func (s *Server) KeyGenerations(ctx context.Context) (driver.KeyGenerations, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gensLocked(), nil
}

func (c *Cluster) gensLocked() driver.KeyGenerations {
	g := c.gens
	g.Now = datetime(c.opts.Now())
	return g
}

// RegisterKeyLifetime raises the registered lifetime to d.
func (s *Server) RegisterKeyLifetime(ctx context.Context, d time.Duration) error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	d = d.Truncate(time.Microsecond) + time.Microsecond // rounded up, as mysqldriver stores it
	c.gens.Lifetime = max(c.gens.Lifetime, d)
	return nil
}

// RotateKeys makes from+1 current if from is and its table was emptied.
func (s *Server) RotateKeys(ctx context.Context, from driver.Generation) (bool, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	g := &c.gens
	if c.genHolders > 0 || g.Current != from || g.Emptied < from+1-driver.KeyTables {
		return false, nil
	}
	g.Current, g.PreviousSince, g.Since = from+1, g.Since, datetime(c.opts.Now())
	return true, nil
}

// MarkKeysEmptied records that generation g's table was emptied.
func (s *Server) MarkKeysEmptied(ctx context.Context, gen driver.Generation) (bool, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	g := &c.gens
	if c.genHolders > 0 || g.Emptied != gen-1 || gen >= g.Current {
		return false, nil
	}
	g.Emptied = gen
	return true, nil
}

// HoldKeyGenerations runs fn on the state while rotations and records are
// refused.
func (s *Server) HoldKeyGenerations(ctx context.Context, fn func(driver.KeyGenerations) error) error {
	c := s.c
	c.mu.Lock()
	c.genHolders++
	st := c.gensLocked()
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.genHolders--
		c.mu.Unlock()
	}()
	return fn(st)
}

// SetKeyGenerations replaces the state (tests: a ledger at a later
// generation, or one whose generations are as the test needs them).
func (c *Cluster) SetKeyGenerations(g driver.KeyGenerations) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g.Now = time.Time{}
	c.gens = g
}
