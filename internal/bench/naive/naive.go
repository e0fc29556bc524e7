package naive

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/failpoint"
)

// FailAfterResults is the failpoint between the results commit (step 3)
// and the offset write (step 4): the window where a crash double counts.
const FailAfterResults = "naive-after-results"

// rowsPerStatement bounds the rows of one multi-row INSERT, as in the
// service.
const rowsPerStatement = 1000

// Schema is the job's own offset table; the result tables are the
// service's (migrations/).
const Schema = `CREATE TABLE IF NOT EXISTS naive_offsets (
    consumer        VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kafka_topic     VARCHAR(249) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    kafka_partition INT NOT NULL,
    next_offset     BIGINT NOT NULL,
    updated_at      DATETIME(6) NOT NULL,
    PRIMARY KEY (consumer, kafka_topic, kafka_partition)
) ENGINE = InnoDB`

// Migrate creates naive_offsets if it does not exist.
func Migrate(ctx context.Context, db *sqlx.DB) error {
	_, err := db.ExecContext(ctx, Schema)
	return err
}

// OpenDB opens a pool with the session settings the service's pools use
// (client-side interpolation, so one round trip per statement; UTC times).
func OpenDB(dsn string) (*sqlx.DB, error) {
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("naive: parse DSN: %w", err)
	}
	mc.InterpolateParams = true
	mc.ParseTime = true
	mc.Loc = time.UTC
	if mc.Params == nil {
		mc.Params = map[string]string{}
	}
	mc.Params["time_zone"] = "'+00:00'"
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, fmt.Errorf("naive: %w", err)
	}
	db := sqlx.NewDb(sql.OpenDB(conn), "mysql")
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	return db, nil
}

// Config configures a Job.
type Config struct {
	Topic string
	// Consumer names this job's rows in naive_offsets (what a group id
	// would be).
	Consumer string
	// KafkaOpts are connection options (at least kgo.SeedBrokers).
	KafkaOpts []kgo.Opt
	// BatchRecords is the fixed batch size.
	BatchRecords int
	// BatchWait bounds how long a batch waits to fill after its first
	// record.
	BatchWait       time.Duration
	BillingWindow   time.Duration
	MaxPayloadBytes int
	Failpoints      *failpoint.Set
	Logger          *slog.Logger
	// OnBatch, if set, is called after every batch whose results
	// committed.
	OnBatch func(BatchInfo)
}

// BatchInfo describes one batch, for benchmarks.
type BatchInfo struct {
	Records    int // records read
	Counted    int // events added to the results
	Duplicates int // repeats dropped inside the batch
	Invalid    int // undecodable records skipped
	// Started is when the batch was complete and writing began; Filled is
	// how long it took to fill.
	Started time.Time
	Filled  time.Duration
	// Duration covers the results transaction and the offset write.
	Duration time.Duration
	Phases   map[string]time.Duration // results, offsets
	// Visible is when the results committed (visible to readers).
	Visible     time.Time
	RecordTimes []time.Time // Kafka timestamps, for end-to-end latency
}

// Job is one running copy of the naive consumer.
type Job struct {
	cfg  Config
	log  *slog.Logger
	db   *sqlx.DB
	cl   *kgo.Client
	dec  *event.Decoder
	next map[int32]int64 // next offset per partition, as far as this job knows
}

