package bench

import (
	"cmp"
	"context"
	"crypto/md5"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/bench/naive"
	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/metrics"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
	"github.com/billing/ledger/migrations"
)

// findBinary returns the binary name of this module's cmd/<name>: the
// flag's path, else the one next to this executable (make bench builds
// them there), else one built now with go build.
func findBinary(flagPath, name, tmp string) (string, error) {
	if flagPath != "" {
		return flagPath, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p := filepath.Join(tmp, name)
	out, err := exec.Command("go", "build", "-o", p, "github.com/billing/ledger/cmd/"+name).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", name, err, out)
	}
	return p, nil
}

// generate produces the workload with billing-gen into a new topic and
// returns the path of the expected ledger.
func generate(ctx context.Context, o *options, v variant, topic, expected string, logf *os.File) (time.Duration, error) {
	// The settings the service runs with (its configuration, the
	// variant's, -service-env last, as runVariant applies them) decide
	// what the expected ledger holds.
	setting := func(name, def string) string {
		if x, ok := o.ServiceEnv[name]; ok {
			return x
		}
		if x, ok := v.env[name]; ok {
			return x
		}
		return def
	}
	args := []string{
		"-brokers", strings.Join(o.Brokers, ","), "-topic", topic, "-create-topic", "-partitions", strconv.Itoa(o.Partitions),
		"-events", strconv.FormatInt(o.Events, 10), "-accounts", strconv.Itoa(v.accounts), "-zipf-s", fmt.Sprint(o.ZipfS),
		"-dup-ratio", fmt.Sprint(o.DupRatio), "-conflict-ratio", "0", "-malformed-ratio", "0", "-aborted-ratio", "0",
		"-overflow-cases", "0", "-window", setting("BILLING_WINDOW", o.svc.BillingWindow), "-timezone", setting("BILLING_TIMEZONE", o.svc.BillingTimezone),
		"-seed", strconv.FormatUint(o.Seed, 10),
		"-max-in-flight", "100000", "-progress", "none", "-expected", expected, "-timeout", o.Timeout.String(),
	}
	if v.randomIDs {
		args = append(args, "-random-ids")
	}
	if v.format != "" {
		args = append(args, "-format", v.format, "-schema-registry", o.Registry)
	}
	if v.versionRatio > 0 {
		args = append(args, "-version-ratio", fmt.Sprint(v.versionRatio))
	}
	if c := setting("WINDOW_CLOSE_AFTER", o.svc.WindowCloseAfter.String()); c != "" {
		args = append(args, "-close-after", c)
	}
	// Entries that a retention deletes cannot be compared: with one, the
	// ledger is checked without them.
	if setting("LEDGER_ENTRIES", strconv.FormatBool(o.svc.LedgerEntries)) == "true" &&
		setting("LEDGER_ENTRIES_RETENTION", o.svc.LedgerEntriesRetention.String()) == "" {
		args = append(args, "-ledger-entries")
	}
	cmd := exec.CommandContext(ctx, o.Gen, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("billing-gen: %w (see %s)", err, logf.Name())
	}
	return time.Since(start), nil
}

func kafkaAdmin(brokers []string) (*kadm.Client, *kgo.Client, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl, nil
}

// endOffsets returns every partition's end offset and their sum (the
// topic has no transactions: offsets are records).
func endOffsets(ctx context.Context, adm *kadm.Client, topic string) (map[int32]int64, int64, error) {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, 0, err
	}
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, 0, err
	}
	out := map[int32]int64{}
	var total int64
	var ferr error
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			ferr = o.Err
			return
		}
		out[o.Partition] = o.Offset
		if s, ok := starts.Lookup(topic, o.Partition); ok {
			total += o.Offset - s.Offset
		}
	})
	return out, total, ferr
}

