package drivertest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

func balance(account string, amount, count int64, absolute bool) driver.Balance {
	return driver.Balance{BalanceKey: driver.BalanceKey{Account: account, Currency: "EUR"}, Amount: amount, Count: count, Absolute: absolute}
}

func storedBalance(t *testing.T, ctx context.Context, f Fixture, account string) (driver.BalanceRow, bool) {
	t.Helper()
	for _, b := range tables(t, ctx, f).Balances {
		if b.Account == account {
			return b, true
		}
	}
	return driver.BalanceRow{}, false
}

// Property (locking reads): a locking read of a row another branch wrote,
// updated or inserted, waits for that branch and then reads what it left:
// its value when it committed, the old one (or none) when it rolled back.
func testLockingReads(t *testing.T, ctx context.Context, f Fixture) {
	now := clock()
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		return tx.WriteBalances(ctx, []driver.Balance{balance("acct-1", 10, 1, false)}, now)
	})
	for _, c := range []struct {
		name    string
		account string
		commit  bool
		want    []driver.Balance
	}{
		{"update committed", "acct-1", true, []driver.Balance{balance("acct-1", 15, 2, false)}},
		{"update rolled back", "acct-1", false, []driver.Balance{balance("acct-1", 15, 2, false)}},
		{"insert committed", "acct-2", true, []driver.Balance{balance("acct-2", 5, 1, false)}},
		{"insert rolled back", "acct-3", false, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			writer := open(t, ctx, f.Server)
			must(t, writer.tx().WriteBalances(ctx, []driver.Balance{balance(c.account, 5, 1, false)}, now))
			reader := open(t, ctx, f.Server)
			var rows []driver.BalanceRow
			done := async(func() (err error) {
				rows, err = reader.tx().LockBalances(ctx, []driver.BalanceKey{{Account: c.account, Currency: "EUR"}})
				return err
			})
			blocked(t, done, f.LockWait/4, "a locking read of a row another branch wrote")
			must(t, writer.end(c.commit))
			must(t, <-done)
			var got []driver.Balance
			for _, r := range rows {
				// The whole row: the changelog's before image.
				if !r.UpdatedAt.Equal(now) {
					t.Errorf("locking read of %+v: updated_at %s, want %s", r, r.UpdatedAt, now)
				}
				got = append(got, driver.Balance{BalanceKey: r.BalanceKey, Amount: r.Amount, Count: r.Count})
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("read %+v, want %+v", got, c.want)
			}
			must(t, reader.end(false))
		})
	}
	// And a window's and an adjustment's, the same way.
	w := driver.WindowSum{WindowKey: driver.WindowKey{Account: "acct-w", Currency: "EUR", Start: now.Truncate(time.Hour)}, Amount: 3, Count: 1}
	writer := open(t, ctx, f.Server)
	must(t, errors.Join(writer.tx().WriteWindows(ctx, []driver.WindowSum{w}, now), writer.tx().WriteAdjustments(ctx, []driver.WindowSum{w}, "c-1", now)))
	reader := open(t, ctx, f.Server)
	var wins []driver.WindowRow
	var adjs []driver.AdjustmentRow
	done := async(func() (err error) {
		if wins, err = reader.tx().LockWindows(ctx, []driver.WindowKey{w.WindowKey}); err == nil {
			adjs, err = reader.tx().LockAdjustments(ctx, []driver.WindowKey{w.WindowKey})
		}
		return err
	})
	blocked(t, done, f.LockWait/4, "a locking read of a window another branch wrote")
	must(t, writer.end(true))
	must(t, <-done)
	wantWin := driver.WindowRow{WindowKey: w.WindowKey, Amount: 3, Count: 1, UpdatedAt: now}
	wantAdj := driver.AdjustmentRow{WindowKey: w.WindowKey, Amount: 3, Count: 1, UpdatedAt: now, Checkpoint: "c-1"}
	if len(wins) != 1 || len(adjs) != 1 || !sameWindow(wins[0], wantWin) || !sameAdjustment(adjs[0], wantAdj) {
		t.Fatalf("read windows %+v and adjustments %+v, want %+v and %+v", wins, adjs, wantWin, wantAdj)
	}
}

