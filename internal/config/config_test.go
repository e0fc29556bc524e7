package config

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/pipeline"
)

// setenv sets exactly kv: every variable Config reads is unset first, so
// that the environment of the test process (make test exports MYSQL_DSN and
// KAFKA_BROKERS) cannot leak in.
func setenv(t *testing.T, kv map[string]string) {
	t.Helper()
	typ := reflect.TypeOf(Config{})
	for i := 0; i < typ.NumField(); i++ {
		if name := typ.Field(i).Tag.Get("envconfig"); name != "" {
			t.Setenv(name, "") // restores the old value after the test
			os.Unsetenv(name)
		}
	}
	for k, v := range kv {
		t.Setenv(k, v)
	}
}

func TestLoadDefaults(t *testing.T) {
	setenv(t, map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092,127.0.0.1:9093", "MYSQL_DSN": "u:p@tcp(127.0.0.1:3306)/billing"})
	c, err := Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if len(c.KafkaBrokers) != 2 || c.CheckpointInterval != time.Second || c.DedupTTL != 24*time.Hour || c.Period().String() != "1h0m0s" ||
		c.WindowCloseAfter != 0 || c.LedgerEntries || c.LedgerEntriesRetention != 0 {
		t.Fatalf("unexpected defaults: %+v", c)
	}
	if got := c.DSNs(); len(got) != 1 || got[0] != c.MySQLDSN {
		t.Fatalf("DSNs() = %v", got)
	}
}

// Every problem is reported at once: values that do not parse, a missing
// required variable and the checks of the values that did parse, in one
// message (issue 22: `CHECKPOINT_INTERVAL=fast DEDUP_TTL=-1h LOG_LEVEL=loud
// BILLING_WINDOW=week` reported only the first). A check that involves a
// value that did not parse is not made: its zero value is not the
// operator's (no "CHECKPOINT_TIMEOUT must exceed CHECKPOINT_INTERVAL (0s)").
func TestLoadListsEveryProblem(t *testing.T) {
	setenv(t, map[string]string{
		"KAFKA_BROKERS":       "127.0.0.1:9092",
		"CHECKPOINT_INTERVAL": "fast",
		"DEDUP_TTL":           "-1h",
		"LOG_LEVEL":           "loud",
		"BILLING_WINDOW":      "week",
		"MYSQL_BRANCHES":      "many",
		"LOG_FORMAT":          "xml",
	})
	_, err := Load()
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("want *Error, got %v", err)
	}
	want := []string{
		`CHECKPOINT_INTERVAL="fast": not a duration`,
		`MYSQL_BRANCHES="many": not a valid int`,
		"MYSQL_DSN is required",
		"DEDUP_TTL must be positive, got -1h0m0s",
		`LOG_LEVEL must be debug, info, warn or error, got "loud"`,
		`BILLING_WINDOW/BILLING_TIMEZONE: window "week"`,
		`LOG_FORMAT must be auto, json or text, got "xml"`,
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("message lacks %q:\n%s", w, err)
		}
	}
	if len(ce.Problems) != len(want) {
		t.Errorf("%d problems, want %d (one per setting, none about the zero value of one that did not parse):\n%s", len(ce.Problems), len(want), err)
	}
}

