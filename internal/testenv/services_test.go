package testenv

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestDatabaseDSN needs no server: it checks the DSN that NewDatabase hands
// out keeps the admin credentials and address and carries the settings
// tests rely on.
func TestDatabaseDSN(t *testing.T) {
	for _, admin := range []string{
		"root:root@tcp(127.0.0.1:3306)/",
		"root:root@tcp(127.0.0.1:3306)/?multiStatements=true&interpolateParams=true&timeout=5s",
	} {
		dsn, err := databaseDSN(admin, "t_0123456789abcdef")
		if err != nil {
			t.Fatalf("databaseDSN(%q): %v", admin, err)
		}
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatalf("result %q does not parse: %v", dsn, err)
		}
		if cfg.DBName != "t_0123456789abcdef" || cfg.User != "root" || cfg.Passwd != "root" ||
			cfg.Net != "tcp" || cfg.Addr != "127.0.0.1:3306" {
			t.Errorf("databaseDSN(%q) = %q: wrong database, credentials or address", admin, dsn)
		}
		if !cfg.ParseTime || cfg.MultiStatements || cfg.InterpolateParams {
			t.Errorf("databaseDSN(%q) = %q: want parseTime on, multiStatements and interpolateParams off", admin, dsn)
		}
	}
}

// TestContainerImages: the testcontainers path starts the public images
// unless the environment names others, and picks the way to start Kafka by
// the image.
func TestContainerImages(t *testing.T) {
	for _, tc := range []struct {
		env, value, want string
		get              func() string
	}{
		{EnvKafkaImage, "", "confluentinc/confluent-local:7.6.0", KafkaImage},
		{EnvKafkaImage, " localhost/billing-local/kafka:4.1.1 ", "localhost/billing-local/kafka:4.1.1", KafkaImage},
		{EnvMySQLImage, "", "mysql:8.4", MySQLImage},
		{EnvMySQLImage, "localhost/billing-local/mariadb:10.11", "localhost/billing-local/mariadb:10.11", MySQLImage},
	} {
		t.Setenv(tc.env, tc.value)
		if got := tc.get(); got != tc.want {
			t.Errorf("%s=%q: image %q, want %q", tc.env, tc.value, got, tc.want)
		}
	}
	for image, module := range map[string]bool{
		"confluentinc/confluent-local:7.6.0":           true,
		"docker.io/confluentinc/confluent-local:7.6.0": true,
		"apache/kafka:4.1.1":                           false,
		"localhost/billing-local/kafka:4.1.1":          false,
	} {
		if got := isConfluentLocal(image); got != module {
			t.Errorf("isConfluentLocal(%q) = %v, want %v", image, got, module)
		}
	}
}

// TestMySQLServerSettings: the server the test environment hands out, local or in a
// container, runs with the settings the exactly-once design relies on and
// with the binary log on, as MySQL 8.4 does by default (scripts/services.sh
// and mysqlServerArgs must agree).
func TestMySQLServerSettings(t *testing.T) {
	db, err := sql.Open("mysql", MySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query("SHOW GLOBAL VARIABLES")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	vars := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		vars[k] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		names []string // MySQL 8 and MariaDB 10.11 spell some differently
		value string
	}{
		{[]string{"transaction_isolation", "tx_isolation"}, "REPEATABLE-READ"},
		{[]string{"innodb_flush_log_at_trx_commit"}, "1"},
		{[]string{"log_bin"}, "ON"},
		{[]string{"sync_binlog"}, "1"},
		{[]string{"binlog_format"}, "ROW"},
		{[]string{"character_set_server"}, "utf8mb4"},
	} {
		got, found := "", false
		for _, n := range want.names {
			if got, found = vars[n]; found {
				break
			}
		}
		if !found || !strings.EqualFold(got, want.value) {
			t.Errorf("%s = %q (found %v), want %q", want.names[0], got, found, want.value)
		}
	}
	// The modes as a set: servers list them in an order of their own.
	got := strings.Split(strings.ToUpper(vars["sql_mode"]), ",")
	if want := strings.Split(mysql84SQLMode, ","); !sameSet(got, want) {
		t.Errorf("sql_mode = %q, want MySQL 8.4's default %q", vars["sql_mode"], mysql84SQLMode)
	}
}

