package config

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"

	"github.com/billing/ledger/internal/connfiles"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/mysqlconn"
)

// Config is the whole configuration of one instance. Every field is read from
// the environment variable named in its envconfig tag; `billing --help`
// prints the table built from these tags.
type Config struct {
	KafkaBrokers          []string      `envconfig:"KAFKA_BROKERS" required:"true" desc:"Kafka bootstrap brokers, comma separated (host:port)"`
	KafkaTopic            string        `envconfig:"KAFKA_TOPIC" default:"billing-events" desc:"topic of billing events"`
	KafkaGroup            string        `envconfig:"KAFKA_GROUP" default:"billing-ledger" desc:"consumer group; also scopes the offsets stored in MySQL"`
	KafkaSessionTimeout   time.Duration `envconfig:"KAFKA_SESSION_TIMEOUT" default:"10s" desc:"group session timeout: a member silent this long loses its partitions"`
	KafkaRebalanceTimeout time.Duration `envconfig:"KAFKA_REBALANCE_TIMEOUT" default:"60s" desc:"time a member has to finish its checkpoint and release partitions in a rebalance; must exceed CHECKPOINT_TIMEOUT"`
	KafkaMaxPollRecords   int           `envconfig:"KAFKA_MAX_POLL_RECORDS" default:"5000" desc:"records taken from the client per poll"`
	AllowGroupChange      bool          `envconfig:"ALLOW_GROUP_CHANGE" default:"false" desc:"start a consumer group that has no stored positions on a ledger that holds positions of the topic under another group; it replays the topic from its start, and events older than DEDUP_TTL count again"`

	KafkaTLSEnabled       bool   `envconfig:"KAFKA_TLS_ENABLED" default:"false" desc:"connect to the brokers over TLS (1.2+, certificates always verified)"`
	KafkaTLSCAFile        string `envconfig:"KAFKA_TLS_CA_FILE" desc:"PEM CA bundle trusted for the brokers instead of the system roots"`
	KafkaTLSCertFile      string `envconfig:"KAFKA_TLS_CERT_FILE" desc:"PEM client certificate for mutual TLS (with KAFKA_TLS_KEY_FILE)"`
	KafkaTLSKeyFile       string `envconfig:"KAFKA_TLS_KEY_FILE" desc:"PEM private key of KAFKA_TLS_CERT_FILE"`
	KafkaTLSServerName    string `envconfig:"KAFKA_TLS_SERVER_NAME" desc:"name the brokers' certificates must carry (default: the host dialled)"`
	KafkaSASLMechanism    string `envconfig:"KAFKA_SASL_MECHANISM" desc:"SASL mechanism: empty (none), PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; PLAIN only with TLS"`
	KafkaSASLUsername     string `envconfig:"KAFKA_SASL_USERNAME" desc:"SASL user"`
	KafkaSASLPassword     string `envconfig:"KAFKA_SASL_PASSWORD" desc:"SASL password (prefer KAFKA_SASL_PASSWORD_FILE)"`
	KafkaSASLPasswordFile string `envconfig:"KAFKA_SASL_PASSWORD_FILE" desc:"file holding the SASL password (trailing newlines ignored)"`

	MySQLDSN             string        `envconfig:"MYSQL_DSN" required:"true" desc:"control server DSN (go-sql-driver/mysql format): offsets, decisions, and the first shard of results"`
	MySQLShardDSNs       []string      `envconfig:"MYSQL_SHARD_DSNS" desc:"further MySQL servers holding shards of the results, comma separated, in the ledger's order: accounts and event ids are placed over MYSQL_DSN and this list by the layout stored in the ledger, checked at every start (another list is refused, exit 4; billing shards status shows it); billing shards add adds a server, which is then appended here"`
	MySQLBranches        int           `envconfig:"MYSQL_BRANCHES" default:"2" desc:"parallel XA branches (connections) per server in each checkpoint; each instance opens at most MYSQL_BRANCHES + 8 connections per server for checkpoints, lookups, recovery and health checks, and MYSQL_BRANCHES + 1 more for cleanup"`
	MySQLLockWaitTimeout time.Duration `envconfig:"MYSQL_LOCK_WAIT_TIMEOUT" default:"5s" desc:"innodb_lock_wait_timeout of branch connections; a checkpoint blocked longer aborts and replays (beside other instances the dedup claims wait up to CHECKPOINT_TIMEOUT: their one lock order has no cycle to break)"`
	MySQLPasswordFile    string        `envconfig:"MYSQL_PASSWORD_FILE" desc:"file holding the MySQL password; replaces the password of every DSN (trailing newlines ignored)"`
	MySQLTLS             string        `envconfig:"MYSQL_TLS" desc:"TLS to MySQL for every DSN: false, true (verified), skip-verify or preferred; empty keeps each DSN's tls parameter"`
	MySQLTLSCAFile       string        `envconfig:"MYSQL_TLS_CA_FILE" desc:"PEM CA bundle trusted for MySQL instead of the system roots (needs MYSQL_TLS=true)"`
	MySQLTLSCertFile     string        `envconfig:"MYSQL_TLS_CERT_FILE" desc:"PEM client certificate for MySQL (with MYSQL_TLS_KEY_FILE; needs MYSQL_TLS=true)"`
	MySQLTLSKeyFile      string        `envconfig:"MYSQL_TLS_KEY_FILE" desc:"PEM private key of MYSQL_TLS_CERT_FILE"`

	CheckpointInterval   time.Duration `envconfig:"CHECKPOINT_INTERVAL" default:"1s" desc:"a checkpoint is taken this often"`
	CheckpointTimeout    time.Duration `envconfig:"CHECKPOINT_TIMEOUT" default:"30s" desc:"a checkpoint that has not decided within this time aborts; undecided branches older than this may be rolled back by any instance"`
	CheckpointMaxRecords int           `envconfig:"CHECKPOINT_MAX_RECORDS" default:"50000" desc:"a checkpoint is taken early once this many records are buffered; fetching pauses at twice this"`
	CheckpointMaxBytes   int           `envconfig:"CHECKPOINT_MAX_BYTES" default:"33554432" desc:"a checkpoint is taken early once buffered records hold this many bytes (keys, values, ids); fetching pauses at twice this, and Kafka fetches are sized from it (bounds memory under large records)"`

	DedupTTL             time.Duration `envconfig:"DEDUP_TTL" default:"24h" desc:"an event id is remembered this long after its first arrival (processing time)"`
	VersionHorizon       time.Duration `envconfig:"VERSION_HORIZON" default:"0s" desc:"how long after an event's first version a later revision is still applied (docs/corrections.md); a version past it is a version_past_horizon dead letter; 0: half of DEDUP_TTL; at most DEDUP_TTL"`
	DedupCacheKeys       int           `envconfig:"DEDUP_CACHE_KEYS" default:"100000" desc:"in-memory budget of remembered event ids; beyond it, ids are checked against MySQL only"`
	DedupReadAheadConns  int           `envconfig:"DEDUP_READ_AHEAD_CONNS" default:"4" desc:"connections per server that look up the ids polled while caught up, before their checkpoint claims them, so that the claim finds their pages in memory (a dedup table larger than the buffer pool); 0 turns it off, at most 4"`
	DedupCleanupInterval time.Duration `envconfig:"DEDUP_CLEANUP_INTERVAL" default:"5s" desc:"how often the upkeep of the dedup keys' generations looks for a table whose keys have all expired (emptied whole) or a rotation that is due, and the retention for old ledger entries (deleted until none is due), on cleanup connections of their own"`
	DedupCleanupBatch    int           `envconfig:"DEDUP_CLEANUP_BATCH" default:"1000" desc:"old ledger entries deleted per statement by the retention (short transactions, no long locks)"`

	BillingWindow          string           `envconfig:"BILLING_WINDOW" default:"1h" desc:"billing windows over occurred_at: a duration (tumbling windows aligned to the Unix epoch, UTC), or day or month (calendar periods from local midnight and the first of the month in BILLING_TIMEZONE); stored in the ledger at its first start: an instance with another refuses to start (billing periods change changes it)"`
	BillingTimezone        string           `envconfig:"BILLING_TIMEZONE" default:"UTC" desc:"IANA time zone of day and month windows (embedded zone database; days follow daylight saving time and last 23 to 25 hours); ignored for duration windows; stored in the ledger like BILLING_WINDOW"`
	WindowCloseAfter       OptionalDuration `envconfig:"WINDOW_CLOSE_AFTER" desc:"empty: windows never close; else a window closes once the watermark (event time) has passed its end plus this, and its later events count in window_adjustments; whether it is set is stored in the ledger (like BILLING_WINDOW), its value may differ between instances (the smallest acts)"`
	MaxEventTimeSkew       time.Duration    `envconfig:"MAX_EVENT_TIME_SKEW" default:"1h" desc:"an event whose occurred_at is later than the processing time (the control server's clock) plus this is dead-lettered as event_time_in_future: no record moves the watermark or the closing frontier past now plus this"`
	LedgerEntries          bool             `envconfig:"LEDGER_ENTRIES" default:"false" desc:"write one ledger_entries row per counted event (its Kafka position, window and checkpoint)"`
	LedgerEntriesRetention OptionalDuration `envconfig:"LEDGER_ENTRIES_RETENTION" desc:"empty: keep ledger entries forever; else entries older than this are deleted every DEDUP_CLEANUP_INTERVAL, batches of DEDUP_CLEANUP_BATCH until none is due"`
	MaxPayloadBytes        int              `envconfig:"MAX_PAYLOAD_BYTES" default:"65536" desc:"larger record values are dead-lettered as payload_too_large"`
	DeadLetterPayloadBytes int              `envconfig:"DEAD_LETTER_PAYLOAD_BYTES" default:"65536" desc:"a dead letter stores at most this prefix of the record's value, with the whole value's size and SHA-256 (a server with a small max_allowed_packet stores less, at least a quarter of it less 4 KiB)"`

	EventFormat          string   `envconfig:"EVENT_FORMAT" default:"json" desc:"format of record values (of a CloudEvent's data in binary mode): json, or avro, protobuf or json-schema (the Confluent wire format, each schema fetched by id from SCHEMA_REGISTRY_URL) (docs/formats.md)"`
	EventFields          string   `envconfig:"EVENT_FIELDS" desc:"where the contract's values (the five of an event, and the optional revision and cancelled of a version) are in a decoded record, comma-separated field=path pairs (account_id=data.customer.id); a field not named is read from its own name at the top level (with CloudEvents, below data); empty: today's names"`
	EventCloudEvents     bool     `envconfig:"EVENT_CLOUDEVENTS" default:"false" desc:"records are CloudEvents (Kafka protocol binding, structured or binary mode); the event id deduplicated on is the event's source and id"`
	EventCloudEventTypes []string `envconfig:"EVENT_CLOUDEVENT_TYPES" desc:"with EVENT_CLOUDEVENTS: the CloudEvent types counted, comma separated; records of other types are skipped (counted in billing_records_skipped_total, not dead letters); empty: every type"`

	SchemaRegistryURL          string        `envconfig:"SCHEMA_REGISTRY_URL" desc:"base URL of the Confluent-compatible schema registry of EVENT_FORMAT=avro, protobuf and json-schema (http or https)"`
	SchemaRegistryUsername     string        `envconfig:"SCHEMA_REGISTRY_USERNAME" desc:"basic auth user of the schema registry"`
	SchemaRegistryPassword     string        `envconfig:"SCHEMA_REGISTRY_PASSWORD" desc:"basic auth password of the schema registry (prefer SCHEMA_REGISTRY_PASSWORD_FILE)"`
	SchemaRegistryPasswordFile string        `envconfig:"SCHEMA_REGISTRY_PASSWORD_FILE" desc:"file holding the schema registry's password (trailing newlines ignored)"`
	SchemaRegistryTLSCAFile    string        `envconfig:"SCHEMA_REGISTRY_TLS_CA_FILE" desc:"PEM CA bundle trusted for an https schema registry instead of the system roots"`
	SchemaRegistryTLSCertFile  string        `envconfig:"SCHEMA_REGISTRY_TLS_CERT_FILE" desc:"PEM client certificate for the schema registry (with SCHEMA_REGISTRY_TLS_KEY_FILE)"`
	SchemaRegistryTLSKeyFile   string        `envconfig:"SCHEMA_REGISTRY_TLS_KEY_FILE" desc:"PEM private key of SCHEMA_REGISTRY_TLS_CERT_FILE"`
	SchemaRegistrySubject      string        `envconfig:"SCHEMA_REGISTRY_SUBJECT" desc:"the subject every record's schema id must belong to (else the record is a dead letter, unknown_schema); empty: KAFKA_TOPIC-value (TopicNameStrategy)"`
	SchemaRegistryTimeout      time.Duration `envconfig:"SCHEMA_REGISTRY_TIMEOUT" default:"5s" desc:"bound on one request to the schema registry; a registry that does not answer holds the records (retried with backoff), never dead-letters them"`
	SchemaRegistryCacheSize    int           `envconfig:"SCHEMA_REGISTRY_CACHE_SIZE" default:"1000" desc:"compiled schemas kept in memory (each fetched by id once)"`

	RecoveryInterval  time.Duration `envconfig:"RECOVERY_INTERVAL" default:"10s" desc:"how often in-doubt XA branches are looked for and resolved"`
	DecisionRetention time.Duration `envconfig:"DECISION_RETENTION" default:"24h" desc:"checkpoint decision rows older than this, with no branch left in doubt, are deleted"`

	CommitLogRetention time.Duration `envconfig:"COMMIT_LOG_RETENTION" default:"840h" desc:"commit log records (checkpoint_commits, what invoicing reads follow) older than this are deleted, oldest first and only below the visible position; at least DECISION_RETENTION; a reader that falls further behind reads in full (docs/periods.md)"`

	ChangelogTopicPrefix      string        `envconfig:"CHANGELOG_TOPIC_PREFIX" desc:"empty: no changelog; else every change the ledger commits is published to Kafka exactly once, in Kafka transactions, to the topics <prefix>.account_balances, .billing_windows, .window_adjustments, .closed_windows and (with LEDGER_ENTRIES) .ledger_entries (docs/changelog.md); the first instance started with it turns the ledger's changelog on (on a ledger that already holds rows its snapshot, op r, is published first, while counting goes on), and an instance without it can then no longer commit"`
	ChangelogMaxBacklog       int           `envconfig:"CHANGELOG_MAX_BACKLOG" default:"10000" desc:"checkpoints committed and not yet published (Kafka unavailable, the publisher behind) at which every instance stops taking checkpoints (fetching pauses; /readyz fails saying why, /healthz does not) until the publisher catches up; the outbox holds them durably meanwhile"`
	ChangelogTxnMaxEvents     int           `envconfig:"CHANGELOG_TRANSACTION_MAX_EVENTS" default:"100000" desc:"change events in one Kafka transaction of the changelog: whole checkpoints in commit order up to this; a larger checkpoint alone is split across transactions at its outbox rows (its changes then become visible in parts)"`
	ChangelogTxnTimeout       time.Duration `envconfig:"CHANGELOG_TRANSACTION_TIMEOUT" default:"60s" desc:"the changelog producer's transaction timeout; at most the brokers' transaction.max.timeout.ms (default 15m)"`
	ChangelogTopicPartitions  int           `envconfig:"CHANGELOG_TOPIC_PARTITIONS" default:"-1" desc:"partitions of the changelog topics created when missing (-1: the brokers' num.partitions); the progress topic has one"`
	ChangelogTopicReplication int           `envconfig:"CHANGELOG_TOPIC_REPLICATION" default:"-1" desc:"replication factor of the changelog topics created when missing (-1: the brokers' default.replication.factor)"`
	ChangelogLease            time.Duration `envconfig:"CHANGELOG_LEASE" default:"10s" desc:"term of the changelog publisher's lease (one instance publishes, renewing it every third of this); another instance takes over once it ran out; Kafka's transactional id fences the one it replaced"`
	ChangelogSnapshotIndex    int           `envconfig:"CHANGELOG_SNAPSHOT_INDEX_BYTES" default:"67108864" desc:"bound on what the snapshot of a ledger that already held rows keeps of the changes since the changelog was enabled (each changed key's first before-image, for the keys ahead of its scan); past it the outbox is read again from the enabling as the scan goes on (docs/changelog.md)"`

	HTTPAddr        string        `envconfig:"HTTP_ADDR" default:":8080" desc:"address of /metrics, /healthz and /readyz; empty disables"`
	ReadyMaxAge     time.Duration `envconfig:"READY_MAX_CHECKPOINT_AGE" default:"60s" desc:"/readyz fails when the last checkpoint is older than this while records wait to be checkpointed"`
	LiveMaxAge      time.Duration `envconfig:"LIVENESS_MAX_CHECKPOINT_AGE" default:"5m" desc:"/healthz fails (the pipeline is wedged; the orchestrator restarts the instance) when records have waited this long with no checkpoint committed; must exceed READY_MAX_CHECKPOINT_AGE and CHECKPOINT_TIMEOUT"`
	HealthCheck     time.Duration `envconfig:"HEALTH_CHECK_INTERVAL" default:"5s" desc:"how often /readyz's view of MySQL, Kafka and group membership is refreshed (each round bounded by it)"`
	MetricsSample   time.Duration `envconfig:"METRICS_SAMPLE_INTERVAL" default:"15s" desc:"how often consumer lag, dead letters waiting, branches in doubt and the dedup_keys row estimates are sampled for /metrics"`
	ShutdownTimeout time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"30s" desc:"bound on a graceful shutdown (SIGTERM); a second signal exits at once"`
	LogFormat       string        `envconfig:"LOG_FORMAT" default:"auto" desc:"json, text, or auto (text on a terminal, json otherwise)"`
	LogLevel        string        `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	LogProgress     time.Duration `envconfig:"LOG_PROGRESS_INTERVAL" default:"30s" desc:"a progress line (records counted, positions against the log end, rate, time to catch up) is logged at info this often while there is work; 0s disables"`

	Failpoints string `envconfig:"BILLING_FAILPOINTS" desc:"testing only: failpoints to arm, name=action[,name=action] (see internal/failpoint)"`
}