// TestEveryProblemNamesItsSettings: Load skips the checks that involve a
// setting that did not parse or that the command does not read by finding
// the settings named in each problem; a problem that names none would be
// reported to every command. Every check of validate is triggered here.
func TestEveryProblemNamesItsSettings(t *testing.T) {
	file := filepath.Join(t.TempDir(), "absent")
	setenv(t, map[string]string{
		"KAFKA_BROKERS": "nohostport", "KAFKA_TOPIC": strings.Repeat("t", 250), "KAFKA_GROUP": strings.Repeat("g", 256),
		"KAFKA_SESSION_TIMEOUT": "0s", "KAFKA_REBALANCE_TIMEOUT": "1s", "CHECKPOINT_INTERVAL": "40s", "CHECKPOINT_TIMEOUT": "30s",
		"DEDUP_TTL": "0s", "MYSQL_DSN": "u:p@tcp(h/d", "MYSQL_SHARD_DSNS": strings.Repeat("x,", 16) + "x", "MYSQL_LOCK_WAIT_TIMEOUT": "10ms",
		"LIVENESS_MAX_CHECKPOINT_AGE": "1s", "DECISION_RETENTION": "1s", "BILLING_WINDOW": "1500ms", "WINDOW_CLOSE_AFTER": "-1h",
		"LEDGER_ENTRIES_RETENTION": "-1h", "MYSQL_BRANCHES": "0", "LOG_FORMAT": "xml", "LOG_LEVEL": "loud",
		"KAFKA_TLS_CA_FILE": file, "KAFKA_TLS_CERT_FILE": file, "KAFKA_SASL_PASSWORD": "x", "MYSQL_TLS": "sometimes",
	})
	_, err := Load()
	var ce *Error
	if !errors.As(err, &ce) || len(ce.Problems) < 20 {
		t.Fatalf("want many problems, got %v", err)
	}
	for _, p := range ce.Problems {
		if len(settingNames(p)) == 0 {
			t.Errorf("problem names no setting: %q", p)
		}
	}
	// A name inside another is not a mention: MYSQL_TLS is not named by
	// MYSQL_TLS_CA_FILE.
	if got := settingNames("MYSQL_TLS_CA_FILE: x"); len(got) != 1 || got[0] != "MYSQL_TLS_CA_FILE" {
		t.Errorf("settingNames = %v", got)
	}
}

// TestLoadScope: a command reads and checks only its settings. Without
// KAFKA_BROKERS and with broken Kafka and service settings, the MySQL
// settings load; a problem of one of its own settings is still reported,
// and one that involves a setting outside the scope is not.
func TestLoadScope(t *testing.T) {
	scope := Scope{"MYSQL_", "LOG_", "KAFKA_TOPIC"}
	setenv(t, map[string]string{
		"MYSQL_DSN": "u:p@tcp(127.0.0.1:3306)/billing", "KAFKA_SASL_MECHANISM": "PLAIN",
		"CHECKPOINT_INTERVAL": "fast", "KAFKA_REBALANCE_TIMEOUT": "1s", "KAFKA_TOPIC": "events",
	})
	c, err := LoadScope(scope)
	if err != nil {
		t.Fatalf("LoadScope: %v", err)
	}
	if c.MySQLDSN == "" || c.KafkaTopic != "events" || c.MySQLBranches != 2 {
		t.Errorf("settings in scope not read, or defaults missing: %+v", c)
	}
	if _, err := Load(); err == nil || !strings.Contains(err.Error(), "KAFKA_BROKERS is required") || !strings.Contains(err.Error(), "CHECKPOINT_INTERVAL") {
		t.Errorf("Load (every setting) = %v; want KAFKA_BROKERS and CHECKPOINT_INTERVAL reported", err)
	}
	t.Setenv("MYSQL_BRANCHES", "0")
	t.Setenv("LOG_LEVEL", "loud")
	_, err = LoadScope(scope)
	if err == nil || !strings.Contains(err.Error(), "MYSQL_BRANCHES must be between") || !strings.Contains(err.Error(), "LOG_LEVEL") {
		t.Fatalf("want the problems of MYSQL_BRANCHES and LOG_LEVEL, got %v", err)
	}
	if strings.Contains(err.Error(), "KAFKA_") || strings.Contains(err.Error(), "CHECKPOINT_") {
		t.Errorf("a problem outside the scope was reported: %v", err)
	}
}

