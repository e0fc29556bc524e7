package drivertest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// ViewFixture is a fresh ledger with its read-only view (driver.View):
// the Fixture writes through Control and Server, the view reads back.
type ViewFixture struct {
	Fixture
	View driver.View
	// StorePeriod appends a period definition as package periods does
	// (no interface of package driver writes them).
	StorePeriod func(ctx context.Context, r driver.PeriodRow) error
	// StoreLayout stores one layout version as package shards does,
	// reporting false when the version exists; ClaimServer claims the
	// server for a ledger unless one did. The fixture's server has its
	// identity (as migrated), unclaimed.
	StoreLayout func(ctx context.Context, rows []driver.LayoutRow) (bool, error)
	ClaimServer func(ctx context.Context, ledger string) error
}

// ViewHarness makes view fixtures.
type ViewHarness interface {
	NewView(ctx context.Context, t *testing.T) ViewFixture
}

// RunViewTests holds an implementation of driver.View to the contract:
// it reads back exactly what Control wrote, the prepared branches as XA
// RECOVER lists them, and the period definitions in order, and it reads
// a ledger no instance has started on as empty, not as an error.
func RunViewTests(t *testing.T, h ViewHarness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, ctx context.Context, f ViewFixture)
	}{
		{"EmptyLedger", testViewEmpty},
		{"ReadsWhatControlWrote", testViewControl},
		{"CommitLogAndUnapplied", testViewCommitLog},
		{"ListsPreparedBranches", testViewRecover},
		{"ReadsPeriodsInOrder", testViewPeriods},
		{"LayoutAndServerIdentity", testViewLayout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tt.fn(t, ctx, h.NewView(ctx, t))
		})
	}
}

func testViewEmpty(t *testing.T, ctx context.Context, f ViewFixture) {
	v := f.View
	if v.Servers() != 1 {
		t.Fatalf("%d servers, want 1", v.Servers())
	}
	if id, secret, found, err := v.Identity(ctx); err != nil || found || id != "" || secret != nil {
		t.Fatalf("identity of an empty ledger: %q %x %v %v", id, secret, found, err)
	}
	if p, err := v.Positions(ctx, driver.Scope{Group: "g", Topic: "t"}); err != nil || len(p) != 0 {
		t.Fatalf("positions: %v %v", p, err)
	}
	if s, err := v.Scopes(ctx); err != nil || len(s) != 0 {
		t.Fatalf("scopes: %v %v", s, err)
	}
	if d, found, err := v.LastCommit(ctx); err != nil || found {
		t.Fatalf("last commit: %+v %v %v", d, found, err)
	}
	if o, found, err := v.Lookup(ctx, xid().Gtrid); err != nil || found || o != "" {
		t.Fatalf("lookup: %q %v %v", o, found, err)
	}
	c, found, err := v.CommitLog(ctx)
	if err != nil || !found || c.Visible != 0 || c.Decided != 0 || c.RetainedFrom != 1 || c.Unapplied != 0 || c.OldestUnapplied != 0 {
		t.Fatalf("commit log: %+v %v %v", c, found, err)
	}
	if p, err := v.Periods(ctx); err != nil || len(p) != 0 {
		t.Fatalf("periods: %v %v", p, err)
	}
	if l, err := v.Layout(ctx); err != nil || len(l) != 0 {
		t.Fatalf("layout: %v %v", l, err)
	}
	if _, err := v.Recover(ctx, 0); err != nil {
		t.Fatalf("recover: %v", err)
	}
	if _, err := v.Recover(ctx, 1); err == nil {
		t.Fatal("recover on a server the ledger does not have: no error")
	}
}