// Property (no gap locks): a locking read of a row that does not exist
// locks nothing, so another branch inserts it without waiting.
func testNoGapLocks(t *testing.T, ctx context.Context, f Fixture) {
	reader := open(t, ctx, f.Server)
	got, err := reader.tx().LockBalances(ctx, []driver.BalanceKey{{Account: "nobody", Currency: "EUR"}})
	if err != nil || len(got) != 0 {
		t.Fatalf("locking read of a missing row: %v, %v", got, err)
	}
	writer := open(t, ctx, f.Server)
	start := time.Now()
	must(t, writer.tx().WriteBalances(ctx, []driver.Balance{balance("nobody", 1, 1, false)}, clock()))
	if d := time.Since(start); d > f.LockWait/2 {
		t.Fatalf("an insert waited %s behind a locking read of the missing row", d)
	}
	must(t, writer.end(true))
	must(t, reader.end(false))
}

// Property (creates): CreateBalances, CreateWindows and CreateAdjustments
// lock every key's row, a stored one left as it was (its columns, and
// another branch's locking read waits for it) and a missing one inserted
// at zero (another branch's insert waits for it), and return every key's
// row, the created ones at zero, and the keys they inserted. A row
// created and written ends as the write alone leaves it.
func testCreates(t *testing.T, ctx context.Context, f Fixture) {
	now := clock()
	start := now.Truncate(time.Hour)
	bk := func(a string) driver.BalanceKey { return driver.BalanceKey{Account: a, Currency: "EUR"} }
	wk := func(a string) driver.WindowKey { return driver.WindowKey{Account: a, Currency: "EUR", Start: start} }
	stored := driver.WindowSum{WindowKey: wk("create-1"), Amount: 3, Count: 1}
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		return errors.Join(tx.WriteBalances(ctx, []driver.Balance{balance("create-1", 10, 1, false)}, now),
			tx.WriteWindows(ctx, []driver.WindowSum{stored}, now), tx.WriteAdjustments(ctx, []driver.WindowSum{stored}, "c-1", now))
	})
	before := tables(t, ctx, f)

	creator := open(t, ctx, f.Server)
	rb, cb, err := creator.tx().CreateBalances(ctx, []driver.BalanceKey{bk("create-2"), bk("create-1")})
	must(t, err)
	rw, cw, err := creator.tx().CreateWindows(ctx, []driver.WindowKey{wk("create-2"), wk("create-1")})
	must(t, err)
	ra, ca, err := creator.tx().CreateAdjustments(ctx, []driver.WindowKey{wk("create-1"), wk("create-2")})
	must(t, err)
	if fmt.Sprint(cb) != fmt.Sprint([]driver.BalanceKey{bk("create-2")}) || len(cw) != 1 || cw[0].Account != "create-2" || len(ca) != 1 || ca[0].Account != "create-2" {
		t.Fatalf("created %v, %v and %v, want create-2's rows only", cb, cw, ca)
	}
	// Every key's row, in key order: the stored one as it is, the created
	// one at zero.
	if len(rb) != 2 || rb[0].Account != "create-1" || rb[0].Amount != 10 || rb[0].Count != 1 || !rb[0].UpdatedAt.Equal(now) ||
		rb[1].Account != "create-2" || rb[1].Amount != 0 || rb[1].Count != 0 {
		t.Errorf("balances read %+v, want create-1's stored row and create-2's at zero", rb)
	}
	if len(rw) != 2 || !sameWindow(rw[0], driver.WindowRow{WindowKey: stored.WindowKey, Amount: 3, Count: 1, UpdatedAt: now}) ||
		rw[1].Account != "create-2" || rw[1].Amount != 0 || rw[1].Count != 0 || !rw[1].ClosedAt.IsZero() {
		t.Errorf("windows read %+v, want create-1's stored row and create-2's at zero", rw)
	}
	if len(ra) != 2 || !sameAdjustment(ra[0], driver.AdjustmentRow{WindowKey: stored.WindowKey, Amount: 3, Count: 1, UpdatedAt: now, Checkpoint: "c-1"}) ||
		ra[1].Account != "create-2" || ra[1].Amount != 0 || ra[1].Count != 0 {
		t.Errorf("adjustments read %+v, want create-1's stored row and create-2's at zero", ra)
	}
	reader := open(t, ctx, f.Server)
	read := async(func() error {
		_, err := reader.tx().LockBalances(ctx, []driver.BalanceKey{bk("create-1")})
		return err
	})
	blocked(t, read, f.LockWait/4, "a locking read of a stored row another branch's create locked")
	writer := open(t, ctx, f.Server)
	write := async(func() error {
		return writer.tx().WriteBalances(ctx, []driver.Balance{balance("create-2", 1, 1, false)}, now)
	})
	blocked(t, write, f.LockWait/4, "an insert of a row another branch created")
	w2 := driver.WindowSum{WindowKey: wk("create-2"), Amount: 5, Count: 2, Absolute: true}
	must(t, errors.Join(creator.tx().WriteBalances(ctx, []driver.Balance{balance("create-2", 5, 2, true)}, now),
		creator.tx().WriteWindows(ctx, []driver.WindowSum{w2}, now), creator.tx().WriteAdjustments(ctx, []driver.WindowSum{w2}, "c-2", now)))
	must(t, creator.end(true))
	must(t, errors.Join(<-read, <-write, reader.end(false), writer.end(false)))

	after := tables(t, ctx, f)
	if b, ok := storedBalance(t, ctx, f, "create-1"); !ok || b != before.Balances[slices.IndexFunc(before.Balances, func(r driver.BalanceRow) bool { return r.Account == "create-1" })] {
		t.Errorf("stored balance %+v changed by a create", b)
	}
	if b, ok := storedBalance(t, ctx, f, "create-2"); !ok || b.Amount != 5 || b.Count != 2 || !b.UpdatedAt.Equal(now) {
		t.Errorf("created balance %+v (found %v), want 5 in 2 events, updated at %s", b, ok, now)
	}
	for _, w := range after.Windows {
		want := driver.WindowRow{WindowKey: wk(w.Account), Amount: 5, Count: 2, UpdatedAt: now}
		if w.Account == "create-1" {
			want = driver.WindowRow{WindowKey: stored.WindowKey, Amount: 3, Count: 1, UpdatedAt: now}
		}
		if strings.HasPrefix(w.Account, "create-") && !sameWindow(w, want) {
			t.Errorf("window %+v, want %+v", w, want)
		}
	}
	for _, a := range after.Adjustments {
		want := driver.AdjustmentRow{WindowKey: wk(a.Account), Amount: 5, Count: 2, UpdatedAt: now, Checkpoint: "c-2"}
		if a.Account == "create-1" {
			want = driver.AdjustmentRow{WindowKey: stored.WindowKey, Amount: 3, Count: 1, UpdatedAt: now, Checkpoint: "c-1"}
		}
		if strings.HasPrefix(a.Account, "create-") && !sameAdjustment(a, want) {
			t.Errorf("adjustment %+v, want %+v", a, want)
		}
	}
}

