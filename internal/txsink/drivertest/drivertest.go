// Package drivertest is the conformance suite of package driver: every
// implementation, the in-memory one included, must pass it, so that tests
// of the protocol over the in-memory driver say something about the real
// servers.
//
// It checks what the protocol relies on: the XA life of a branch, what a
// dropped or killed connection leaves, prepared branches attached to their
// connection or not (as the implementation declares), XA RECOVER listing
// every account's branches, what a session lookup may say, and the control
// bookkeeping: a decision inserted once, the commit point's fence and
// offsets, claims raising epochs.
package drivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// Fixture is one fresh server (or a fresh ledger database on a shared
// server) for one test.
type Fixture struct {
	Server  driver.Server
	Control driver.Control
	// Other is the same server as another account without privileges on
	// the ledger; nil when the implementation cannot make one.
	Other driver.Server
	// Write writes key=value in the branch c holds; Read reads a committed
	// value.
	Write func(ctx context.Context, c driver.Conn, key, value string) error
	Read  func(ctx context.Context, key string) (string, bool, error)
	// AttachesPrepared: a prepared branch stays attached to its live
	// connection (MariaDB); else PREPARE detaches it (MySQL 8.4).
	AttachesPrepared bool
}

// Harness makes fixtures.
type Harness interface {
	New(ctx context.Context, t *testing.T) Fixture
}

// RunConformanceTests runs the suite against h.
func RunConformanceTests(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, ctx context.Context, f Fixture)
	}{
		{"CommitMakesWritesVisible", testCommit},
		{"RollbackDiscardsWrites", testRollback},
		{"DroppedConnectionRollsBackUnprepared", testDroppedUnprepared},
		{"PreparedBranchSurvivesItsConnection", testPreparedSurvives},
		{"AttachedPreparedBranch", testAttached},
		{"DuplicateXid", testDuplicateXid},
		{"ResolveUnknownXid", testResolveUnknown},
		{"Session", testSession},
		{"OtherAccounts", testOtherAccounts},
		{"Uptime", testUptime},
		{"StatementBudget", testBudget},
		{"IdentityIsCreatedOnce", testIdentity},
		{"DecideIsCompareAndSet", testDecide},
		{"CommitFencesAndMovesOffsets", testControlCommit},
		{"ClaimRaisesEpochs", testClaim},
		{"DecisionsAgeAndForget", testForget},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tt.fn(t, ctx, h.New(ctx, t))
		})
	}
}

var seq atomic.Int64

