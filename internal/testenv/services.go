package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/testcontainers/testcontainers-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Environment variables and container images the test environment uses.
const (
	EnvKafkaBrokers = "KAFKA_BROKERS"
	EnvMySQLDSN     = "MYSQL_DSN"
	// EnvMySQL2DSN names a second, independent MySQL-compatible server
	// (admin DSN without a database), for tests that need two servers.
	EnvMySQL2DSN = "MYSQL2_DSN"
)

// howToRun ends every skip or CI failure message.
const howToRun = "run `make test` (starts local Kafka and MariaDB with scripts/services.sh), " +
	"or set " + EnvKafkaBrokers + " (e.g. 127.0.0.1:9092) and " + EnvMySQLDSN +
	" (admin DSN without database, e.g. root:root@tcp(127.0.0.1:3306)/), " +
	"or make a Docker engine reachable for testcontainers (`make test-containers`, docs/docker.md)"

// Env is everything an integration test can connect to.
type Env struct {
	KafkaBrokers []string
	// MySQLAdminDSN may create and drop databases; it names no database.
	MySQLAdminDSN string
}

// Services resolves both Kafka and MySQL; see the package documentation.
func Services(t testing.TB) Env {
	t.Helper()
	return Env{KafkaBrokers: Kafka(t), MySQLAdminDSN: MySQL(t)}
}

// errAbsent marks "no service configured and no Docker": the one case that
// skips (outside CI) rather than fails.
var errAbsent = errors.New("service not available")

// once memoizes a service lookup for the life of the test binary, so all
// tests in a package share one check and, with Docker, one container.
type once[T any] struct {
	sync.Once
	val T
	err error
}

var (
	kafkaOnce  once[[]string]
	mysqlOnce  once[string]
	mysql2Once once[string]
	dockerOnce once[struct{}]
)

// Kafka returns seed brokers of a cluster that supports transactions.
func Kafka(t testing.TB) []string {
	t.Helper()
	requireIntegration(t)
	kafkaOnce.Do(func() { kafkaOnce.val, kafkaOnce.err = resolveKafka() })
	check(t, "Kafka", kafkaOnce.err)
	return slices.Clone(kafkaOnce.val)
}

// MySQL returns an admin DSN (no database) for a MySQL-compatible server
// with XA support. Tests should use NewDatabase rather than the admin DSN.
func MySQL(t testing.TB) string {
	t.Helper()
	requireIntegration(t)
	mysqlOnce.Do(func() { mysqlOnce.val, mysqlOnce.err = resolveMySQL() })
	check(t, "MySQL", mysqlOnce.err)
	return mysqlOnce.val
}

// MySQL2 returns an admin DSN for a second server, independent of MySQL's
// (scripts/services.sh starts one as mariadb2; `make test` sets
// MYSQL2_DSN). Tests that need two servers (not two databases of one) use
// it: two ledgers whose control databases have the same name, say.
func MySQL2(t testing.TB) string {
	t.Helper()
	requireIntegration(t)
	mysql2Once.Do(func() { mysql2Once.val, mysql2Once.err = resolveMySQL2() })
	check(t, "a second MySQL server", mysql2Once.err)
	return mysql2Once.val
}

func requireIntegration(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped in -short mode")
	}
}

func check(t testing.TB, what string, err error) {
	t.Helper()
	switch {
	case err == nil:
	case errors.Is(err, errAbsent) && !inCI():
		t.Skipf("integration test needs %s: %v; %s", what, err, howToRun)
	case errors.Is(err, errAbsent):
		t.Fatalf("integration test needs %s and CI=true forbids skipping: %v; %s", what, err, howToRun)
	default:
		t.Fatalf("%s: %v", what, err)
	}
}

func inCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

func resolveKafka() ([]string, error) {
	if v := strings.TrimSpace(os.Getenv(EnvKafkaBrokers)); v != "" {
		var brokers []string
		for _, b := range strings.Split(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				brokers = append(brokers, b)
			}
		}
		if err := pingKafka(brokers); err != nil {
			return nil, fmt.Errorf("%s=%s is set but Kafka does not answer: %w", EnvKafkaBrokers, v, err)
		}
		return brokers, nil
	}
	if err := containerPath(EnvKafkaBrokers); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return startKafka(ctx)
}

func resolveMySQL() (string, error) {
	if dsn, err := resolveMySQLEnv(EnvMySQLDSN); !errors.Is(err, errAbsent) {
		return dsn, err
	}
	return mysqlContainer(EnvMySQLDSN)
}

// resolveMySQL2: a second server, from MYSQL2_DSN or a second container.
func resolveMySQL2() (string, error) {
	if dsn, err := resolveMySQLEnv(EnvMySQL2DSN); !errors.Is(err, errAbsent) {
		return dsn, err
	}
	return mysqlContainer(EnvMySQL2DSN)
}