// Property (creates wait): a row another branch creates first, the
// create waits for it and, that branch committed, did not insert it;
// rolled back, the rows a create inserted are gone.
func testCreatesWait(t *testing.T, ctx context.Context, f Fixture) {
	now := clock()
	bk := func(a string) driver.BalanceKey { return driver.BalanceKey{Account: a, Currency: "EUR"} }
	other := open(t, ctx, f.Server)
	if _, got, err := other.tx().CreateBalances(ctx, []driver.BalanceKey{bk("create-3")}); err != nil || len(got) != 1 {
		t.Fatalf("created %v, %v; want create-3", got, err)
	}
	late := open(t, ctx, f.Server)
	var got []driver.BalanceKey
	done := async(func() (err error) {
		var rows []driver.BalanceRow
		rows, got, err = late.tx().CreateBalances(ctx, []driver.BalanceKey{bk("create-3"), bk("create-4")})
		if err == nil && (len(rows) != 2 || rows[0].Amount != 7) {
			err = fmt.Errorf("read %+v, want create-3 as the other branch committed it and create-4 at zero", rows)
		}
		return err
	})
	blocked(t, done, f.LockWait/4, "a create of a row another branch created")
	must(t, other.tx().WriteBalances(ctx, []driver.Balance{balance("create-3", 7, 1, true)}, now))
	must(t, other.end(true))
	must(t, <-done)
	if fmt.Sprint(got) != fmt.Sprint([]driver.BalanceKey{bk("create-4")}) {
		t.Errorf("created %v after the other branch committed create-3, want create-4 only", got)
	}
	// Rolled back, the rows it created are gone.
	must(t, late.end(false))
	if _, ok := storedBalance(t, ctx, f, "create-4"); ok {
		t.Error("a created row outlived its branch's rollback")
	}
	if b, ok := storedBalance(t, ctx, f, "create-3"); !ok || b.Amount != 7 || b.Count != 1 {
		t.Errorf("balance %+v, want the other branch's 7 in 1 event", b)
	}
	// Every row stored: nothing created, each read and locked.
	again := open(t, ctx, f.Server)
	rows, created, err := again.tx().CreateBalances(ctx, []driver.BalanceKey{bk("create-3")})
	if err != nil || len(created) != 0 || len(rows) != 1 || rows[0].Amount != 7 {
		t.Errorf("create of a stored row: rows %+v, created %v, %v", rows, created, err)
	}
	writer := open(t, ctx, f.Server)
	done = async(func() error {
		return writer.tx().WriteBalances(ctx, []driver.Balance{balance("create-3", 1, 1, false)}, now)
	})
	blocked(t, done, f.LockWait/4, "a write of a stored row another branch's create locked")
	must(t, errors.Join(again.end(false), <-done, writer.end(false)))
}

