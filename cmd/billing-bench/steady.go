package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// The steady-state variant measures the service as it runs once the TTL
// has turned over: every key inserted is deleted later, and keys are
// deleted at the rate new ones are inserted. The run's own keys cannot
// provide that: they would have to expire within the run, while a repeat
// may arrive later than that in processing time (a repeat on another
// partition can be read far from its original during a catch-up: the
// partitions are read at their own pace), and the ledger would then rightly
// count it twice. So the run's keys keep the shipped TTL, and the child
// stores, before the catch-up, as many keys as the run will insert, which
// it then makes expire as the catch-up goes: after every checkpoint, as
// many stored keys as the checkpoint inserted become due, and the
// service's own janitor deletes them (DEDUP_CLEANUP_INTERVAL is short, so
// that the deletes follow the inserts closely rather than in bursts).
//
// A key expires when its journal row is due (driver.Store.CleanupKeys): the stored
// keys' rows are written already expired, their journal rows due in a
// year, and a key is made to expire by making its journal row due.

// steadyPrefix starts the stored keys' ids, which have the workload's
// shape (billing-gen's "e-<16 hex digits>-<n>", n counting up: ids that
// are inserted near each other sort near each other) so that deleting
// them costs what deleting the run's own keys a TTL later would.
const steadyPrefix = "e-steadysteadyst-"

// steadyPerRow is the ids per journal row, as the store journals them (mysqldriver.JournalIDs):
// keys expire in steps of this many.
const steadyPerRow = 8192

// steadyKeys is the stock of stored keys of one child.
type steadyKeys struct {
	db       *sqlx.DB
	n        int64
	rows     []int64 // journal rows' seq, in key order
	released int     // rows made due so far
}

// storeSteadyKeys stores n keys with their journal rows, none due.
func storeSteadyKeys(ctx context.Context, dsn string, n int64) (*steadyKeys, error) {
	db, err := mysqldriver.OpenDB(dsn, 30*time.Second, 2)
	if err != nil {
		return nil, err
	}
	s := &steadyKeys{db: db, n: n}
	const perStatement = 1024
	now := time.Now().UTC()
	for lo := int64(0); lo < n; lo += steadyPerRow {
		hi := min(lo+steadyPerRow, n)
		var blob []byte
		for st := lo; st < hi; st += perStatement {
			e := min(st+perStatement, hi)
			args := make([]any, 0, 3*(e-st))
			for i := st; i < e; i++ {
				id := fmt.Sprintf("%s%d", steadyPrefix, i)
				sum := sha256.Sum256([]byte(id))
				args = append(args, id, sum[:16], now)
				blob = append(append(blob, byte(len(id))), id...)
			}
			q := "INSERT INTO dedup_keys (event_id, fingerprint, expires_at) VALUES " + strings.TrimSuffix(strings.Repeat("(?,?,?),", int(e-st)), ",")
			if _, err := db.ExecContext(ctx, q, args...); err != nil {
				s.close()
				return nil, fmt.Errorf("store steady keys: %w", err)
			}
		}
		r, err := db.ExecContext(ctx, "INSERT INTO dedup_expiry (expires_at, event_ids) VALUES (?, ?)", now.AddDate(1, 0, 0), blob)
		if err == nil {
			var seq int64
			if seq, err = r.LastInsertId(); err == nil {
				s.rows = append(s.rows, seq)
			}
		}
		if err != nil {
			s.close()
			return nil, fmt.Errorf("store steady keys: %w", err)
		}
	}
	return s, nil
}

func (s *steadyKeys) close() { s.db.Close() }

// release makes due the journal rows of the first inserted stored keys
// (whole rows only).
func (s *steadyKeys) release(ctx context.Context, inserted int64) error {
	due := min(int(inserted/steadyPerRow), len(s.rows))
	if due <= s.released {
		return nil
	}
	_, err := s.db.ExecContext(ctx, "UPDATE dedup_expiry SET expires_at = ? WHERE seq BETWEEN ? AND ?",
		time.Now().UTC(), s.rows[s.released], s.rows[due-1])
	if err != nil {
		return fmt.Errorf("release steady keys: %w", err)
	}
	s.released = due
	return nil
}

// pace releases, every 50 ms until stop is called, as many stored keys as
// the checkpoints collected by col have inserted.
func (s *steadyKeys) pace(col *collector) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				col.mu.Lock()
				inserted := col.inserted
				col.mu.Unlock()
				if err := s.release(ctx, inserted); err != nil && ctx.Err() == nil {
					childLogger().Warn("steady-state pacing", "err", err)
				}
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// deleted is how many stored keys are gone.
func (s *steadyKeys) deleted(ctx context.Context) (int64, error) {
	var left int64
	if err := s.db.GetContext(ctx, &left, "SELECT COUNT(*) FROM dedup_keys WHERE event_id LIKE ?", steadyPrefix+"%"); err != nil {
		return 0, fmt.Errorf("count steady keys: %w", err)
	}
	return s.n - left, nil
}
