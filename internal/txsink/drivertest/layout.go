package drivertest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The live move's cursor (driver.MoveCursor): what every decision checks,
// and what a step of the mover changes (Fixture.MoveCursor).

func init() {
	layoutTests := []struct {
		name string
		fn   func(t *testing.T, ctx context.Context, f Fixture)
	}{
		{"MoveCursorRoundTrips", testMoveCursorRoundTrip},
		{"CommitRefusedByTheMoveCursor", testCommitLayout},
		{"MoveCursorWaitsForDecisionsThatReadIt", testMoveCursorWaits},
		{"AwaitStepRecordsTheLatestWait", testAwaitStep},
	}
	storeTests = append(storeTests, layoutTests...)
}

// Property: the cursor reads as the mover stored it, keys of any bytes
// (driver.KeysEnd among them); a fresh ledger's is version 0, not moving.
func testMoveCursorRoundTrip(t *testing.T, ctx context.Context, f Fixture) {
	if f.MoveCursor == nil {
		t.Skip("the fixture cannot move the cursor")
	}
	cur, err := f.Control.MoveCursor(ctx)
	must(t, err)
	if cur.Moving || cur.Frozen() || cur.Version != 0 {
		t.Fatalf("a fresh ledger's cursor: %+v", cur)
	}
	for _, next := range []driver.MoveCursor{
		{Version: 2, Moving: true, Mover: "run 1"},
		{Version: 2, Moving: true, AnnouncedBelow: "acct-\x00\x01é", Mover: "run 1"},
		{Version: 2, Moving: true, MovedBelow: "acct-\x00\x01é", AnnouncedBelow: driver.KeysEnd, Mover: "run 2"},
		{Version: 2, Moving: true, MovedBelow: "acct-\x00\x01é", FrozenBelow: driver.KeysEnd, Mover: "run 2"},
		{Version: 2, MovedBelow: driver.KeysEnd, Mover: "run 2"},
	} {
		_, err := f.MoveCursor(ctx, cur, next)
		must(t, err)
		got, err := f.Control.MoveCursor(ctx)
		must(t, err)
		if got != next {
			t.Fatalf("cursor stored %+v, read %+v", next, got)
		}
		cur = got
	}
	if _, err := f.MoveCursor(ctx, driver.MoveCursor{Version: 9}, driver.MoveCursor{Version: 10}); !errors.Is(err, driver.ErrMoveCursorMoved) {
		t.Fatalf("a change from a cursor that is not the stored one: %v, want ErrMoveCursorMoved", err)
	}
}

// Property: a decision passes the cursor as stored to its layout check,
// and is refused, writing nothing, when the check refuses.
func testCommitLayout(t *testing.T, ctx context.Context, f Fixture) {
	if f.MoveCursor == nil {
		t.Skip("the fixture cannot move the cursor")
	}
	sc := driver.Scope{Group: "g-" + xid().Gtrid, Topic: "layout"}
	_, err := f.Control.Claim(ctx, sc, "me", []int32{0}, time.Now().UTC())
	must(t, err)
	ok := func([]driver.Stored) error { return nil }
	was, err := f.Control.MoveCursor(ctx)
	must(t, err)
	moving := driver.MoveCursor{Version: 3, Moving: true, MovedBelow: "k", FrozenBelow: "m", Mover: "run"}
	_, err = f.MoveCursor(ctx, was, moving)
	must(t, err)
	var seen driver.MoveCursor
	_, err = f.Control.Commit(ctx, decision(xid().Gtrid, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 5}}, ok, nil, nil,
		func(c driver.MoveCursor) error { seen = c; return nil }, true)
	must(t, err)
	if seen != moving {
		t.Fatalf("the decision's check saw %+v, want %+v", seen, moving)
	}
	refused := errors.New("a key frozen")
	late := xid().Gtrid
	_, err = f.Control.Commit(ctx, decision(late, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 9}}, ok, nil, nil,
		func(driver.MoveCursor) error { return refused }, true)
	if !errors.Is(err, refused) {
		t.Fatalf("a decision its layout check refuses: %v", err)
	}
	if _, found, err := f.Control.Lookup(ctx, late); err != nil || found {
		t.Fatalf("the refused decision was written (%v, %v)", found, err)
	}
	pos, err := f.Control.Positions(ctx, sc, []int32{0})
	must(t, err)
	if pos[0].NextOffset != 5 {
		t.Fatalf("the refused decision moved the offset to %d", pos[0].NextOffset)
	}
}

