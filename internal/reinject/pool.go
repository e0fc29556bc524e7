package reinject

import (
	"context"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Pool is a server's dead letters and dedup keys on its MySQL pool (the
// driver's statements, mysqldriver).
func Pool(db *sqlx.DB) Server { return Server{Letters: mysqldriver.NewLetters(db), Keys: poolKeys{db}} }

// poolKeys looks dedup keys up on a pool (the store's SQL, mysqldriver).
type poolKeys struct{ db *sqlx.DB }

func (p poolKeys) Lookup(ctx context.Context, ids []string) (map[string]dedup.Stored, error) {
	keys, err := mysqldriver.LookupKeys(ctx, p.db, ids)
	if err != nil {
		return nil, err
	}
	seen := make(map[string]dedup.Stored, len(keys))
	for _, k := range keys {
		v, ok := dedup.DecodeVersion(k.Version)
		seen[k.ID] = dedup.Stored{Fingerprint: k.Fingerprint, ExpiresAt: k.ExpiresAt, Version: v, Unknown: !ok}
	}
	return seen, nil
}