func testViewControl(t *testing.T, ctx context.Context, f ViewFixture) {
	v := f.View
	id, secret, err := f.Control.Identity(ctx, func() (string, []byte) { return "0123456789abcdef", []byte{0, 1, 0xfe, 0xff} })
	must(t, err)
	if gid, gsecret, found, err := v.Identity(ctx); err != nil || !found || gid != id || !slices.Equal(gsecret, secret) {
		t.Fatalf("identity %q %x %v %v, want %q %x", gid, gsecret, found, err, id, secret)
	}

	a := driver.Scope{Group: "g-a", Topic: "t"}
	b := driver.Scope{Group: "g-b", Topic: "t"}
	claimed := time.Now().UTC().Add(-time.Minute).Truncate(time.Microsecond)
	_, err = f.Control.Claim(ctx, a, "owner-a", []int32{0, 1}, claimed)
	must(t, err)
	_, err = f.Control.Claim(ctx, b, "owner-b", []int32{0}, claimed)
	must(t, err)
	_, err = f.Control.Claim(ctx, b, "owner-b2", []int32{0}, claimed)
	must(t, err)
	scopes, err := v.Scopes(ctx)
	must(t, err)
	if want := []driver.ScopeRows{{Scope: a, Partitions: 2}, {Scope: b, Partitions: 1}}; !slices.Equal(scopes, want) {
		t.Fatalf("scopes %+v, want %+v", scopes, want)
	}

	first := decision(xid().Gtrid, driver.Committed)
	first.At = claimed.Add(time.Second)
	_, err = f.Control.Commit(ctx, first, a, []driver.Cut{{Partition: 0, NextOffset: 42}}, func([]driver.Stored) error { return nil }, nil, nil, nil, true)
	must(t, err)
	pos, err := v.Positions(ctx, a)
	must(t, err)
	if p := pos[0]; len(pos) != 2 || p.NextOffset != 42 || p.Epoch != 1 || p.Owner != "owner-a" || !p.UpdatedAt.Equal(first.At) {
		t.Fatalf("partition 0 after the decision: %+v (of %d), want next 42, epoch 1, updated %s", p, len(pos), first.At)
	}
	if p := pos[1]; p.NextOffset != driver.StartOffset || !p.UpdatedAt.Equal(claimed) {
		t.Fatalf("partition 1, claimed only: %+v, want next %d, updated %s", p, driver.StartOffset, claimed)
	}
	if pb, err := v.Positions(ctx, b); err != nil || pb[0].Epoch != 2 || pb[0].Owner != "owner-b2" {
		t.Fatalf("scope b: %+v %v", pb, err)
	}

	// The newest commit decision, whatever aborts came after it.
	later := decision(xid().Gtrid, driver.Committed)
	later.At = first.At.Add(time.Second)
	_, err = f.Control.Commit(ctx, later, a, nil, func([]driver.Stored) error { return nil }, nil, nil, nil, true)
	must(t, err)
	abort := decision(xid().Gtrid, driver.Aborted)
	abort.At = later.At.Add(time.Second)
	_, err = f.Control.Decide(ctx, abort)
	must(t, err)
	got, found, err := v.LastCommit(ctx)
	if err != nil || !found || got.Gtrid != later.Gtrid || got.Outcome != driver.Committed || got.By != later.By || !got.At.Equal(later.At) {
		t.Fatalf("last commit %+v %v %v, want %+v", got, found, err, later)
	}
	if o, found, err := v.Lookup(ctx, abort.Gtrid); err != nil || !found || o != driver.Aborted {
		t.Fatalf("lookup of the abort: %q %v %v", o, found, err)
	}
}

func testViewCommitLog(t *testing.T, ctx context.Context, f ViewFixture) {
	g1, s1 := commitOne(t, ctx, f.Fixture, nil, false)
	_, s2 := commitOne(t, ctx, f.Fixture, nil, true)
	c, found, err := f.View.CommitLog(ctx)
	if err != nil || !found || c.Decided != s2 || c.Visible != s1-1 || c.Unapplied != 1 || c.OldestUnapplied < 0 || c.OldestUnapplied > time.Minute {
		t.Fatalf("with %d unapplied: %+v %v %v", s1, c, found, err)
	}
	if want := position(t, ctx, f.Fixture); c.CommitPosition != want {
		t.Fatalf("view's position %+v, Control's %+v", c.CommitPosition, want)
	}
	_, err = f.Control.MarkApplied(ctx, []string{g1})
	must(t, err)
	if c, _, err := f.View.CommitLog(ctx); err != nil || c.Visible != s2 || c.Unapplied != 0 || c.OldestUnapplied != 0 {
		t.Fatalf("all applied: %+v %v", c, err)
	}
}

func testViewRecover(t *testing.T, ctx context.Context, f ViewFixture) {
	x := xid()
	x.Format, x.Bqual = 0x626C67, "p1-c2a-l0123456789abcdef-m0a1b2c3d4e5f"
	c := conn(t, ctx, f.Server)
	prepare(t, ctx, f.Fixture, c, x, "view-"+x.Gtrid)
	t.Cleanup(func() { _ = c.XA(context.Background(), driver.Rollback, x) })
	listed, err := f.View.Recover(ctx, 0)
	must(t, err)
	want, err := f.Server.Recover(ctx)
	must(t, err)
	if !slices.Contains(listed, x) || !slices.Contains(want, x) {
		t.Fatalf("the view lists %v, the server %v: want both to hold %v", listed, want, x)
	}
}