// Property (the step's freeze): a change of the cursor waits for a
// decision that is reading it (its check runs under the lock it holds to
// its COMMIT), and the commit log's number it returns covers that
// decision: a step moves rows only after every decision taken under the
// cursor before is numbered at or below it.
func testMoveCursorWaits(t *testing.T, ctx context.Context, f Fixture) {
	if f.MoveCursor == nil {
		t.Skip("the fixture cannot move the cursor")
	}
	sc := driver.Scope{Group: "g-" + xid().Gtrid, Topic: "freeze"}
	_, err := f.Control.Claim(ctx, sc, "me", []int32{0}, time.Now().UTC())
	must(t, err)
	was, err := f.Control.MoveCursor(ctx)
	must(t, err)
	inCheck, release := make(chan struct{}), make(chan struct{})
	type result struct {
		seq int64
		err error
	}
	decided := make(chan result, 1)
	go func() {
		seq, err := f.Control.Commit(ctx, decision(xid().Gtrid, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 5}},
			func([]driver.Stored) error { return nil }, nil, nil, func(driver.MoveCursor) error {
				close(inCheck)
				<-release
				return nil
			}, true)
		decided <- result{seq, err}
	}()
	<-inCheck
	changed := make(chan result, 1)
	go func() {
		seq, err := f.MoveCursor(ctx, was, driver.MoveCursor{Version: 4, Moving: true, FrozenBelow: "z", Mover: "run"})
		changed <- result{seq, err}
	}()
	select {
	case r := <-changed:
		t.Fatalf("the cursor changed (%+v) while a decision was reading it", r)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	d := <-decided
	must(t, d.err)
	c := <-changed
	must(t, c.err)
	if c.seq < d.seq {
		t.Fatalf("the change returned commit number %d, below the decision's %d that read the cursor before it", c.seq, d.seq)
	}
}

// Property: an instance's wait for an announced step reads back for that
// step only, one per instance, the latest of each; an instance that
// stopped (a wait for no step) waits for every step.
func testAwaitStep(t *testing.T, ctx context.Context, f Fixture) {
	if f.StepWaiters == nil {
		t.Skip("the fixture cannot read the waits")
	}
	one := driver.MoveCursor{Version: 2, Moving: true, MovedBelow: "a\x00", AnnouncedBelow: "k\xff", Mover: "run"}
	two := one
	two.MovedBelow, two.AnnouncedBelow = one.AnnouncedBelow, driver.KeysEnd
	inst := func(s string) string { return s + "-" + xid().Gtrid[:12] }
	a, b, gone := inst("a"), inst("b"), inst("c")
	for _, w := range []struct {
		inst string
		cur  driver.MoveCursor
	}{{a, one}, {b, one}, {b, one}, {a, two}, {gone, two}, {gone, driver.MoveCursor{}}} {
		must(t, f.Control.AwaitStep(ctx, w.inst, w.cur))
	}
	for _, c := range []struct {
		cur  driver.MoveCursor
		want []string
	}{{one, []string{b, gone}}, {two, []string{a, gone}}, {driver.MoveCursor{Version: 3, Moving: true, AnnouncedBelow: "k\xff"}, []string{gone}}} {
		got, err := f.StepWaiters(ctx, c.cur)
		must(t, err)
		got = slices.DeleteFunc(got, func(s string) bool { return s != a && s != b && s != gone })
		slices.Sort(c.want)
		if !slices.Equal(got, c.want) {
			t.Fatalf("waiting for %+v: %q, want %q", c.cur, got, c.want)
		}
	}
}