func mysqlContainer(missing string) (string, error) {
	if err := containerPath(missing); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return startMySQL(ctx)
}

// resolveMySQLEnv checks the admin DSN in the environment variable env;
// errAbsent when it is unset.
func resolveMySQLEnv(env string) (string, error) {
	v := strings.TrimSpace(os.Getenv(env))
	if v == "" {
		return "", fmt.Errorf("%w: %s is not set", errAbsent, env)
	}
	cfg, err := mysql.ParseDSN(v)
	if err != nil {
		return "", fmt.Errorf("%s is not a valid DSN: %w", env, err)
	}
	if cfg.DBName != "" {
		return "", fmt.Errorf("%s must name no database (admin DSN such as root:root@tcp(127.0.0.1:3306)/), got database %q",
			env, cfg.DBName)
	}
	if err := pingMySQL(v); err != nil {
		return "", fmt.Errorf("%s is set but MySQL does not answer: %w", env, err)
	}
	return v, nil
}

// dockerHealthy is testcontainers.SkipIfProviderIsNotHealthy without the
// skip: the caller decides between skipping and failing.
func dockerHealthy() error {
	dockerOnce.Do(func() {
		dockerOnce.err = func() (err error) {
			// Provider lookup panics in some misconfigured environments.
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("testcontainers provider: %v", r)
				}
			}()
			provider, err := testcontainers.ProviderDefault.GetProvider()
			if err != nil {
				return err
			}
			defer provider.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return provider.Health(ctx)
		}()
	})
	return dockerOnce.err
}

func pingKafka(brokers []string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	md, err := kadm.NewClient(cl).BrokerMetadata(ctx)
	if err != nil {
		return err
	}
	if len(md.Brokers) == 0 {
		return errors.New("metadata lists no brokers")
	}
	return nil
}

func pingMySQL(dsn string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// randomHex returns 2n lowercase hex digits.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// NewDatabase creates an empty database named t_<16 hex digits> through
// the admin DSN and returns a DSN for it; the database is dropped when the
// test ends.
//
// The DSN spells out parseTime=true&multiStatements=false&interpolateParams=false:
// times scan into time.Time, and statements with arguments run as real
// server-side prepared statements, the way the service runs them.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return NewDatabaseOn(t, MySQL(t), "t_"+randomHex(8))
}

