package drivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

var storeTests = []struct {
	name string
	fn   func(t *testing.T, ctx context.Context, f Fixture)
}{
	{"Store/ClaimFindsEveryStoredKey", testClaimKeys},
	{"Store/ClaimWaitsForTheOtherBranch", testClaimWaits},
	{"Store/ClaimsRacingAcrossBranchesOwnEachKeyOnce", testClaimRace},
	{"Store/UnclaimAndReplace", testUnclaimReplace},
	{"Store/KeysKeepTheirVersion", testKeyVersions},
	{"Store/LookupsReadCommittedRowsOnly", testLookupCommitted},
	{"Store/LockingReadsWaitForWriters", testLockingReads},
	{"Store/NoGapLocks", testNoGapLocks},
	{"Store/CreatesLockStoredAndMissingRows", testCreates},
	{"Store/CreatesWaitForAnotherBranchsInsert", testCreatesWait},
	{"Store/LockWaitTimesOut", testLockWaitTimeout},
	{"Store/LockWaitSetPerBranch", testLockWaitSet},
	{"Store/SumsAddSetAndOverflow", testSums},
	{"Store/AdjustmentsNameTheirCheckpoint", testAdjustments},
	{"Store/EntriesAndDeadLettersKeepTheStoredRow", testKeepStored},
	{"Store/EntriesOfOnePositionByKind", testEntryKinds},
	{"Store/WindowStartsOfTheCommittedRows", testWindowStarts},
	{"Store/ServerCounters", testStats},
	{"Store/IdentifiersOfAnyBytesRoundTrip", testCharsets},
	{"Store/StatementSizesFromMaxAllowedPacket", testPacketSizes},
	{"Store/DeadLettersOfAnySize", testDeadLetterSizes},
	{"Store/DeadLetterIDsInTheOrderWritten", testDeadLetterOrder},
	{"Store/TooLargeOnceTheLimitFell", testTooLarge},
	{"Store/SealingOrderAndResult", testSealing},
	{"Store/SealingWaitsForOpenWrites", testSealingWaits},
	{"Store/RetentionInBatches", testBatches},
	{"Store/GenerationsAreTablesOfTheirOwn", testGenerationTables},
	{"Store/LockingReadsOfKeysWaitForClaims", testLockKeys},
	{"Store/ClaimsUnderDifferentGenerationsOwnEachKeyOnce", testGenerationRace},
	{"Store/EmptyingWaitsBoundedForAPreparedBranch", testEmptyPrepared},
	{"Store/LockingReadsAndUnclaimsLockTheirIdsOnly", testPointLocks},
	{"Store/EmptyingTheFirstTableWaitsForTheJournal", testEmptyJournal},
}

// contestedIDs are the ids of a claim's contested statements.
func contestedIDs(cs []driver.Contested) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.IDs...)
	}
	return out
}

// branch is one open branch on a connection of its own, for store tests.
type branch struct {
	t    *testing.T
	ctx  context.Context
	c    driver.Conn
	x    driver.Xid
	done bool
}

// open starts a branch on a new connection of s.
func open(t *testing.T, ctx context.Context, s driver.Server) *branch {
	t.Helper()
	c, err := s.Conn(ctx)
	must(t, err)
	b := &branch{t: t, ctx: ctx, c: c, x: xid()}
	must(t, c.XA(ctx, driver.Start, b.x))
	t.Cleanup(func() {
		if !b.done {
			c.Close(false)
			_ = s.Resolve(context.Background(), b.x, false)
		}
	})
	return b
}

func (b *branch) tx() driver.StoreTx { return b.c.Store() }

// end commits (by two phases, as the protocol does) or rolls back.
func (b *branch) end(commit bool) error {
	b.done = true
	defer b.c.Close(false)
	if err := b.c.XA(b.ctx, driver.End, b.x); err != nil {
		return err
	}
	if !commit {
		return b.c.XA(b.ctx, driver.Rollback, b.x)
	}
	if err := b.c.XA(b.ctx, driver.Prepare, b.x); err != nil {
		return err
	}
	return b.c.XA(b.ctx, driver.Commit, b.x)
}

// commit runs fn in a branch of its own and commits it.
func commit(t *testing.T, ctx context.Context, f Fixture, fn func(driver.StoreTx) error) {
	t.Helper()
	b := open(t, ctx, f.Server)
	must(t, fn(b.tx()))
	must(t, b.end(true))
}

