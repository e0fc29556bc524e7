package testenv

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	tcmysql "github.com/testcontainers/testcontainers-go/modules/mysql"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Images of the testcontainers path. The defaults are public images; a
// machine without a registry sets the variables to images it built
// (`make test-containers` passes those of scripts/images/).
const (
	// EnvKafkaImage names the Kafka image. An image whose name contains
	// confluentinc/confluent-local is started through testcontainers' kafka
	// module (the only kind it supports); any other is taken to be
	// configured like apache/kafka (KAFKA_* variables, /etc/kafka/docker/run),
	// which the local image of scripts/images/kafka is.
	EnvKafkaImage     = "TESTCONTAINERS_KAFKA_IMAGE"
	DefaultKafkaImage = "confluentinc/confluent-local:7.6.0"

	// EnvMySQLImage names the MySQL-compatible image; it must take the mysql
	// image's variables (MYSQL_ROOT_PASSWORD, ...) and server options as
	// arguments, as scripts/images/mariadb does.
	EnvMySQLImage     = "TESTCONTAINERS_MYSQL_IMAGE"
	DefaultMySQLImage = "mysql:8.4"
)

// KafkaImage and MySQLImage return the images the testcontainers path
// starts: the environment's choice, else the public default.
func KafkaImage() string { return envOr(EnvKafkaImage, DefaultKafkaImage) }

// MySQLImage: see KafkaImage.
func MySQLImage() string { return envOr(EnvMySQLImage, DefaultMySQLImage) }

func envOr(name, def string) string {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		return v
	}
	return def
}

// isConfluentLocal: images the kafka module of testcontainers can start.
func isConfluentLocal(image string) bool {
	return strings.Contains(strings.ToLower(image), "confluentinc/confluent-local")
}

// mysql84SQLMode is MySQL 8.4's default sql_mode, which the test servers
// run with (scripts/services.sh too): it is stricter than MariaDB 10.11's
// (ONLY_FULL_GROUP_BY, NO_ZERO_IN_DATE, NO_ZERO_DATE), so SQL that MySQL
// 8.4 would refuse fails in the tests on MariaDB as well.
const mysql84SQLMode = "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"

// mysqlServerArgs are the server settings scripts/services.sh gives its
// MariaDB (its my.cnf), as options both mysql:8.4 and MariaDB accept: the
// isolation and durability the exactly-once design relies on, and the
// binary log on, as MySQL 8.4 runs by default. Keep the two in step.
func mysqlServerArgs() []string {
	return []string{
		"--transaction-isolation=REPEATABLE-READ",
		"--innodb-flush-log-at-trx-commit=1",
		"--innodb-lock-wait-timeout=10",
		"--max-connections=1000",
		"--character-set-server=utf8mb4",
		"--collation-server=utf8mb4_general_ci",
		"--sql-mode=" + mysql84SQLMode,
		"--log-bin=mysql-bin",
		"--server-id=1",
		"--binlog-format=ROW",
		"--sync-binlog=1",
		"--max-binlog-size=64M",
		"--binlog-expire-logs-seconds=3600",
	}
}

// kafkaSettings are the broker settings of scripts/services.sh that tests
// depend on, as KAFKA_* variables (both kinds of image turn KAFKA_ABC_DEF
// into abc.def): one node, so every internal topic has one replica;
// topics only when asked for; groups form at once; transactions may stay
// open for a long time.
func kafkaSettings() map[string]string {
	return map[string]string{
		"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":         "1",
		"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
		"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":            "1",
		"KAFKA_DEFAULT_REPLICATION_FACTOR":               "1",
		"KAFKA_MIN_INSYNC_REPLICAS":                      "1",
		"KAFKA_AUTO_CREATE_TOPICS_ENABLE":                "false",
		"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":         "0",
		"KAFKA_TRANSACTION_MAX_TIMEOUT_MS":               "3600000",
	}
}

