package drivertest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The dedup keys' generations in the store: a table per generation in
// rotation, locking reads that see other branches' claims, emptying a
// table whole, and the table of the version before generations with its
// journal.

// Property (a table per generation): a generation's keys are in its own
// table only (generation g+KeyTables shares g's), its lookups and locking
// reads see no other table, and emptying one table leaves the others.
func testGenerationTables(t *testing.T, ctx context.Context, f Fixture) {
	later := clock().Add(time.Hour)
	for g := range driver.Generation(driver.KeyTables + 1) {
		var contested []driver.Contested
		commit(t, ctx, f, func(tx driver.StoreTx) (err error) {
			contested, err = tx.ClaimKeys(ctx, g, []driver.DedupKey{
				{ID: fmt.Sprintf("own-%d", g), ExpiresAt: later}, {ID: "shared", Fingerprint: [16]byte{byte(g)}, ExpiresAt: later}})
			return err
		})
		if want := g >= driver.KeyTables; (len(contested) != 0) != want {
			t.Fatalf("generation %d: contested %v: the shared id should meet a stored row only in the table of generation %d", g, contested, g-driver.KeyTables)
		}
	}
	tb := tables(t, ctx, f)
	for table, want := range [][]string{{"own-0", "own-3", "shared"}, {"own-1", "shared"}, {"own-2", "shared"}} {
		if got := idsOf(tb.Keys[table]); !slices.Equal(got, want) {
			t.Fatalf("table %d holds %v, want %v", table, got, want)
		}
		if fp := tb.Keys[table][len(want)-1].Fingerprint[0]; int(fp) != table {
			t.Fatalf("table %d: the shared id has the fingerprint of generation %d", table, fp)
		}
	}
	found, err := f.Store.LookupKeys(ctx, 1, []string{"shared", "own-0", "own-2"})
	must(t, err)
	if len(found) != 1 || found[0].Fingerprint[0] != 1 {
		t.Fatalf("lookup in generation 1 found %+v, want its shared key alone", found)
	}
	b := open(t, ctx, f.Server)
	locked, err := b.tx().LockKeys(ctx, 2, []string{"own-1", "shared", "own-2"})
	must(t, err)
	if got := idsOf(locked); !slices.Equal(got, []string{"own-2", "shared"}) || locked[1].Fingerprint[0] != 2 {
		t.Fatalf("locking read of generation 2 found %+v", locked)
	}
	must(t, b.end(true))
	must(t, f.Store.EmptyKeys(ctx, 1, time.Time{}))
	tb = tables(t, ctx, f)
	if len(tb.Keys[1]) != 0 || len(tb.Keys[0]) != 3 || len(tb.Keys[2]) != 2 {
		t.Fatalf("after emptying generation 1's table: %d, %d, %d keys, want 3, 0, 2", len(tb.Keys[0]), len(tb.Keys[1]), len(tb.Keys[2]))
	}
}

// Property (locking reads of keys): a key another branch claimed and has
// not decided makes a locking read of it wait; committed, it is read;
// rolled back, it is not there. Shared locks of two readers do not wait
// for each other, and they hold off a delete of the row until both end.
func testLockKeys(t *testing.T, ctx context.Context, f Fixture) {
	for _, commitFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("claimer commits=%v", commitFirst), func(t *testing.T) {
			k := keys(fmt.Sprintf("lk%v", commitFirst), 1, clock().Add(time.Hour))
			claimer := open(t, ctx, f.Server)
			if _, err := claimer.tx().ClaimKeys(ctx, 1, slices.Clone(k)); err != nil {
				t.Fatal(err)
			}
			reader := open(t, ctx, f.Server)
			var found []driver.DedupKey
			done := async(func() (err error) {
				found, err = reader.tx().LockKeys(ctx, 1, idsOf(k))
				return err
			})
			blocked(t, done, f.LockWait/4, "a locking read of a key another branch claimed")
			must(t, claimer.end(commitFirst))
			must(t, <-done)
			if (len(found) == 1) != commitFirst {
				t.Fatalf("read after the claimer's commit=%v: %+v", commitFirst, found)
			}
			must(t, reader.end(true))
		})
	}
	t.Run("shared", func(t *testing.T) {
		k := keys("shr", 1, clock().Add(time.Hour))
		commit(t, ctx, f, func(tx driver.StoreTx) error { _, err := tx.ClaimKeys(ctx, 1, slices.Clone(k)); return err })
		var readers []*branch
		for range 2 {
			r := open(t, ctx, f.Server)
			start := time.Now()
			found, err := r.tx().LockKeys(ctx, 1, idsOf(k))
			must(t, err)
			if len(found) != 1 || time.Since(start) > f.LockWait/2 {
				t.Fatalf("second reader found %+v after %s: shared locks should not wait for each other", found, time.Since(start))
			}
			readers = append(readers, r)
		}
		deleter := open(t, ctx, f.Server)
		done := async(func() error { return deleter.tx().UnclaimKeys(ctx, 1, idsOf(k)) })
		blocked(t, done, f.LockWait/4, "a delete of a key two branches read under shared locks")
		must(t, readers[0].end(true))
		blocked(t, done, f.LockWait/4, "a delete of a key a branch still reads under a shared lock")
		must(t, readers[1].end(true))
		must(t, <-done)
		must(t, deleter.end(true))
		if slices.Contains(idsOf(tables(t, ctx, f).Keys[1]), k[0].ID) {
			t.Fatalf("key %s left after the delete", k[0].ID)
		}
	})
}