// Property (lock wait timeout): a branch waiting longer than the server's
// lock wait timeout fails as Transient (and a checkpoint aborts and
// replays).
func testLockWaitTimeout(t *testing.T, ctx context.Context, f Fixture) {
	holder := open(t, ctx, f.Server)
	k := keys("timeout", 1, clock().Add(time.Hour))
	if _, err := holder.tx().ClaimKeys(ctx, 0, k); err != nil {
		t.Fatal(err)
	}
	waiter := open(t, ctx, f.Server)
	start := time.Now()
	_, err := waiter.tx().ClaimKeys(ctx, 0, k)
	if code(f, err) != driver.Transient || time.Since(start) < f.LockWait/2 {
		t.Fatalf("after %s: %v (%v), want a Transient lock wait timeout after about %s", time.Since(start), err, code(f, err), f.LockWait)
	}
	must(t, holder.end(false))
}

// Property (lock wait per branch): after SetLockWait a branch waits past
// the server's lock wait timeout for a lock that is released in time;
// SetLockWait(0) sets the server's bound back.
func testLockWaitSet(t *testing.T, ctx context.Context, f Fixture) {
	holder, holder2 := open(t, ctx, f.Server), open(t, ctx, f.Server)
	k, k2 := keys("longwait", 1, clock().Add(time.Hour)), keys("shortwait", 1, clock().Add(time.Hour))
	// Both keys are held before the waiter waits: on InnoDB a wait for a
	// key whose insert then rolls back leaves the waiter a gap lock there.
	if _, err := holder.tx().ClaimKeys(ctx, 0, k); err != nil {
		t.Fatal(err)
	}
	if _, err := holder2.tx().ClaimKeys(ctx, 0, k2); err != nil {
		t.Fatal(err)
	}
	waiter := open(t, ctx, f.Server)
	long := f.LockWait.Truncate(time.Second) + 3*time.Second
	must(t, waiter.tx().SetLockWait(ctx, long))
	released := make(chan error, 1)
	go func() {
		time.Sleep(f.LockWait + f.LockWait/2)
		released <- holder.end(false)
	}()
	start := time.Now()
	contested, err := waiter.tx().ClaimKeys(ctx, 0, k)
	if err != nil || len(contested) != 0 || time.Since(start) < f.LockWait {
		t.Fatalf("after %s: contested %v, %v; want the key claimed once the holder rolled back, after the server's %s", time.Since(start), contested, err, f.LockWait)
	}
	must(t, <-released)

	must(t, waiter.tx().SetLockWait(ctx, 0))
	start = time.Now()
	_, err = waiter.tx().ClaimKeys(ctx, 0, k2)
	if code(f, err) != driver.Transient || time.Since(start) >= long-time.Second {
		t.Fatalf("after %s: %v (%v), want a Transient lock wait timeout after the server's %s", time.Since(start), err, code(f, err), f.LockWait)
	}
	must(t, holder2.end(false))
}