// New reads the recorded offsets of every partition of the topic and
// creates a consumer assigned to all of them at those offsets (partitions
// never recorded start at the beginning of the log).
func New(ctx context.Context, cfg Config, db *sqlx.DB) (*Job, error) {
	if cfg.Topic == "" || cfg.Consumer == "" || cfg.BatchRecords < 1 || cfg.BatchWait <= 0 || cfg.BillingWindow <= 0 || cfg.MaxPayloadBytes < 1 {
		return nil, errors.New("naive: Topic, Consumer, BatchRecords, BatchWait, BillingWindow and MaxPayloadBytes are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	meta, err := kgo.NewClient(cfg.KafkaOpts...)
	if err != nil {
		return nil, fmt.Errorf("naive: kafka client: %w", err)
	}
	topics, err := kadm.NewClient(meta).ListTopics(ctx, cfg.Topic)
	meta.Close()
	if err != nil {
		return nil, fmt.Errorf("naive: list topic: %w", err)
	}
	td, ok := topics[cfg.Topic]
	if !ok || td.Err != nil {
		return nil, fmt.Errorf("naive: topic %q: %v", cfg.Topic, td.Err)
	}
	var stored []struct {
		Partition int32 `db:"kafka_partition"`
		Next      int64 `db:"next_offset"`
	}
	if err := db.SelectContext(ctx, &stored, `SELECT kafka_partition, next_offset FROM naive_offsets WHERE consumer = ? AND kafka_topic = ?`,
		cfg.Consumer, cfg.Topic); err != nil {
		return nil, fmt.Errorf("naive: read offsets: %w", err)
	}
	j := &Job{cfg: cfg, log: cfg.Logger, db: db, dec: event.NewDecoder(cfg.MaxPayloadBytes), next: map[int32]int64{}}
	for _, s := range stored {
		j.next[s.Partition] = s.Next
	}
	assign := map[int32]kgo.Offset{}
	for _, p := range td.Partitions.Numbers() {
		if o, ok := j.next[p]; ok {
			assign[p] = kgo.NewOffset().At(o)
		} else {
			assign[p] = kgo.NewOffset().AtStart()
		}
	}
	opts := append(slices.Clip(cfg.KafkaOpts),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{cfg.Topic: assign}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	if j.cl, err = kgo.NewClient(opts...); err != nil {
		return nil, fmt.Errorf("naive: kafka client: %w", err)
	}
	return j, nil
}

// Close closes the Kafka client (not the database).
func (j *Job) Close() { j.cl.Close() }

// Run processes batches until ctx ends (it then returns nil; a batch not
// yet written is read again by the next run) or a batch fails (it returns
// the error: restart the job, which resumes from the recorded offsets).
func (j *Job) Run(ctx context.Context) error {
	for {
		recs, filled, err := j.fill(ctx)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		if len(recs) == 0 {
			continue
		}
		if err := j.process(ctx, recs, filled); err != nil {
			return err
		}
	}
}

// fill reads one batch: it waits for a first record, then for at most
// BatchWait more, until BatchRecords records are in.
func (j *Job) fill(ctx context.Context) ([]*kgo.Record, time.Duration, error) {
	var recs []*kgo.Record
	var first time.Time
	for len(recs) < j.cfg.BatchRecords {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if len(recs) > 0 {
			left := time.Until(first.Add(j.cfg.BatchWait))
			if left <= 0 {
				break
			}
			pctx, cancel = context.WithTimeout(ctx, left)
		}
		fetches := j.cl.PollRecords(pctx, j.cfg.BatchRecords-len(recs))
		cancel()
		if ctx.Err() != nil {
			return nil, 0, nil
		}
		var ferr error
		fetches.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				ferr = errors.Join(ferr, fmt.Errorf("fetch %s/%d: %w", topic, p, err))
			}
		})
		if ferr != nil {
			return nil, 0, ferr
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if len(recs) == 0 {
				first = time.Now()
			}
			recs = append(recs, r)
		})
	}
	return recs, time.Since(first), nil
}

type balanceKey struct{ account, currency string }

type windowKey struct {
	account, currency string
	start             time.Time
}

type sums struct{ amount, count int64 }

// process dedups the batch in memory, writes its sums in one transaction,
// then records the offsets.
func (j *Job) process(ctx context.Context, recs []*kgo.Record, filled time.Duration) error {
	start := time.Now()
	info := BatchInfo{Records: len(recs), Started: start, Filled: filled, Phases: map[string]time.Duration{}}
	seen := make(map[string]struct{}, len(recs))
	balances := map[balanceKey]*sums{}
	windows := map[windowKey]*sums{}
	next := map[int32]int64{}
	for _, r := range recs {
		next[r.Partition] = r.Offset + 1
		ev, err := j.dec.Decode(r.Value)
		if err != nil {
			info.Invalid++
			continue
		}
		if _, dup := seen[ev.EventID]; dup {
			info.Duplicates++
			continue
		}
		seen[ev.EventID] = struct{}{}
		info.Counted++
		bk := balanceKey{ev.AccountID, ev.Currency}
		b := balances[bk]
		if b == nil {
			b = &sums{}
			balances[bk] = b
		}
		b.amount += ev.AmountMinor
		b.count++
		wk := windowKey{ev.AccountID, ev.Currency, event.Window(ev.OccurredAt, j.cfg.BillingWindow)}
		w := windows[wk]
		if w == nil {
			w = &sums{}
			windows[wk] = w
		}
		w.amount += ev.AmountMinor
		w.count++
	}

	// Step 3: the results, in one local transaction.
	now := time.Now().UTC()
	tx, err := j.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("naive: begin: %w", err)
	}
	if err := writeResults(ctx, tx, balances, windows, now); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("naive: commit results: %w", err)
	}
	info.Visible = time.Now()
	info.Phases["results"] = info.Visible.Sub(start)

	if err := j.cfg.Failpoints.Inject(FailAfterResults); err != nil {
		return err
	}

	// Step 4: the offsets, afterwards.
	if err := j.writeOffsets(ctx, next, now); err != nil {
		return err
	}
	maps.Copy(j.next, next)
	info.Duration = time.Since(start)
	info.Phases["offsets"] = info.Duration - info.Phases["results"]
	if j.cfg.OnBatch != nil {
		info.RecordTimes = make([]time.Time, len(recs))
		for i, r := range recs {
			info.RecordTimes[i] = r.Timestamp
		}
		j.cfg.OnBatch(info)
	}
	return nil
}

