// Package drivertest is the conformance suite of package driver: every
// implementation, the in-memory one included, must pass it, so that tests
// of the protocol and of the pipeline over the in-memory driver say
// something about the real servers.
//
// It checks what the protocol relies on: the XA life of a branch, what a
// dropped or killed connection leaves, prepared branches attached to their
// connection or not (as the implementation declares), XA RECOVER listing
// every account's branches, what a session lookup may say, and the control
// bookkeeping: a decision inserted once, the commit point's fence and
// offsets, claims raising epochs, watermarks that never go back, the
// frontier checked and raised by the commit point, and the commit log:
// numbered in commit order under concurrent decisions, applied marking,
// the visible position, and pruning; the dedup keys' generations, their
// rotation and records in order, the decision's check of the generation,
// and the hold of the state while a table is emptied (generations.go).
// And the ledger's tables (store*.go):
// claims (their affected rows, racing across branches), lookups of
// committed rows only, locking reads and lock waits, sums and their
// overflow, statement sizes from max_allowed_packet, identifiers of any
// bytes, sealing (its order, what it returns, its wait for open writes),
// dead letters of any size, retention in batches, and the generations'
// tables: one per generation, locking reads that wait for claims, claims
// under different generations racing on one key, emptying that waits a
// bounded time for a prepared branch, and the table of the version before
// with its journal (store_generations.go).
package drivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
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

	// Store is the ledger's tables on Server's pools (Server's connections
	// carry the branches' driver.StoreTx); Tables reads what they hold, as
	// committed. LockWait is the server's lock wait timeout.
	Store  driver.Store
	Tables func(ctx context.Context) (driver.Tables, error)
	// Letters is dead_letters on Server's pools, as the operator's
	// tools read and update it.
	Letters  Letters
	LockWait time.Duration
	// Packet returns a fixture on the same ledger whose max_allowed_packet
	// is n bytes (the smaller of the server's and the client's).
	Packet func(t *testing.T, n int) Fixture
	// Legacy stores the keys ids in dedup_keys with one journal row of
	// dedup_expiry listing them, expiring at expires, committed, as the
	// version before generations wrote them.
	Legacy func(ctx context.Context, expires time.Time, ids []string) error
	// LowerPacket returns a fixture (this one, or one on a server of the
	// test's own) whose server's max_allowed_packet was lowered to n after
	// its budget was read (an operator's SET GLOBAL, until the next
	// RefreshLimits); nil when the harness cannot do it alone. A server
	// shared with other tests is never lowered: MariaDB's limit is global,
	// and every connection opened meanwhile, other tests' too, would get it.
	LowerPacket func(t *testing.T, n int) Fixture
	// MoveCursor changes the live move's cursor from was to next, as a
	// step of the mover does, and returns the commit log's last number as
	// of the change; nil when the implementation cannot.
	MoveCursor func(ctx context.Context, was, next driver.MoveCursor) (int64, error)
	// StepWaiters lists, sorted, the instances that said they wait for the
	// step cur announces (Control.AwaitStep), as the mover reads them;
	// nil when the implementation cannot.
	StepWaiters func(ctx context.Context, cur driver.MoveCursor) ([]string, error)
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
		{"CommitWritesEventTime", testEventTime},
		{"CommitChecksAndRaisesTheFrontier", testFrontier},
		{"DecisionsAgeAndForget", testForget},
		{"CommitLogInCommitOrder", testCommitOrder},
		{"CommitLogAppliedAndVisible", testApplied},
		{"CommitLogRecordsTheSealedFrontier", testCommitSealed},
		{"CommitLogForget", testForgetCommits},
		{"KeyGenerationsRotateAndRecordInOrder", testGenerationState},
		{"CommitRefusesKeysOfAGenerationLeft", testCommitGeneration},
		{"HeldKeyGenerationsStopRotationNotDecisions", testHoldGenerations},
	}
	tests = append(tests, storeTests...)
	tests = append(tests, changelogTests...)
	tests = append(tests, lettersTests...)
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
// A prepared branch stays attached to its session until the server has
// seen the holder's connection close, and until then another session's
// rollback answers UnknownXid (MariaDB, under load, for a moment): so it
// retries while the branch is still listed, for up to cleanupWait. A
// branch left prepared would hold its locks past the test and block the
// dropping of the test's database.
func cleanup(t *testing.T, f Fixture, x driver.Xid, holder driver.Conn) {
	t.Cleanup(func() {
		ctx := context.Background()
		holder.Close(false)
		deadline := time.Now().Add(cleanupWait)
		for f.Server.Resolve(ctx, x, false) != nil && listed(t, ctx, f.Server, x) {
			if time.Now().After(deadline) {
				t.Errorf("branch %v still prepared %v after its connection closed", x, cleanupWait)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// cleanupWait bounds how long cleanup waits for the server to let go of a
// closed connection's branch.
const cleanupWait = 10 * time.Second

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
	// Its xid is free again, once the server has ended the dropped
	// session's work: MariaDB does so asynchronously, and an XA START at
	// once may still meet the xid (XAER_DUPID; make test failed so once).
	d := conn(t, ctx, f.Server)
	for deadline := time.Now().Add(10 * time.Second); ; {
		err := d.XA(ctx, driver.Start, x)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dropped branch's xid is still taken after 10s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
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
	// MariaDB detaches the branch from the closed session asynchronously:
	// until then another connection's XA COMMIT meets XAER_NOTA (a fresh
	// clone's make test failed so once).
	for deadline := time.Now().Add(10 * time.Second); ; {
		err := f.Server.Resolve(ctx, x, true)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the prepared branch cannot be committed from another connection after 10s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
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
	_, err = f.Control.Commit(ctx, decision(g, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 10}, {Partition: 1, NextOffset: 20}},
		func(s []driver.Stored) error { seen = s; return nil }, nil, nil, nil,
		true)

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
	_, err = f.Control.Commit(ctx, decision(g2, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 99}}, func([]driver.Stored) error { return refused }, nil, nil, nil, true)
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
	_, err = f.Control.Commit(ctx, decision(g3, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 50}}, func([]driver.Stored) error { return nil }, nil, nil, nil, true)
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

func testEventTime(t *testing.T, ctx context.Context, f Fixture) {
	sc := driver.Scope{Group: "g-" + xid().Gtrid, Topic: "et"}
	_, err := f.Control.Claim(ctx, sc, "me", []int32{0, 1}, time.Now().UTC())
	must(t, err)
	at := func(h int) time.Time { return time.Date(2026, 3, 29, h, 0, 0, 123456000, time.UTC) }
	commit := func(cuts ...driver.Cut) {
		t.Helper()
		_, err := f.Control.Commit(ctx, decision(xid().Gtrid, driver.Committed), sc, cuts, func([]driver.Stored) error { return nil }, nil, nil, nil, true)
		must(t, err)
	}
	read := func() map[int32]driver.Stored {
		t.Helper()
		_, rows, err := f.Control.EventTime(ctx, sc)
		must(t, err)
		m := map[int32]driver.Stored{}
		for _, r := range rows {
			m[r.Partition] = r
		}
		return m
	}
	if rows := read(); len(rows) != 2 || !rows[0].Watermark.IsZero() || rows[0].CaughtUp || rows[1].NextOffset != driver.StartOffset {
		t.Fatalf("after claims: %+v", rows)
	}
	commit(driver.Cut{Partition: 0, NextOffset: 10, Watermark: at(5), CaughtUp: true}, driver.Cut{Partition: 1, NextOffset: 3})
	rows := read()
	if r := rows[0]; !r.Watermark.Equal(at(5)) || !r.CaughtUp || r.NextOffset != 10 || r.Owner != "me" {
		t.Fatalf("p0 after commit: %+v", r)
	}
	if r := rows[1]; !r.Watermark.IsZero() || r.CaughtUp || r.NextOffset != 3 {
		t.Fatalf("p1 after commit: %+v", r)
	}
	// An older watermark, or none, leaves the stored one; the flag follows
	// the cut.
	commit(driver.Cut{Partition: 0, NextOffset: 11, Watermark: at(4)}, driver.Cut{Partition: 1, NextOffset: 4, Watermark: at(2), CaughtUp: true})
	commit(driver.Cut{Partition: 1, NextOffset: 5, CaughtUp: true})
	rows = read()
	if r := rows[0]; !r.Watermark.Equal(at(5)) || r.CaughtUp || r.NextOffset != 11 {
		t.Fatalf("p0 went back: %+v", r)
	}
	if r := rows[1]; !r.Watermark.Equal(at(2)) || !r.CaughtUp || r.NextOffset != 5 {
		t.Fatalf("p1: %+v", r)
	}
	// Positions and claims carry the event time too.
	pos, err := f.Control.Positions(ctx, sc, []int32{0})
	must(t, err)
	if !pos[0].Watermark.Equal(at(5)) {
		t.Fatalf("positions: %+v", pos[0])
	}
	cl, err := f.Control.Claim(ctx, sc, "you", []int32{1}, time.Now().UTC())
	must(t, err)
	if r := cl[1]; !r.Watermark.Equal(at(2)) || !r.CaughtUp || r.Epoch != 2 {
		t.Fatalf("claim: %+v", r)
	}
}

func testFrontier(t *testing.T, ctx context.Context, f Fixture) {
	sc := driver.Scope{Group: "g-" + xid().Gtrid, Topic: "frontier"}
	_, err := f.Control.Claim(ctx, sc, "me", []int32{0}, time.Now().UTC())
	must(t, err)
	// The fixture's ledger may be shared by the tests of one server:
	// start from what is stored.
	base, _, err := f.Control.EventTime(ctx, sc)
	must(t, err)
	at := func(h int) time.Time {
		return later(base.Closed, base.Sealed, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)).Add(time.Duration(h) * time.Hour)
	}
	var seen []driver.Frontier
	change := func(closed, sealed time.Time, refuse error) *driver.FrontierChange {
		return &driver.FrontierChange{Raise: driver.Frontier{Closed: closed, Sealed: sealed},
			Check: func(fr driver.Frontier) error { seen = append(seen, fr); return refuse }}
	}
	commit := func(fc *driver.FrontierChange, cuts ...driver.Cut) (string, error) {
		g := xid().Gtrid
		_, err := f.Control.Commit(ctx, decision(g, driver.Committed), sc, cuts, func([]driver.Stored) error { return nil }, fc, nil, nil, true)
		return g, err
	}
	frontier := func() driver.Frontier {
		t.Helper()
		fr, _, err := f.Control.EventTime(ctx, sc)
		must(t, err)
		return fr
	}
	if _, err := commit(change(at(2), time.Time{}, nil), driver.Cut{Partition: 0, NextOffset: 5}); err != nil {
		t.Fatal(err)
	}
	if fr := frontier(); !fr.Closed.Equal(at(2)) || !fr.Sealed.Equal(base.Sealed) {
		t.Fatalf("after raising closed: %+v", fr)
	}
	// Check sees the stored frontier; a lower raise leaves it.
	if _, err := commit(change(at(1), at(2), nil)); err != nil {
		t.Fatal(err)
	}
	if fr := frontier(); !fr.Closed.Equal(at(2)) || !fr.Sealed.Equal(at(2)) {
		t.Fatalf("after a lower raise: %+v", fr)
	}
	if len(seen) != 2 || !seen[1].Closed.Equal(at(2)) {
		t.Fatalf("check saw %+v", seen)
	}
	// A refusing check writes nothing: no decision, no offsets, no raise.
	refused := errors.New("moved")
	g, err := commit(change(at(9), at(9), refused), driver.Cut{Partition: 0, NextOffset: 99, Watermark: at(9)})
	if !errors.Is(err, refused) {
		t.Fatalf("refused check: %v", err)
	}
	if _, ok, _ := f.Control.Lookup(ctx, g); ok {
		t.Fatal("a refused frontier check left a decision")
	}
	fr, rows, err := f.Control.EventTime(ctx, sc)
	must(t, err)
	if !fr.Closed.Equal(at(2)) || rows[0].NextOffset != 5 || !rows[0].Watermark.IsZero() {
		t.Fatalf("a refused check changed something: %+v %+v", fr, rows)
	}
	// Without a change, the frontier is not touched.
	if _, err := commit(nil, driver.Cut{Partition: 0, NextOffset: 6}); err != nil {
		t.Fatal(err)
	}
	if n := len(seen); n != 3 {
		t.Fatalf("check called %d times, want 3", n)
	}
}

func later(ts ...time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if t.After(out) {
			out = t
		}
	}
	return out
}

// position reads the commit position.
func position(t *testing.T, ctx context.Context, f Fixture) driver.CommitPosition {
	t.Helper()
	p, err := f.Control.CommitPosition(ctx)
	must(t, err)
	return p
}

// commitOne commits an empty decision of a fresh gtrid on a fresh scope
// (no partition, so no fence) and returns the gtrid and its number.
func commitOne(t *testing.T, ctx context.Context, f Fixture, fc *driver.FrontierChange, applied bool) (string, int64) {
	t.Helper()
	g := xid().Gtrid
	seq, err := f.Control.Commit(ctx, decision(g, driver.Committed), driver.Scope{Group: "g-" + g, Topic: "log"}, nil,
		func([]driver.Stored) error { return nil }, fc, nil, nil,
		applied)

	must(t, err)
	return g, seq
}

// Concurrent decisions get the numbers 1, 2, 3... in the order they
// commit: a reader never sees a number committed while a smaller one is
// still missing, and every decision's number is its record's.
func testCommitOrder(t *testing.T, ctx context.Context, f Fixture) {
	const coordinators, each = 8, 25
	base := position(t, ctx, f)
	if base.Visible != base.Decided {
		t.Fatalf("fresh ledger with unapplied decisions: %+v", base)
	}
	got := make([]map[string]int64, coordinators)
	errs := make([]error, coordinators)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range coordinators {
		got[i] = map[string]int64{}
		wg.Go(func() {
			sc := driver.Scope{Group: "g-" + xid().Gtrid, Topic: "order"}
			st, err := f.Control.Claim(ctx, sc, "me", []int32{int32(i)}, time.Now().UTC())
			if err != nil {
				errs[i] = err
				return
			}
			for n := range each {
				g := xid().Gtrid
				seq, err := f.Control.Commit(ctx, decision(g, driver.Committed), sc, []driver.Cut{{Partition: int32(i), NextOffset: int64(n)}},
					func(s []driver.Stored) error {
						if len(s) != 1 || s[0].Epoch != st[int32(i)].Epoch {
							return fmt.Errorf("fence saw %+v", s)
						}
						return nil
					}, nil, nil, nil,

					n%2 == 0)

				if err != nil {
					errs[i] = err
					return
				}
				got[i][g] = seq
				if n%2 == 1 {
					if _, err := f.Control.MarkApplied(ctx, []string{g}); err != nil {
						errs[i] = err
						return
					}
				}
			}
		})
	}
	reader := make(chan struct{})
	var observed int64
	var bad string
	go func() {
		defer close(reader)
		observed, bad = readCommitLog(ctx, f, base, coordinators*each, done)
	}()
	wg.Wait()
	close(done)
	<-reader
	for _, err := range errs {
		must(t, err)
	}
	if bad != "" {
		t.Fatal(bad)
	}
	recs, err := f.Control.Commits(ctx, base.Decided+1, false, coordinators*each+1)
	must(t, err)
	if len(recs) != coordinators*each {
		t.Fatalf("%d records, want %d", len(recs), coordinators*each)
	}
	bySeq := map[int64]string{}
	for _, r := range recs {
		bySeq[r.Seq] = r.Gtrid
		if !r.Applied {
			t.Fatalf("record %d not applied", r.Seq)
		}
	}
	for _, m := range got {
		for g, seq := range m {
			if bySeq[seq] != g {
				t.Fatalf("decision %s was given %d, the log has %q there", g, seq, bySeq[seq])
			}
		}
	}
	if p := position(t, ctx, f); p.Visible != base.Decided+coordinators*each || p.Decided != p.Visible {
		t.Fatalf("after every decision applied: %+v", p)
	}
	t.Logf("%d snapshots of the log observed during the decisions", observed)
}

// readCommitLog reads the commit log over and over until done: each
// listing is one snapshot of the log; the numbers it holds must be exactly
// base+1 ... base+k, and the visible position never goes back. It returns
// how many snapshots it read, and what was wrong, if anything.
func readCommitLog(ctx context.Context, f Fixture, base driver.CommitPosition, total int, done <-chan struct{}) (int64, string) {
	var observed, lastVisible int64
	for {
		select {
		case <-done:
			return observed, ""
		default:
		}
		recs, err := f.Control.Commits(ctx, base.Decided+1, false, total+1)
		if err != nil {
			return observed, err.Error()
		}
		for i, r := range recs {
			if r.Seq != base.Decided+1+int64(i) {
				return observed, fmt.Sprintf("a snapshot of the log holds %d at place %d: a later number committed before an earlier one", r.Seq, i)
			}
		}
		p, err := f.Control.CommitPosition(ctx)
		if err != nil {
			return observed, err.Error()
		}
		if p.Visible < lastVisible || p.Visible > p.Decided {
			return observed, fmt.Sprintf("visible position %d after %d (decided %d)", p.Visible, lastVisible, p.Decided)
		}
		lastVisible = p.Visible
		observed++
	}
}

// A decision is applied at once only when told so; the visible position
// stops below the first decision not applied; a refused commit takes no
// number.
func testApplied(t *testing.T, ctx context.Context, f Fixture) {
	base := position(t, ctx, f)
	g1, s1 := commitOne(t, ctx, f, nil, false)
	g2, s2 := commitOne(t, ctx, f, nil, true)
	if s1 != base.Decided+1 || s2 != s1+1 {
		t.Fatalf("numbers %d, %d after %d", s1, s2, base.Decided)
	}
	if p := position(t, ctx, f); p.Visible != base.Visible || p.Decided != s2 {
		t.Fatalf("with %d not applied: %+v", s1, p)
	}
	un, err := f.Control.Commits(ctx, 0, true, 10)
	must(t, err)
	if len(un) != 1 || un[0].Gtrid != g1 || un[0].Seq != s1 || un[0].Applied {
		t.Fatalf("unapplied: %+v", un)
	}
	if un[0].Age < 0 || un[0].Age > time.Minute || un[0].CommittedAt.IsZero() {
		t.Fatalf("age %s, committed at %s: not the server's clock", un[0].Age, un[0].CommittedAt)
	}
	// A refused commit, and one of a gtrid decided already, take no number.
	refused := errors.New("fenced")
	sc := driver.Scope{Group: "g-" + g1, Topic: "log"}
	_, err = f.Control.Claim(ctx, sc, "me", []int32{0}, time.Now().UTC())
	must(t, err)
	_, err = f.Control.Commit(ctx, decision(xid().Gtrid, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 1}},
		func([]driver.Stored) error { return refused }, nil, nil, nil,
		true)

	if !errors.Is(err, refused) {
		t.Fatalf("refused fence: %v", err)
	}
	if _, err := f.Control.Commit(ctx, decision(g2, driver.Committed), driver.Scope{Group: "g", Topic: "log"}, nil,
		func([]driver.Stored) error { return nil }, nil, nil, nil,
		true); !errors.Is(err, driver.ErrDecided) {
		t.Fatalf("commit of a decided gtrid: %v", err)
	}
	if n, err := f.Control.MarkApplied(ctx, []string{g1, g2, "never-decided"}); err != nil || n != 1 {
		t.Fatalf("mark applied: %d %v, want 1 (the others are applied or unknown)", n, err)
	}
	if p := position(t, ctx, f); p.Visible != s2 || p.Decided != s2 {
		t.Fatalf("after marking %d applied: %+v", s1, p)
	}
	if _, s3 := commitOne(t, ctx, f, nil, true); s3 != s2+1 {
		t.Fatalf("after refused commits the next number is %d, want %d", s3, s2+1)
	}
}

// Each record keeps the sealed frontier its decision left; the position
// reports the one of the decision at the visible position.
func testCommitSealed(t *testing.T, ctx context.Context, f Fixture) {
	fr, _, err := f.Control.EventTime(ctx, driver.Scope{Group: "g", Topic: "sealed"})
	must(t, err)
	x := later(fr.Closed, fr.Sealed, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)).Add(time.Hour)
	y := x.Add(time.Hour)
	raise := func(sealed time.Time) *driver.FrontierChange {
		return &driver.FrontierChange{Raise: driver.Frontier{Closed: sealed, Sealed: sealed}}
	}
	_, sx := commitOne(t, ctx, f, raise(x), true)
	if p := position(t, ctx, f); p.Visible != sx || !p.SealedBefore.Equal(x) {
		t.Fatalf("after sealing before %s: %+v", x, p)
	}
	gy, sy := commitOne(t, ctx, f, raise(y), false)
	if p := position(t, ctx, f); p.Visible != sx || !p.SealedBefore.Equal(x) {
		t.Fatalf("with the seal before %s not applied: %+v, want the earlier seal", y, p)
	}
	// A decision that does not touch the frontier records none; a lower
	// raise records the frontier as it stands.
	_, sn := commitOne(t, ctx, f, nil, true)
	_, sl := commitOne(t, ctx, f, raise(x), true)
	if _, err := f.Control.MarkApplied(ctx, []string{gy}); err != nil {
		t.Fatal(err)
	}
	recs, err := f.Control.Commits(ctx, sx, false, 10)
	must(t, err)
	want := map[int64]time.Time{sx: x, sy: y, sn: {}, sl: y}
	for _, r := range recs {
		if w, ok := want[r.Seq]; !ok || !r.SealedBefore.Equal(w) {
			t.Errorf("record %d: sealed before %s, want %s", r.Seq, r.SealedBefore, w)
		}
	}
	if p := position(t, ctx, f); p.Visible != sl || !p.SealedBefore.Equal(y) {
		t.Fatalf("all applied: %+v, want visible %d sealed before %s", p, sl, y)
	}
}