// createTopic creates an empty topic and waits until every partition has a
// leader.
func createTopic(ctx context.Context, adm *kadm.Client, topic string, partitions int) error {
	if _, err := adm.CreateTopic(ctx, int32(partitions), -1, nil, topic); err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		md, err := adm.Metadata(ctx, topic)
		if err == nil {
			if td, ok := md.Topics[topic]; ok && td.Err == nil && len(td.Partitions) == partitions {
				ready := true
				for _, p := range td.Partitions {
					ready = ready && p.Err == nil && p.Leader >= 0
				}
				if ready {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s not ready: %w", topic, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func deleteTopic(adm *kadm.Client, topic string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := adm.DeleteTopic(ctx, topic); err != nil && !errors.Is(err, kerr.UnknownTopicOrPartition) {
		fmt.Fprintf(os.Stderr, "billing-bench: delete topic %s: %v\n", topic, err)
	}
}

// databaseDSN derives the DSN of database name from the admin DSN; with
// counting, through countingNet.
func databaseDSN(admin, name string, counting bool) (string, error) {
	cfg, err := mysql.ParseDSN(admin)
	if err != nil {
		return "", err
	}
	cfg.DBName = name
	if counting && cfg.Net == "tcp" {
		cfg.Net = countingNet
	}
	return cfg.FormatDSN(), nil
}

func adminDB(admin string) (*sql.DB, error) {
	db, err := sql.Open("mysql", admin)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(4)
	return db, nil
}

// createDatabase creates an empty database with the ledger schema and
// naive_offsets.
func createDatabase(ctx context.Context, admin, name string) error {
	db, err := adminDB(admin)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		return fmt.Errorf("create database %s: %w", name, err)
	}
	dsn, err := databaseDSN(admin, name, false)
	if err != nil {
		return err
	}
	sdb, err := mysqldriver.OpenDB(dsn, 5*time.Second, 2)
	if err != nil {
		return err
	}
	defer sdb.Close()
	if err := migrations.Up(ctx, sdb.DB, quietLogger(), mysqldriver.SchemaExists); err != nil {
		return err
	}
	return naive.Migrate(ctx, sdb)
}

func dropDatabase(admin, name string) {
	db, err := adminDB(admin)
	if err != nil {
		return
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "billing-bench: drop database %s: %v\n", name, err)
		return
	}
	defer conn.Close()
	_, _ = conn.ExecContext(ctx, "SET SESSION lock_wait_timeout = 30")
	if _, err := conn.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
		fmt.Fprintf(os.Stderr, "billing-bench: drop database %s: %v\n", name, err)
	}
}

// preloadDedupKeys inserts n unexpired dedup keys (random-looking ids, so
// that they spread over the whole index) before the run: a dedup state far
// larger than the cache. The ids are old-<32 hex digits>, which sort after
// the workload's e-<seed>-<n>, or, with uuid, UUID-shaped, as the ids of
// billing-gen -random-ids: then the run's keys land among the stored ones.
func preloadDedupKeys(ctx context.Context, admin, name string, n int64, ttl time.Duration, uuid bool) error {
	dsn, err := databaseDSN(admin, name, false)
	if err != nil {
		return err
	}
	db, err := mysqldriver.OpenDB(dsn, 30*time.Second, 2)
	if err != nil {
		return err
	}
	defer db.Close()
	expires := time.Now().Add(ttl).UTC()
	// MariaDB generates them itself (Sequence engine), twice as fast as
	// sending them; elsewhere they are sent in batches. Two connections
	// insert disjoint ranges side by side (the pool's two), one per core.
	var one int
	if db.QueryRowContext(ctx, "SELECT seq FROM seq_1_to_1").Scan(&one) == nil {
		const step = 500_000
		var next atomic.Int64
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for w := range errs {
			wg.Go(func() {
				for lo := next.Add(step) - step; lo < n && errs[w] == nil && ctx.Err() == nil; lo = next.Add(step) - step {
					hi := min(lo+step, n)
					q := fmt.Sprintf("INSERT INTO dedup_keys (event_id, fingerprint, expires_at) SELECT CONCAT('old-', MD5(seq)), UNHEX(MD5(seq)), ? FROM seq_%d_to_%d", lo+1, hi)
					if uuid {
						q = fmt.Sprintf("INSERT INTO dedup_keys (event_id, fingerprint, expires_at) SELECT CONCAT_WS('-', SUBSTR(h, 1, 8), SUBSTR(h, 9, 4), SUBSTR(h, 13, 4), SUBSTR(h, 17, 4), SUBSTR(h, 21, 12)), UNHEX(h), ? FROM (SELECT MD5(seq) AS h FROM seq_%d_to_%d) AS k", lo+1, hi)
					}
					if _, err := db.ExecContext(ctx, q, expires); err != nil {
						errs[w] = fmt.Errorf("preload dedup keys: %w", err)
					}
				}
			})
		}
		wg.Wait()
		return cmp.Or(cmp.Or(errs...), ctx.Err())
	}
	const rows = 5000
	var b strings.Builder
	for lo := int64(0); lo < n; lo += rows {
		hi := min(lo+rows, n)
		b.Reset()
		b.WriteString("INSERT INTO dedup_keys (event_id, fingerprint, expires_at) VALUES ")
		args := make([]any, 0, 3*(hi-lo))
		for i := lo; i < hi; i++ {
			if i > lo {
				b.WriteByte(',')
			}
			b.WriteString("(?,?,?)")
			sum := md5.Sum([]byte(strconv.FormatInt(i, 10)))
			id := "old-" + hex.EncodeToString(sum[:])
			if uuid {
				id = uuidShaped(sum)
			}
			args = append(args, id, sum[:], expires)
		}
		if _, err := db.ExecContext(ctx, b.String(), args...); err != nil {
			return fmt.Errorf("preload dedup keys: %w", err)
		}
	}
	return nil
}

