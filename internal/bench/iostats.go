package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// InnoDB's IO per event: each child that writes to MySQL reads the
// server's InnoDB counters (SHOW GLOBAL STATUS) before and after its
// catch-up, as it samples the CPU (cpu.go). The counters are server-wide:
// they include whatever else the server did meanwhile (the janitor, other
// databases' work), as the CPU figures do.

// innodbIO are InnoDB's cumulative IO counters, or their difference over
// a catch-up.
type innodbIO struct {
	// PoolReads (Innodb_buffer_pool_reads): pages read from disk because
	// the buffer pool did not hold them, one random read each.
	PoolReads int64 `json:"buffer_pool_reads"`
	// ReadRequests (Innodb_buffer_pool_read_requests): logical page reads.
	ReadRequests int64 `json:"buffer_pool_read_requests"`
	// ReadAhead (Innodb_buffer_pool_read_ahead): pages read ahead in the
	// background, not counted in PoolReads.
	ReadAhead int64 `json:"buffer_pool_read_ahead"`
	// DataReads and DataWrites (Innodb_data_reads, Innodb_data_writes):
	// read and write requests to the data files, the IOPS a disk serves
	// (a write of a batch of pages through the doublewrite buffer counts
	// once per request).
	DataReads  int64 `json:"data_reads"`
	DataWrites int64 `json:"data_writes"`
	// PagesWritten (Innodb_pages_written): pages written to the data files.
	PagesWritten int64 `json:"pages_written"`
	// LogWrites (Innodb_log_writes): writes to the redo log.
	LogWrites int64 `json:"log_writes"`
}

// innodbStatusNames are the status variables of innodbIO's fields.
var innodbStatusNames = map[string]func(*innodbIO) *int64{
	"Innodb_buffer_pool_reads":         func(c *innodbIO) *int64 { return &c.PoolReads },
	"Innodb_buffer_pool_read_requests": func(c *innodbIO) *int64 { return &c.ReadRequests },
	"Innodb_buffer_pool_read_ahead":    func(c *innodbIO) *int64 { return &c.ReadAhead },
	"Innodb_data_reads":                func(c *innodbIO) *int64 { return &c.DataReads },
	"Innodb_data_writes":               func(c *innodbIO) *int64 { return &c.DataWrites },
	"Innodb_pages_written":             func(c *innodbIO) *int64 { return &c.PagesWritten },
	"Innodb_log_writes":                func(c *innodbIO) *int64 { return &c.LogWrites },
}

// parseInnoDBStatus takes innodbIO from SHOW GLOBAL STATUS rows; every
// counter must be there.
func parseInnoDBStatus(rows map[string]string) (innodbIO, error) {
	var c innodbIO
	for name, field := range innodbStatusNames {
		v, ok := rows[name]
		if !ok {
			return c, fmt.Errorf("status variable %s missing", name)
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return c, fmt.Errorf("status variable %s: %w", name, err)
		}
		*field(&c) = n
	}
	return c, nil
}

// sub is c − before.
func (c innodbIO) sub(before innodbIO) innodbIO {
	return innodbIO{PoolReads: c.PoolReads - before.PoolReads, ReadRequests: c.ReadRequests - before.ReadRequests,
		ReadAhead: c.ReadAhead - before.ReadAhead, DataReads: c.DataReads - before.DataReads,
		DataWrites: c.DataWrites - before.DataWrites, PagesWritten: c.PagesWritten - before.PagesWritten,
		LogWrites: c.LogWrites - before.LogWrites}
}

// perEvent is x per event of a catch-up of events (0 without events).
func perEvent(x, events int64) float64 {
	if events <= 0 {
		return 0
	}
	return float64(x) / float64(events)
}

// ioLine reports a catch-up's InnoDB IO per event.
func ioLine(io innodbIO, events int64) string {
	return fmt.Sprintf("%.3f pool reads (disk), %.1f read requests, %.3f data reads, %.3f data writes, %.3f pages written per event (%d events)",
		perEvent(io.PoolReads, events), perEvent(io.ReadRequests, events), perEvent(io.DataReads, events),
		perEvent(io.DataWrites, events), perEvent(io.PagesWritten, events), events)
}

// readInnoDBIO reads the counters.
func readInnoDBIO(ctx context.Context, db *sql.DB) (innodbIO, error) {
	rows, err := db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('"+strings.Join(statusNameList(), "','")+"')")
	if err != nil {
		return innodbIO{}, err
	}
	defer rows.Close()
	got := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return innodbIO{}, err
		}
		got[k] = v
	}
	if err := rows.Err(); err != nil {
		return innodbIO{}, err
	}
	return parseInnoDBStatus(got)
}

func statusNameList() []string {
	out := make([]string, 0, len(innodbStatusNames))
	for k := range innodbStatusNames {
		out = append(out, k)
	}
	return out
}

// ioMeter measures the counters' difference over a phase. A meter that
// cannot read them (no DSN, a server without them) measures nothing and
// says so in the child's log.
type ioMeter struct {
	db    *sql.DB
	start innodbIO
}

// newIOMeter starts measuring on the server of dsn (a child's DSN: its
// countingNet is dialed as plain TCP, so that the meter's statements are
// not counted as the measured round trips).
func newIOMeter(dsn string) *ioMeter {
	if dsn == "" {
		return nil
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		childLogger().Warn("InnoDB counters", "err", err)
		return nil
	}
	if cfg.Net == countingNet {
		cfg.Net = "tcp"
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		childLogger().Warn("InnoDB counters", "err", err)
		return nil
	}
	db.SetMaxOpenConns(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start, err := readInnoDBIO(ctx, db)
	if err != nil {
		childLogger().Warn("InnoDB counters", "err", err)
		db.Close()
		return nil
	}
	return &ioMeter{db: db, start: start}
}

// done returns the difference since the start (nil if unmeasured) and
// ends the meter.
func (m *ioMeter) done() *innodbIO {
	if m == nil {
		return nil
	}
	defer m.db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	end, err := readInnoDBIO(ctx, m.db)
	if err != nil {
		childLogger().Warn("InnoDB counters", "err", err)
		return nil
	}
	d := end.sub(m.start)
	return &d
}