// Property (sums): adding rows add to the stored sums (creating the row),
// absolute rows set them, updated_at is the writer's now; a sum beyond 64
// bits fails as Overflow and changes nothing, whichever table.
func testSums(t *testing.T, ctx context.Context, f Fixture) {
	t0 := clock()
	t1 := t0.Add(time.Minute)
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		return tx.WriteBalances(ctx, []driver.Balance{balance("a", 10, 1, false), balance("b", math.MaxInt64-1, 1, false)}, t0)
	})
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		return tx.WriteBalances(ctx, []driver.Balance{balance("a", -3, 2, false), balance("c", 7, 7, true)}, t1)
	})
	if a, _ := storedBalance(t, ctx, f, "a"); a.Amount != 7 || a.Count != 3 || !a.UpdatedAt.Equal(t1) {
		t.Fatalf("balance a %+v, want 7 over 3 at %s", a, t1)
	}
	if c, _ := storedBalance(t, ctx, f, "c"); c.Amount != 7 || c.Count != 7 {
		t.Fatalf("balance c %+v, want 7 over 7", c)
	}
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		return tx.WriteBalances(ctx, []driver.Balance{balance("a", 100, 100, true)}, t1)
	})
	if a, _ := storedBalance(t, ctx, f, "a"); a.Amount != 100 || a.Count != 100 {
		t.Fatalf("balance a %+v after an absolute write, want 100 over 100", a)
	}
	for _, c := range []struct {
		name  string
		write func(tx driver.StoreTx) error
	}{
		{"balance", func(tx driver.StoreTx) error {
			return tx.WriteBalances(ctx, []driver.Balance{balance("a", 1, 1, false), balance("b", 2, 1, false)}, t1)
		}},
		{"window", func(tx driver.StoreTx) error {
			w := driver.WindowSum{WindowKey: driver.WindowKey{Account: "w", Currency: "EUR", Start: t0}, Amount: math.MinInt64 + 1, Count: 1}
			if err := tx.WriteWindows(ctx, []driver.WindowSum{w}, t0); err != nil {
				return fmt.Errorf("first write: %w", err)
			}
			w.Amount = -2
			return tx.WriteWindows(ctx, []driver.WindowSum{w}, t0)
		}},
		{"adjustment count", func(tx driver.StoreTx) error {
			w := driver.WindowSum{WindowKey: driver.WindowKey{Account: "w", Currency: "EUR", Start: t0}, Amount: 1, Count: math.MaxInt64}
			if err := tx.WriteAdjustments(ctx, []driver.WindowSum{w}, "c", t0); err != nil {
				return fmt.Errorf("first write: %w", err)
			}
			w.Count = 1
			return tx.WriteAdjustments(ctx, []driver.WindowSum{w}, "c", t0)
		}},
	} {
		b := open(t, ctx, f.Server)
		if err := c.write(b.tx()); code(f, err) != driver.Overflow {
			t.Fatalf("%s beyond 64 bits: %v (%v), want Overflow", c.name, err, code(f, err))
		}
		must(t, b.end(true))
	}
	if a, _ := storedBalance(t, ctx, f, "a"); a.Amount != 100 || a.Count != 100 {
		t.Fatalf("balance a %+v: the statement that overflowed changed it", a)
	}
	if b, _ := storedBalance(t, ctx, f, "b"); b.Amount != math.MaxInt64-1 {
		t.Fatalf("balance b %+v: the statement that overflowed changed it", b)
	}
	if tb := tables(t, ctx, f); len(tb.Windows) != 1 || tb.Windows[0].Amount != math.MinInt64+1 || len(tb.Adjustments) != 1 || tb.Adjustments[0].Count != math.MaxInt64 {
		t.Fatalf("windows %+v, adjustments %+v: a statement that overflowed changed them", tb.Windows, tb.Adjustments)
	}
}