func tables(t *testing.T, ctx context.Context, f Fixture) driver.Tables {
	t.Helper()
	tb, err := f.Tables(ctx)
	must(t, err)
	return tb
}

// clock is an instant as the tables keep it (DATETIME(6), UTC).
func clock() time.Time { return time.Now().UTC().Truncate(time.Second) }

func keys(prefix string, n int, expires time.Time) []driver.DedupKey {
	out := make([]driver.DedupKey, n)
	for i := range out {
		out[i] = driver.DedupKey{ID: fmt.Sprintf("%s-%05d", prefix, i), Fingerprint: [16]byte{byte(i), byte(i >> 8)}, ExpiresAt: expires}
	}
	return out
}

func idsOf(ks []driver.DedupKey) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.ID
	}
	return out
}

// storedIDs are the ids stored in generation 0's table (dedup_keys).
func storedIDs(t *testing.T, ctx context.Context, f Fixture) []string {
	t.Helper()
	return idsOf(tables(t, ctx, f).Keys[0])
}

// code is the server's classification of err.
func code(f Fixture, err error) driver.Code { return f.Server.Code(err) }

// async runs fn on a goroutine; the channel yields its error.
func async(fn func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- fn() }()
	return ch
}

// blocked fails the test unless ch stays silent for d: the call waits.
func blocked(t *testing.T, ch <-chan error, d time.Duration, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s returned at once (%v): it should wait for the other branch", what, err)
	case <-time.After(d):
	}
}

// Property (claim): every new key is written by the claim itself, and a
// stored key is never taken for new. Only the statements that met a stored
// key report their ids (to be looked up); a stored row is left as it was,
// fingerprint and expiry included.
func testClaimKeys(t *testing.T, ctx context.Context, f Fixture) {
	later := clock().Add(time.Hour)
	first := keys("e", 2500, later)
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		s, err := tx.ClaimKeys(ctx, 0, slices.Clone(first))
		if err == nil && len(s) != 0 {
			err = fmt.Errorf("claim of 2500 new keys: %d contested, want 0", len(s))
		}
		return err
	})
	// 2999 new keys and one stored, e-01500, which sorts into the third
	// statement ("e-…" after "a-…"): the claim names that statement's ids,
	// and the stored fingerprint and expiry win.
	again := keys("a", 2999, later.Add(time.Hour))
	stored := first[1500]
	again = append(again, driver.DedupKey{ID: stored.ID, Fingerprint: [16]byte{0xff}, ExpiresAt: later.Add(time.Hour)})
	var statements []driver.Contested
	commit(t, ctx, f, func(tx driver.StoreTx) (err error) {
		statements, err = tx.ClaimKeys(ctx, 0, again)
		return err
	})
	contested := contestedIDs(statements)
	if !slices.Contains(contested, stored.ID) || len(contested) != 1000 || len(statements) != 1 || statements[0].Stored != 1 {
		t.Fatalf("%d contested ids (stored key among them: %v) in %d statements (stored %v), want one statement's 1000, one of them stored",
			len(contested), slices.Contains(contested, stored.ID), len(statements), statements)
	}
	found, err := f.Store.LookupKeys(ctx, 0, []string{stored.ID})
	must(t, err)
	if len(found) != 1 || found[0] != stored {
		t.Fatalf("looked up %+v, want the stored key unchanged (%+v)", found, stored)
	}
	if n := len(storedIDs(t, ctx, f)); n != 5499 {
		t.Fatalf("%d keys stored, want 5499", n)
	}
}