// Error lists every problem found in the environment. Load returns it; the
// command prints it and exits with status 2.
type Error struct {
	Problems []string
}

func (e *Error) Error() string {
	return "invalid configuration:\n  - " + strings.Join(e.Problems, "\n  - ")
}

// Load reads every variable and validates the result. Unlike a plain
// envconfig.Process, which stops at the first bad variable, it parses each
// field on its own (still through envconfig, so tags, defaults and required
// behave as documented) and reports all problems together as an *Error:
// every value that does not parse, every required variable missing, and
// every check of the values that did parse.
func Load() (Config, error) { return LoadScope(nil) }

// Scope names the settings a command reads: variable names, and prefixes
// ending in "_" ("MYSQL_" is every MySQL setting). nil is every setting
// (the service).
type Scope []string

// Has reports whether the setting name is in the scope.
func (s Scope) Has(name string) bool {
	if s == nil {
		return true
	}
	for _, n := range s {
		if n == name || strings.HasSuffix(n, "_") && strings.HasPrefix(name, n) {
			return true
		}
	}
	return false
}

// LoadScope is Load for a command that reads only the settings of scope:
// a setting outside it is neither required nor checked (it keeps its
// default, or its zero value when it does not parse), so that a command
// never fails on a setting it does not use (billing compare needs no
// KAFKA_BROKERS).
func LoadScope(scope Scope) (Config, error) {
	var c Config
	var problems []string
	// failed are the settings that could not be read: checks that involve
	// them are skipped, since their value is not the operator's.
	failed := map[string]bool{}
	v := reflect.ValueOf(&c).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := f.Tag.Get("envconfig")
		tag := f.Tag
		if !scope.Has(name) {
			tag = reflect.StructTag(strings.Replace(string(tag), `required:"true"`, "", 1))
		}
		one := reflect.New(reflect.StructOf([]reflect.StructField{{Name: f.Name, Type: f.Type, Tag: tag}}))
		if err := envconfig.Process("", one.Interface()); err != nil {
			failed[name] = true
			if scope.Has(name) {
				problems = append(problems, describe(f, err))
			}
			continue
		}
		v.Field(i).Set(one.Elem().Field(0))
	}
	for _, p := range c.validate() {
		if concerns(p, func(name string) bool { return failed[name] || !scope.Has(name) }) {
			continue
		}
		problems = append(problems, p)
	}
	if len(problems) > 0 {
		return c, &Error{Problems: problems}
	}
	return c, nil
}

