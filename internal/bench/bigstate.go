package bench

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"time"
)

// The larger-than-memory variant: the dedup table is many times
// the server's InnoDB buffer pool, as in production, where a day of keys is
// terabytes. The bench shrinks the pool for the variant's measurements
// (SET GLOBAL innodb_buffer_pool_size, online in MariaDB 10.11 and MySQL
// 8.4) rather than storing terabytes, and restores it after the variant,
// whatever happens (runVariant defers it; a signal cancels the run and the
// deferred restore still runs). The keys stored beforehand and the run's
// own ids are random-looking UUIDs of one shape (billing-gen -random-ids,
// preloadDedupKeys with uuid ids, the live producer's), so that every new
// key lands on a random leaf page among the stored ones; ids that sort in
// production order would all land on the index's right edge and never
// read the rest. The preload runs with a pool large enough to hold the
// table (the keys are stored in random order, as a day of UUIDs arrives,
// which leaves pages as full as production's), and the pool is shrunk right
// before the child starts.

// minStateRatio is how many times the buffer pool the dedup table must be
// for the variant to show state larger than memory.
const minStateRatio = 10

// poolSetting is the buffer pool of a variant's measurements and of its
// preload.
type poolSetting struct {
	measure int64 // bytes: the variant's measurements run with this pool
	preload int64 // bytes: the preload runs with this pool (at least the server's own)
	// oldPct is the variant's innodb_old_blocks_pct (0: the server's):
	// the share of the pool where a page read once waits to be used
	// again. The read-ahead's pages must stay there until their claim at
	// the barrier; at MySQL's 37% a 128 MiB pool's old sublist holds
	// about 3,000 pages, one interval of the variant's live ids, and the
	// claims read again what was evicted before the barrier
	// (docs/performance.md, "Read-ahead"). A production pool holds many
	// intervals of new leaves at 37%.
	oldPct int
}

// stateSize is the measured size of a database's dedup key tables.
type stateSize struct {
	Rows int64 `json:"rows"`
	// DataIndex is data_length + index_length of information_schema.TABLES
	// after ANALYZE TABLE: the pages of the B-trees, what the pool would
	// have to hold.
	DataIndex int64 `json:"data_index_bytes"`
	// File is the tablespace files' allocated size
	// (INNODB_SYS_TABLESPACES.ALLOCATED_SIZE): the bytes on disk.
	File int64 `json:"file_bytes"`
}

// stateInfo is a measurement's dedup state: the pool it ran with, and the
// tables' size right before the child started and after it ended (the
// catch-up's and the live phase's keys added).
type stateInfo struct {
	Pool   int64     `json:"buffer_pool_bytes"`
	Before stateSize `json:"before"`
	After  stateSize `json:"after"`
}

// ratio is the table's size over the pool (data and index pages).
func (s stateSize) ratio(pool int64) float64 {
	if pool <= 0 {
		return 0
	}
	return float64(s.DataIndex) / float64(pool)
}

// bytesPerKey is the bytes on disk per stored key.
func (s stateSize) bytesPerKey() float64 {
	if s.Rows <= 0 {
		return 0
	}
	return float64(s.File) / float64(s.Rows)
}

// stateLine reports a measurement's dedup state; vsDefault is the
// service's rate over the default variant's in the same run (0: none).
func stateLine(st stateInfo, vsDefault float64) string {
	mib := func(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
	s := fmt.Sprintf("dedup tables %s (data+index; %s on disk, %d keys) = %.1f × the %s buffer pool before the child, %s (%s on disk, %d keys, %.0f bytes on disk per key) = %.1f × after",
		mib(st.Before.DataIndex), mib(st.Before.File), st.Before.Rows, st.Before.ratio(st.Pool), mib(st.Pool),
		mib(st.After.DataIndex), mib(st.After.File), st.After.Rows, st.After.bytesPerKey(), st.After.ratio(st.Pool))
	if st.Before.ratio(st.Pool) < minStateRatio {
		s += fmt.Sprintf(" (BELOW the %d × the variant needs: raise -ltm-keys)", minStateRatio)
	}
	if vsDefault > 0 {
		s += fmt.Sprintf("; service ÷ default's service %.2f", vsDefault)
	}
	return s
}

// bufferPoolSize reads the server's innodb_buffer_pool_size.
func bufferPoolSize(ctx context.Context, db *sql.DB) (int64, error) {
	var n int64
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.innodb_buffer_pool_size").Scan(&n); err != nil {
		return 0, fmt.Errorf("innodb_buffer_pool_size: %w", err)
	}
	return n, nil
}