// Property (concurrent claims): a key that another branch has claimed but
// not yet decided makes the claim wait; committed, it is contested;
// rolled back, the key is claimed here. Either way one branch, never
// both, owns the key.
func testClaimWaits(t *testing.T, ctx context.Context, f Fixture) {
	for _, commitFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("first commits=%v", commitFirst), func(t *testing.T) {
			k := keys(fmt.Sprintf("w%v", commitFirst), 1, clock().Add(time.Hour))
			first := open(t, ctx, f.Server)
			if s, err := first.tx().ClaimKeys(ctx, 0, slices.Clone(k)); err != nil || len(s) != 0 {
				t.Fatalf("first claim: %v, %v", s, err)
			}
			second := open(t, ctx, f.Server)
			var contested []driver.Contested
			done := async(func() (err error) {
				contested, err = second.tx().ClaimKeys(ctx, 0, slices.Clone(k))
				return err
			})
			blocked(t, done, f.LockWait/4, "a claim of a key another branch claimed")
			must(t, first.end(commitFirst))
			must(t, <-done)
			if got := len(contested) == 1 && contested[0].Stored == 1 && len(contested[0].IDs) == 1; got != commitFirst {
				t.Fatalf("contested after the first's commit=%v: %v", commitFirst, contested)
			}
			must(t, second.end(true))
			if ids := storedIDs(t, ctx, f); !slices.Contains(ids, k[0].ID) {
				t.Fatalf("key %s not stored", k[0].ID)
			}
		})
	}
}

// Property (exactly one owner): branches claiming overlapping sets of keys
// at once, each looking up its contested ids before it commits (as a
// checkpoint does), own every key exactly once between them: the owned
// ids are those it claimed uncontested, and the contested ones no
// committed row holds.
func testClaimRace(t *testing.T, ctx context.Context, f Fixture) {
	const branches, pool, each = 6, 300, 120
	all := keys("race", pool, clock().Add(time.Hour))
	owned := make([][]string, branches)
	errs := make([]<-chan error, branches)
	for i := range branches {
		var mine []driver.DedupKey
		for j := range each {
			mine = append(mine, all[(i*37+j*7)%pool])
		}
		b := open(t, ctx, f.Server)
		errs[i] = async(func() error {
			statements, err := b.tx().ClaimKeys(ctx, 0, mine)
			if err != nil {
				return err
			}
			contested := contestedIDs(statements)
			found, err := f.Store.LookupKeys(ctx, 0, contested)
			if err != nil {
				return err
			}
			stored := map[string]bool{}
			for _, k := range found {
				stored[k.ID] = true
			}
			for _, k := range mine {
				if !slices.Contains(contested, k.ID) || !stored[k.ID] {
					owned[i] = append(owned[i], k.ID)
				}
			}
			return b.end(true)
		})
	}
	for _, e := range errs {
		must(t, <-e)
	}
	owners := map[string]int{}
	for _, ids := range owned {
		for _, id := range ids {
			owners[id]++
		}
	}
	claimed := map[string]bool{}
	for i := range branches {
		for j := range each {
			claimed[all[(i*37+j*7)%pool].ID] = true
		}
	}
	for id := range claimed {
		if owners[id] != 1 {
			t.Errorf("key %s owned by %d branches, want exactly 1", id, owners[id])
		}
	}
	if n := len(storedIDs(t, ctx, f)); n != len(claimed) {
		t.Errorf("%d keys stored, want the %d claimed", n, len(claimed))
	}
}

// Property (unclaim, replace): a claimed key the checkpoint does not keep
// is gone and no other is touched; an expired key is replaced with its new
// content, and a live one is refused as a duplicate.
func testUnclaimReplace(t *testing.T, ctx context.Context, f Fixture) {
	now := clock()
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		_, err := tx.ClaimKeys(ctx, 0, keys("u", 3, now.Add(time.Hour)))
		return errors.Join(err, tx.UnclaimKeys(ctx, 0, []string{"u-00001"}))
	})
	if ids := storedIDs(t, ctx, f); !slices.Equal(ids, []string{"u-00000", "u-00002"}) {
		t.Fatalf("keys after unclaim: %v", ids)
	}
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		_, err := tx.ClaimKeys(ctx, 0, keys("x", 1, now.Add(-time.Minute)))
		return err
	})
	fresh := driver.DedupKey{ID: "x-00000", Fingerprint: [16]byte{9}, ExpiresAt: now.Add(time.Hour)}
	commit(t, ctx, f, func(tx driver.StoreTx) error { return tx.ReplaceKeys(ctx, 0, []driver.DedupKey{fresh}, now) })
	found, err := f.Store.LookupKeys(ctx, 0, []string{"x-00000"})
	must(t, err)
	if len(found) != 1 || found[0] != fresh {
		t.Fatalf("replaced key %+v, want %+v", found, fresh)
	}
	b := open(t, ctx, f.Server)
	err = b.tx().ReplaceKeys(ctx, 0, []driver.DedupKey{{ID: "u-00000", ExpiresAt: now.Add(2 * time.Hour)}}, now)
	if code(f, err) != driver.Duplicate {
		t.Fatalf("replacing a live key: %v (%v), want a duplicate", err, code(f, err))
	}
}

