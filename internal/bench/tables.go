package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// The steady-state-entries variant shows that the cleanup keeps the tables
// it cleans bounded in steady state: the dedup key tables (the upkeep
// empties them whole, as in steady-state, steady.go) and ledger_entries (the retention,
// with a LEDGER_ENTRIES_RETENTION shorter than the catch-up, so that the
// run's own entries fall due while it runs). The child counts both
// tables' rows while the catch-up runs: bounded means that the largest
// count stays near what the settings imply (the stored keys; the entries of
// one retention period at the catch-up's rate), however many events the
// catch-up inserts. Counting is COUNT(*), every tableSampleEvery: exact,
// and it costs the server a little, which the variant's rate includes.

// tableSampleEvery is how often the tables' rows are counted.
const tableSampleEvery = time.Second

// rowStats are a table's row counts during a catch-up.
type rowStats struct {
	Start   int64 `json:"start"`
	Max     int64 `json:"max"`
	End     int64 `json:"end"`
	Samples int   `json:"samples"`
}

// sampleTables counts the rows of tables every tableSampleEvery until stop
// is called, which counts them once more and returns the statistics.
func sampleTables(dsn string, tables []string) (stop func() map[string]rowStats, err error) {
	db, err := mysqldriver.OpenDB(dsn, 30*time.Second, 1)
	if err != nil {
		return nil, err
	}
	var (
		mu    sync.Mutex
		stats = map[string]rowStats{}
	)
	sample := func(ctx context.Context) {
		for _, t := range tables {
			n, err := countRows(ctx, db, t)
			if err != nil {
				if ctx.Err() == nil {
					childLogger().Warn("counting rows", "table", t, "err", err)
				}
				continue
			}
			mu.Lock()
			s := stats[t]
			if s.Samples == 0 {
				s.Start = n
			}
			s.Max, s.End = max(s.Max, n), n
			s.Samples++
			stats[t] = s
			mu.Unlock()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	sample(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(tableSampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				sample(ctx)
			}
		}
	})
	return func() map[string]rowStats {
		cancel()
		wg.Wait()
		sample(context.Background())
		db.Close()
		mu.Lock()
		defer mu.Unlock()
		return stats
	}, nil
}

func countRows(ctx context.Context, db *sqlx.DB, table string) (int64, error) {
	var n int64
	err := db.GetContext(ctx, &n, "SELECT COUNT(*) FROM "+table) // a name from sampledTables, not input
	return n, err
}

// sampledTables are the tables the steady-state-entries variant counts.
var sampledTables = []string{"dedup_keys", "dedup_keys_g1", "dedup_keys_g2", "ledger_entries"}

// tablesLine reports the tables' row counts of a catch-up.
func tablesLine(r childResult) string {
	return fmt.Sprintf("%s; %d events inserted", rowsLine(r.Tables), r.SteadyInserted)
}

// liveTablesLine reports the tables' row counts of the live phase.
func liveTablesLine(r childResult) string {
	return fmt.Sprintf("%s; %d records produced", rowsLine(r.LiveTables), r.LiveRecords)
}

func rowsLine(tables map[string]rowStats) string {
	var parts []string
	for _, t := range slices.Sorted(maps.Keys(tables)) {
		s := tables[t]
		parts = append(parts, fmt.Sprintf("%s %d rows at the start, at most %d, %d at the end (%d counts)", t, s.Start, s.Max, s.End, s.Samples))
	}
	return strings.Join(parts, "; ")
}