// claimer is one branch claiming keys as a checkpoint does under a view of
// the generations: insert into write, then lock-read read. owned are the
// ids it counts: neither met stored in write (the lookup of contested ids)
// nor found in read.
type claimer struct {
	b           *branch
	write, read driver.Generation
	ids         []string
	owned       []string
	err         error
}

func (c *claimer) insert(ctx context.Context, f Fixture, expires time.Time) ([]string, error) {
	ks := make([]driver.DedupKey, len(c.ids))
	for i, id := range c.ids {
		ks[i] = driver.DedupKey{ID: id, ExpiresAt: expires}
	}
	statements, err := c.b.tx().ClaimKeys(ctx, c.write, ks)
	return contestedIDs(statements), err
}

func (c *claimer) readOthers(ctx context.Context, f Fixture, contested []string) error {
	elsewhere, err := c.b.tx().LockKeys(ctx, c.read, c.ids)
	if err != nil {
		return err
	}
	stored, err := f.Store.LookupKeys(ctx, c.write, contested)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, k := range append(elsewhere, stored...) {
		seen[k.ID] = true
	}
	for _, id := range c.ids {
		if !seen[id] {
			c.owned = append(c.owned, id)
		}
	}
	return nil
}

// Property (claims under different generations): two branches
// that disagree on the current generation (each inserts into its own and
// lock-reads the other's, as instances on either side of a rotation would)
// never both count a key: one's insert precedes the other's read of that
// table, and that read waits for it. In every interleaving, and under
// random concurrent claims of overlapping keys, each key that a committed
// branch claimed is owned by exactly one committed branch; a branch the
// server ended (a deadlock between the two reads) owns nothing.
func testGenerationRace(t *testing.T, ctx context.Context, f Fixture) {
	expires := clock().Add(time.Hour)
	pair := func(t *testing.T, name string) (*claimer, *claimer) {
		id := fmt.Sprintf("race-%s", name)
		return &claimer{b: open(t, ctx, f.Server), write: 1, read: 2, ids: []string{id}},
			&claimer{b: open(t, ctx, f.Server), write: 2, read: 1, ids: []string{id}}
	}
	t.Run("one reads before the other inserts", func(t *testing.T) {
		for _, commitFirst := range []bool{true, false} {
			a, b := pair(t, fmt.Sprintf("seq%v", commitFirst))
			ca, err := a.insert(ctx, f, expires)
			must(t, err)
			must(t, a.readOthers(ctx, f, ca))
			cb, err := b.insert(ctx, f, expires)
			must(t, err)
			done := async(func() error { return b.readOthers(ctx, f, cb) })
			blocked(t, done, f.LockWait/4, "a locking read of a key claimed under another generation")
			must(t, a.b.end(commitFirst))
			must(t, <-done)
			must(t, b.b.end(true))
			if len(a.owned) != 1 || (len(b.owned) == 1) == commitFirst {
				t.Fatalf("first commits=%v: owned %v and %v, want exactly one owner", commitFirst, a.owned, b.owned)
			}
		}
	})
	t.Run("both insert before either reads", func(t *testing.T) {
		a, b := pair(t, "both")
		ca, err := a.insert(ctx, f, expires)
		must(t, err)
		cb, err := b.insert(ctx, f, expires)
		must(t, err)
		da := async(func() error { return a.readOthers(ctx, f, ca) })
		blocked(t, da, f.LockWait/4, "a locking read of a key another branch inserted")
		db := async(func() error { return b.readOthers(ctx, f, cb) })

		// Each read waits for the other branch: a deadlock, which the
		// server breaks by failing one of them; that branch is rolled
		// back (InnoDB rolls the victim back itself, the in-memory model
		// when the branch ends), and the other then reads nothing and
		// owns the key. Either answer may arrive first.
		type answer struct {
			c   *claimer
			err error
		}
		answers := make(chan answer, 2)
		go func() { answers <- answer{a, <-da} }()
		go func() { answers <- answer{b, <-db} }()
		next := func() answer {
			select {
			case x := <-answers:
				return x
			case <-time.After(2 * f.LockWait):
				t.Fatal("neither read returned: the two claims wait for each other forever")
				return answer{}
			}
		}
		first := next()
		var loser, winner answer
		if first.err != nil {
			loser = first
			_ = loser.c.b.end(false)
			winner = next()
		} else {
			winner, loser = first, next()
			_ = loser.c.b.end(false)
		}
		if code(f, loser.err) != driver.Transient || winner.err != nil {
			t.Fatalf("the reads returned %v (%v) and %v: want one deadlock (transient), one success", loser.err, code(f, loser.err), winner.err)
		}
		must(t, winner.c.b.end(true))
		if len(winner.c.owned) != 1 {
			t.Fatalf("the branch left owns %v, want the key", winner.c.owned)
		}
	})
	t.Run("random", func(t *testing.T) { randomGenerationRace(t, ctx, f, expires) })
}