// Property (adjustments): every write of an adjustment records the
// checkpoint that made it; windows keep their closed_at.
func testAdjustments(t *testing.T, ctx context.Context, f Fixture) {
	t0 := clock()
	w := driver.WindowSum{WindowKey: driver.WindowKey{Account: "a", Currency: "USD", Start: t0.Truncate(time.Hour)}, Amount: 5, Count: 1}
	commit(t, ctx, f, func(tx driver.StoreTx) error { return tx.WriteAdjustments(ctx, []driver.WindowSum{w}, "first", t0) })
	commit(t, ctx, f, func(tx driver.StoreTx) error { return tx.WriteAdjustments(ctx, []driver.WindowSum{w}, "second", t0) })
	tb := tables(t, ctx, f)
	if len(tb.Adjustments) != 1 || tb.Adjustments[0].Checkpoint != "second" || tb.Adjustments[0].Amount != 10 || !tb.Adjustments[0].Start.Equal(w.Start) {
		t.Fatalf("adjustments %+v, want one of 10 by checkpoint second", tb.Adjustments)
	}
}

// Property (replays): an entry or a dead letter already stored at its
// Kafka position is kept as it is when a replay writes it again, and
// WriteEntries names exactly the entries it kept (a checkpoint's
// changelog says it created the others only).
func testKeepStored(t *testing.T, ctx context.Context, f Fixture) {
	t0 := clock()
	e := driver.Entry{Partition: 1, Offset: 7, EventID: "e", Account: "a", Currency: "EUR", Amount: 3, OccurredAt: t0, WindowStart: t0.Truncate(time.Hour)}
	d := driver.DeadLetter{Partition: 1, Offset: 8, Reason: "invalid_json", Detail: "first", Payload: []byte("x"), Size: 1}
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		kept, err := tx.WriteEntries(ctx, "topic", "c1", []driver.Entry{e}, t0)
		if err == nil && len(kept) != 0 {
			err = fmt.Errorf("the first write kept %v, want none", kept)
		}
		return errors.Join(err, tx.WriteDeadLetters(ctx, "topic", "c1", []driver.DeadLetter{d}, t0))
	})
	e.Amount, d.Detail = 99, "second"
	// The replay writes the stored entry between new ones, at the same
	// partition and offset in another topic too.
	var fresh []driver.Entry
	for i := range 5 {
		n := e
		n.Offset, n.EventID = e.Offset+1+int64(i), fmt.Sprint("new-", i)
		fresh = append(fresh, n)
	}
	replay := append(append(fresh[:2:2], e), fresh[2:]...)
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		kept, err := tx.WriteEntries(ctx, "topic", "c2", replay, t0.Add(time.Minute))
		if want := []driver.EntryKey{{Topic: "topic", Partition: 1, Offset: 7}}; err == nil && !slices.Equal(kept, want) {
			err = fmt.Errorf("the replay kept %v, want %v", kept, want)
		}
		other, err2 := tx.WriteEntries(ctx, "other", "c2", []driver.Entry{e}, t0.Add(time.Minute))
		if err2 == nil && len(other) != 0 {
			err2 = fmt.Errorf("a write in another topic kept %v, want none", other)
		}
		return errors.Join(err, err2, tx.WriteDeadLetters(ctx, "topic", "c2", []driver.DeadLetter{d}, t0.Add(time.Minute)))
	})
	tb := tables(t, ctx, f)
	var stored []driver.EntryRow
	for _, r := range tb.Entries {
		if r.Topic == "topic" && r.Offset == e.Offset {
			stored = append(stored, r)
		}
	}
	if len(tb.Entries) != 2+len(fresh) || len(stored) != 1 || stored[0].Amount != 3 || stored[0].Checkpoint != "c1" || !stored[0].CreatedAt.Equal(t0) {
		t.Fatalf("entries %+v, want the first one kept", tb.Entries)
	}
	if len(tb.DeadLetters) != 1 || tb.DeadLetters[0].Detail != "first" || tb.DeadLetters[0].Checkpoint != "c1" {
		t.Fatalf("dead letters %+v, want the first one kept", tb.DeadLetters)
	}
}

