package drivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The changelog's part of the contract (driver/changelog.go): the outbox
// commits and rolls back with its branch and stays within the statement
// budget, new rows are inserted or refused, the snapshot's scans follow
// the primary key's byte order, and the control server's changelog state
// guards decisions and holds one lease.

var changelogTests = []struct {
	name string
	fn   func(t *testing.T, ctx context.Context, f Fixture)
}{
	{"Store/NewRowsAreInsertedOrRefused", testNewRows},
	{"Store/OutboxCommitsWithItsBranch", testOutbox},
	{"Store/OutboxBlobsWithinTheBudget", testOutboxBudget},
	{"Store/ScansFollowThePrimaryKey", testScans},
	{"ChangelogGuardsDecisions", testChangelogGuard},
	{"ChangelogLeaseHasOneHolder", testChangelogLease},
}

// Property (new rows): a row written New is inserted when absent; a
// stored row makes the write fail as Duplicate, and so does a row another
// branch inserted and then committed (the write waits for it); rolled
// back, the write goes through. In every sums table.
func testNewRows(t *testing.T, ctx context.Context, f Fixture) {
	now := clock()
	start := now.Truncate(time.Hour)
	newBalance := func(a string) []driver.Balance {
		return []driver.Balance{{BalanceKey: driver.BalanceKey{Account: a, Currency: "EUR"}, Amount: 7, Count: 1, New: true}}
	}
	newWindow := func(a string) []driver.WindowSum {
		return []driver.WindowSum{{WindowKey: driver.WindowKey{Account: a, Currency: "EUR", Start: start}, Amount: 7, Count: 1, New: true}}
	}
	writes := map[string]func(driver.StoreTx, string) error{
		"balances":    func(tx driver.StoreTx, a string) error { return tx.WriteBalances(ctx, newBalance(a), now) },
		"windows":     func(tx driver.StoreTx, a string) error { return tx.WriteWindows(ctx, newWindow(a), now) },
		"adjustments": func(tx driver.StoreTx, a string) error { return tx.WriteAdjustments(ctx, newWindow(a), "c-new", now) },
	}
	for _, name := range []string{"balances", "windows", "adjustments"} {
		write := writes[name]
		t.Run(name, func(t *testing.T) {
			a := "new-" + name
			commit(t, ctx, f, func(tx driver.StoreTx) error { return write(tx, a) })
			b := open(t, ctx, f.Server)
			if err := write(b.tx(), a); code(f, err) != driver.Duplicate {
				t.Fatalf("a new row over a stored one: %v (%v), want Duplicate", err, code(f, err))
			}
			must(t, b.end(false))
			for _, commitFirst := range []bool{true, false} {
				k := fmt.Sprintf("%s-race-%v", a, commitFirst)
				first := open(t, ctx, f.Server)
				must(t, write(first.tx(), k))
				second := open(t, ctx, f.Server)
				done := async(func() error { return write(second.tx(), k) })
				blocked(t, done, f.LockWait/4, "inserting a row another branch inserts")
				must(t, first.end(commitFirst))
				err := <-done
				if commitFirst && code(f, err) != driver.Duplicate || !commitFirst && err != nil {
					t.Fatalf("first branch committed %v: the second's insert gave %v (%v)", commitFirst, err, code(f, err))
				}
				must(t, second.end(err == nil))
			}
		})
	}
	if bal, ok := storedBalance(t, ctx, f, "new-balances"); !ok || bal.Amount != 7 || bal.Count != 1 {
		t.Fatalf("new balance %+v (%v), want 7 and 1", bal, ok)
	}
}

// blobOf is n bytes that cost the most in a statement's text (each one
// escaped), with every byte value among them.
func blobOf(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 17))
	worst := []byte{0, '\'', '"', '\\', '\n', '\r', 0x1a}
	b := make([]byte, n)
	for i := range b {
		if i%3 == 0 {
			b[i] = byte(r.IntN(256))
		} else {
			b[i] = worst[r.IntN(len(worst))]
		}
	}
	return b
}