// setBufferPool resizes the server's buffer pool to size and waits, at
// most two minutes, until the resize is done; it returns the size the
// server settled on (it rounds to its granularity).
func setBufferPool(ctx context.Context, admin string, size int64) (int64, error) {
	db, err := adminDB(admin)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	if cur, err := bufferPoolSize(ctx, db); err == nil && cur == size {
		return cur, nil
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf("SET GLOBAL innodb_buffer_pool_size = %d", size)); err != nil {
		return 0, fmt.Errorf("set innodb_buffer_pool_size: %w", err)
	}
	// MariaDB 10.11 resizes within the statement; MySQL 8.4 in the
	// background, reporting its progress in Innodb_buffer_pool_resize_status.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var name, status string
		if err := db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_resize_status'").Scan(&name, &status); err != nil && err != sql.ErrNoRows {
			return 0, fmt.Errorf("buffer pool resize status: %w", err)
		}
		cur, err := bufferPoolSize(ctx, db)
		if err != nil {
			return 0, err
		}
		if resizeDone(status) && cur != 0 {
			return cur, nil
		}
		if time.Now().After(deadline) {
			return cur, fmt.Errorf("buffer pool resize to %d not done after 2 minutes: %q", size, status)
		}
		select {
		case <-ctx.Done():
			return cur, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// resizeDone says whether Innodb_buffer_pool_resize_status shows no resize
// under way: empty (MariaDB), or MySQL's "Completed ..." message.
func resizeDone(status string) bool {
	s := strings.ToLower(strings.TrimSpace(status))
	return s == "" || strings.HasPrefix(s, "completed") || strings.Contains(s, "finished")
}

// shrinkPool sets the variant's pool and returns the function that puts
// the server's own size back; it runs on a context of its own, so that a
// cancelled run still restores the pool.
func shrinkPool(ctx context.Context, admin string, size int64, oldPct int) (orig int64, restore func(), err error) {
	db, err := adminDB(admin)
	if err != nil {
		return 0, nil, err
	}
	defer db.Close()
	orig, err = bufferPoolSize(ctx, db)
	if err != nil {
		return 0, nil, err
	}
	var origPct int
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.innodb_old_blocks_pct").Scan(&origPct); err != nil {
		return 0, nil, fmt.Errorf("innodb_old_blocks_pct: %w", err)
	}
	restore = func() {
		rctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if oldPct > 0 {
			if err := setOldBlocksPct(rctx, admin, origPct); err != nil {
				fmt.Fprintf(os.Stderr, "billing-bench: RESTORE BY HAND: SET GLOBAL innodb_old_blocks_pct = %d (%v)\n", origPct, err)
			}
		}
		if got, err := setBufferPool(rctx, admin, orig); err != nil || got != orig {
			fmt.Fprintf(os.Stderr, "billing-bench: RESTORE THE BUFFER POOL BY HAND: SET GLOBAL innodb_buffer_pool_size = %d (now %d: %v)\n", orig, got, err)
			return
		}
		fmt.Printf("   (innodb_buffer_pool_size restored to %d MiB)\n", orig>>20)
	}
	if _, err := setBufferPool(ctx, admin, size); err != nil {
		restore()
		return 0, nil, err
	}
	if oldPct > 0 {
		if err := setOldBlocksPct(ctx, admin, oldPct); err != nil {
			restore()
			return 0, nil, err
		}
	}
	return orig, restore, nil
}

// setOldBlocksPct sets the server's innodb_old_blocks_pct (dynamic in
// MariaDB 10.11 and MySQL 8.4).
func setOldBlocksPct(ctx context.Context, admin string, pct int) error {
	db, err := adminDB(admin)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, fmt.Sprintf("SET GLOBAL innodb_old_blocks_pct = %d", pct)); err != nil {
		return fmt.Errorf("set innodb_old_blocks_pct: %w", err)
	}
	return nil
}

// measureState measures the dedup key tables of database name: every
// table named dedup_keys or dedup_keys_*, so that tables of generations
// count too.
func measureState(ctx context.Context, admin, name string) (stateSize, error) {
	db, err := adminDB(admin)
	if err != nil {
		return stateSize{}, err
	}
	defer db.Close()
	var s stateSize
	rows, err := db.QueryContext(ctx, `SELECT table_name FROM information_schema.TABLES WHERE table_schema = ? AND (table_name = 'dedup_keys' OR table_name LIKE 'dedup\_keys\_%')`, name)
	if err != nil {
		return s, fmt.Errorf("dedup tables: %w", err)
	}
	var tables []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return s, err
		}
		tables = append(tables, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return s, err
	}
	for _, t := range tables {
		q := "`" + name + "`.`" + t + "`" // names from information_schema and the bench's own database
		if _, err := db.ExecContext(ctx, "ANALYZE TABLE "+q); err != nil {
			return s, fmt.Errorf("analyze %s: %w", t, err)
		}
		var n, dataIndex int64
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+q).Scan(&n); err != nil {
			return s, fmt.Errorf("count %s: %w", t, err)
		}
		if err := db.QueryRowContext(ctx, `SELECT data_length + index_length FROM information_schema.TABLES WHERE table_schema = ? AND table_name = ?`, name, t).Scan(&dataIndex); err != nil {
			return s, fmt.Errorf("size of %s: %w", t, err)
		}
		s.Rows += n
		s.DataIndex += dataIndex
		var file int64
		// MariaDB's INNODB_SYS_TABLESPACES; MySQL 8.4 calls it INNODB_TABLESPACES.
		err := db.QueryRowContext(ctx, `SELECT allocated_size FROM information_schema.INNODB_SYS_TABLESPACES WHERE name = ?`, name+"/"+t).Scan(&file)
		if err != nil {
			err = db.QueryRowContext(ctx, `SELECT allocated_size FROM information_schema.INNODB_TABLESPACES WHERE name = ?`, name+"/"+t).Scan(&file)
		}
		if err != nil {
			return s, fmt.Errorf("file size of %s: %w", t, err)
		}
		s.File += file
	}
	return s, nil
}