func TestValidate(t *testing.T) {
	base := func() map[string]string {
		return map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092", "MYSQL_DSN": "u:p@tcp(127.0.0.1:3306)/billing"}
	}
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"negative ttl", map[string]string{"DEDUP_TTL": "-1h"}, "DEDUP_TTL must be positive"},
		{"horizon past the ttl", map[string]string{"DEDUP_TTL": "1h", "VERSION_HORIZON": "2h"}, "VERSION_HORIZON must be 0 (half of DEDUP_TTL) up to DEDUP_TTL"},
		{"negative horizon", map[string]string{"VERSION_HORIZON": "-1s"}, "VERSION_HORIZON must be 0"},
		{"liveness before readiness", map[string]string{"LIVENESS_MAX_CHECKPOINT_AGE": "30s"}, "LIVENESS_MAX_CHECKPOINT_AGE (30s) must exceed READY_MAX_CHECKPOINT_AGE"},
		{"liveness within the checkpoint timeout", map[string]string{"LIVENESS_MAX_CHECKPOINT_AGE": "90s", "CHECKPOINT_TIMEOUT": "2m", "KAFKA_REBALANCE_TIMEOUT": "3m"}, "must exceed READY_MAX_CHECKPOINT_AGE (1m0s) and CHECKPOINT_TIMEOUT (2m0s)"},
		{"no health checks", map[string]string{"HEALTH_CHECK_INTERVAL": "0s"}, "HEALTH_CHECK_INTERVAL must be positive"},
		{"broker without port", map[string]string{"KAFKA_BROKERS": "localhost"}, "is not host:port"},
		{"rebalance shorter than checkpoint", map[string]string{"KAFKA_REBALANCE_TIMEOUT": "10s"}, "must exceed CHECKPOINT_TIMEOUT"},
		{"fractional window", map[string]string{"BILLING_WINDOW": "1500ms"}, "BILLING_WINDOW must be a whole number of seconds"},
		{"unknown period", map[string]string{"BILLING_WINDOW": "week"}, `window "week": want a duration (1h), day or month`},
		{"unknown zone", map[string]string{"BILLING_WINDOW": "month", "BILLING_TIMEZONE": "Europe/Berln"}, `time zone "Europe/Berln"`},
		{"negative close", map[string]string{"WINDOW_CLOSE_AFTER": "-1h"}, "WINDOW_CLOSE_AFTER must not be negative"},
		{"close not a duration", map[string]string{"WINDOW_CLOSE_AFTER": "tomorrow"}, `WINDOW_CLOSE_AFTER="tomorrow": not a duration`},
		{"retention without entries", map[string]string{"LEDGER_ENTRIES_RETENTION": "720h"}, "LEDGER_ENTRIES is false"},
		{"branches", map[string]string{"MYSQL_BRANCHES": "0"}, "MYSQL_BRANCHES must be between 1 and 64"},
		{"log format", map[string]string{"LOG_FORMAT": "xml"}, "LOG_FORMAT must be"},
		{"interval beyond timeout", map[string]string{"CHECKPOINT_INTERVAL": "1m"}, "CHECKPOINT_TIMEOUT (30s) must exceed CHECKPOINT_INTERVAL"},
		{"bad DSN", map[string]string{"MYSQL_DSN": "u:p@tcp(h/d"}, "MYSQL_DSN is not a valid DSN"},
		{"bad shard DSN", map[string]string{"MYSQL_SHARD_DSNS": "u:p@tcp(h:1)/d,nonsense"}, "MYSQL_SHARD_DSNS[1] is not a valid DSN"},
		{"sample interval", map[string]string{"METRICS_SAMPLE_INTERVAL": "0s"}, "METRICS_SAMPLE_INTERVAL must be positive"},
		{"changelog prefix not a topic name", map[string]string{"CHANGELOG_TOPIC_PREFIX": "bill ing"}, "CHANGELOG_TOPIC_PREFIX must be at most 230 characters"},
		{"changelog prefix too long", map[string]string{"CHANGELOG_TOPIC_PREFIX": strings.Repeat("p", 231)}, "CHANGELOG_TOPIC_PREFIX must be at most 230 characters"},
		{"changelog backlog", map[string]string{"CHANGELOG_TOPIC_PREFIX": "cl", "CHANGELOG_MAX_BACKLOG": "0"}, "CHANGELOG_MAX_BACKLOG must be at least 1"},
		{"changelog transaction", map[string]string{"CHANGELOG_TOPIC_PREFIX": "cl", "CHANGELOG_TRANSACTION_MAX_EVENTS": "0"}, "CHANGELOG_TRANSACTION_MAX_EVENTS must be between"},
		{"changelog timeout", map[string]string{"CHANGELOG_TOPIC_PREFIX": "cl", "CHANGELOG_TRANSACTION_TIMEOUT": "1h"}, "CHANGELOG_TRANSACTION_TIMEOUT must be between 1s and 15m"},
		{"changelog partitions", map[string]string{"CHANGELOG_TOPIC_PREFIX": "cl", "CHANGELOG_TOPIC_PARTITIONS": "0"}, "CHANGELOG_TOPIC_PARTITIONS must be -1 or"},
		{"changelog replication", map[string]string{"CHANGELOG_TOPIC_PREFIX": "cl", "CHANGELOG_TOPIC_REPLICATION": "-2"}, "CHANGELOG_TOPIC_REPLICATION must be -1 or"},
		{"changelog lease", map[string]string{"CHANGELOG_TOPIC_PREFIX": "cl", "CHANGELOG_LEASE": "100ms"}, "CHANGELOG_LEASE must be at least 1s"},
		{"changelog snapshot index", map[string]string{"CHANGELOG_TOPIC_PREFIX": "cl", "CHANGELOG_SNAPSHOT_INDEX_BYTES": "1000"}, "CHANGELOG_SNAPSHOT_INDEX_BYTES must be at least 1048576"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := base()
			for k, v := range tt.env {
				env[k] = v
			}
			setenv(t, env)
			_, err := Load()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("want error containing %q, got %v", tt.want, err)
			}
		})
	}
}

