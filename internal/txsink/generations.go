package txsink

import (
	"context"
	"fmt"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The dedup keys' generations on the control server (driver.Control;
// package dedup has their rules): read by the checkpoints that claim keys
// and checked by their decisions (Txn.Decide), changed by the upkeep
// (pipeline.Keeper).

// KeyGenerations reads the generations' state, with the control server's
// clock.
func (s *Sink) KeyGenerations(ctx context.Context) (driver.KeyGenerations, error) {
	g, err := s.control.KeyGenerations(ctx)
	if err != nil {
		return g, fmt.Errorf("dedup generations: %w", err)
	}
	return g, nil
}

// RegisterKeyLifetime raises the registered key lifetime to d: before an
// instance claims a key that lives d, so that no table is emptied while
// such a key may be live.
func (s *Sink) RegisterKeyLifetime(ctx context.Context, d time.Duration) error {
	if err := s.control.RegisterKeyLifetime(ctx, d); err != nil {
		return fmt.Errorf("dedup generations: %w", err)
	}
	return nil
}

// RotateKeys makes generation from+1 current (driver.Control.RotateKeys).
func (s *Sink) RotateKeys(ctx context.Context, from driver.Generation) (bool, error) {
	ok, err := s.control.RotateKeys(ctx, from)
	if err != nil {
		return false, fmt.Errorf("dedup generations: rotate from %d: %w", from, err)
	}
	return ok, nil
}

// HoldKeyGenerations runs fn on the state held shared
// (driver.Control.HoldKeyGenerations).
func (s *Sink) HoldKeyGenerations(ctx context.Context, fn func(driver.KeyGenerations) error) error {
	return s.control.HoldKeyGenerations(ctx, fn)
}

// MarkKeysEmptied records that generation g's table was emptied on every
// server.
func (s *Sink) MarkKeysEmptied(ctx context.Context, g driver.Generation) (bool, error) {
	ok, err := s.control.MarkKeysEmptied(ctx, g)
	if err != nil {
		return false, fmt.Errorf("dedup generations: record %d emptied: %w", g, err)
	}
	return ok, nil
}
