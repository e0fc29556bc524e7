package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The dedup keys' generations on the control server (driver.Control).

func generations(t *testing.T, ctx context.Context, f Fixture) driver.KeyGenerations {
	t.Helper()
	s, err := f.Control.KeyGenerations(ctx)
	must(t, err)
	return s
}

// Property (the state and its changes): a new ledger is at generation 0,
// nothing emptied, no lifetime; the lifetime only grows; a rotation moves
// on from the current generation only, once the table it takes was
// emptied, records its time and the time before; tables are recorded
// emptied in order and never the current one's.
func testGenerationState(t *testing.T, ctx context.Context, f Fixture) {
	s := generations(t, ctx, f)
	if s.Current != 0 || s.Emptied != -1 || s.Lifetime != 0 || !s.PreviousSince.IsZero() || s.Since.IsZero() || s.Since.After(s.Now) {
		t.Fatalf("a new ledger's generations: %+v", s)
	}
	if d := time.Since(s.Now); d > time.Minute || d < -time.Minute {
		t.Fatalf("state read with a clock %s off this host's", d)
	}
	must(t, f.Control.RegisterKeyLifetime(ctx, time.Hour))
	must(t, f.Control.RegisterKeyLifetime(ctx, time.Minute))
	if l := generations(t, ctx, f).Lifetime; l < time.Hour || l > time.Hour+time.Millisecond {
		t.Fatalf("lifetime %s after registering an hour then a minute, want an hour (rounded up)", l)
	}
	rotate := func(from driver.Generation, want bool) {
		t.Helper()
		ok, err := f.Control.RotateKeys(ctx, from)
		must(t, err)
		if ok != want {
			t.Fatalf("rotation from %d: %v, want %v (state %+v)", from, ok, want, generations(t, ctx, f))
		}
	}
	mark := func(g driver.Generation, want bool) {
		t.Helper()
		ok, err := f.Control.MarkKeysEmptied(ctx, g)
		must(t, err)
		if ok != want {
			t.Fatalf("record of %d emptied: %v, want %v (state %+v)", g, ok, want, generations(t, ctx, f))
		}
	}
	first := s.Since
	rotate(1, false)
	rotate(0, true)
	rotate(0, false)
	s = generations(t, ctx, f)
	if s.Current != 1 || !s.PreviousSince.Equal(first) || s.Since.Before(first) {
		t.Fatalf("after one rotation: %+v (the first since %s)", s, first)
	}
	mark(1, false) // the current one
	rotate(1, true)
	rotate(2, false) // generation 3 takes generation 0's table, not emptied
	mark(1, false)   // out of order
	mark(0, true)
	mark(0, false)
	rotate(2, true)
	s = generations(t, ctx, f)
	if s.Current != 3 || s.Emptied != 0 || s.Current.Table() != 0 {
		t.Fatalf("after three rotations and one record: %+v", s)
	}
	mark(1, true)
	mark(2, true)
	mark(3, false)
}

// Property (the decision's check): a commit decision that names the
// generation its keys were claimed in commits while that generation is
// current, and is refused with ErrKeysMoved, writing nothing, once a
// rotation moved on; a decision without keys is not checked.
func testCommitGeneration(t *testing.T, ctx context.Context, f Fixture) {
	sc := driver.Scope{Group: "g-" + xid().Gtrid, Topic: "gen"}
	_, err := f.Control.Claim(ctx, sc, "me", []int32{0}, time.Now().UTC())
	must(t, err)
	ok := func([]driver.Stored) error { return nil }
	g0 := driver.Generation(0)
	_, err = f.Control.Commit(ctx, decision(xid().Gtrid, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 5}}, ok, nil, &g0, nil, true)
	must(t, err)
	if moved, err := f.Control.RotateKeys(ctx, 0); err != nil || !moved {
		t.Fatalf("rotation: %v %v", moved, err)
	}
	late := xid().Gtrid
	_, err = f.Control.Commit(ctx, decision(late, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 9}}, ok, nil, &g0, nil, true)
	if !errors.Is(err, driver.ErrKeysMoved) {
		t.Fatalf("a decision of keys claimed under the generation left: %v, want ErrKeysMoved", err)
	}
	if _, found, err := f.Control.Lookup(ctx, late); err != nil || found {
		t.Fatalf("the refused decision was written (%v, %v)", found, err)
	}
	pos, err := f.Control.Positions(ctx, sc, []int32{0})
	must(t, err)
	if pos[0].NextOffset != 5 {
		t.Fatalf("the refused decision moved the offset to %d", pos[0].NextOffset)
	}
	g1 := driver.Generation(1)
	_, err = f.Control.Commit(ctx, decision(xid().Gtrid, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 9}}, ok, nil, &g1, nil, true)
	must(t, err)
	_, err = f.Control.Commit(ctx, decision(xid().Gtrid, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 10}}, ok, nil, nil, nil, true)
	must(t, err)
}

// Property (the hold of an emptying): while the state is held, rotations
// and records of emptied tables are refused at once (they never wait),
// commit decisions that check the generation go on; once the hold ends,
// both succeed.
func testHoldGenerations(t *testing.T, ctx context.Context, f Fixture) {
	if ok, err := f.Control.RotateKeys(ctx, 0); err != nil || !ok {
		t.Fatalf("first rotation: %v %v", ok, err)
	}
	sc := driver.Scope{Group: "g-" + xid().Gtrid, Topic: "hold"}
	_, err := f.Control.Claim(ctx, sc, "me", []int32{0}, time.Now().UTC())
	must(t, err)
	g1 := driver.Generation(1)
	err = f.Control.HoldKeyGenerations(ctx, func(s driver.KeyGenerations) error {
		if s.Current != 1 {
			t.Errorf("held state %+v, want generation 1", s)
		}
		start := time.Now()
		rotated, err := f.Control.RotateKeys(ctx, 1)
		if err != nil || rotated {
			t.Errorf("rotation during a hold: %v %v, want refused", rotated, err)
		}
		marked, err := f.Control.MarkKeysEmptied(ctx, 0)
		if err != nil || marked {
			t.Errorf("record during a hold: %v %v, want refused", marked, err)
		}
		if d := time.Since(start); d > f.LockWait/2 {
			t.Errorf("the refusals took %s: they must not wait for the lock", d)
		}
		cctx, cancel := context.WithTimeout(ctx, f.LockWait/2)
		defer cancel()
		_, err = f.Control.Commit(cctx, decision(xid().Gtrid, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 3}},
			func([]driver.Stored) error { return nil }, nil, &g1, nil,
			true)

		if err != nil {
			t.Errorf("a decision during a hold: %v", err)
		}
		return nil
	})
	must(t, err)
	if ok, err := f.Control.MarkKeysEmptied(ctx, 0); err != nil || !ok {
		t.Fatalf("record after the hold: %v %v", ok, err)
	}
	if ok, err := f.Control.RotateKeys(ctx, 1); err != nil || !ok {
		t.Fatalf("rotation after the hold: %v %v", ok, err)
	}
}