// writeResults upserts the sums, rows in key order (one lock order for
// every writer), rowsPerStatement rows per statement.
func writeResults(ctx context.Context, tx *sqlx.Tx, balances map[balanceKey]*sums, windows map[windowKey]*sums, now time.Time) error {
	bkeys := make([]balanceKey, 0, len(balances))
	for k := range balances {
		bkeys = append(bkeys, k)
	}
	slices.SortFunc(bkeys, func(x, y balanceKey) int {
		return cmp.Or(strings.Compare(x.account, y.account), strings.Compare(x.currency, y.currency))
	})
	err := batches(ctx, tx, len(bkeys),
		`INSERT INTO account_balances (account_id, currency, balance_minor, event_count, updated_at) VALUES `, "(?,?,?,?,?)",
		` ON DUPLICATE KEY UPDATE balance_minor = balance_minor + VALUES(balance_minor), event_count = event_count + VALUES(event_count), updated_at = VALUES(updated_at)`,
		func(i int) []any {
			k := bkeys[i]
			s := balances[k]
			return []any{k.account, k.currency, s.amount, s.count, now}
		})
	if err != nil {
		return fmt.Errorf("naive: write balances: %w", err)
	}
	wkeys := make([]windowKey, 0, len(windows))
	for k := range windows {
		wkeys = append(wkeys, k)
	}
	slices.SortFunc(wkeys, func(x, y windowKey) int {
		return cmp.Or(strings.Compare(x.account, y.account), strings.Compare(x.currency, y.currency), x.start.Compare(y.start))
	})
	err = batches(ctx, tx, len(wkeys),
		`INSERT INTO billing_windows (account_id, currency, window_start, amount_minor, event_count, updated_at) VALUES `, "(?,?,?,?,?,?)",
		` ON DUPLICATE KEY UPDATE amount_minor = amount_minor + VALUES(amount_minor), event_count = event_count + VALUES(event_count), updated_at = VALUES(updated_at)`,
		func(i int) []any {
			k := wkeys[i]
			s := windows[k]
			return []any{k.account, k.currency, k.start, s.amount, s.count, now}
		})
	if err != nil {
		return fmt.Errorf("naive: write windows: %w", err)
	}
	return nil
}

// writeOffsets records where the next run starts, in its own (autocommit)
// statement.
func (j *Job) writeOffsets(ctx context.Context, next map[int32]int64, now time.Time) error {
	parts := slices.Sorted(maps.Keys(next))
	err := batches(ctx, j.db, len(parts),
		`INSERT INTO naive_offsets (consumer, kafka_topic, kafka_partition, next_offset, updated_at) VALUES `, "(?,?,?,?,?)",
		` ON DUPLICATE KEY UPDATE next_offset = VALUES(next_offset), updated_at = VALUES(updated_at)`,
		func(i int) []any {
			p := parts[i]
			return []any{j.cfg.Consumer, j.cfg.Topic, p, next[p], now}
		})
	if err != nil {
		return fmt.Errorf("naive: write offsets: %w", err)
	}
	return nil
}

// batches runs one multi-row INSERT per rowsPerStatement rows.
func batches(ctx context.Context, ex sqlx.ExecerContext, n int, head, tuple, tail string, args func(i int) []any) error {
	var b strings.Builder
	for start := 0; start < n; start += rowsPerStatement {
		end := min(start+rowsPerStatement, n)
		b.Reset()
		b.WriteString(head)
		var all []any
		for i := start; i < end; i++ {
			if i > start {
				b.WriteByte(',')
			}
			b.WriteString(tuple)
			all = append(all, args(i)...)
		}
		b.WriteString(tail)
		if _, err := ex.ExecContext(ctx, b.String(), all...); err != nil {
			return err
		}
	}
	return nil
}