// concerns reports whether the problem names a setting for which skip is
// true. Every problem validate reports names the settings it is about
// (TestEveryProblemNamesItsSettings), which is what lets Load skip the
// checks of settings that failed to parse or that a command does not read.
func concerns(problem string, skip func(name string) bool) bool {
	for _, name := range settingNames(problem) {
		if skip(name) {
			return true
		}
	}
	return false
}

// settingNames returns the settings a message names, as whole words.
func settingNames(msg string) []string {
	var out []string
	t := reflect.TypeFor[Config]()
	for i := 0; i < t.NumField(); i++ {
		name := t.Field(i).Tag.Get("envconfig")
		for rest := msg; ; {
			j := strings.Index(rest, name)
			if j < 0 {
				break
			}
			before, after := byte(' '), byte(' ')
			if j > 0 {
				before = rest[j-1]
			}
			if j+len(name) < len(rest) {
				after = rest[j+len(name)]
			}
			if !isNameByte(before) && !isNameByte(after) {
				out = append(out, name)
				break
			}
			rest = rest[j+len(name):]
		}
	}
	return out
}

func isNameByte(b byte) bool { return b == '_' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' }

func describe(f reflect.StructField, err error) string {
	name := f.Tag.Get("envconfig")
	var pe *envconfig.ParseError
	if errors.As(err, &pe) && f.Type == reflect.TypeFor[OptionalDuration]() {
		return fmt.Sprintf("%s=%q: not a duration (empty for none)", name, pe.Value)
	}
	if errors.As(err, &pe) && f.Type == reflect.TypeFor[time.Duration]() {
		return fmt.Sprintf("%s=%q: not a duration (such as 500ms, 30s, 1h)", name, pe.Value)
	}
	if errors.As(err, &pe) {
		return fmt.Sprintf("%s=%q: not a valid %s", name, pe.Value, pe.TypeName)
	}
	if f.Tag.Get("required") == "true" {
		if _, ok := os.LookupEnv(name); !ok {
			return fmt.Sprintf("%s is required: %s", name, f.Tag.Get("desc"))
		}
	}
	return fmt.Sprintf("%s: %v", name, err)
}

// Validate checks a configuration built in code (from Defaults, by a test
// or the benchmark) as Load checks the environment's: every problem, as an
// *Error.
func (c Config) Validate() error {
	if p := c.validate(); len(p) > 0 {
		return &Error{Problems: p}
	}
	return nil
}

// validate checks what the types cannot: ranges and relations between
// settings. It returns every problem, not the first.
func (c *Config) validate() []string {
	var p []string
	bad := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	for _, b := range c.KafkaBrokers {
		if strings.TrimSpace(b) == "" || !strings.Contains(b, ":") {
			bad("KAFKA_BROKERS: %q is not host:port", b)
		}
	}
	if c.KafkaTopic == "" || len(c.KafkaTopic) > 249 {
		bad("KAFKA_TOPIC must be 1 to 249 characters")
	}
	if c.KafkaGroup == "" || len(c.KafkaGroup) > 255 {
		bad("KAFKA_GROUP must be 1 to 255 characters")
	}
	positive := map[string]time.Duration{
		"KAFKA_SESSION_TIMEOUT":    c.KafkaSessionTimeout,
		"CHECKPOINT_INTERVAL":      c.CheckpointInterval,
		"CHECKPOINT_TIMEOUT":       c.CheckpointTimeout,
		"DEDUP_TTL":                c.DedupTTL,
		"DEDUP_CLEANUP_INTERVAL":   c.DedupCleanupInterval,
		"RECOVERY_INTERVAL":        c.RecoveryInterval,
		"DECISION_RETENTION":       c.DecisionRetention,
		"COMMIT_LOG_RETENTION":     c.CommitLogRetention,
		"SHUTDOWN_TIMEOUT":         c.ShutdownTimeout,
		"READY_MAX_CHECKPOINT_AGE": c.ReadyMaxAge,
		"HEALTH_CHECK_INTERVAL":    c.HealthCheck,
		"METRICS_SAMPLE_INTERVAL":  c.MetricsSample,
		"MAX_EVENT_TIME_SKEW":      c.MaxEventTimeSkew,
	}
	for _, name := range slices.Sorted(maps.Keys(positive)) {
		if positive[name] <= 0 {
			bad("%s must be positive, got %s", name, positive[name])
		}
	}
	p = append(p, c.securityProblems()...)
	for i, dsn := range c.DSNs() {
		name := "MYSQL_DSN"
		if i > 0 {
			name = fmt.Sprintf("MYSQL_SHARD_DSNS[%d]", i-1)
		}
		if err := mysqlconn.CheckDSN(dsn); err != nil {
			bad("%s is not a valid DSN: %v", name, err)
		}
	}
	if c.DedupTTL > 0 && (c.VersionHorizon < 0 || c.VersionHorizon > c.DedupTTL) {
		bad("VERSION_HORIZON must be 0 (half of DEDUP_TTL) up to DEDUP_TTL (%s), got %s: a version is recognised only while its event's key is kept", c.DedupTTL, c.VersionHorizon)
	}
	if c.MySQLLockWaitTimeout < time.Second {
		bad("MYSQL_LOCK_WAIT_TIMEOUT must be at least 1s (whole seconds), got %s", c.MySQLLockWaitTimeout)
	}
	if c.KafkaRebalanceTimeout <= c.CheckpointTimeout {
		bad("KAFKA_REBALANCE_TIMEOUT (%s) must exceed CHECKPOINT_TIMEOUT (%s): a revoke waits for the checkpoint in flight", c.KafkaRebalanceTimeout, c.CheckpointTimeout)
	}
	if c.CheckpointTimeout <= c.CheckpointInterval {
		bad("CHECKPOINT_TIMEOUT (%s) must exceed CHECKPOINT_INTERVAL (%s)", c.CheckpointTimeout, c.CheckpointInterval)
	}
	if c.LiveMaxAge <= c.ReadyMaxAge || c.LiveMaxAge <= c.CheckpointTimeout {
		bad("LIVENESS_MAX_CHECKPOINT_AGE (%s) must exceed READY_MAX_CHECKPOINT_AGE (%s) and CHECKPOINT_TIMEOUT (%s): an instance must be taken out of service before it is restarted", c.LiveMaxAge, c.ReadyMaxAge, c.CheckpointTimeout)
	}
	if c.DecisionRetention < 2*c.CheckpointTimeout {
		bad("DECISION_RETENTION (%s) must be at least twice CHECKPOINT_TIMEOUT", c.DecisionRetention)
	}
	if c.CommitLogRetention < c.DecisionRetention {
		bad("COMMIT_LOG_RETENTION (%s) must be at least DECISION_RETENTION (%s)", c.CommitLogRetention, c.DecisionRetention)
	}
	if p, err := c.period(); err != nil {
		bad("BILLING_WINDOW/BILLING_TIMEZONE: %v", err)
	} else if !p.Calendar() && (p.Size() < time.Second || p.Size()%time.Second != 0) {
		bad("BILLING_WINDOW must be a whole number of seconds, at least 1s, day or month, got %s", c.BillingWindow)
	}
	if c.WindowCloseAfter < 0 {
		bad("WINDOW_CLOSE_AFTER must not be negative, got %s", time.Duration(c.WindowCloseAfter))
	}
	if c.LedgerEntriesRetention < 0 {
		bad("LEDGER_ENTRIES_RETENTION must not be negative, got %s", time.Duration(c.LedgerEntriesRetention))
	}
	if c.LedgerEntriesRetention > 0 && !c.LedgerEntries {
		bad("LEDGER_ENTRIES_RETENTION is set but LEDGER_ENTRIES is false")
	}
	p = append(p, c.changelogProblems()...)
	if _, err := c.EventDecoderOptions(); err != nil {
		bad("%v", err)
	}
	ints := []struct {
		name     string
		v, lo, h int
	}{
		{"KAFKA_MAX_POLL_RECORDS", c.KafkaMaxPollRecords, 1, 1 << 20},
		{"MYSQL_BRANCHES", c.MySQLBranches, 1, 64},
		{"CHECKPOINT_MAX_RECORDS", c.CheckpointMaxRecords, 1, 10 << 20},
		{"CHECKPOINT_MAX_BYTES", c.CheckpointMaxBytes, 1 << 20, 1 << 30},
		{"DEAD_LETTER_PAYLOAD_BYTES", c.DeadLetterPayloadBytes, 0, 1 << 20},
		{"DEDUP_CACHE_KEYS", c.DedupCacheKeys, 0, 1 << 30},
		{"DEDUP_READ_AHEAD_CONNS", c.DedupReadAheadConns, 0, 4}, // pipeline.MaxReadAheadConns (TestReadAheadBoundIsThePipelines)
		{"DEDUP_CLEANUP_BATCH", c.DedupCleanupBatch, 1, 100000},
		{"MAX_PAYLOAD_BYTES", c.MaxPayloadBytes, 64, 16 << 20},
	}
	for _, i := range ints {
		if i.v < i.lo || i.v > i.h {
			bad("%s must be between %d and %d, got %d", i.name, i.lo, i.h, i.v)
		}
	}
	if len(c.MySQLShardDSNs)+1 > 16 {
		bad("at most 15 MYSQL_SHARD_DSNS")
	}
	switch c.LogFormat {
	case "auto", "json", "text":
	default:
		bad("LOG_FORMAT must be auto, json or text, got %q", c.LogFormat)
	}
	if c.LogProgress < 0 {
		bad("LOG_PROGRESS_INTERVAL must not be negative (0s disables the progress line), got %s", c.LogProgress)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		bad("LOG_LEVEL must be debug, info, warn or error, got %q", c.LogLevel)
	}
	return p
}

// changelogProblems checks the changelog's settings (only when it is on).
func (c *Config) changelogProblems() []string {
	var p []string
	bad := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	if c.ChangelogTopicPrefix == "" {
		return nil
	}
	// The longest topic is <prefix>.window_adjustments; Kafka's names are
	// at most 249 characters of [a-zA-Z0-9._-].
	if n := len(c.ChangelogTopicPrefix); n > 249-len(".window_adjustments") ||
		strings.Trim(c.ChangelogTopicPrefix, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
		bad("CHANGELOG_TOPIC_PREFIX must be at most %d characters of a-z, A-Z, 0-9, '.', '_' and '-', got %q", 249-len(".window_adjustments"), c.ChangelogTopicPrefix)
	}
	if c.ChangelogMaxBacklog < 1 {
		bad("CHANGELOG_MAX_BACKLOG must be at least 1, got %d", c.ChangelogMaxBacklog)
	}
	if c.ChangelogTxnMaxEvents < 1 || c.ChangelogTxnMaxEvents > 10_000_000 {
		bad("CHANGELOG_TRANSACTION_MAX_EVENTS must be between 1 and 10000000, got %d", c.ChangelogTxnMaxEvents)
	}
	if c.ChangelogTxnTimeout < time.Second || c.ChangelogTxnTimeout > 15*time.Minute {
		bad("CHANGELOG_TRANSACTION_TIMEOUT must be between 1s and 15m (the brokers' default transaction.max.timeout.ms), got %s", c.ChangelogTxnTimeout)
	}
	if v := c.ChangelogTopicPartitions; v != -1 && (v < 1 || v > 10000) {
		bad("CHANGELOG_TOPIC_PARTITIONS must be -1 or between 1 and 10000, got %d", v)
	}
	if v := c.ChangelogTopicReplication; v != -1 && (v < 1 || v > 32767) {
		bad("CHANGELOG_TOPIC_REPLICATION must be -1 or between 1 and 32767, got %d", v)
	}
	if c.ChangelogLease < time.Second {
		bad("CHANGELOG_LEASE must be at least 1s, got %s", c.ChangelogLease)
	}
	if c.ChangelogSnapshotIndex < 1<<20 {
		bad("CHANGELOG_SNAPSHOT_INDEX_BYTES must be at least 1048576 (1 MiB), got %d", c.ChangelogSnapshotIndex)
	}
	return p
}

// OptionalDuration is a duration whose empty value means none (zero).
type OptionalDuration time.Duration

// Decode implements envconfig.Decoder.
func (d *OptionalDuration) Decode(v string) error {
	if strings.TrimSpace(v) == "" {
		*d = 0
		return nil
	}
	x, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return err
	}
	*d = OptionalDuration(x)
	return nil
}