// uuidShaped formats 16 bytes as a UUID (8-4-4-4-12 hex digits), as
// preloadDedupKeys's SQL formats MD5(seq).
func uuidShaped(b [16]byte) string {
	x := hex.EncodeToString(b[:])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}

// verify compares a database's ledger, read from the database of that
// name on each of servers (admin DSNs, in the ledger's order), with the
// generator's expectation. The rows of accounts whose id begins with
// The rows of accounts whose id ends in dropSuffix (none when empty: the
// live phase's of the add-server variant, which the expectation does not
// hold) are left out.
func verify(ctx context.Context, servers []string, name, expectedPath, topic, dropSuffix string) (string, *ledgercheck.Report, error) {
	exp, err := ledgercheck.ReadFile(expectedPath)
	if err != nil {
		return "", nil, err
	}
	var dbs []*sqlx.DB
	defer func() {
		for _, db := range dbs {
			db.Close()
		}
	}()
	for _, admin := range servers {
		dsn, err := databaseDSN(admin, name, false)
		if err != nil {
			return "", nil, err
		}
		db, err := ledgercheck.OpenDB(ctx, dsn)
		if err != nil {
			return "", nil, err
		}
		dbs = append(dbs, db)
	}
	act, err := ledgercheck.ReadActual(ctx, dbs, topic, exp.LedgerEntries)
	if err != nil {
		return "", nil, err
	}
	if dropSuffix != "" {
		dropAccounts(act, dropSuffix)
	}
	rep := ledgercheck.Compare(exp, act)
	switch {
	case rep.Exact():
		return "exact", rep, nil
	case rep.Lost == 0 && rep.CountedTwice == 0 && rep.Violations > 0:
		return fmt.Sprintf("%d broken invariants", rep.Violations), rep, nil
	case rep.Lost == 0 && rep.CountedTwice == 0:
		return fmt.Sprintf("not exact (%s; first: %s)", rep.Verdict(), rep.Diffs[0]), rep, nil
	case rep.Lost == 0:
		return fmt.Sprintf("%d twice", rep.CountedTwice), rep, nil
	default:
		return fmt.Sprintf("%d lost, %d twice", rep.Lost, rep.CountedTwice), rep, nil
	}
}

