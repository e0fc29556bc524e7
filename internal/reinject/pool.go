package reinject

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/deadletters"
	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Pool is a server's dead letters and dedup keys on its MySQL pool.
func Pool(db *sqlx.DB) Server { return Server{Letters: poolLetters{db}, Keys: poolKeys{db}} }

// poolLetters is dead_letters on a pool (package deadletters' SQL).
type poolLetters struct{ db *sqlx.DB }

func (p poolLetters) Get(ctx context.Context, id int64) (*deadletters.Row, error) {
	return deadletters.Get(ctx, p.db, id)
}

func (p poolLetters) Mark(ctx context.Context, r *deadletters.Row, a deadletters.Audit) (bool, error) {
	return deadletters.Mark(ctx, p.db, r, a)
}

func (p poolLetters) Restore(ctx context.Context, r *deadletters.Row, at time.Time) error {
	return deadletters.Restore(ctx, p.db, r, at)
}

func (p poolLetters) Landed(ctx context.Context, id int64, at time.Time, partition int32, offset int64) error {
	return deadletters.Landed(ctx, p.db, id, at, partition, offset)
}

// poolKeys looks dedup keys up on a pool (the store's SQL, mysqldriver).
type poolKeys struct{ db *sqlx.DB }

func (p poolKeys) Lookup(ctx context.Context, ids []string) (map[string]dedup.Seen, error) {
	keys, err := mysqldriver.LookupKeys(ctx, p.db, ids)
	if err != nil {
		return nil, err
	}
	seen := make(map[string]dedup.Seen, len(keys))
	for _, k := range keys {
		seen[k.ID] = dedup.Seen{Fingerprint: k.Fingerprint, ExpiresAt: k.ExpiresAt}
	}
	return seen, nil
}