// xid returns an xid no other test uses (servers may be shared).
func xid() driver.Xid {
	n := seq.Add(1)
	return driver.Xid{Format: 7, Gtrid: fmt.Sprintf("dt-%d-%d", time.Now().UnixNano(), n), Bqual: "b"}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func conn(t *testing.T, ctx context.Context, s driver.Server) driver.Conn {
	t.Helper()
	c, err := s.Conn(ctx)
	must(t, err)
	t.Cleanup(func() { c.Close(false) })
	return c
}

// prepare runs a branch up to PREPARE with one write, on c.
func prepare(t *testing.T, ctx context.Context, f Fixture, c driver.Conn, x driver.Xid, key string) {
	t.Helper()
	must(t, c.XA(ctx, driver.Start, x))
	must(t, f.Write(ctx, c, key, "v-"+key))
	must(t, c.XA(ctx, driver.End, x))
	must(t, c.XA(ctx, driver.Prepare, x))
}

func visible(t *testing.T, ctx context.Context, f Fixture, key string) bool {
	t.Helper()
	_, ok, err := f.Read(ctx, key)
	must(t, err)
	return ok
}

func listed(t *testing.T, ctx context.Context, s driver.Server, x driver.Xid) bool {
	t.Helper()
	xs, err := s.Recover(ctx)
	must(t, err)
	return slices.Contains(xs, x)
}

// cleanup resolves x (rolls it back) whatever state a failed test left.
func cleanup(t *testing.T, f Fixture, x driver.Xid, holder driver.Conn) {
	t.Cleanup(func() {
		ctx := context.Background()
		holder.Close(false)
		_ = f.Server.Resolve(ctx, x, false)
	})
}

func testCommit(t *testing.T, ctx context.Context, f Fixture) {
	c := conn(t, ctx, f.Server)
	x := xid()
	prepare(t, ctx, f, c, x, "commit")
	if !listed(t, ctx, f.Server, x) {
		t.Fatal("a prepared branch is not listed by Recover")
	}
	if visible(t, ctx, f, "commit") {
		t.Fatal("a prepared write is visible before commit")
	}
	must(t, c.XA(ctx, driver.Commit, x))
	if !visible(t, ctx, f, "commit") {
		t.Fatal("a committed write is not visible")
	}
	if listed(t, ctx, f.Server, x) {
		t.Fatal("a committed branch is still listed")
	}
}

func testRollback(t *testing.T, ctx context.Context, f Fixture) {
	c := conn(t, ctx, f.Server)
	x := xid()
	must(t, c.XA(ctx, driver.Start, x))
	must(t, f.Write(ctx, c, "rollback", "v"))
	must(t, c.XA(ctx, driver.End, x))
	must(t, c.XA(ctx, driver.Rollback, x))
	if visible(t, ctx, f, "rollback") {
		t.Fatal("a rolled-back write is visible")
	}
	// The connection is clean again: it can carry another branch.
	y := xid()
	prepare(t, ctx, f, c, y, "after-rollback")
	must(t, c.XA(ctx, driver.Rollback, y))
}

func testDroppedUnprepared(t *testing.T, ctx context.Context, f Fixture) {
	c, err := f.Server.Conn(ctx)
	must(t, err)
	x := xid()
	must(t, c.XA(ctx, driver.Start, x))
	must(t, f.Write(ctx, c, "dropped", "v"))
	c.Close(false)
	if listed(t, ctx, f.Server, x) || visible(t, ctx, f, "dropped") {
		t.Fatal("a dropped connection's unprepared branch survived")
	}
	// Its xid is free again.
	d := conn(t, ctx, f.Server)
	must(t, d.XA(ctx, driver.Start, x))
	must(t, d.XA(ctx, driver.End, x))
	must(t, d.XA(ctx, driver.Rollback, x))
}

func testPreparedSurvives(t *testing.T, ctx context.Context, f Fixture) {
	c, err := f.Server.Conn(ctx)
	must(t, err)
	x := xid()
	prepare(t, ctx, f, c, x, "survives")
	cleanup(t, f, x, c)
	c.Close(false)
	if !listed(t, ctx, f.Server, x) {
		t.Fatal("a prepared branch did not survive its connection")
	}
	must(t, f.Server.Resolve(ctx, x, true))
	if !visible(t, ctx, f, "survives") {
		t.Fatal("the branch committed from another connection is not visible")
	}
	if err := f.Server.Resolve(ctx, x, true); f.Server.Code(err) != driver.UnknownXid {
		t.Fatalf("resolving a resolved branch: %v (code %v), want UnknownXid", err, f.Server.Code(err))
	}
}

func testAttached(t *testing.T, ctx context.Context, f Fixture) {
	c, err := f.Server.Conn(ctx)
	must(t, err)
	x := xid()
	prepare(t, ctx, f, c, x, "attached")
	cleanup(t, f, x, c)
	err = f.Server.Resolve(ctx, x, false)
	if !f.AttachesPrepared {
		must(t, err)
		if listed(t, ctx, f.Server, x) {
			t.Fatal("a detached branch is listed after its rollback")
		}
		return
	}
	if f.Server.Code(err) != driver.UnknownXid {
		t.Fatalf("resolving a branch attached to a live connection: %v (code %v), want UnknownXid", err, f.Server.Code(err))
	}
	if !listed(t, ctx, f.Server, x) {
		t.Fatal("the attached branch is not listed")
	}
	// Ending the holder detaches it; the branch is still prepared.
	must(t, f.Server.Kill(ctx, c.ID()))
	deadline := time.Now().Add(10 * time.Second)
	for {
		err = f.Server.Resolve(ctx, x, false)
		if err == nil {
			break
		}
		if f.Server.Code(err) != driver.UnknownXid || time.Now().After(deadline) {
			t.Fatalf("resolving after the holder was killed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if visible(t, ctx, f, "attached") || listed(t, ctx, f.Server, x) {
		t.Fatal("the rolled-back branch left traces")
	}
}

func testDuplicateXid(t *testing.T, ctx context.Context, f Fixture) {
	c, err := f.Server.Conn(ctx)
	must(t, err)
	x := xid()
	prepare(t, ctx, f, c, x, "dup")
	cleanup(t, f, x, c)
	d := conn(t, ctx, f.Server)
	if err := d.XA(ctx, driver.Start, x); f.Server.Code(err) != driver.DuplicateXid {
		t.Fatalf("XA START of a prepared branch's xid: %v (code %v), want DuplicateXid", err, f.Server.Code(err))
	}
}

func testResolveUnknown(t *testing.T, ctx context.Context, f Fixture) {
	for _, commit := range []bool{true, false} {
		if err := f.Server.Resolve(ctx, xid(), commit); f.Server.Code(err) != driver.UnknownXid {
			t.Fatalf("resolving an unknown xid: %v (code %v), want UnknownXid", err, f.Server.Code(err))
		}
	}
}

func testSession(t *testing.T, ctx context.Context, f Fixture) {
	c, err := f.Server.Conn(ctx)
	must(t, err)
	s, err := f.Server.Session(ctx, c.ID())
	must(t, err)
	if !s.Exists || !s.OwnUser {
		t.Fatalf("own open connection: %+v", s)
	}
	if s.TxKnown && s.InTx {
		t.Fatalf("an idle connection holds a transaction: %+v", s)
	}
	t.Cleanup(func() { c.Close(false) })
	x := xid()
	must(t, c.XA(ctx, driver.Start, x))
	must(t, f.Write(ctx, c, "session", "v"))
	// A server may say it a moment late (InnoDB serves its list of
	// transactions from a cache refreshed only when not read for 0.1 s).
	deadline := time.Now().Add(2 * time.Second)
	for {
		time.Sleep(150 * time.Millisecond)
		s, err = f.Server.Session(ctx, c.ID())
		must(t, err)
		if !s.TxKnown || s.InTx {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a connection in a branch: %+v", s)
		}
	}
	c.Close(false)
	deadline = time.Now().Add(10 * time.Second)
	for {
		s, err = f.Server.Session(ctx, c.ID())
		must(t, err)
		if !s.Exists {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed connection still exists: %+v", s)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Another account's branches are listed too (any account can see the
// ledger's xids and start a branch with any xid: hence the MAC in the
// qualifier), and its connections are never taken for ours.
func testOtherAccounts(t *testing.T, ctx context.Context, f Fixture) {
	if f.Other == nil {
		t.Skip("the fixture has no second account")
	}
	c, err := f.Other.Conn(ctx)
	must(t, err)
	x := xid()
	must(t, c.XA(ctx, driver.Start, x))
	must(t, c.XA(ctx, driver.End, x))
	must(t, c.XA(ctx, driver.Prepare, x))
	t.Cleanup(func() {
		c.Close(false)
		_ = f.Other.Resolve(context.Background(), x, false)
	})
	if !listed(t, ctx, f.Server, x) {
		t.Fatal("another account's prepared branch is not listed")
	}
	s, err := f.Server.Session(ctx, c.ID())
	must(t, err)
	if s.Exists && s.OwnUser {
		t.Fatalf("another account's connection passes for our own: %+v", s)
	}
}

func testUptime(t *testing.T, ctx context.Context, f Fixture) {
	u, err := f.Server.Uptime(ctx)
	must(t, err)
	if u < 0 {
		t.Fatalf("uptime %s", u)
	}
}

func testBudget(t *testing.T, ctx context.Context, f Fixture) {
	if b := f.Server.MaxStatementBytes(); b < 32<<10 {
		t.Fatalf("statement budget %d", b)
	}
}

func testIdentity(t *testing.T, ctx context.Context, f Fixture) {
	made := 0
	mk := func() (string, []byte) {
		made++
		return fmt.Sprintf("%016x", made), []byte(fmt.Sprintf("%032d", made))
	}
	id1, s1, err := f.Control.Identity(ctx, mk)
	must(t, err)
	id2, s2, err := f.Control.Identity(ctx, mk)
	must(t, err)
	if id1 != id2 || string(s1) != string(s2) || id1 == "" || len(s1) != 32 {
		t.Fatalf("identity changed or is empty: %q %q / %q %q", id1, s1, id2, s2)
	}
}

func decision(g string, o driver.Outcome) driver.Decision {
	return driver.Decision{Gtrid: g, Outcome: o, By: "dt", At: time.Now().UTC().Truncate(time.Microsecond)}
}

func testDecide(t *testing.T, ctx context.Context, f Fixture) {
	g := xid().Gtrid
	if _, ok, err := f.Control.Lookup(ctx, g); err != nil || ok {
		t.Fatalf("lookup of an undecided gtrid: %v %v", ok, err)
	}
	o, err := f.Control.Decide(ctx, decision(g, driver.Aborted))
	if err != nil || o != driver.Aborted {
		t.Fatalf("first decision: %v %v", o, err)
	}
	o, err = f.Control.Decide(ctx, decision(g, driver.Committed))
	if err != nil || o != driver.Aborted {
		t.Fatalf("second decision: %v %v, want the first one's abort", o, err)
	}
	if o, ok, err := f.Control.Lookup(ctx, g); err != nil || !ok || o != driver.Aborted {
		t.Fatalf("lookup: %v %v %v", o, ok, err)
	}
}

func testControlCommit(t *testing.T, ctx context.Context, f Fixture) {
	sc := driver.Scope{Group: "g-" + xid().Gtrid, Topic: "t"}
	st, err := f.Control.Claim(ctx, sc, "me", []int32{0, 1}, time.Now().UTC())
	must(t, err)
	var seen []driver.Stored
	g := xid().Gtrid
	err = f.Control.Commit(ctx, decision(g, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 10}, {Partition: 1, NextOffset: 20}},
		func(s []driver.Stored) error { seen = s; return nil })
	must(t, err)
	if len(seen) != 2 || seen[0].Epoch != st[0].Epoch || seen[0].Owner != "me" {
		t.Fatalf("fence saw %+v", seen)
	}
	pos, err := f.Control.Positions(ctx, sc, []int32{0, 1, 2})
	must(t, err)
	if len(pos) != 2 || pos[0].NextOffset != 10 || pos[1].NextOffset != 20 || pos[1].Owner != "me" || pos[1].Epoch != st[1].Epoch {
		t.Fatalf("positions after commit: %+v", pos)
	}
	if o, ok, _ := f.Control.Lookup(ctx, g); !ok || o != driver.Committed {
		t.Fatal("the commit decision is missing")
	}
	// A fence that refuses writes nothing.
	refused := errors.New("fenced")
	g2 := xid().Gtrid
	err = f.Control.Commit(ctx, decision(g2, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 99}}, func([]driver.Stored) error { return refused })
	if !errors.Is(err, refused) {
		t.Fatalf("refused fence: %v", err)
	}
	if _, ok, _ := f.Control.Lookup(ctx, g2); ok {
		t.Fatal("a fenced commit left a decision")
	}
	if pos, _ := f.Control.Positions(ctx, sc, []int32{0}); pos[0].NextOffset != 10 {
		t.Fatalf("a fenced commit moved the offset: %+v", pos[0])
	}
	// A gtrid decided already (by a recoverer's abort) cannot commit.
	g3 := xid().Gtrid
	if _, err := f.Control.Decide(ctx, decision(g3, driver.Aborted)); err != nil {
		t.Fatal(err)
	}
	err = f.Control.Commit(ctx, decision(g3, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 50}}, func([]driver.Stored) error { return nil })
	if !errors.Is(err, driver.ErrDecided) {
		t.Fatalf("commit of a decided gtrid: %v, want ErrDecided", err)
	}
	if pos, _ := f.Control.Positions(ctx, sc, []int32{0}); pos[0].NextOffset != 10 {
		t.Fatalf("a refused commit moved the offset: %+v", pos[0])
	}
}

func testClaim(t *testing.T, ctx context.Context, f Fixture) {
	sc := driver.Scope{Group: "g-" + xid().Gtrid, Topic: "claims"}
	first, err := f.Control.Claim(ctx, sc, "a", []int32{3}, time.Now().UTC())
	must(t, err)
	if r := first[3]; r.Epoch != 1 || r.Owner != "a" || r.NextOffset != driver.StartOffset {
		t.Fatalf("first claim: %+v", r)
	}
	second, err := f.Control.Claim(ctx, sc, "b", []int32{3}, time.Now().UTC())
	must(t, err)
	if r := second[3]; r.Epoch != 2 || r.Owner != "b" {
		t.Fatalf("second claim: %+v", r)
	}
	groups, err := f.Control.Groups(ctx, "claims")
	must(t, err)
	if !slices.Contains(groups, sc.Group) {
		t.Fatalf("groups %v lack %s", groups, sc.Group)
	}
}

func testForget(t *testing.T, ctx context.Context, f Fixture) {
	old := decision(xid().Gtrid, driver.Aborted)
	old.At = time.Now().UTC().Add(-time.Hour).Truncate(time.Microsecond)
	young := decision(xid().Gtrid, driver.Committed)
	for _, d := range []driver.Decision{old, young} {
		if _, err := f.Control.Decide(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	got, err := f.Control.Decided(ctx, time.Now().UTC().Add(-time.Minute), 1000)
	must(t, err)
	if !slices.Contains(got, old.Gtrid) || slices.Contains(got, young.Gtrid) {
		t.Fatalf("decided before a minute ago: %v", got)
	}
	n, err := f.Control.Forget(ctx, []string{old.Gtrid, "never-decided"})
	if err != nil || n != 1 {
		t.Fatalf("forget: %d %v", n, err)
	}
	if _, ok, _ := f.Control.Lookup(ctx, old.Gtrid); ok {
		t.Fatal("a forgotten decision is still there")
	}
}