// The periods settings: calendar months in a zone, windows that close, and
// empty values (as docker compose passes unset variables) meaning none.
func TestPeriodSettings(t *testing.T) {
	setenv(t, map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092", "MYSQL_DSN": "u:p@tcp(127.0.0.1:3306)/billing",
		"BILLING_WINDOW": "month", "BILLING_TIMEZONE": "Europe/Berlin", "WINDOW_CLOSE_AFTER": "36h",
		"LEDGER_ENTRIES": "true", "LEDGER_ENTRIES_RETENTION": "2160h"})
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.Period().String() != "month in Europe/Berlin" || time.Duration(c.WindowCloseAfter) != 36*time.Hour || !c.LedgerEntries || time.Duration(c.LedgerEntriesRetention) != 90*24*time.Hour {
		t.Fatalf("period settings: window %v, close after %v, entries %v, retention %v", c.Period(), c.WindowCloseAfter, c.LedgerEntries, c.LedgerEntriesRetention)
	}
	setenv(t, map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092", "MYSQL_DSN": "u:p@tcp(127.0.0.1:3306)/billing",
		"WINDOW_CLOSE_AFTER": "", "LEDGER_ENTRIES_RETENTION": " "})
	c, err = Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.WindowCloseAfter != 0 || c.LedgerEntriesRetention != 0 {
		t.Fatalf("empty values: close after %v, retention %v", c.WindowCloseAfter, c.LedgerEntriesRetention)
	}
}

func TestUsageListsEveryVariable(t *testing.T) {
	var b strings.Builder
	if err := Usage(&b); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"KAFKA_BROKERS", "MYSQL_DSN", "CHECKPOINT_INTERVAL", "DEDUP_TTL", "BILLING_WINDOW", "MYSQL_SHARD_DSNS"} {
		if !strings.Contains(b.String(), v) {
			t.Errorf("usage lacks %s", v)
		}
	}
}

