package dedup_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/stmt/stmttest"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// sqlTx runs the dedup statements in one local transaction, as a branch
// does in its XA transaction.
// sqlTx runs statements in a local transaction, like a branch does in its
// XA transaction. budget is its statement budget (stmt.Budget of a 16 MiB
// max_allowed_packet when 0); every statement it is given is checked
// against it.
type sqlTx struct {
	tx     *sqlx.Tx
	budget int
}

func (x sqlTx) MaxStatementBytes() int {
	if x.budget == 0 {
		return stmt.Budget(16 << 20)
	}
	return x.budget
}

// checkSize fails a statement whose text, as the driver interpolates it,
// exceeds the budget: the server would refuse it.
func (x sqlTx) checkSize(q string, args []any) error {
	if n := stmttest.Statement(q, args); n > x.MaxStatementBytes() {
		return fmt.Errorf("statement of %d bytes exceeds the budget of %d", n, x.MaxStatementBytes())
	}
	return nil
}

func (x sqlTx) Exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if err := x.checkSize(q, args); err != nil {
		return nil, err
	}
	return x.tx.ExecContext(ctx, q, args...)
}

func (x sqlTx) Select(ctx context.Context, dest any, q string, args ...any) error {
	if err := x.checkSize(q, args); err != nil {
		return err
	}
	return x.tx.SelectContext(ctx, dest, q, args...)
}

