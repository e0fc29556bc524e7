package dedup_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/integration/harness"
	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/migrations"
)

// sqlTx runs the dedup statements in one local transaction, as a branch
// does in its XA transaction.
type sqlTx struct{ tx *sqlx.Tx }

func (x sqlTx) Exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return x.tx.ExecContext(ctx, q, args...)
}

func (x sqlTx) Select(ctx context.Context, dest any, q string, args ...any) error {
	return x.tx.SelectContext(ctx, dest, q, args...)
}

// newStore opens a fresh database with the schema, through txsink.OpenDB
// so that sessions are configured as the service's are.
func newStore(t *testing.T) *sqlx.DB {
	t.Helper()
	dsn := harness.NewDatabase(t)
	db, err := txsink.OpenDB(dsn, 2*time.Second, 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := migrations.Up(context.Background(), db.DB, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	return db
}

func keys(prefix string, n int, expires time.Time) []dedup.Insert {
	out := make([]dedup.Insert, n)
	for i := range out {
		out[i] = dedup.Insert{ID: fmt.Sprintf("%s-%05d", prefix, i), Fingerprint: dedup.Fingerprint{byte(i)}, ExpiresAt: expires}
	}
	return out
}

func claim(t *testing.T, db *sqlx.DB, ins []dedup.Insert) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	suspects, err := dedup.Claim(ctx, sqlTx{tx}, ins)
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
// as it was, fingerprint and expiry included.
func TestClaimFindsEveryStoredKey(t *testing.T) {
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
	if err := dedup.Lookup(ctx, pool{db}, suspects, found); err != nil {
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
type pool struct{ db *sqlx.DB }

func (q pool) Select(ctx context.Context, dest any, query string, args ...any) error {
	return q.db.SelectContext(ctx, dest, query, args...)
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
			if s, err := dedup.Claim(ctx, sqlTx{other}, slices.Clone(k)); err != nil || len(s) != 0 {
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
				s, err := dedup.Claim(ctx, sqlTx{tx}, slices.Clone(k))
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
	if err := dedup.Unclaim(ctx, sqlTx{tx}, []string{"u-00001"}); err != nil {
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