// TestSecurityValidation covers the TLS, SASL and secret-file settings: each
// misconfiguration is reported, and no message contains a secret.
func TestSecurityValidation(t *testing.T) {
	const secret = "hunter2-secret"
	dir := t.TempDir()
	file := filepath.Join(dir, "f.pem")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092", "MYSQL_DSN": "u:" + secret + "@tcp(127.0.0.1:3306)/billing"}
	tests := []struct {
		name string
		env  map[string]string
		want string // empty: valid
	}{
		{"scram with password", map[string]string{"KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": secret}, ""},
		{"scram with password file", map[string]string{"KAFKA_SASL_MECHANISM": "scram-sha-256", "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD_FILE": file}, ""},
		{"plain with tls", map[string]string{"KAFKA_TLS_ENABLED": "true", "KAFKA_TLS_CA_FILE": file, "KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": secret}, ""},
		{"mysql tls with CA and password file", map[string]string{"MYSQL_TLS": "true", "MYSQL_TLS_CA_FILE": file, "MYSQL_PASSWORD_FILE": file}, ""},
		{"plain without tls", map[string]string{"KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": secret}, "sends the password in clear"},
		{"unknown mechanism", map[string]string{"KAFKA_SASL_MECHANISM": "GSSAPI", "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": secret}, "KAFKA_SASL_MECHANISM must be"},
		{"no user", map[string]string{"KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "KAFKA_SASL_PASSWORD": secret}, "needs KAFKA_SASL_USERNAME"},
		{"no password", map[string]string{"KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "KAFKA_SASL_USERNAME": "u"}, "needs KAFKA_SASL_PASSWORD or KAFKA_SASL_PASSWORD_FILE"},
		{"both passwords", map[string]string{"KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": secret, "KAFKA_SASL_PASSWORD_FILE": file}, "not both"},
		{"password without mechanism", map[string]string{"KAFKA_SASL_PASSWORD": secret}, "KAFKA_SASL_MECHANISM is empty"},
		{"tls file without tls", map[string]string{"KAFKA_TLS_CA_FILE": file}, "KAFKA_TLS_CA_FILE is set but KAFKA_TLS_ENABLED is false"},
		{"kafka cert without key", map[string]string{"KAFKA_TLS_ENABLED": "true", "KAFKA_TLS_CERT_FILE": file}, "KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE go together"},
		{"missing file", map[string]string{"MYSQL_PASSWORD_FILE": filepath.Join(dir, "absent")}, "MYSQL_PASSWORD_FILE: stat"},
		{"directory as file", map[string]string{"KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD_FILE": dir}, "is a directory"},
		{"mysql tls mode", map[string]string{"MYSQL_TLS": "required"}, "MYSQL_TLS must be"},
		{"mysql CA without verify", map[string]string{"MYSQL_TLS": "skip-verify", "MYSQL_TLS_CA_FILE": file}, "needs TLS mode true"},
		{"bad DSN keeps its password", map[string]string{"MYSQL_DSN": "u:" + secret + "@tcp(h:1)/d?tls=" + secret}, "MYSQL_DSN is not a valid DSN"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := maps.Clone(base)
			maps.Copy(env, tt.env)
			setenv(t, env)
			_, err := Load()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("want error containing %q, got %v", tt.want, err)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error leaks a secret: %v", err)
			}
		})
	}
}

// TestUsageAligned: --help prints one row per variable, columns aligned.
func TestUsageAligned(t *testing.T) {
	var b strings.Builder
	if err := Usage(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if n := reflect.TypeFor[Config]().NumField(); len(lines) != n+1 {
		t.Fatalf("%d lines, want a header and %d variables", len(lines), n)
	}
	head := lines[0]
	defCol, meanCol := strings.Index(head, "DEFAULT"), strings.Index(head, "MEANING")
	if !strings.HasPrefix(head, "VARIABLE ") || defCol < 0 || meanCol < defCol {
		t.Fatalf("bad header %q", head)
	}
	for _, l := range lines[1:] {
		if strings.Contains(l, "\t") {
			t.Fatalf("tab left in %q", l)
		}
		// The meaning starts at the MEANING column, after blanks.
		if len(l) <= meanCol || l[meanCol-1] != ' ' || l[meanCol] == ' ' {
			t.Errorf("meaning not aligned at column %d: %q", meanCol, l)
		}
		// The default, if any, starts at the DEFAULT column.
		if def := l[defCol:meanCol]; l[defCol-1] != ' ' || strings.TrimSpace(def) != "" && def[0] == ' ' {
			t.Errorf("default not aligned at column %d: %q", defCol, l)
		}
	}
	if !regexp.MustCompile(`(?m)^CHECKPOINT_INTERVAL +1s +a checkpoint`).MatchString(b.String()) {
		t.Errorf("defaults missing or misaligned:\n%s", b.String())
	}
}

// TestDefaultsAreLoads: Defaults, read from the tags without the
// environment, is what Load reads from an environment that sets only the
// required variables, setting by setting.
func TestDefaultsAreLoads(t *testing.T) {
	required := map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092", "MYSQL_DSN": "u:p@tcp(127.0.0.1:3306)/billing"}
	setenv(t, required)
	loaded, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	d := Defaults()
	if len(d.KafkaBrokers) != 0 || d.MySQLDSN != "" {
		t.Errorf("Defaults has required settings: %v %q", d.KafkaBrokers, d.MySQLDSN)
	}
	d.KafkaBrokers, d.MySQLDSN = loaded.KafkaBrokers, loaded.MySQLDSN
	lv, dv := reflect.ValueOf(loaded), reflect.ValueOf(d)
	for i := 0; i < lv.NumField(); i++ {
		name := lv.Type().Field(i).Tag.Get("envconfig")
		if !reflect.DeepEqual(lv.Field(i).Interface(), dv.Field(i).Interface()) {
			t.Errorf("%s: Defaults has %#v, Load %#v", name, dv.Field(i).Interface(), lv.Field(i).Interface())
		}
	}
	if problems := d.validate(); len(problems) != 0 {
		t.Errorf("the defaults (with the required settings) are invalid: %q", problems)
	}
	// It reads no environment.
	t.Setenv("CHECKPOINT_INTERVAL", "7s")
	if got := Defaults().CheckpointInterval; got != time.Second {
		t.Errorf("with CHECKPOINT_INTERVAL=7s, Defaults has %s", got)
	}
}

// TestWithReadsAsLoad: a configuration built from Defaults and settings
// in code is the one Load reads from an environment of the same settings,
// for every kind of field (and an unknown name or a bad value is refused,
// naming it).
func TestWithReadsAsLoad(t *testing.T) {
	vars := map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092,127.0.0.1:9093", "MYSQL_DSN": "u:p@tcp(127.0.0.1:3306)/billing",
		"MYSQL_SHARD_DSNS": "u:p@tcp(h:1)/a", "CHECKPOINT_INTERVAL": "250ms", "MYSQL_BRANCHES": "0x3", "LEDGER_ENTRIES": "1",
		"LEDGER_ENTRIES_RETENTION": " 48h ", "WINDOW_CLOSE_AFTER": "", "BILLING_WINDOW": "day", "BILLING_TIMEZONE": "Europe/Berlin", "HTTP_ADDR": ""}
	setenv(t, vars)
	loaded, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	built, err := Defaults().With(vars)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(loaded, built) {
		t.Errorf("With:\n%+v\nLoad:\n%+v", built, loaded)
	}
	if env := Environment(); !reflect.DeepEqual(env, vars) {
		t.Errorf("Environment() = %v, want what was set: %v", env, vars)
	}
	_, err = Defaults().With(map[string]string{"NO_SUCH_SETTING": "1", "MYSQL_BRANCHES": "many"})
	var ce *Error
	if !errors.As(err, &ce) || len(ce.Problems) != 2 || !strings.Contains(err.Error(), "NO_SUCH_SETTING") || !strings.Contains(err.Error(), "MYSQL_BRANCHES") {
		t.Errorf("bad settings: %v", err)
	}
}

// settingsReference is the operators' reference of every setting; the
// README shows the few every deployment sets, in the same table format.
const settingsReference = "../../docs/configuration.md"

// settingRows returns the settings a doc's tables show, by name, with
// the default each row shows.
func settingRows(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([A-Z0-9_]+)` \\| (`([^`]*)`)? \\|")
	shown := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		shown[m[1]] = m[3]
	}
	return shown
}

// TestReadmeShowsTheDefaults: the settings reference (docs/configuration.md)
// has a row for every variable, and it and the README's table of the
// settings every deployment sets show each variable's default as its tag
// (the one home of the default) spells it; the README's rows are
// settings.
func TestReadmeShowsTheDefaults(t *testing.T) {
	typ := reflect.TypeOf(Config{})
	tags := map[string]string{}
	for i := 0; i < typ.NumField(); i++ {
		tags[typ.Field(i).Tag.Get("envconfig")] = typ.Field(i).Tag.Get("default")
	}
	ref := settingRows(t, settingsReference)
	for name, want := range tags {
		got, ok := ref[name]
		if !ok {
			t.Errorf("%s has no row for %s", settingsReference, name)
			continue
		}
		if got != want {
			t.Errorf("%s shows the default of %s as %q, its tag is %q", settingsReference, name, got, want)
		}
	}
	for name := range ref {
		if _, ok := tags[name]; !ok {
			t.Errorf("%s has a row for %s, which is not a setting", settingsReference, name)
		}
	}
	readme := settingRows(t, "../../README.md")
	if len(readme) < 5 {
		t.Fatalf("README.md shows %d settings: its table of the settings every deployment sets is gone", len(readme))
	}
	for name, got := range readme {
		want, ok := tags[name]
		switch {
		case !ok:
			t.Errorf("README.md has a row for %s, which is not a setting", name)
		case got != want:
			t.Errorf("README.md shows the default of %s as %q, its tag is %q", name, got, want)
		}
	}
}

// The settings reference is the operators' reference: every variable must
// be in it.
func TestReadmeListsEveryVariable(t *testing.T) {
	ref, err := os.ReadFile(settingsReference)
	if err != nil {
		t.Fatal(err)
	}
	typ := reflect.TypeOf(Config{})
	for i := 0; i < typ.NumField(); i++ {
		name := typ.Field(i).Tag.Get("envconfig")
		if !strings.Contains(string(ref), "`"+name+"`") {
			t.Errorf("%s does not document %s", settingsReference, name)
		}
	}
}

// TestResultSettingsExist: the settings the "configured" line shows are
// settings, with their values as the variables spell them, and no DSN is
// shown.
func TestResultSettingsExist(t *testing.T) {
	setenv(t, map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092", "MYSQL_DSN": "u:secret@tcp(127.0.0.1:3306)/billing",
		"MYSQL_SHARD_DSNS": "u:secret@tcp(h:1)/a,u:secret@tcp(h:2)/b", "BILLING_WINDOW": "month", "BILLING_TIMEZONE": "Europe/Berlin",
		"WINDOW_CLOSE_AFTER": "48h", "LEDGER_ENTRIES": "true"})
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"BILLING_WINDOW": "month", "BILLING_TIMEZONE": "Europe/Berlin", "WINDOW_CLOSE_AFTER": "48h0m0s",
		"LEDGER_ENTRIES": "true", "LEDGER_ENTRIES_RETENTION": "", "DEDUP_TTL": "24h0m0s", "MYSQL_SHARD_DSNS": "2 server(s)", "KAFKA_GROUP": "billing-ledger"}
	for _, name := range ResultSettings() {
		v, ok := c.Setting(name)
		if !ok {
			t.Errorf("%s is not a setting", name)
		}
		if strings.Contains(v, "secret") {
			t.Errorf("%s shows a secret: %q", name, v)
		}
		if w, ok := want[name]; ok && v != w {
			t.Errorf("%s = %q, want %q", name, v, w)
		}
	}
	if _, ok := c.Setting("NO_SUCH_SETTING"); ok {
		t.Error("an unknown setting has a value")
	}
}