// NewDatabaseOn is NewDatabase on the server of the admin DSN admin, with a
// given name (letters, digits and underscores; the caller makes it unique on
// that server) and options of CREATE DATABASE (such as "CHARACTER SET
// latin1").
func NewDatabaseOn(t testing.TB, admin, name string, options ...string) string {
	t.Helper()
	if !regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`).MatchString(name) {
		t.Fatalf("NewDatabaseOn: bad database name %q", name)
	}
	db, err := sql.Open("mysql", admin)
	if err != nil {
		t.Fatalf("open admin DSN: %v", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The name was checked above, so quoting is safe.
	if _, err := db.ExecContext(ctx, strings.Join(append([]string{"CREATE DATABASE `" + name + "`"}, options...), " ")); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() { dropDatabase(t, admin, name) })

	dsn, err := databaseDSN(admin, name)
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// RandomName returns prefix followed by 16 random hex digits.
func RandomName(prefix string) string { return prefix + randomHex(8) }

func dropDatabase(t testing.TB, admin, name string) {
	t.Helper()
	db, err := sql.Open("mysql", admin)
	if err != nil {
		t.Errorf("drop database %s: %v", name, err)
		return
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Errorf("drop database %s: %v", name, err)
		return
	}
	defer conn.Close()
	// A prepared XA transaction that a test left behind keeps its metadata
	// locks and would make DROP wait for lock_wait_timeout (default: a
	// year). Fail after 30 s instead, and say why.
	if _, err := conn.ExecContext(ctx, "SET SESSION lock_wait_timeout = 30"); err != nil {
		t.Errorf("drop database %s: %v", name, err)
		return
	}
	rollBackLeftBranches(ctx, t, conn, name)
	if _, err := conn.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
		t.Errorf("drop database %s: %v (a prepared XA transaction left by the test holds its locks? see XA RECOVER)", name, err)
	}
}

// rollBackLeftBranches rolls back the prepared XA branches that the
// ledger in database name left on its server: a test that ends with a
// branch in doubt (a killed coordinator that no recovery followed) would
// otherwise leave it prepared for good once the database is gone, holding
// InnoDB purge back on the whole server and slowing every later test. A
// branch is the ledger's when its qualifier names the ledger's id
// ("-l<id>-", see txsink.Qualifier). Each one is logged: a test that
// leaves them is worth a look.
func rollBackLeftBranches(ctx context.Context, t testing.TB, conn *sql.Conn, name string) {
	var id string
	if err := conn.QueryRowContext(ctx, "SELECT ledger_id FROM `"+name+"`.ledger_identity WHERE singleton = 1").Scan(&id); err != nil {
		return // no ledger in it, or not yet an identity
	}
	rows, err := conn.QueryContext(ctx, "XA RECOVER")
	if err != nil {
		return
	}
	type xid struct {
		format       int64
		gtrid, bqual string
	}
	var left []xid
	for rows.Next() {
		var format, glen, blen int64
		var data []byte
		if rows.Scan(&format, &glen, &blen, &data) != nil || glen < 0 || blen < 0 || int(glen+blen) > len(data) {
			continue
		}
		x := xid{format, string(data[:glen]), string(data[glen : glen+blen])}
		if strings.Contains(x.bqual, "-l"+id+"-") {
			left = append(left, x)
		}
	}
	_ = rows.Close()
	for _, x := range left {
		// On MariaDB a prepared branch stays attached to the session that
		// prepared it until the server has seen that session end (a
		// closed connection takes a moment): XAER_NOTA until then.
		var err error
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			_, err = conn.ExecContext(ctx, fmt.Sprintf("XA ROLLBACK X'%x', X'%x', %d", x.gtrid, x.bqual, x.format))
			if err == nil || time.Now().After(deadline) {
				break
			}
		}
		t.Logf("testenv: the test left the prepared XA branch %s/%s of its ledger %s (database %s); rolled back: %v", x.gtrid, x.bqual, id, name, err)
	}
}

// databaseDSN turns the admin DSN into one for database name.
func databaseDSN(admin, name string) (string, error) {
	cfg, err := mysql.ParseDSN(admin)
	if err != nil {
		return "", fmt.Errorf("parse admin DSN: %w", err)
	}
	cfg.DBName = name
	cfg.ParseTime = true
	cfg.MultiStatements = false
	cfg.InterpolateParams = false
	dsn := cfg.FormatDSN()
	// FormatDSN leaves out parameters at their default (false); write them
	// anyway so the DSN states the settings tests rely on.
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "multiStatements=false&interpolateParams=false", nil
}

var topicUnsafe = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// NewTopic creates a topic with the given number of partitions and the
// cluster's default replication factor, waits until every partition has a
// leader, and deletes it when the test ends. The name is t-<test name>-<12
// hex digits>, unique per call and recognisable in broker logs.
func NewTopic(t testing.TB, brokers []string, partitions int) string {
	t.Helper()
	return NewTopicWithConfigs(t, brokers, partitions, nil)
}

// NewTopicWithConfigs is NewTopic with topic-level settings, such as
// max.message.bytes for records larger than the broker's default.
func NewTopicWithConfigs(t testing.TB, brokers []string, partitions int, configs map[string]string) string {
	t.Helper()
	if partitions < 1 {
		t.Fatalf("NewTopic: partitions must be >= 1, got %d", partitions)
	}
	label := strings.Trim(topicUnsafe.ReplaceAllString(t.Name(), "-"), "-")
	if len(label) > 60 {
		label = label[:60]
	}
	name := "t-" + label + "-" + randomHex(6)

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Replication factor -1: the broker's default.replication.factor.
	var cfgs map[string]*string
	for k, v := range configs {
		if cfgs == nil {
			cfgs = map[string]*string{}
		}
		cfgs[k] = &v
	}
	if _, err := adm.CreateTopic(ctx, int32(partitions), -1, cfgs, name); err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	t.Cleanup(func() { deleteTopic(t, brokers, name) })

	// CreateTopics returns once the controller committed the topic; brokers
	// learn it a moment later. Wait, so the test's first produce or fetch
	// does not race metadata propagation.
	for {
		md, err := adm.Metadata(ctx, name)
		if err == nil && topicReady(md, name, partitions) {
			return name
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topic %s: partitions without leader after 1m (last error: %v)", name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func topicReady(md kadm.Metadata, name string, partitions int) bool {
	td, ok := md.Topics[name]
	if !ok || td.Err != nil || len(td.Partitions) != partitions {
		return false
	}
	for _, p := range td.Partitions {
		if p.Err != nil || p.Leader < 0 {
			return false
		}
	}
	return true
}

func deleteTopic(t testing.TB, brokers []string, name string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Logf("delete topic %s: %v", name, err)
		return
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A leftover topic is harmless (names are unique) and a test that
	// restarts Kafka may leave it briefly unreachable: log, do not fail.
	if _, err := kadm.NewClient(cl).DeleteTopic(ctx, name); err != nil && !errors.Is(err, kerr.UnknownTopicOrPartition) {
		t.Logf("delete topic %s: %v", name, err)
	}
}