// Property (outbox): a branch's outbox rows are there once it commits,
// never when it rolls back; the index lists them in key order with their
// sizes, the bodies read back byte for byte, and deleting a checkpoint's
// rows deletes those only.
func testOutbox(t *testing.T, ctx context.Context, f Fixture) {
	now := clock()
	g1, g2, g3 := xid().Gtrid, xid().Gtrid, xid().Gtrid
	blobs := [][]byte{blobOf(1000, 1), blobOf(1, 2), blobOf(70000, 3)}
	counts := []int{10, 1, 700}
	rolled := open(t, ctx, f.Server)
	must(t, rolled.tx().WriteOutbox(ctx, g3, 0, blobs, counts, now))
	must(t, rolled.end(false))
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		return errors.Join(tx.WriteOutbox(ctx, g1, 3, blobs, counts, now), tx.WriteOutbox(ctx, g1, 1, blobs[:1], counts[:1], now))
	})
	commit(t, ctx, f, func(tx driver.StoreTx) error { return tx.WriteOutbox(ctx, g2, 0, blobs[1:2], counts[1:2], now) })
	idx, err := f.Store.OutboxIndex(ctx, []string{g1, g2, g3})
	must(t, err)
	var got []string
	for _, c := range idx {
		got = append(got, fmt.Sprintf("%s/%d/%d:%d,%d", c.Checkpoint, c.Participant, c.Chunk, c.Events, c.Bytes))
	}
	want := []string{
		fmt.Sprintf("%s/1/0:10,1000", g1), fmt.Sprintf("%s/3/0:10,1000", g1), fmt.Sprintf("%s/3/1:1,1", g1), fmt.Sprintf("%s/3/2:700,70000", g1),
		fmt.Sprintf("%s/0/0:1,1", g2)}
	slices.Sort(want[:4]) // the gtrids' order is their bytes'
	if g2 < g1 {
		want = append(want[4:], want[:4]...)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("outbox index %v, want %v (nothing of the rolled-back branch)", got, want)
	}
	bodies, err := f.Store.ReadOutbox(ctx, idx)
	must(t, err)
	for i, c := range idx {
		w := blobs[c.Chunk]
		if c.Checkpoint == g2 {
			w = blobs[1]
		}
		if !bytes.Equal(bodies[i], w) {
			t.Fatalf("body of %+v: %d bytes, not the %d written", c, len(bodies[i]), len(w))
		}
	}
	n, err := f.Store.DeleteOutbox(ctx, []string{g1, g3})
	must(t, err)
	left, err := f.Store.OutboxIndex(ctx, []string{g1, g2})
	must(t, err)
	if n != 4 || len(left) != 1 || left[0].Checkpoint != g2 {
		t.Fatalf("deleted %d, left %+v: want the 4 rows of %s gone and %s's kept", n, left, g1, g2)
	}
}

// Property (budget): on a server of the smallest packet the service
// takes, a blob of MaxOutboxBlob bytes of the costliest bytes is written
// and read back; one byte more is refused before it reaches the server
// (a bug: the pipeline packs blobs to the bound).
func testOutboxBudget(t *testing.T, ctx context.Context, f Fixture) {
	small := f.Packet(t, stmt.MinPacket)
	max := driver.MaxOutboxBlob(small.Server.MaxStatementBytes())
	if max < 16<<10 {
		t.Fatalf("MaxOutboxBlob of a %d-byte packet is %d: too small to pack changes", stmt.MinPacket, max)
	}
	g := xid().Gtrid
	blob := blobOf(max, 9)
	commit(t, ctx, small, func(tx driver.StoreTx) error {
		return tx.WriteOutbox(ctx, g, 0, [][]byte{blob, blob, blob}, []int{1, 1, 1}, clock())
	})
	idx, err := small.Store.OutboxIndex(ctx, []string{g})
	must(t, err)
	bodies, err := small.Store.ReadOutbox(ctx, idx)
	must(t, err)
	if len(bodies) != 3 || !bytes.Equal(bodies[2], blob) {
		t.Fatalf("%d bodies read back", len(bodies))
	}
	b := open(t, ctx, small.Server)
	err = b.tx().WriteOutbox(ctx, xid().Gtrid, 0, [][]byte{blobOf(max+stmt.MinPacket, 10)}, []int{1}, clock())
	var tl *stmt.TooLargeError
	if !errors.As(err, &tl) {
		t.Fatalf("a blob over the budget: %v, want a *stmt.TooLargeError", err)
	}
	must(t, b.end(false))
	if got := driver.MaxOutboxBlob(64 << 20); got != 1<<20 {
		t.Fatalf("MaxOutboxBlob of a large budget is %d, want the 1 MiB cap", got)
	}
}