// TestDocsNameOnlyRealSettings: every setting the operator's docs name
// exists (a setting renamed or removed cannot linger in them), and the
// production checklist's table of settings every instance must share has
// every setting that changes results (ResultSettings).
func TestDocsNameOnlyRealSettings(t *testing.T) {
	names := map[string]bool{}
	typ := reflect.TypeOf(Config{})
	for i := 0; i < typ.NumField(); i++ {
		names[typ.Field(i).Tag.Get("envconfig")] = true
	}
	// Words of the docs shaped like settings that are not: columns of
	// billing status.
	notSettings := map[string]bool{"LOG_START": true, "LOG_END": true}
	re := regexp.MustCompile(`\b(KAFKA|MYSQL|CHECKPOINT|DEDUP|BILLING|WINDOW|LEDGER|MAX|DEAD_LETTER|RECOVERY|DECISION|HTTP|READY|LIVENESS|HEALTH|METRICS|SHUTDOWN|LOG|ALLOW|EVENT|SCHEMA_REGISTRY)_[A-Z0-9_]*[A-Z0-9]\b`)
	found := 0
	// The pages that speak of the service's settings (docker.md and
	// chaos.md also name other programs' variables: the images', the
	// local services' ports).
	docs := []string{"README.md", "docs/configuration.md", "docs/contract.md", "docs/design.md", "docs/testing.md",
		"docs/operations.md", "docs/production.md", "docs/periods.md", "docs/changelog.md", "docs/performance.md"}
	for _, doc := range docs {
		doc = "../../" + doc
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range re.FindAllString(string(b), -1) {
			found++
			if !names[name] && !notSettings[name] {
				t.Errorf("%s names %s, which is not a setting", doc, name)
			}
		}
	}
	if found < 100 {
		t.Fatalf("found %d mentions of settings: the pattern lost them", found)
	}
	b, err := os.ReadFile("../../docs/production.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "## 3. Settings every instance must share")
	table, _, _ = strings.Cut(table, "\n## ")
	if !ok {
		t.Fatal("docs/production.md has no section of the settings every instance must share")
	}
	for _, name := range ResultSettings() {
		if !strings.Contains(table, "`"+name+"`") {
			t.Errorf("docs/production.md does not list %s among the settings every instance must share", name)
		}
	}
}

// DEDUP_READ_AHEAD_CONNS has the pipeline's bound: what Load accepts,
// pipeline.New accepts.
func TestReadAheadBoundIsThePipelines(t *testing.T) {
	for n, ok := range map[int]bool{-1: false, 0: true, pipeline.MaxReadAheadConns: true, pipeline.MaxReadAheadConns + 1: false} {
		setenv(t, map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092", "MYSQL_DSN": "u:p@tcp(127.0.0.1:3306)/billing",
			"DEDUP_READ_AHEAD_CONNS": strconv.Itoa(n)})
		if _, err := Load(); (err == nil) != ok {
			t.Errorf("DEDUP_READ_AHEAD_CONNS=%d: %v, want accepted %v", n, err, ok)
		}
	}
}