// String is the duration's text, empty for none.
func (d OptionalDuration) String() string {
	if d == 0 {
		return ""
	}
	return time.Duration(d).String()
}

// period parses BILLING_WINDOW in BILLING_TIMEZONE.
func (c *Config) period() (event.Period, error) {
	return event.ParsePeriod(c.BillingWindow, c.BillingTimezone)
}

// Period is the billing window these settings describe (see
// event.Period). It panics on settings Load refused: a Config comes from
// Load.
func (c Config) Period() event.Period {
	p, err := c.period()
	if err != nil {
		panic("config: invalid billing window: " + err.Error())
	}
	return p
}

// EventDecoderOptions are the options of the record decoder the EVENT_*
// settings describe; an error names the setting that is wrong.
func (c *Config) EventDecoderOptions() (format.Options, error) {
	m, err := event.ParseMapping(c.EventFields)
	if err != nil {
		return format.Options{}, fmt.Errorf("EVENT_FIELDS: %w", err)
	}
	o := format.Options{Format: c.EventFormat, Mapping: &m, MaxPayload: c.MaxPayloadBytes,
		CloudEvents: c.EventCloudEvents, CloudEventTypes: c.EventCloudEventTypes}
	if format.NeedsRegistry(c.EventFormat) {
		if o.Registry, err = c.registryOptions(); err != nil {
			return format.Options{}, err
		}
	}
	if _, err := format.New(o); err != nil {
		return format.Options{}, fmt.Errorf("EVENT_FORMAT, EVENT_FIELDS, EVENT_CLOUDEVENTS, EVENT_CLOUDEVENT_TYPES: %w", err)
	}
	return o, nil
}