// liveProducer produces events at a fixed rate for d or until stop is
// closed (nil: never), with fresh ids, billing-gen's account names
// (acct-000123) followed by acctSuffix, and repeats at the workload's
// duplicate ratio. Each record's timestamp is its creation time. With
// randomIDs the ids are UUID-shaped digests of <prefix>-<n>, as
// billing-gen -random-ids makes them.
func liveProducer(ctx context.Context, brokers []string, topic, prefix string, rate float64, d time.Duration, stop <-chan struct{}, acctSuffix string, accounts int, dupRatio float64, seed uint64, randomIDs bool) (int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	rng := rand.New(rand.NewPCG(seed, 7))
	zipf := rand.NewZipf(rng, 1.1, 1, uint64(accounts-1))
	currencies := []string{"EUR", "USD", "GBP", "JPY"}
	var sent, failed atomic.Int64
	var firstErr atomic.Value
	var recent [][2][]byte
	n := 0
	produce := func(key, value []byte) {
		sent.Add(1)
		cl.Produce(ctx, &kgo.Record{Key: key, Value: value, Timestamp: time.Now()}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
		})
	}
	start := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var due float64
	for stopped := false; !stopped && time.Since(start) < d; {
		select {
		case <-ctx.Done():
			return sent.Load(), ctx.Err()
		case <-stop:
			stopped = true
		case <-tick.C:
		}
		due = rate * time.Since(start).Seconds()
		for float64(sent.Load()) < due {
			if len(recent) > 0 && rng.Float64() < dupRatio {
				r := recent[rng.IntN(len(recent))]
				produce(r[0], r[1])
				continue
			}
			n++
			acct := fmt.Sprintf("acct-%06d%s", zipf.Uint64(), acctSuffix)
			at := time.Now().UTC().Truncate(time.Millisecond).Format(time.RFC3339Nano)
			id := fmt.Sprintf("%s-%d", prefix, n)
			if randomIDs {
				id = uuidShaped(md5.Sum([]byte(id)))
			}
			value := fmt.Appendf(nil, `{"event_id":"%s","account_id":"%s","amount_minor":%d,"currency":"%s","occurred_at":"%s"}`,
				id, acct, 1+rng.IntN(100000), currencies[rng.IntN(len(currencies))], at)
			key := []byte(acct)
			produce(key, value)
			if len(recent) < 1000 {
				recent = append(recent, [2][]byte{key, value})
			} else {
				recent[rng.IntN(len(recent))] = [2][]byte{key, value}
			}
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return sent.Load(), err
	}
	if f := failed.Load(); f > 0 {
		return sent.Load(), fmt.Errorf("%d live records failed: %v", f, firstErr.Load())
	}
	return sent.Load(), nil
}

// settleHistory is the undo history (InnoDB's purge backlog) below which
// the server counts as quiet.
const settleHistory = 10_000

// settle waits, at most maxWait, until the server's purge has caught up
// with the undo history of what ran before (the previous measurement's
// deletes and dropped database), so that no measurement pays for another's
// work. It returns how long it waited, the history left and the number of
// prepared XA branches on the server: a branch left in doubt holds purge
// back for as long as it lasts (the history then only grows), which slows
// every measurement until someone resolves it.
func settle(ctx context.Context, admin string, maxWait time.Duration) (waited time.Duration, history int64, prepared int, err error) {
	db, err := adminDB(admin)
	if err != nil {
		return 0, 0, 0, err
	}
	defer db.Close()
	start := time.Now()
	for {
		if history, err = metrics.PurgeHistory(ctx, db); err != nil {
			return time.Since(start), 0, 0, err
		}
		if history < settleHistory || time.Since(start) >= maxWait {
			break
		}
		select {
		case <-ctx.Done():
			return time.Since(start), history, 0, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	rows, err := db.QueryContext(ctx, "XA RECOVER")
	if err != nil {
		return time.Since(start), history, 0, fmt.Errorf("XA RECOVER: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		prepared++
	}
	return time.Since(start), history, prepared, rows.Err()
}

// setServerPacket sets the server's global max_allowed_packet for the run:
// every connection opened after it (each measurement's service, naive job
// and checks) sees it. restore sets the value found before, whatever
// happens to the run.
func setServerPacket(ctx context.Context, admin string, n int64) (restore func(), err error) {
	db, err := adminDB(admin)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var was int64
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.max_allowed_packet").Scan(&was); err != nil {
		return nil, fmt.Errorf("read max_allowed_packet: %w", err)
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf("SET GLOBAL max_allowed_packet = %d", n)); err != nil {
		return nil, fmt.Errorf("set max_allowed_packet: %w", err)
	}
	fmt.Printf("max_allowed_packet: %d KiB for the run (was %d KiB)\n", n>>10, was>>10)
	return func() {
		db, err := adminDB(admin)
		if err == nil {
			_, err = db.Exec(fmt.Sprintf("SET GLOBAL max_allowed_packet = %d", was))
			db.Close()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "billing-bench: could not restore max_allowed_packet to %d: %v\n", was, err)
		}
	}, nil
}