// The EVENT_* settings are checked at load: a mapping, format or filter no
// decoder can be built from is refused, naming the setting.
func TestEventSettingsChecked(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"EVENT_FIELDS": "account_id=data.customer.id", "EVENT_CLOUDEVENTS": "true", "EVENT_CLOUDEVENT_TYPES": "a,b"}, ""},
		{map[string]string{"EVENT_FIELDS": "account_id"}, "EVENT_FIELDS"},
		{map[string]string{"EVENT_FORMAT": "xml"}, "unknown format"},
		{map[string]string{"EVENT_CLOUDEVENT_TYPES": "a"}, "needs CloudEvents"},
		{map[string]string{"EVENT_CLOUDEVENTS": "true", "EVENT_FIELDS": "event_id=id"}, "cannot name event_id"},
		{map[string]string{"EVENT_FORMAT": "avro"}, "needs SCHEMA_REGISTRY_URL"},
		{map[string]string{"EVENT_FORMAT": "avro", "SCHEMA_REGISTRY_URL": "localhost:8081"}, "not an http or https URL"},
		{map[string]string{"EVENT_FORMAT": "avro", "SCHEMA_REGISTRY_URL": "http://r:8081", "SCHEMA_REGISTRY_USERNAME": "u"}, "go together"},
		{map[string]string{"EVENT_FORMAT": "avro", "SCHEMA_REGISTRY_URL": "http://r:8081", "SCHEMA_REGISTRY_TLS_CA_FILE": "config_test.go"}, "not https"},
		{map[string]string{"EVENT_FORMAT": "avro", "SCHEMA_REGISTRY_URL": "https://r:8081", "SCHEMA_REGISTRY_USERNAME": "u", "SCHEMA_REGISTRY_PASSWORD_FILE": "config_test.go"}, ""},
	} {
		env := map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092", "MYSQL_DSN": "u:p@tcp(127.0.0.1:3306)/billing"}
		maps.Copy(env, c.env)
		setenv(t, env)
		_, err := Load()
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%v: %v, want %q", c.env, err, c.want)
		}
	}
}