func testViewPeriods(t *testing.T, ctx context.Context, f ViewFixture) {
	at := time.Now().UTC().Truncate(time.Microsecond)
	second := driver.PeriodRow{Seq: 2, From: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), Window: "day", Timezone: "Europe/Berlin", Close: true,
		RecordedAt: at, RecordedBy: "billing periods change by ops"}
	first := driver.PeriodRow{Seq: 1, Window: "1h", Timezone: "UTC", RecordedAt: at.Add(-time.Hour), RecordedBy: "instance a"}
	must(t, f.StorePeriod(ctx, second)) // stored out of order: read in order
	must(t, f.StorePeriod(ctx, first))
	got, err := f.View.Periods(ctx)
	must(t, err)
	if want := []driver.PeriodRow{first, second}; !slices.EqualFunc(got, want, samePeriod) {
		t.Fatalf("periods %+v, want %+v", got, want)
	}
}

func samePeriod(a, b driver.PeriodRow) bool {
	return a.Seq == b.Seq && a.From.Equal(b.From) && a.Window == b.Window && a.Timezone == b.Timezone && a.Close == b.Close &&
		a.RecordedAt.Equal(b.RecordedAt) && a.RecordedBy == b.RecordedBy
}

// testViewLayout: the server has its own identity, unclaimed; the first
// claim holds; a layout version is stored whole or not at all, and the
// highest version is read, by ordinal.
func testViewLayout(t *testing.T, ctx context.Context, f ViewFixture) {
	id, found, err := f.View.ServerIdentity(ctx, 0)
	must(t, err)
	if !found || len(id.UUID) != 36 || id.Ledger != "" {
		t.Fatalf("identity of a fresh server: %+v found %v; want a UUID, unclaimed", id, found)
	}
	if _, _, err := f.View.ServerIdentity(ctx, 1); err == nil {
		t.Fatal("identity of server 1 of a one-server view: no error")
	}
	must(t, f.ClaimServer(ctx, "00000000000000aa"))
	must(t, f.ClaimServer(ctx, "00000000000000bb"))
	if got, _, err := f.View.ServerIdentity(ctx, 0); err != nil || got != (driver.ServerIdentity{UUID: id.UUID, Ledger: "00000000000000aa"}) {
		t.Fatalf("after two claims: %+v %v; want the first to hold", got, err)
	}
	at := time.Now().UTC().Truncate(time.Microsecond)
	v1 := []driver.LayoutRow{{Version: 1, Ordinal: 1, ServerUUID: "u1", RecordedAt: at, RecordedBy: "instance a"},
		{Version: 1, Ordinal: 0, ServerUUID: "u0", RecordedAt: at, RecordedBy: "instance a"}}
	if ok, err := f.StoreLayout(ctx, v1); err != nil || !ok {
		t.Fatalf("store version 1: %v %v", ok, err)
	}
	other := []driver.LayoutRow{{Version: 1, Ordinal: 0, ServerUUID: "x0", RecordedAt: at, RecordedBy: "instance b"},
		{Version: 1, Ordinal: 2, ServerUUID: "x2", RecordedAt: at, RecordedBy: "instance b"}}
	if ok, err := f.StoreLayout(ctx, other); err != nil || ok {
		t.Fatalf("store version 1 again: %v %v; want nothing stored", ok, err)
	}
	got, err := f.View.Layout(ctx)
	must(t, err)
	if want := []driver.LayoutRow{v1[1], v1[0]}; !slices.EqualFunc(got, want, sameLayoutRow) {
		t.Fatalf("layout %+v, want %+v", got, want)
	}
	v2 := []driver.LayoutRow{{Version: 2, Ordinal: 0, ServerUUID: "u0", RecordedAt: at, RecordedBy: "c"}}
	if ok, err := f.StoreLayout(ctx, v2); err != nil || !ok {
		t.Fatalf("store version 2: %v %v", ok, err)
	}
	got, err = f.View.Layout(ctx)
	must(t, err)
	if !slices.EqualFunc(got, v2, sameLayoutRow) {
		t.Fatalf("layout %+v, want the highest version %+v", got, v2)
	}
}

func sameLayoutRow(a, b driver.LayoutRow) bool {
	return a.Version == b.Version && a.Ordinal == b.Ordinal && a.ServerUUID == b.ServerUUID && a.RecordedAt.Equal(b.RecordedAt) && a.RecordedBy == b.RecordedBy
}