// Pruning deletes a prefix; the lowest retained number tells readers what
// is gone; numbers are never reused.
func testForgetCommits(t *testing.T, ctx context.Context, f Fixture) {
	base := position(t, ctx, f)
	var seqs []int64
	for range 3 {
		_, s := commitOne(t, ctx, f, nil, true)
		seqs = append(seqs, s)
	}
	n, err := f.Control.ForgetCommits(ctx, seqs[1])
	must(t, err)
	if n != seqs[1]-base.RetainedFrom+1 {
		t.Fatalf("forgot %d records through %d, retained from %d before", n, seqs[1], base.RetainedFrom)
	}
	p := position(t, ctx, f)
	if p.RetainedFrom != seqs[2] || p.Decided != seqs[2] || p.Visible != seqs[2] {
		t.Fatalf("after forgetting through %d: %+v", seqs[1], p)
	}
	recs, err := f.Control.Commits(ctx, 0, false, 10)
	must(t, err)
	if len(recs) != 1 || recs[0].Seq != seqs[2] {
		t.Fatalf("records left: %+v", recs)
	}
	_, err = f.Control.ForgetCommits(ctx, seqs[2])
	must(t, err)
	if p := position(t, ctx, f); p.RetainedFrom != seqs[2]+1 || p.Decided != seqs[2] || p.Visible != seqs[2] || !p.SealedBefore.IsZero() {
		t.Fatalf("with the log empty: %+v", p)
	}
	if _, s := commitOne(t, ctx, f, nil, true); s != seqs[2]+1 {
		t.Fatalf("after pruning the next number is %d, want %d", s, seqs[2]+1)
	}
}

// noKept is the error of a WriteEntries that keeps nothing stored.
func noKept(_ []driver.EntryKey, err error) error { return err }