// Property (scans): paging through every table with the scans gives its
// rows in the primary key's order of bytes (identifiers that differ in
// case, trailing spaces or normalisation are distinct and ordered by
// their bytes), whole, each once.
func testScans(t *testing.T, ctx context.Context, f Fixture) {
	r := rand.New(rand.NewPCG(23, 29))
	accounts := identifiers(r, 30, 64)
	now := clock()
	var bals []driver.Balance
	var wins []driver.WindowSum
	var entries []driver.Entry
	for i, a := range accounts {
		bals = append(bals, balance(a, int64(i), 1, false))
		for h := range 2 {
			wins = append(wins, driver.WindowSum{WindowKey: driver.WindowKey{Account: a, Currency: []string{"EUR", "USD"}[i%2], Start: now.Truncate(time.Hour).Add(time.Duration(-h) * time.Hour)},
				Amount: int64(i), Count: 1})
		}
		entries = append(entries, driver.Entry{Partition: int32(i % 3), Offset: int64(1000 - i), EventID: "e" + a, Account: a, Currency: "EUR", Amount: 1,
			OccurredAt: now, WindowStart: now.Truncate(time.Hour)})
	}
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		return errors.Join(tx.WriteBalances(ctx, bals, now), tx.WriteWindows(ctx, wins, now), tx.WriteAdjustments(ctx, wins, "c-scan", now),
			noKept(tx.WriteEntries(ctx, "topic-b", "c-scan", entries[:15], now)), noKept(tx.WriteEntries(ctx, "topic-a", "c-scan", entries[15:], now)))
	})
	tb := tables(t, ctx, f)
	for _, page := range []int{1, 7, 1000} {
		gotB := pages(t, page, func(after *driver.BalanceRow) ([]driver.BalanceRow, error) {
			var k *driver.BalanceKey
			if after != nil {
				k = &after.BalanceKey
			}
			return f.Store.ScanBalances(ctx, k, page)
		})
		gotW := pages(t, page, func(after *driver.WindowRow) ([]driver.WindowRow, error) {
			var k *driver.WindowKey
			if after != nil {
				k = &after.WindowKey
			}
			return f.Store.ScanWindows(ctx, k, page)
		})
		gotA := pages(t, page, func(after *driver.AdjustmentRow) ([]driver.AdjustmentRow, error) {
			var k *driver.WindowKey
			if after != nil {
				k = &after.WindowKey
			}
			return f.Store.ScanAdjustments(ctx, k, page)
		})
		gotE := pages(t, page, func(after *driver.EntryRow) ([]driver.EntryRow, error) {
			var k *driver.EntryKey
			if after != nil {
				k = &driver.EntryKey{Topic: after.Topic, Partition: after.Partition, Offset: after.Offset, Kind: after.Kind}
			}
			return f.Store.ScanEntries(ctx, k, page)
		})
		for name, pair := range map[string][2]string{
			"balances": {fmt.Sprint(tb.Balances), fmt.Sprint(gotB)}, "windows": {fmt.Sprint(tb.Windows), fmt.Sprint(gotW)},
			"adjustments": {fmt.Sprint(tb.Adjustments), fmt.Sprint(gotA)}, "entries": {fmt.Sprint(tb.Entries), fmt.Sprint(gotE)},
		} {
			if pair[0] != pair[1] {
				t.Errorf("%s in pages of %d:\n got %s\nwant %s", name, page, pair[1], pair[0])
			}
		}
	}
	if len(tb.Balances) != len(accounts) || len(tb.Entries) != len(accounts) {
		t.Fatalf("%d balances, %d entries stored for %d accounts", len(tb.Balances), len(tb.Entries), len(accounts))
	}
}

// pages collects a scan page by page, each after the last row of the one
// before.
func pages[R any](t *testing.T, page int, scan func(after *R) ([]R, error)) []R {
	t.Helper()
	var out []R
	var last *R
	for {
		rows, err := scan(last)
		must(t, err)
		if len(rows) > page {
			t.Fatalf("a scan of %d rows returned %d", page, len(rows))
		}
		out = append(out, rows...)
		if len(rows) < page {
			return out
		}
		last = &rows[len(rows)-1]
	}
}