// registryOptions connect to SCHEMA_REGISTRY_URL: its secret and TLS
// files read, the subject defaulted to the topic's value subject.
func (c *Config) registryOptions() (format.RegistryOptions, error) {
	o := format.RegistryOptions{URL: c.SchemaRegistryURL, Username: c.SchemaRegistryUsername, Password: c.SchemaRegistryPassword,
		Subject: c.SchemaRegistrySubject, Timeout: c.SchemaRegistryTimeout, CacheSize: c.SchemaRegistryCacheSize}
	if o.URL == "" {
		return o, fmt.Errorf("EVENT_FORMAT=%s needs SCHEMA_REGISTRY_URL", c.EventFormat)
	}
	u, err := url.Parse(o.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return o, fmt.Errorf("SCHEMA_REGISTRY_URL %q is not an http or https URL", o.URL)
	}
	if o.Subject == "" {
		o.Subject = c.KafkaTopic + "-value"
	}
	if c.SchemaRegistryPassword != "" && c.SchemaRegistryPasswordFile != "" {
		return o, errors.New("set SCHEMA_REGISTRY_PASSWORD or SCHEMA_REGISTRY_PASSWORD_FILE, not both")
	}
	if c.SchemaRegistryPasswordFile != "" {
		if o.Password, err = connfiles.ReadSecret(c.SchemaRegistryPasswordFile); err != nil {
			return o, fmt.Errorf("SCHEMA_REGISTRY_PASSWORD_FILE: %w", err)
		}
	}
	if (o.Password != "") != (o.Username != "") {
		return o, errors.New("SCHEMA_REGISTRY_USERNAME and a password go together")
	}
	files := connfiles.Files{CAFile: c.SchemaRegistryTLSCAFile, CertFile: c.SchemaRegistryTLSCertFile, KeyFile: c.SchemaRegistryTLSKeyFile}
	if files != (connfiles.Files{}) {
		if u.Scheme != "https" {
			return o, errors.New("SCHEMA_REGISTRY_TLS_* files are set but SCHEMA_REGISTRY_URL is not https")
		}
		if o.TLS, err = files.Client(""); err != nil {
			return o, fmt.Errorf("SCHEMA_REGISTRY_TLS_*: %w", err)
		}
	}
	if o.Timeout <= 0 || o.CacheSize < 1 {
		return o, errors.New("SCHEMA_REGISTRY_TIMEOUT and SCHEMA_REGISTRY_CACHE_SIZE must be positive")
	}
	return o, nil
}