// newStore opens a fresh database with the schema, through mysqldriver.OpenDB
// so that sessions are configured as the service's are.
func newStore(t *testing.T) *sqlx.DB {
	t.Helper()
	dsn, _ := testenv.LedgerDB(t)
	db, err := mysqldriver.OpenDB(dsn, 2*time.Second, 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func keys(prefix string, n int, expires time.Time) []dedup.Insert {
	out := make([]dedup.Insert, n)
	for i := range out {
		out[i] = dedup.Insert{ID: fmt.Sprintf("%s-%05d", prefix, i), Fingerprint: dedup.Fingerprint{byte(i)}, ExpiresAt: expires}
	}
	return out
}

// preparedTx is sqlTx that also runs statements prepared, as a branch's
// ExecPrepared does (binary protocol), counting them.
type preparedTx struct {
	sqlTx
	n *int
}

func (x preparedTx) ExecPrepared(ctx context.Context, q string, args ...any) (sql.Result, error) {
	st, err := x.tx.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	*x.n++
	return st.ExecContext(ctx, args...)
}

func claim(t *testing.T, db *sqlx.DB, ins []dedup.Insert) []string {
	t.Helper()
	return claimWith(t, db, ins, false)
}

// claimWith claims in one transaction; prepared runs the full statements
// through server-side prepared statements, and fails the test unless some
// did.
func claimWith(t *testing.T, db *sqlx.DB, ins []dedup.Insert, prepared bool) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ex dedup.Execer = sqlTx{tx: tx}
	var n int
	if prepared {
		ex = preparedTx{sqlTx{tx: tx}, &n}
	}
	suspects, err := dedup.Claim(ctx, ex, ins)
	if prepared && n == 0 {
		t.Fatal("no statement ran prepared")
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return suspects
}

// Property (claim): every new key is written by the claim itself, and a
// stored key is never taken for new. Only the statements that met a stored
// key report their ids as suspects (to be looked up); a stored row is left
// as it was, fingerprint and expiry included. Both with interpolated and
// with server-side prepared statements (the branches' ExecPrepared), whose
// affected-row counts must mean the same.
func TestClaimFindsEveryStoredKey(t *testing.T) {
	for _, prepared := range []bool{false, true} {
		t.Run(fmt.Sprintf("prepared=%v", prepared), func(t *testing.T) {
			testClaimFindsEveryStoredKey(t, func(t *testing.T, db *sqlx.DB, ins []dedup.Insert) []string {
				t.Helper()
				return claimWith(t, db, ins, prepared)
			})
		})
	}
}

func testClaimFindsEveryStoredKey(t *testing.T, claim func(*testing.T, *sqlx.DB, []dedup.Insert) []string) {
	db := newStore(t)
	ctx := context.Background()
	later := time.Now().UTC().Add(time.Hour).Truncate(time.Microsecond)
	first := keys("e", 2500, later)
	if s := claim(t, db, slices.Clone(first)); len(s) != 0 {
		t.Fatalf("claim of 2500 new keys: %d suspects, want 0", len(s))
	}
	var n int
	if err := db.Get(&n, `SELECT COUNT(*) FROM dedup_keys`); err != nil || n != 2500 {
		t.Fatalf("stored %d keys (%v), want 2500", n, err)
	}

	// A second batch: 2999 new keys and one stored one, e-01500, which
	// sorts into the second statement ("e-…" after "a-…"). Its claim must
	// name it, with a different fingerprint and expiry that must not win.
	again := keys("a", 2999, later.Add(time.Hour))
	stored := first[1500]
	again = append(again, dedup.Insert{ID: stored.ID, Fingerprint: dedup.Fingerprint{0xff}, ExpiresAt: later.Add(time.Hour)})
	suspects := claim(t, db, again)
	if !slices.Contains(suspects, stored.ID) {
		t.Fatalf("stored key %s not among the %d suspects", stored.ID, len(suspects))
	}
	if len(suspects) != 1000 {
		t.Fatalf("%d suspects, want one statement's 1000", len(suspects))
	}
	found := map[string]dedup.Seen{}
	if err := dedup.Lookup(ctx, pool{db: db}, suspects, found); err != nil {
		t.Fatal(err)
	}
	seen, ok := found[stored.ID]
	if !ok || seen.Fingerprint != stored.Fingerprint || !seen.ExpiresAt.Equal(stored.ExpiresAt) {
		t.Fatalf("stored key after claim = %+v, %v; want it unchanged (%x, %v)", seen, ok, stored.Fingerprint, stored.ExpiresAt)
	}
	if err := db.Get(&n, `SELECT COUNT(*) FROM dedup_keys`); err != nil || n != 5499 {
		t.Fatalf("stored %d keys (%v), want 5499", n, err)
	}
}

// pool reads committed rows outside any transaction, as the checkpoint's
// lookups of suspects do.
type pool struct {
	db     *sqlx.DB
	budget int
}

func (q pool) Select(ctx context.Context, dest any, query string, args ...any) error {
	return q.db.SelectContext(ctx, dest, query, args...)
}

func (q pool) MaxStatementBytes() int {
	if q.budget == 0 {
		return stmt.Budget(16 << 20)
	}
	return q.budget
}

// Property (concurrent claims): a key that another transaction has claimed
// but not yet decided makes the claim wait; committed, it is a suspect
// (stored before); rolled back, the key is claimed here. Either way one
// transaction, never both, owns the key.
func TestConcurrentClaimWaitsForTheOther(t *testing.T) {
	for _, commit := range []bool{true, false} {
		t.Run(fmt.Sprintf("other commits=%v", commit), func(t *testing.T) {
			db := newStore(t)
			ctx := context.Background()
			k := keys("k", 1, time.Now().UTC().Add(time.Hour))
			other, err := db.BeginTxx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if s, err := dedup.Claim(ctx, sqlTx{tx: other}, slices.Clone(k)); err != nil || len(s) != 0 {
				t.Fatalf("first claim: %v, %v", s, err)
			}
			type result struct {
				suspects []string
				err      error
			}
			done := make(chan result, 1)
			go func() {
				tx, err := db.BeginTxx(ctx, nil)
				if err != nil {
					done <- result{err: err}
					return
				}
				s, err := dedup.Claim(ctx, sqlTx{tx: tx}, slices.Clone(k))
				done <- result{s, errors.Join(err, tx.Commit())}
			}()
			select {
			case r := <-done:
				t.Fatalf("second claim returned before the first was decided: %+v", r)
			case <-time.After(300 * time.Millisecond):
			}
			if commit {
				err = other.Commit()
			} else {
				err = other.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			if got := len(r.suspects) == 1; got != commit {
				t.Fatalf("suspects after the other's commit=%v: %v", commit, r.suspects)
			}
			var n int
			if err := db.Get(&n, `SELECT COUNT(*) FROM dedup_keys`); err != nil || n != 1 {
				t.Fatalf("stored %d keys (%v), want 1", n, err)
			}
		})
	}
}

// Property (unclaim): a claimed key that the checkpoint does not keep is
// gone, and no other key is touched.
func TestUnclaim(t *testing.T) {
	db := newStore(t)
	ctx := context.Background()
	claim(t, db, keys("u", 3, time.Now().UTC().Add(time.Hour)))
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := dedup.Unclaim(ctx, sqlTx{tx: tx}, []string{"u-00001"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var ids []string
	if err := db.Select(&ids, `SELECT event_id FROM dedup_keys ORDER BY event_id`); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []string{"u-00000", "u-00002"}) {
		t.Fatalf("keys after unclaim: %v", ids)
	}
}

func ids(ins []dedup.Insert) []string {
	out := make([]string, len(ins))
	for i, in := range ins {
		out[i] = in.ID
	}
	return out
}

// write claims keys and journals them in one transaction, as a checkpoint's
// branch does.
func write(t *testing.T, db *sqlx.DB, ins []dedup.Insert) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dedup.Claim(ctx, sqlTx{tx: tx}, slices.Clone(ins)); err != nil {
		t.Fatal(err)
	}
	if err := dedup.Journal(ctx, sqlTx{tx: tx}, ins[0].ExpiresAt, ids(ins)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

func storedIDs(t *testing.T, db *sqlx.DB) []string {
	t.Helper()
	var out []string
	if err := db.Select(&out, `SELECT event_id FROM dedup_keys ORDER BY event_id`); err != nil {
		t.Fatal(err)
	}
	return out
}

// Property (TTL cleanup): the janitor deletes exactly the keys whose expiry
// has passed, found through the journal: not a key still within its TTL,
// not a key re-inserted after it expired (its first journal row is due, its
// row is not), and every key of a journal split over several rows.
func TestCleanupDeletesExactlyTheExpiredKeys(t *testing.T) {
	db := newStore(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	past, future := now.Add(-time.Minute), now.Add(time.Hour)

	expired := keys("x", 20000, past) // three journal rows
	write(t, db, expired)
	live := keys("l", 3, future)
	write(t, db, live)
	// "x-00007" expired and was seen again: replaced by a live row with a
	// journal row of its own, as a checkpoint's Store + Journal do.
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	again := []dedup.Insert{{ID: "x-00007", ExpiresAt: future, Replace: true}}
	if err := dedup.Store(ctx, sqlTx{tx: tx}, again, now); err != nil {
		t.Fatal(err)
	}
	if err := dedup.Journal(ctx, sqlTx{tx: tx}, future, ids(again)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	n, err := dedup.Cleanup(ctx, db, now, 1000, 1_000_000, stmt.Budget(16<<20))
	if err != nil {
		t.Fatal(err)
	}
	if n != 19999 {
		t.Errorf("cleanup deleted %d keys, want 19999", n)
	}
	want := append(ids(live), "x-00007")
	slices.Sort(want)
	if got := storedIDs(t, db); !slices.Equal(got, want) {
		t.Fatalf("keys left: %v, want %v", got, want)
	}
	var due, left int
	if err := db.Get(&due, `SELECT COUNT(*) FROM dedup_expiry WHERE expires_at <= ?`, now); err != nil || due != 0 {
		t.Fatalf("%d due journal rows left (%v)", due, err)
	}
	if err := db.Get(&left, `SELECT COUNT(*) FROM dedup_expiry`); err != nil || left != 2 {
		t.Fatalf("%d journal rows left (%v), want the 2 live ones", left, err)
	}

	// Once those expire too, nothing is left.
	if _, err := dedup.Cleanup(ctx, db, future, 1000, 1_000_000, stmt.Budget(16<<20)); err != nil {
		t.Fatal(err)
	}
	if got := storedIDs(t, db); len(got) != 0 {
		t.Fatalf("keys left after every expiry: %v", got)
	}
}

// Property (bounded passes and bad rows): a pass stops after max keys, and
// a journal row that does not parse stops the cleanup with an error naming
// it instead of being skipped silently.
func TestCleanupBoundsAndMalformedRows(t *testing.T) {
	db := newStore(t)
	ctx := context.Background()
	now := time.Now().UTC()
	write(t, db, keys("a", 9000, now.Add(-time.Minute))) // rows of 8192 and 808
	n, err := dedup.Cleanup(ctx, db, now, 1000, 100, stmt.Budget(16<<20))
	if err != nil || n != 8192 {
		t.Fatalf("bounded pass deleted %d (%v), want one journal row's 8192", n, err)
	}
	if _, err := db.Exec(`INSERT INTO dedup_expiry (expires_at, event_ids) VALUES (?, ?)`, now.Add(-2*time.Minute), []byte{5, 'a'}); err != nil {
		t.Fatal(err)
	}
	_, err = dedup.Cleanup(ctx, db, now, 1000, 1_000_000, stmt.Budget(16<<20))
	if err == nil || !strings.Contains(err.Error(), "malformed journal row") {
		t.Fatalf("cleanup over a malformed row: %v", err)
	}
}

// Property (statements bounded in bytes): with ids of the longest legal
// size and a small statement budget, every statement of Claim, Lookup,
// Journal, Store, Unclaim and Cleanup stays within the budget (sqlTx
// refuses any that does not), and the keys are still all written, found
// and cleaned up.
func TestStatementsStayWithinBudget(t *testing.T) {
	db := newStore(t)
	ctx := context.Background()
	const budget = 24 << 10
	now := time.Now().UTC().Truncate(time.Microsecond)
	long := make([]dedup.Insert, 3000)
	for i := range long {
		long[i] = dedup.Insert{ID: fmt.Sprintf("%0128d", i), ExpiresAt: now.Add(-time.Second)}
	}
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	small := sqlTx{tx: tx, budget: budget}
	if s, err := dedup.Claim(ctx, small, slices.Clone(long)); err != nil || len(s) != 0 {
		t.Fatalf("claim: %d suspects, %v", len(s), err)
	}
	if err := dedup.Journal(ctx, small, long[0].ExpiresAt, ids(long)); err != nil {
		t.Fatal(err)
	}
	if err := dedup.Unclaim(ctx, small, ids(long[:1500])); err != nil {
		t.Fatal(err)
	}
	replace := slices.Clone(long[1500:])
	for i := range replace {
		replace[i].Replace = true
	}
	if err := dedup.Store(ctx, small, replace, now); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	found := map[string]dedup.Seen{}
	if err := dedup.Lookup(ctx, pool{db: db, budget: budget}, ids(long), found); err != nil {
		t.Fatal(err)
	}
	if len(found) != 1500 {
		t.Fatalf("lookup found %d keys, want 1500", len(found))
	}
	var rows int
	if err := db.Get(&rows, `SELECT COUNT(*) FROM dedup_expiry`); err != nil || rows < 2 {
		t.Fatalf("journal rows = %d (%v): the budget should have split the journal", rows, err)
	}
	n, err := dedup.Cleanup(ctx, db, now, 1000, 1_000_000, budget)
	if err != nil || n != 1500 {
		t.Fatalf("cleanup deleted %d (%v), want 1500", n, err)
	}
}
