package bench

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/ledgerclock"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// The steady-state variant measures the service as it runs once the TTL
// has turned over. With expiry by generations (package dedup) that is:
// claims insert into the current generation's table and lock-read the
// previous generation's, which holds a TTL's worth of keys, and now and
// then the upkeep empties a whole table whose keys have all expired. The
// run's own keys cannot provide that: they would have to expire within the
// run, while a repeat may arrive later than that in processing time (a
// repeat on another partition can be read far from its original during a
// catch-up: the partitions are read at their own pace), and the ledger
// would then rightly count it twice. So the run's keys keep the shipped
// TTL, and the child stores, before the catch-up, as many keys as the run
// will insert in the previous generation's table (dedup_keys_g1: every
// claim's locking read meets a table of that size) and as many again in
// the table of the generation before (dedup_keys), whose keys have all
// expired: the state (dedup_generations) says generation 5 (table 2)
// became current just now and generation 4 (table 1) a lifetime ago, so
// that claims read generation 4 only and the service's upkeep empties
// generation 3's table, dedup_keys, with one TRUNCATE at its first pass,
// within the run (DEDUP_CLEANUP_INTERVAL is short). Generations 0 to 2 are
// over: generation 0 is special (its table may hold keys of the version
// before generations, so claims read it until it is emptied), which is the
// upgrade's first cycle, not the steady state. A generation lasts a TTL,
// so the run pays for more emptying per event than the service in
// production does.

// steadyPrefix starts the stored keys' ids, which have the workload's
// shape (billing-gen's "e-<16 hex digits>-<n>", n counting up: ids that
// are inserted near each other sort near each other), so that the tables
// are as the run's own keys would leave them.
const steadyPrefix = "e-steadysteadyst-"

// steadyKeys is the stock of stored keys of one child.
type steadyKeys struct {
	db *sqlx.DB
	n  int64
}

// storeSteadyKeys stores n keys in the previous generation's table and n
// expired ones in the table of the one before, and sets the generations'
// state to match, for keys of lifetime ttl plus the clock margin.
func storeSteadyKeys(ctx context.Context, dsn string, n int64, ttl time.Duration) (*steadyKeys, error) {
	db, err := mysqldriver.OpenDB(dsn, 30*time.Second, 2)
	if err != nil {
		return nil, err
	}
	s := &steadyKeys{db: db, n: n}
	now := time.Now().UTC()
	for _, t := range []struct {
		table   string
		first   int64
		expires time.Time
	}{{"dedup_keys_g1", n, now.Add(ttl)}, {"dedup_keys", 0, now}} {
		if err := storeKeys(ctx, db, t.table, t.first, n, t.expires); err != nil {
			s.close()
			return nil, err
		}
	}
	lifetime := ttl + ledgerclock.Margin
	_, err = db.ExecContext(ctx, `UPDATE dedup_generations SET current_gen = 5, current_since = UTC_TIMESTAMP(6),
		previous_since = UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND, emptied_gen = 2, lifetime_us = GREATEST(lifetime_us, ?) WHERE singleton = 1`,
		(lifetime + ledgerclock.Margin + time.Second).Microseconds(), lifetime.Microseconds()+1)
	if err != nil {
		s.close()
		return nil, fmt.Errorf("store steady keys: set the generations: %w", err)
	}
	return s, nil
}

// storeKeys stores n keys from number first in table, expiring at expires.
func storeKeys(ctx context.Context, db *sqlx.DB, table string, first, n int64, expires time.Time) error {
	const perStatement = 1024
	for lo := first; lo < first+n; lo += perStatement {
		hi := min(lo+perStatement, first+n)
		args := make([]any, 0, 3*(hi-lo))
		for i := lo; i < hi; i++ {
			id := fmt.Sprintf("%s%d", steadyPrefix, i)
			sum := sha256.Sum256([]byte(id))
			args = append(args, id, sum[:16], expires)
		}
		q := "INSERT INTO " + table + " (event_id, fingerprint, expires_at) VALUES " + strings.TrimSuffix(strings.Repeat("(?,?,?),", int(hi-lo)), ",")
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("store steady keys in %s: %w", table, err)
		}
	}
	return nil
}

func (s *steadyKeys) close() { s.db.Close() }

// deleted is how many of the expired stored keys are gone (all of them once
// the upkeep emptied their table).
func (s *steadyKeys) deleted(ctx context.Context) (int64, error) {
	var left int64
	if err := s.db.GetContext(ctx, &left, "SELECT COUNT(*) FROM dedup_keys WHERE event_id LIKE ?", steadyPrefix+"%"); err != nil {
		return 0, fmt.Errorf("count steady keys: %w", err)
	}
	return s.n - left, nil
}