// DSNs returns the control server's DSN followed by the shard servers'.
func (c *Config) DSNs() []string {
	return append([]string{c.MySQLDSN}, c.MySQLShardDSNs...)
}

// Usage writes the table of environment variables, defaults and meanings,
// its columns aligned with spaces (text/tabwriter).
func Usage(w io.Writer) error {
	var c Config
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	if err := envconfig.Usagef("", &c, tw, usageFormat); err != nil {
		return err
	}
	return tw.Flush()
}

const usageFormat = `VARIABLE	DEFAULT	MEANING
{{range .}}{{usage_key .}}	{{usage_default .}}	{{usage_description .}}{{if usage_required .}} (required){{end}}
{{end}}`

// The settings of each part a command may use, to build its Scope.

// MySQLSettings are the connection settings of the ledger's servers.
func MySQLSettings() Scope { return Scope{"MYSQL_"} }

// KafkaSettings are the connection settings of the brokers (not the topic
// or the group).
func KafkaSettings() Scope { return Scope{"KAFKA_BROKERS", "KAFKA_TLS_", "KAFKA_SASL_"} }

// LogSettings are the logger's.
func LogSettings() Scope { return Scope{"LOG_"} }

// ResultSettings are the settings that change what the ledger holds (which
// events count, where, and what is kept): the service logs them at start
// (the "configured" line), so that an operator can confirm them. A new
// setting of that kind belongs here (TestResultSettingsExist).
func ResultSettings() []string {
	return []string{
		"KAFKA_TOPIC", "KAFKA_GROUP", "ALLOW_GROUP_CHANGE", "MYSQL_SHARD_DSNS",
		"DEDUP_TTL", "BILLING_WINDOW", "BILLING_TIMEZONE", "WINDOW_CLOSE_AFTER",
		"LEDGER_ENTRIES", "LEDGER_ENTRIES_RETENTION", "MAX_PAYLOAD_BYTES", "DEAD_LETTER_PAYLOAD_BYTES",
		"CHANGELOG_TOPIC_PREFIX",
		"EVENT_FORMAT", "EVENT_FIELDS", "EVENT_CLOUDEVENTS", "EVENT_CLOUDEVENT_TYPES", "SCHEMA_REGISTRY_SUBJECT",
	}
}

// Setting returns the value of the setting name as the configuration holds
// it, in the text of its variable (a list comma separated, an empty
// optional duration empty); ok is false for an unknown name. DSNs are
// counted, never shown (they may hold a password).
func (c Config) Setting(name string) (value string, ok bool) {
	v := reflect.ValueOf(c)
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		if t.Field(i).Tag.Get("envconfig") != name {
			continue
		}
		switch f := v.Field(i).Interface().(type) {
		case []string:
			if strings.Contains(name, "DSN") {
				return fmt.Sprintf("%d server(s)", len(f)), true
			}
			return strings.Join(f, ","), true
		case fmt.Stringer:
			return f.String(), true
		default:
			if strings.Contains(name, "DSN") || strings.Contains(name, "PASSWORD") {
				return "(set)", true
			}
			return fmt.Sprint(f), true
		}
	}
	return "", false
}