// Property (the changelog's guard): enabling takes the commit log's next
// number as From; from then on a commit decision without Changelog is
// refused (ErrChangelogOn) and writes nothing, one with it commits;
// enabling again keeps the first prefix; the published hint only grows;
// disabling lifts the guard.
func testChangelogGuard(t *testing.T, ctx context.Context, f Fixture) {
	off, err := f.Control.Changelog(ctx)
	must(t, err)
	if off.On {
		t.Fatalf("a fresh ledger's changelog: %+v", off)
	}
	commitOne(t, ctx, f, nil, true)
	before := position(t, ctx, f)
	at := clock()
	st, err := f.Control.EnableChangelog(ctx, "p1", at)
	must(t, err)
	if !st.On || st.Prefix != "p1" || st.From != before.Decided+1 || !st.Snapshot || st.Published != before.Decided || !st.EnabledAt.Equal(at) {
		t.Fatalf("enabled %+v, want p1 from %d, snapshot, published %d", st, before.Decided+1, before.Decided)
	}
	again, err := f.Control.EnableChangelog(ctx, "p2", at)
	must(t, err)
	if again.Prefix != "p1" || again.From != st.From {
		t.Fatalf("enabling again gave %+v, want the first state", again)
	}
	sc := driver.Scope{Group: "g-" + xid().Gtrid, Topic: "cl"}
	_, err = f.Control.Claim(ctx, sc, "me", []int32{0}, time.Now().UTC())
	must(t, err)
	g := xid().Gtrid
	_, err = f.Control.Commit(ctx, decision(g, driver.Committed), sc, []driver.Cut{{Partition: 0, NextOffset: 5}},
		func([]driver.Stored) error { return nil }, nil, nil, nil,
		true)

	if !errors.Is(err, driver.ErrChangelogOn) {
		t.Fatalf("a decision without the changelog: %v, want ErrChangelogOn", err)
	}
	if _, ok, _ := f.Control.Lookup(ctx, g); ok {
		t.Fatal("the refused decision was written")
	}
	if p := position(t, ctx, f); p.Decided != before.Decided {
		t.Fatalf("the refused decision took a number: %+v", p)
	}
	if pos, _ := f.Control.Positions(ctx, sc, []int32{0}); pos[0].NextOffset != driver.StartOffset {
		t.Fatalf("the refused decision moved the offset: %+v", pos[0])
	}
	d := decision(xid().Gtrid, driver.Committed)
	d.Changelog = true
	seq, err := f.Control.Commit(ctx, d, sc, []driver.Cut{{Partition: 0, NextOffset: 5}}, func([]driver.Stored) error { return nil }, nil, nil, nil, true)
	must(t, err)
	if seq != st.From {
		t.Fatalf("the first decision with the changelog got %d, want From %d", seq, st.From)
	}
	must(t, f.Control.SkipChangelogSnapshot(ctx, st.From+7)) // another enabling's: ignored
	must(t, f.Control.ChangelogPublished(ctx, seq))
	must(t, f.Control.ChangelogPublished(ctx, seq-1))
	got, err := f.Control.Changelog(ctx)
	must(t, err)
	if got.Published != seq || !got.Snapshot || got.PublishedAt.IsZero() {
		t.Fatalf("after publishing %d then %d: %+v, want the hint at %d, the snapshot still due", seq, seq-1, got, seq)
	}
	must(t, f.Control.SkipChangelogSnapshot(ctx, st.From))
	if got, _ := f.Control.Changelog(ctx); got.Snapshot {
		t.Fatalf("snapshot still due after it was skipped: %+v", got)
	}
	must(t, f.Control.DisableChangelog(ctx))
	if got, _ := f.Control.Changelog(ctx); got.On {
		t.Fatalf("disabled: %+v", got)
	}
	commitOne(t, ctx, f, nil, true)
}

// Property (lease): one owner holds the lease at a time; it renews it;
// another takes it only once it expired (by the control server's clock)
// or was released, and the first then no longer holds it.
func testChangelogLease(t *testing.T, ctx context.Context, f Fixture) {
	if held, err := f.Control.LeaseChangelog(ctx, "a", time.Second); err != nil || held {
		t.Fatalf("a lease without a changelog: %v %v", held, err)
	}
	_, err := f.Control.EnableChangelog(ctx, "p", clock())
	must(t, err)
	lease := func(owner string, ttl time.Duration, want bool) {
		t.Helper()
		held, err := f.Control.LeaseChangelog(ctx, owner, ttl)
		must(t, err)
		if held != want {
			t.Fatalf("lease of %s for %s: held %v, want %v", owner, ttl, held, want)
		}
	}
	lease("a", time.Minute, true)
	lease("b", time.Minute, false)
	lease("a", 600*time.Millisecond, true) // renewed, shorter
	st, _ := f.Control.Changelog(ctx)
	if st.Publisher != "a" || st.LeaseLeft <= 0 || st.LeaseLeft > 600*time.Millisecond {
		t.Fatalf("state %+v, want a's lease of at most 600ms", st)
	}
	time.Sleep(700 * time.Millisecond)
	lease("b", time.Minute, true)
	lease("a", time.Minute, false)
	lease("b", 0, false) // released
	lease("a", time.Minute, true)
}