// randomGenerationRace runs branches of random views claiming overlapping
// random keys at once.
func randomGenerationRace(t *testing.T, ctx context.Context, f Fixture, expires time.Time) {
	const branches, pool, each = 8, 40, 6
	r := rand.New(rand.NewPCG(21, uint64(time.Now().UnixNano())))
	cs := make([]*claimer, branches)
	for i := range cs {
		write := driver.Generation(1 + r.IntN(2))
		c := &claimer{b: open(t, ctx, f.Server), write: write, read: 3 - write}
		for _, j := range r.Perm(pool)[:each] {
			c.ids = append(c.ids, fmt.Sprintf("rnd-%02d", j))
		}
		cs[i] = c
	}
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() {
			contested, err := c.insert(ctx, f, expires)
			if err == nil {
				err = c.readOthers(ctx, f, contested)
			}
			if err != nil {
				c.err, c.owned = err, nil
				_ = c.b.end(false)
				return
			}
			c.err = c.b.end(true)
		})
	}
	wg.Wait()
	owners, claimed := map[string]int{}, map[string]bool{}
	for _, c := range cs {
		if c.err != nil {
			if code(f, c.err) != driver.Transient {
				t.Fatalf("a claim failed with %v (%v), want only deadlocks or lock waits", c.err, code(f, c.err))
			}
			continue
		}
		for _, id := range c.ids {
			claimed[id] = true
		}
		for _, id := range c.owned {
			owners[id]++
		}
	}
	for id := range claimed {
		if owners[id] != 1 {
			t.Errorf("key %s owned by %d committed branches, want exactly 1", id, owners[id])
		}
	}
}

// prepared claims ks in generation g in a branch of its own and prepares
// it; the caller commits or rolls it back (end).
func prepared(t *testing.T, ctx context.Context, f Fixture, g driver.Generation, ks []driver.DedupKey) (end func(commit bool) error) {
	t.Helper()
	b := open(t, ctx, f.Server)
	_, err := b.tx().ClaimKeys(ctx, g, slices.Clone(ks))
	must(t, err)
	must(t, b.c.XA(ctx, driver.End, b.x))
	must(t, b.c.XA(ctx, driver.Prepare, b.x))
	return func(commit bool) error {
		b.done = true
		defer b.c.Close(false)
		verb := driver.Rollback
		if commit {
			verb = driver.Commit
		}
		return b.c.XA(ctx, verb, b.x)
	}
}

