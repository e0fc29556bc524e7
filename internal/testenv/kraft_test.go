package testenv

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The KRaft cluster id of a fresh Kafka (issue 18): 16 random bytes in
// URL-safe base64, so one id in 64 starts with "-", which Kafka's storage
// tool took for an option when the id came as `-t "$id"`: one fresh
// machine in 64 could not start Kafka. scripts/kafka/format-storage is the
// one place that makes an id and passes it (--cluster-id=ID), for
// scripts/services.sh and the local Kafka image; this package's
// containers make their own (clusterID) for images whose scripts are not
// ours.

const repoRoot = "../.."

// kafkaLibs is the broker's classpath that scripts/services.sh resolves
// (KAFKA_LIBS, else the checkout's .services/kafka/libs); the test is
// skipped without it, and fails under CI=true.
func kafkaLibs(t *testing.T) string {
	t.Helper()
	libs := os.Getenv("KAFKA_LIBS")
	if libs == "" {
		libs = filepath.Join(repoRoot, ".services", "kafka", "libs")
	}
	jars, _ := filepath.Glob(filepath.Join(libs, "kafka_2.13-*.jar"))
	_, javaErr := exec.LookPath("java")
	if len(jars) == 0 || javaErr != nil {
		msg := fmt.Sprintf("needs Kafka's jars (KAFKA_LIBS or %s, from `make services`) and java", libs)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	abs, err := filepath.Abs(libs)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// kraftConfig writes a one-node broker-and-controller configuration whose
// log directory is under dir (the storage tool binds no port).
func kraftConfig(t *testing.T, dir string) (config, data string) {
	t.Helper()
	data = filepath.Join(dir, "data")
	config = filepath.Join(dir, "server.properties")
	props := "process.roles=broker,controller\nnode.id=1\ncontroller.quorum.voters=1@127.0.0.1:1\n" +
		"listeners=PLAINTEXT://127.0.0.1:2,CONTROLLER://127.0.0.1:1\ncontroller.listener.names=CONTROLLER\n" +
		"listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\ninter.broker.listener.name=PLAINTEXT\nlog.dirs=" + data + "\n"
	if err := os.WriteFile(config, []byte(props), 0o644); err != nil {
		t.Fatal(err)
	}
	return config, data
}

// formatStorage runs scripts/kafka/format-storage (id "" lets it make one)
// and returns its output.
func formatStorage(t *testing.T, libs, config, id string) (string, error) {
	t.Helper()
	log4j := filepath.Join(t.TempDir(), "log4j2-tools.properties")
	if err := os.WriteFile(log4j, []byte("status = warn\nappender.err.type = Console\nappender.err.name = err\nappender.err.target = SYSTEM_ERR\n"+
		"appender.err.layout.type = PatternLayout\nappender.err.layout.pattern = %p %m%n\nrootLogger.level = warn\nrootLogger.appenderRef.err.ref = err\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{libs, log4j, config}
	if id != "" {
		args = append(args, id)
	}
	out, err := exec.Command(filepath.Join(repoRoot, "scripts", "kafka", "format-storage"), args...).CombinedOutput()
	return string(out), err
}

// storedID is the cluster id a formatted log directory holds.
func storedID(t *testing.T, data string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(data, "meta.properties"))
	if err != nil {
		t.Fatalf("no meta.properties: %v", err)
	}
	m := regexp.MustCompile(`(?m)^cluster\.id=(.*)$`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("meta.properties has no cluster.id:\n%s", b)
	}
	return m[1]
}

// dashID is a valid cluster id (16 bytes, URL-safe base64) that starts
// with "-" (62 in the URL-safe alphabet).
func dashID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[0] = 62<<2 | b[0]&3
	return base64.RawURLEncoding.EncodeToString(b)
}

// The format step, with the real storage tool from the broker's jars, in a
// temporary directory (the running broker is not touched): ids that start
// with "-", the one seen on a fresh machine among them, are stored as
// given; without an id a new one is made, never starting with "-"; a
// second run with it changes nothing. The old invocation (-t ID) fails on the
// same ids, which is what this guards against.
func TestFormatStorageTakesIdsStartingWithADash(t *testing.T) {
	libs := kafkaLibs(t)
	for _, id := range []string{"--yJugIwJkqY0R6q-WuXLw", dashID(), dashID()} {
		t.Run(id, func(t *testing.T) {
			config, data := kraftConfig(t, t.TempDir())
			if out, err := formatStorage(t, libs, config, id); err != nil {
				t.Fatalf("format-storage with %q: %v\n%s", id, err, out)
			}
			if got := storedID(t, data); got != id {
				t.Fatalf("stored cluster id %q, want %q", got, id)
			}
		})
	}
	t.Run("made here", func(t *testing.T) {
		config, data := kraftConfig(t, t.TempDir())
		out, err := formatStorage(t, libs, config, "")
		if err != nil {
			t.Fatalf("format-storage: %v\n%s", err, out)
		}
		id := storedID(t, data)
		if b, err := base64.RawURLEncoding.DecodeString(id); err != nil || len(b) != 16 || strings.HasPrefix(id, "-") {
			t.Fatalf("made cluster id %q (%v): want 16 bytes of URL-safe base64 not starting with -", id, err)
		}
		if !strings.Contains(out, "cluster id "+id) {
			t.Errorf("format-storage did not say the id it used:\n%s", out)
		}
		if out, err := formatStorage(t, libs, config, id); err != nil || storedID(t, data) != id {
			t.Fatalf("formatting again failed or changed the id: %v\n%s", err, out)
		}
	})
	t.Run("the old invocation", func(t *testing.T) {
		config, _ := kraftConfig(t, t.TempDir())
		out, err := exec.Command("java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", libs+"/*", "kafka.tools.StorageTool",
			"format", "--ignore-formatted", "-t", "--yJugIwJkqY0R6q-WuXLw", "-c", config).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "expected one argument") {
			t.Errorf("-t with an id starting with - was accepted (%v):\n%s", err, out)
		}
	})
}

// Every copy of the format step goes through format-storage: the local
// services (scripts/services.sh) and the local Kafka image's entrypoint
// (scripts/images/kafka/run, with the script copied into the image by
// scripts/images/lib.sh); no script under scripts/ runs the storage tool
// any other way.
func TestEveryFormatStepUsesFormatStorage(t *testing.T) {
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(repoRoot, path))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if s := read("scripts/services.sh"); !strings.Contains(s, `"$ROOT/scripts/kafka/format-storage" "$KAFKA_LIBS"`) {
		t.Error("scripts/services.sh does not format through scripts/kafka/format-storage")
	}
	if s := read("scripts/images/kafka/run"); !regexp.MustCompile(`(?m)^\s*format-storage /opt/kafka/libs \S+ "\$CONF" "\$\{CLUSTER_ID:-[A-Za-z0-9_-]{22}\}"$`).MatchString(s) {
		t.Error("scripts/images/kafka/run does not format through format-storage with CLUSTER_ID")
	}
	if s := read("scripts/images/lib.sh"); !strings.Contains(s, `cp -a "$ROOT/scripts/kafka/format-storage" "$ctx/bin/"`) ||
		!strings.Contains(s, `cat "$ROOT/scripts/kafka/format-storage"`) {
		t.Error("scripts/images/lib.sh does not put format-storage into the Kafka image (and its inputs)")
	}
	tool := regexp.MustCompile(`StorageTool|kafka-storage(\.sh)?\s+format`)
	err := filepath.WalkDir(filepath.Join(repoRoot, "scripts"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(path, "format-storage") || strings.HasSuffix(path, "kafka-storage.sh") {
			return err
		}
		if ext := filepath.Ext(path); ext != "" && ext != ".sh" {
			return nil // scripts only: the pom names the tool in a comment
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if code, _, _ := strings.Cut(line, "#"); tool.MatchString(code) {
				t.Errorf("%s runs the storage tool itself: %q", path, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The ids this package gives containers (CLUSTER_ID) are 16 bytes of
// URL-safe base64 and never start with "-": images whose scripts are not
// ours (confluent-local) may pass them as -t.
func TestClusterIDNeverStartsWithADash(t *testing.T) {
	for range 20_000 {
		id := clusterID()
		if b, err := base64.RawURLEncoding.DecodeString(id); err != nil || len(b) != 16 || strings.HasPrefix(id, "-") {
			t.Fatalf("clusterID() = %q (%v)", id, err)
		}
	}
}