// containers are those this test binary started. Without the reaper (Ryuk
// cannot be had where no registry answers) nothing else removes them: Main
// does, after the package's tests.
var containers struct {
	sync.Mutex
	managed bool // Main is running the tests and removes the containers after
	started []testcontainers.Container
}

// Main runs the tests of a package that uses the test environment and then removes
// every container the test environment started for them. Such packages call it from
// their TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
//
// The containers live for the whole test binary (one Kafka and one MySQL
// for all its tests), so no single test's Cleanup can remove them. A
// failure to remove one makes the run fail: a container left behind is a
// leak that later runs would trip over. The harness refuses to start
// containers for a package without this TestMain.
func Main(m *testing.M) int {
	containers.Lock()
	containers.managed = true
	containers.Unlock()
	code := m.Run()
	if err := removeContainers(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func removeContainers() error {
	containers.Lock()
	started := containers.started
	containers.started = nil
	containers.Unlock()
	var errs []error
	for _, c := range started {
		if err := testcontainers.TerminateContainer(c); err != nil {
			errs = append(errs, fmt.Errorf("remove container %s: %w", c.GetContainerID(), err))
		}
	}
	return errors.Join(errs...)
}

// track records a started container (also one that failed to start
// completely) for Main to remove.
func track(c testcontainers.Container) {
	containers.Lock()
	defer containers.Unlock()
	containers.started = append(containers.started, c)
}

// containerPath checks that containers may be started: an engine answers,
// and Main will remove them.
func containerPath(missing string) error {
	if err := dockerHealthy(); err != nil {
		return fmt.Errorf("%w: %s is not set and Docker is not reachable (%v)", errAbsent, missing, err)
	}
	containers.Lock()
	defer containers.Unlock()
	if !containers.managed {
		return fmt.Errorf("%s is not set, and this package cannot use containers: its TestMain must call testenv.Main, which removes them after the tests", missing)
	}
	return nil
}

// startKafka starts a one-node Kafka container and returns its seed broker.
func startKafka(ctx context.Context) ([]string, error) {
	image := KafkaImage()
	var (
		brokers []string
		err     error
	)
	if isConfluentLocal(image) {
		var kc *tckafka.KafkaContainer
		kc, err = tckafka.Run(ctx, image, tckafka.WithClusterID(clusterID()), testcontainers.WithEnv(kafkaSettings()))
		if kc != nil {
			track(kc)
		}
		if err == nil {
			brokers, err = kc.Brokers(ctx)
		}
	} else {
		brokers, err = startApacheKafka(ctx, image)
	}
	if err != nil {
		return nil, fmt.Errorf("Kafka container %s: %w", image, err)
	}
	return brokers, pingKafka(brokers)
}

// Listeners of the apache/kafka-style container: HOST is what the tests on
// the host use (published on a random port, advertised as that port once it
// is known), BROKER the container-internal one, CONTROLLER the KRaft quorum.
const (
	kafkaHostPort    = "9093/tcp"
	kafkaAdvertised  = "/tmp/testenv-advertised-listeners"
	kafkaStartedLine = "Kafka Server started"
)

// startApacheKafka starts an image configured like apache/kafka. The port
// published for the tests is known only once the container runs, and Kafka
// must advertise it: the container waits for a file with the advertised
// listeners, which a post-start hook writes (what the kafka module does for
// confluent-local).
func startApacheKafka(ctx context.Context, image string) ([]string, error) {
	env := kafkaSettings()
	maps.Copy(env, map[string]string{
		"CLUSTER_ID":                           clusterID(),
		"KAFKA_NODE_ID":                        "1",
		"KAFKA_PROCESS_ROLES":                  "broker,controller",
		"KAFKA_LISTENERS":                      "HOST://:9093,BROKER://:9092,CONTROLLER://:9094",
		"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "HOST:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"KAFKA_INTER_BROKER_LISTENER_NAME":     "BROKER",
		"KAFKA_CONTROLLER_LISTENER_NAMES":      "CONTROLLER",
		"KAFKA_CONTROLLER_QUORUM_VOTERS":       "1@localhost:9094",
		// Kafka 4 (share groups): one replica here too.
		"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
		"KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR":            "1",
	})
	ctr, err := testcontainers.Run(ctx, image,
		testcontainers.WithExposedPorts(kafkaHostPort),
		testcontainers.WithEnv(env),
		testcontainers.WithEntrypoint("sh", "-c"),
		testcontainers.WithCmd(`while [ ! -s `+kafkaAdvertised+` ]; do sleep 0.1; done
export KAFKA_ADVERTISED_LISTENERS="$(cat `+kafkaAdvertised+`)"
exec /etc/kafka/docker/run`),
		testcontainers.WithLifecycleHooks(testcontainers.ContainerLifecycleHooks{
			PostStarts: []testcontainers.ContainerHook{advertiseKafka},
		}),
	)
	if ctr != nil {
		track(ctr)
	}
	if err != nil {
		return nil, err
	}
	endpoint, err := ctr.PortEndpoint(ctx, kafkaHostPort, "")
	if err != nil {
		return nil, err
	}
	return []string{endpoint}, nil
}

func advertiseKafka(ctx context.Context, c testcontainers.Container) error {
	if err := wait.ForMappedPort(kafkaHostPort).WaitUntilReady(ctx, c); err != nil {
		return fmt.Errorf("wait for the published port: %w", err)
	}
	endpoint, err := c.PortEndpoint(ctx, kafkaHostPort, "")
	if err != nil {
		return err
	}
	inspect, err := c.Inspect(ctx)
	if err != nil {
		return err
	}
	listeners := "HOST://" + endpoint + ",BROKER://" + inspect.Config.Hostname + ":9092"
	if err := c.CopyToContainer(ctx, []byte(listeners), kafkaAdvertised, 0o644); err != nil {
		return fmt.Errorf("write the advertised listeners: %w", err)
	}
	return wait.ForLog(kafkaStartedLine).WithStartupTimeout(3*time.Minute).WaitUntilReady(ctx, c)
}

// clusterID is a new KRaft cluster id: 16 random bytes, base64url, not
// starting with "-" (which the storage tool would take for an option; Kafka's
// own random ids avoid it the same way).
func clusterID() string {
	b := make([]byte, 16)
	for {
		_, _ = rand.Read(b)
		if id := base64.RawURLEncoding.EncodeToString(b); id[0] != '-' {
			return id
		}
	}
}

// startMySQL starts a MySQL-compatible server as root:root and returns the
// admin DSN.
func startMySQL(ctx context.Context) (string, error) {
	image := MySQLImage()
	ctr, err := tcmysql.Run(ctx, image,
		tcmysql.WithUsername("root"),
		tcmysql.WithPassword("root"),
		// The tests use UTC only; loading the zone tables costs seconds.
		testcontainers.WithEnv(map[string]string{"MYSQL_INITDB_SKIP_TZINFO": "1"}),
		testcontainers.WithCmdArgs(mysqlServerArgs()...),
		// The module waits for MySQL's own banner; both MySQL and MariaDB
		// log "port: 3306  " when the final server listens (the one that
		// runs the init scripts has networking off and logs port 0).
		testcontainers.WithWaitStrategyAndDeadline(3*time.Minute, wait.ForLog("port: 3306  ")),
	)
	if ctr != nil {
		track(ctr)
	}
	if err != nil {
		return "", fmt.Errorf("MySQL container %s: %w", image, err)
	}
	endpoint, err := ctr.PortEndpoint(ctx, "3306/tcp", "")
	if err != nil {
		return "", fmt.Errorf("MySQL container %s endpoint: %w", image, err)
	}
	dsn := "root:root@tcp(" + endpoint + ")/"
	return dsn, pingMySQL(dsn)
}