// Property (emptying and a prepared branch): a table a prepared
// branch touched is not emptied under it: the emptying gives up after a
// bounded wait (about a second, far below the lock wait), changing
// nothing, while claims in another generation's table go on meanwhile;
// the branch commits as if nothing happened, and once it has, the table is
// emptied at once.
func testEmptyPrepared(t *testing.T, ctx context.Context, f Fixture) {
	ks := keys("pb", 3, clock().Add(time.Hour))
	end := prepared(t, ctx, f, 1, ks)
	start := time.Now()
	empty := async(func() error { return f.Store.EmptyKeys(ctx, 1, time.Time{}) })
	other := open(t, ctx, f.Server)
	claimStart := time.Now()
	if _, err := other.tx().ClaimKeys(ctx, 2, keys("other", 5, clock().Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(claimStart); d > 500*time.Millisecond {
		t.Errorf("a claim in another generation's table took %s while a table was being emptied", d)
	}
	must(t, other.end(true))
	err := <-empty
	took := time.Since(start)
	if err == nil || code(f, err) != driver.Transient {
		t.Fatalf("emptying a table a prepared branch holds: %v (%v), want a transient failure", err, code(f, err))
	}
	if took < 500*time.Millisecond || took > 10*time.Second {
		t.Fatalf("emptying gave up after %s, want about a second", took)
	}
	must(t, end(true))
	if got := idsOf(tables(t, ctx, f).Keys[1]); !slices.Equal(got, idsOf(ks)) {
		t.Fatalf("the prepared branch's keys after it committed: %v, want %v", got, idsOf(ks))
	}
	must(t, f.Store.EmptyKeys(ctx, 1, time.Time{}))
	tb := tables(t, ctx, f)
	if len(tb.Keys[1]) != 0 || len(tb.Keys[2]) != 5 {
		t.Fatalf("after emptying once the branch ended: %d keys in its table (want 0), %d in the other (want 5)", len(tb.Keys[1]), len(tb.Keys[2]))
	}
}

// Property (the version before generations): generation 0's table is
// where that version wrote keys, with their expiry in its journal; the
// table is emptied (with the journal) only once no journal row expires
// after the instant given, and left as it is before.
func testEmptyJournal(t *testing.T, ctx context.Context, f Fixture) {
	now := clock()
	ids := []string{"old-1", "old-2", "old-3"}
	must(t, f.Legacy(ctx, now.Add(time.Hour), ids))
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		_, err := tx.ClaimKeys(ctx, 0, keys("new", 2, now.Add(2*time.Hour)))
		return err
	})
	for _, g := range []driver.Generation{0, driver.KeyTables} {
		err := f.Store.EmptyKeys(ctx, g, now.Add(30*time.Minute))
		if !errors.Is(err, driver.ErrKeysLive) {
			t.Fatalf("generation %d: emptying while a journal row expires later: %v, want ErrKeysLive", g, err)
		}
	}
	tb := tables(t, ctx, f)
	if len(tb.Keys[0]) != 5 || len(tb.Journal) != 1 {
		t.Fatalf("after the refusals: %d keys and %d journal rows, want 5 and 1", len(tb.Keys[0]), len(tb.Journal))
	}
	must(t, f.Store.EmptyKeys(ctx, 0, now.Add(time.Hour)))
	tb = tables(t, ctx, f)
	if len(tb.Keys[0]) != 0 || len(tb.Journal) != 0 {
		t.Fatalf("after emptying: %d keys and %d journal rows, want none", len(tb.Keys[0]), len(tb.Journal))
	}
}

// Property (point locks): locking reads and unclaims lock the rows of
// their ids only. Two branches of one checkpoint hold uncommitted claims
// of interleaved ids in a small table (as a generation's is just after its
// table was emptied); each one's locking read and unclaim of its own ids
// returns at once, without waiting for the other's rows or deadlocking
// with it.
func testPointLocks(t *testing.T, ctx context.Context, f Fixture) {
	const n = 50
	expires := clock().Add(time.Hour)
	var mine, theirs []driver.DedupKey
	for i := range n {
		k := driver.DedupKey{ID: fmt.Sprintf("pt-%02d", i), Fingerprint: [16]byte{byte(i)}, ExpiresAt: expires}
		if i%2 == 0 {
			mine = append(mine, k)
		} else {
			theirs = append(theirs, k)
		}
	}
	a, b := open(t, ctx, f.Server), open(t, ctx, f.Server)
	_, err := a.tx().ClaimKeys(ctx, 1, slices.Clone(mine))
	must(t, err)
	_, err = b.tx().ClaimKeys(ctx, 1, slices.Clone(theirs))
	must(t, err)
	quick := func(what string, ch <-chan error) {
		t.Helper()
		select {
		case err := <-ch:
			if err != nil {
				t.Fatalf("%s: %v (%v)", what, err, code(f, err))
			}
		case <-time.After(f.LockWait / 2):
			t.Fatalf("%s waited: it locks rows of other ids", what)
		}
	}
	quick("a locking read of a branch's own ids", async(func() error {
		found, err := a.tx().LockKeys(ctx, 1, idsOf(mine))
		if err == nil && len(found) != len(mine) {
			err = fmt.Errorf("found %d of %d", len(found), len(mine))
		}
		return err
	}))
	da := async(func() error { return a.tx().UnclaimKeys(ctx, 1, idsOf(mine)) })
	db := async(func() error { return b.tx().UnclaimKeys(ctx, 1, idsOf(theirs)) })
	quick("one branch's unclaim of its interleaved ids", da)
	quick("the other branch's", db)
	must(t, a.end(true))
	must(t, b.end(true))
	if left := tables(t, ctx, f).Keys[1]; slices.ContainsFunc(left, func(k driver.DedupKey) bool { return strings.HasPrefix(k.ID, "pt-") }) {
		t.Fatalf("keys left after both unclaims: %v", idsOf(left))
	}
}
