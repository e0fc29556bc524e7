package memdriver

import (
	"context"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The server's own counters the metrics sample (mysqldriver's
// PurgeHistory and DedupRows).

// PurgeHistory is 0: the in-memory server keeps no undo history.
func (s *Server) PurgeHistory(ctx context.Context) (int64, error) { return 0, nil }

// DedupRows counts the committed rows of every generation's key table
// (the estimate MariaDB keeps live).
func (s *Server) DedupRows(ctx context.Context) (int64, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int
	for g := range driver.KeyTables {
		n += len(c.rows[tKeys+table(g)])
	}
	return int64(n), nil
}