// Property (versions): a key's version, any bytes, reads back as written
// from the claim, the lookup and the locking read (none: empty, a key
// stored before versions); a claim that meets a stored key leaves its
// version as it was, and UpdateKeys sets the fingerprint, expiry and
// version of a stored key and of one its own branch claimed, in the
// generation's table it names.
func testKeyVersions(t *testing.T, ctx context.Context, f Fixture) {
	now := clock()
	v1, v2 := "\x01\x00\xff\x80EURacct", "\x02\x07"
	old := driver.DedupKey{ID: "ver-old", Fingerprint: [16]byte{1}, ExpiresAt: now.Add(time.Hour)}
	stored := driver.DedupKey{ID: "ver-stored", Fingerprint: [16]byte{2}, ExpiresAt: now.Add(time.Hour), Version: v1}
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		_, err := tx.ClaimKeys(ctx, 1, []driver.DedupKey{old, stored})
		return err
	})
	found, err := f.Store.LookupKeys(ctx, 1, []string{"ver-old", "ver-stored"})
	must(t, err)
	slices.SortFunc(found, func(a, b driver.DedupKey) int { return strings.Compare(a.ID, b.ID) })
	if !slices.Equal(found, []driver.DedupKey{old, stored}) {
		t.Fatalf("looked up %+v, want %+v", found, []driver.DedupKey{old, stored})
	}
	again := stored
	again.Version = v2
	fresh := driver.DedupKey{ID: "ver-fresh", Fingerprint: [16]byte{3}, ExpiresAt: now.Add(time.Hour), Version: v1}
	amended := driver.DedupKey{ID: "ver-stored", Fingerprint: [16]byte{4}, ExpiresAt: now.Add(30 * time.Minute), Version: v2}
	freshAmended := driver.DedupKey{ID: "ver-fresh", Fingerprint: [16]byte{5}, ExpiresAt: now.Add(time.Hour), Version: v2}
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		contested, err := tx.ClaimKeys(ctx, 1, []driver.DedupKey{again, fresh})
		if err != nil {
			return err
		}
		if len(contested) == 0 {
			return errors.New("a claim that met a stored key reported none")
		}
		locked, err := tx.LockKeys(ctx, 1, []string{"ver-stored"})
		if err != nil {
			return err
		}
		if !slices.Equal(locked, []driver.DedupKey{stored}) {
			return fmt.Errorf("locking read %+v, want the stored version %+v", locked, stored)
		}
		return tx.UpdateKeys(ctx, 1, []driver.DedupKey{freshAmended, amended})
	})
	found, err = f.Store.LookupKeys(ctx, 1, []string{"ver-fresh", "ver-old", "ver-stored"})
	must(t, err)
	slices.SortFunc(found, func(a, b driver.DedupKey) int { return strings.Compare(a.ID, b.ID) })
	if want := []driver.DedupKey{freshAmended, old, amended}; !slices.Equal(found, want) {
		t.Fatalf("after the update %+v, want %+v", found, want)
	}
	if other, err := f.Store.LookupKeys(ctx, 2, []string{"ver-stored"}); err != nil || len(other) != 0 {
		t.Fatalf("another generation's table: %+v, %v", other, err)
	}
}

// Property (visibility): the pools' lookups read committed keys only, and
// never wait for a branch that holds one.
func testLookupCommitted(t *testing.T, ctx context.Context, f Fixture) {
	b := open(t, ctx, f.Server)
	k := keys("v", 1, clock().Add(time.Hour))
	if _, err := b.tx().ClaimKeys(ctx, 0, k); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	found, err := f.Store.LookupKeys(ctx, 0, idsOf(k))
	must(t, err)
	if len(found) != 0 || time.Since(start) > f.LockWait/2 {
		t.Fatalf("a lookup saw an uncommitted key (%v) or waited for it (%s)", found, time.Since(start))
	}
	must(t, b.end(true))
	if found, err = f.Store.LookupKeys(ctx, 0, idsOf(k)); err != nil || len(found) != 1 {
		t.Fatalf("after commit: %v, %v", found, err)
	}
}