// Property (versions' entries): one Kafka position holds an entry of each
// kind (a version's retraction and addition), each its own row with its
// revision and its signed amount; a replay keeps every stored one and
// names exactly those it kept, kind included; the scan pages through
// them in key order, kind last.
func testEntryKinds(t *testing.T, ctx context.Context, f Fixture) {
	t0 := clock()
	w := t0.Truncate(time.Hour)
	event := driver.Entry{Partition: 2, Offset: 40, Kind: driver.EntryEvent, EventID: "e", Account: "a", Currency: "EUR", Amount: 10, OccurredAt: t0, WindowStart: w}
	retraction := driver.Entry{Partition: 2, Offset: 41, Kind: driver.EntryRetraction, EventID: "e", Account: "a", Currency: "EUR", Amount: -10,
		OccurredAt: t0, WindowStart: w, Late: true}
	addition := driver.Entry{Partition: 2, Offset: 41, Kind: driver.EntryAddition, EventID: "e", Account: "a", Currency: "EUR", Amount: 25,
		OccurredAt: t0.Add(time.Hour), WindowStart: w.Add(time.Hour), Revision: 3}
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		kept, err := tx.WriteEntries(ctx, "topic", "c1", []driver.Entry{event, retraction}, t0)
		if err == nil && len(kept) != 0 {
			err = fmt.Errorf("the first write kept %v, want none", kept)
		}
		return err
	})
	// The replay meets the stored retraction and the event's entry, and
	// writes the addition beside them at the retraction's position.
	replay := []driver.Entry{event, retraction, addition}
	replay[1].Amount = -99
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		kept, err := tx.WriteEntries(ctx, "topic", "c2", replay, t0.Add(time.Minute))
		slices.SortFunc(kept, func(a, b driver.EntryKey) int { return cmp.Compare(a.Offset, b.Offset) })
		if want := []driver.EntryKey{{Topic: "topic", Partition: 2, Offset: 40, Kind: driver.EntryEvent}, {Topic: "topic", Partition: 2, Offset: 41, Kind: driver.EntryRetraction}}; err == nil && !slices.Equal(kept, want) {
			err = fmt.Errorf("the replay kept %v, want %v", kept, want)
		}
		return err
	})
	tb := tables(t, ctx, f)
	want := []driver.EntryRow{{Topic: "topic", Entry: event, Checkpoint: "c1", CreatedAt: t0}, {Topic: "topic", Entry: retraction, Checkpoint: "c1", CreatedAt: t0},
		{Topic: "topic", Entry: addition, Checkpoint: "c2", CreatedAt: t0.Add(time.Minute)}}
	if len(tb.Entries) != len(want) {
		t.Fatalf("entries %+v, want %+v", tb.Entries, want)
	}
	for i, r := range tb.Entries {
		if r.Entry != want[i].Entry || r.Topic != want[i].Topic || r.Checkpoint != want[i].Checkpoint || !r.CreatedAt.Equal(want[i].CreatedAt) {
			t.Errorf("entry %d: %+v, want %+v", i, r, want[i])
		}
	}
	for _, page := range []int{1, 2} {
		got := pages(t, page, func(after *driver.EntryRow) ([]driver.EntryRow, error) {
			var k *driver.EntryKey
			if after != nil {
				k = &driver.EntryKey{Topic: after.Topic, Partition: after.Partition, Offset: after.Offset, Kind: after.Kind}
			}
			return f.Store.ScanEntries(ctx, k, page)
		})
		if fmt.Sprint(got) != fmt.Sprint(tb.Entries) {
			t.Errorf("scanned in pages of %d:\n got %v\nwant %v", page, got, tb.Entries)
		}
	}
}

// sameWindow and sameAdjustment compare rows as the columns hold them.
func sameWindow(a, b driver.WindowRow) bool {
	return a.Account == b.Account && a.Currency == b.Currency && a.Start.Equal(b.Start) && a.Amount == b.Amount && a.Count == b.Count &&
		a.UpdatedAt.Equal(b.UpdatedAt) && a.ClosedAt.Equal(b.ClosedAt)
}

func sameAdjustment(a, b driver.AdjustmentRow) bool {
	return a.Account == b.Account && a.Currency == b.Currency && a.Start.Equal(b.Start) && a.Amount == b.Amount && a.Count == b.Count &&
		a.UpdatedAt.Equal(b.UpdatedAt) && a.Checkpoint == b.Checkpoint
}