func sameSet(a, b []string) bool {
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

// TestKafkaBrokerSettings: the broker the test environment hands out, local or in a
// container, has the settings of scripts/services.sh that tests rely on.
func TestKafkaBrokerSettings(t *testing.T) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(Kafka(t)...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	md, err := adm.BrokerMetadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rcs, err := adm.DescribeBrokerConfigs(ctx, md.Brokers.NodeIDs()...)
	if err != nil {
		t.Fatal(err)
	}
	for _, rc := range rcs {
		if rc.Err != nil {
			t.Fatalf("broker %s: %v", rc.Name, rc.Err)
		}
		got := map[string]string{}
		for _, c := range rc.Configs {
			got[c.Key] = c.MaybeValue()
		}
		for k, want := range map[string]string{
			"auto.create.topics.enable":                "false",
			"transaction.max.timeout.ms":               "3600000",
			"group.initial.rebalance.delay.ms":         "0",
			"transaction.state.log.min.isr":            "1",
			"offsets.topic.replication.factor":         "1",
			"transaction.state.log.replication.factor": "1",
		} {
			if got[k] != want {
				t.Errorf("broker %s: %s = %q, want %q", rc.Name, k, got[k], want)
			}
		}
	}
}

// SetGlobal changes a server variable for the test and gives the old value
// back when it ends; a connection opened meanwhile sees the new value
// (max_connect_errors: a setting nothing here depends on).
func TestSetGlobalRestores(t *testing.T) {
	admin := MySQL(t)
	db, err := sql.Open("mysql", admin)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	read := func() int64 {
		t.Helper()
		var v int64
		if err := db.QueryRow(`SELECT @@GLOBAL.max_connect_errors`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := read()
	t.Run("changed", func(t *testing.T) {
		SetGlobal(t, admin, "max_connect_errors", before+7)
		if got := read(); got != before+7 {
			t.Fatalf("max_connect_errors = %d, want %d", got, before+7)
		}
	})
	if got := read(); got != before {
		t.Fatalf("max_connect_errors = %d after the test, want it restored to %d", got, before)
	}
}

// TestDroppedLedgerLeavesNoBranchInDoubt: a test that ends with a branch of
// its ledger prepared (a killed coordinator no recovery followed) does not
// leave it on the shared server once its database is dropped, where it
// would hold purge back for every later test; another ledger's branch is
// left alone.
func TestDroppedLedgerLeavesNoBranchInDoubt(t *testing.T) {
	admin := MySQL(t)
	db, err := sql.Open("mysql", admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // after the rollback below
	mine, other := "blg1-"+randomHex(6)+"-1-1", "blg1-"+randomHex(6)+"-1-2"
	prepare := func(dsn, gtrid, bqual string) {
		t.Helper()
		c, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conn, err := c.Conn(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Raw(func(any) error { return driver.ErrBadConn }) // never back to the pool
		for _, q := range []string{"XA START '" + gtrid + "','" + bqual + "'", "INSERT INTO scratch VALUES (1)",
			"XA END '" + gtrid + "','" + bqual + "'", "XA PREPARE '" + gtrid + "','" + bqual + "'"} {
			if _, err := conn.ExecContext(t.Context(), q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	ledger := func(t *testing.T, id string) string {
		dsn := NewDatabaseOn(t, admin, RandomName("t_"))
		c, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, q := range []string{"CREATE TABLE ledger_identity (singleton TINYINT PRIMARY KEY, ledger_id CHAR(16))",
			"INSERT INTO ledger_identity VALUES (1, '" + id + "')", "CREATE TABLE scratch (x INT)"} {
			if _, err := c.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
		return dsn
	}
	// Another ledger's branch, in a database of its own that outlives the
	// subtest's: its cleanup rolls it back first.
	prepare(ledger(t, "eeeeeeeeeeeeeeee"), other, "p0-c1-leeeeeeeeeeeeeeee-m0")
	t.Cleanup(func() {
		if _, err := db.Exec("XA ROLLBACK '" + other + "','p0-c1-leeeeeeeeeeeeeeee-m0'"); err != nil {
			t.Errorf("roll back the other ledger's branch: %v", err)
		}
	})
	t.Run("test", func(t *testing.T) {
		prepare(ledger(t, "00112233aabbccdd"), mine, "p0-c1-l00112233aabbccdd-m0")
	})
	rows, err := db.Query("XA RECOVER")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var left []string
	for rows.Next() {
		var f, g, b int64
		var data []byte
		if err := rows.Scan(&f, &g, &b, &data); err != nil {
			t.Fatal(err)
		}
		left = append(left, string(data))
	}
	var sawOther bool
	for _, d := range left {
		if strings.HasPrefix(d, mine) {
			t.Errorf("the ledger's branch is still prepared after its database was dropped: %s", d)
		}
		sawOther = sawOther || strings.HasPrefix(d, other)
	}
	if !sawOther {
		t.Errorf("another ledger's branch was rolled back too (XA RECOVER: %q)", left)
	}
}
