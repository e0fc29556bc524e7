package integration_test

// Tests of the container image (issue 10): the image the Dockerfile builds,
// run with Docker or Podman against the Kafka and MySQL of the testenv.
// `make test-containers` builds the image and runs these with BILLING_IMAGE
// set; without it they skip, also in CI, since `make test` runs before any
// image exists. With BILLING_IMAGE set, a missing engine or image fails.
//
//	BILLING_IMAGE         the image to test, e.g. billing-ledger:local
//	BILLING_IMAGE_COMMIT  the commit `make image` stamped into it (checked when set)
//	CONTAINER_ENGINE      docker or podman (default: docker if it answers, else podman)
//
// The containers use the host's network, so that the services on 127.0.0.1
// (scripts/services.sh, or the harness's containers on published ports) are
// reachable at the addresses the tests use.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/testenv"
)

// ctrEngine runs the container engine's CLI.
type ctrEngine struct {
	bin   string // docker or podman
	image string
}

func newCtrEngine(t *testing.T) *ctrEngine {
	t.Helper()
	if testing.Short() {
		t.Skip("container test: skipped in -short mode")
	}
	image := os.Getenv("BILLING_IMAGE")
	if image == "" {
		t.Skip("container test: set BILLING_IMAGE to the image to test (`make test-containers` builds billing-ledger:local and sets it)")
	}
	bin := os.Getenv("CONTAINER_ENGINE")
	if bin == "" {
		bin = "podman"
		if exec.Command("docker", "info").Run() == nil {
			bin = "docker"
		}
	}
	e := &ctrEngine{bin: bin, image: image}
	if out, code := e.run(t, "image", "inspect", "--format", "{{.Id}}", image); code != 0 {
		t.Fatalf("BILLING_IMAGE=%s: %s image inspect exited %d: %s", image, bin, code, out)
	}
	return e
}

// run runs the engine with args and returns its combined output and exit
// status (a failure to run the engine at all fails the test).
func (e *ctrEngine) run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, e.bin, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee) && ctx.Err() == nil:
		return string(out), ee.ExitCode()
	default:
		t.Fatalf("%s %s: %v\n%s", e.bin, strings.Join(args, " "), err, out)
		return "", -1
	}
}

// must runs the engine and fails the test unless it exits 0.
func (e *ctrEngine) must(t *testing.T, args ...string) string {
	t.Helper()
	out, code := e.run(t, args...)
	if code != 0 {
		t.Fatalf("%s %s exited %d:\n%s", e.bin, strings.Join(args, " "), code, out)
	}
	return strings.TrimSpace(out)
}

// oneOff are the options of a container that runs one command: removed on
// exit, no health check (the image's probes the service's HTTP port).
func (e *ctrEngine) oneOff(name string, env map[string]string, extra ...string) []string {
	args := []string{"run", "--rm", "--name", name, "--network", "host", "--no-healthcheck"}
	args = append(args, envArgs(env)...)
	return append(args, extra...)
}

// startService starts a detached container of the service with the
// image's health check. Podman runs health checks from systemd timers,
// which these machines lack: the check is left to `podman healthcheck run`.
// The container is removed when the test ends, its log printed if the test
// failed.
func (e *ctrEngine) startService(t *testing.T, name string, env map[string]string) {
	t.Helper()
	args := []string{"run", "-d", "--name", name, "--network", "host"}
	if e.bin == "podman" {
		args = append(args, "--health-interval", "disable")
	}
	args = append(args, envArgs(env)...)
	e.must(t, append(args, e.image)...)
	t.Cleanup(func() { e.remove(t, name) })
}

// remove force-removes a container and its anonymous volumes, printing its
// log first when the test failed.
func (e *ctrEngine) remove(t *testing.T, name string) {
	t.Helper()
	if t.Failed() || os.Getenv("TEST_LOG") != "" {
		out, _ := e.run(t, "logs", name)
		t.Logf("---- log of container %s ----\n%s", name, out)
	}
	if out, code := e.run(t, "rm", "-f", "-v", name); code != 0 && !strings.Contains(strings.ToLower(out), "no such container") {
		t.Errorf("remove container %s: %s", name, out)
	}
}

func (e *ctrEngine) inspect(t *testing.T, name, format string) string {
	t.Helper()
	return e.must(t, "inspect", "--format", format, name)
}

// healthy runs the image's HEALTHCHECK: at once with Podman, by waiting
// for Docker's periodic run otherwise.
func (e *ctrEngine) healthy(t *testing.T, name string) {
	t.Helper()
	if e.bin == "podman" {
		testenv.Eventually(t, time.Minute, "podman healthcheck run "+name, func() (bool, string) {
			out, code := e.run(t, "healthcheck", "run", name)
			return code == 0, out
		})
		return
	}
	testenv.Eventually(t, 2*time.Minute, name+" healthy", func() (bool, string) {
		s := e.inspect(t, name, "{{.State.Health.Status}}")
		return s == "healthy", s
	})
}

func envArgs(env map[string]string) []string {
	var args []string
	for k, v := range env {
		args = append(args, "-e", k+"="+v)
	}
	return args
}

func ctrName(prefix string) string { return testenv.RandomName("billing-ct-" + prefix + "-") }

// TestContainerImage: what the image is, without any service: --help works,
// the tools run (static binaries: the image has no C library), there is no
// shell, the user is nonroot, the health check is `billing healthcheck`,
// and `billing version` names the commit it was built from.
func TestContainerImage(t *testing.T) {
	e := newCtrEngine(t)

	out := e.must(t, append(e.oneOff(ctrName("help"), nil), e.image, "--help")...)
	for _, want := range []string{"KAFKA_BROKERS", "MYSQL_DSN", "SHUTDOWN_TIMEOUT", "billing healthcheck"} {
		if !strings.Contains(out, want) {
			t.Errorf("billing --help does not mention %s:\n%s", want, out)
		}
	}
	for _, tool := range []string{"billing-gen", "billing-verify"} {
		out, _ := e.run(t, append(e.oneOff(ctrName("tool"), nil, "--entrypoint", "/usr/local/bin/"+tool), e.image, "-h")...)
		if !strings.Contains(out, "Usage of "+tool) {
			t.Errorf("%s -h in the image printed no usage:\n%s", tool, out)
		}
	}
	out, code := e.run(t, append(e.oneOff(ctrName("sh"), nil, "--entrypoint", "/bin/sh"), e.image, "-c", "true")...)
	if code != 126 && code != 127 {
		t.Errorf("/bin/sh in the image: exit %d, want 126 or 127 (no shell):\n%s", code, out)
	}
	if user := e.must(t, "image", "inspect", "--format", "{{.Config.User}}", e.image); !strings.HasPrefix(user, "65532") && !strings.HasPrefix(user, "nonroot") {
		t.Errorf("image user %q, want nonroot (65532)", user)
	}
	if hc := e.must(t, "image", "inspect", "--format", "{{json .Config.Healthcheck}}", e.image); !strings.Contains(hc, `"/usr/local/bin/billing","healthcheck"`) {
		t.Errorf("image health check %s, want billing healthcheck", hc)
	}

	// `billing version` reports the commit `make image` stamped
	// (internal/buildinfo), when the test is told which.
	if commit := os.Getenv("BILLING_IMAGE_COMMIT"); commit != "" {
		out := e.must(t, append(e.oneOff(ctrName("version"), nil), e.image, "version")...)
		if !strings.Contains(out, "commit "+commit) {
			t.Errorf("billing version in the image: %q, want commit %s (BILLING_IMAGE_COMMIT)", out, commit)
		}
	}
}

// TestContainerExactlyOnce runs the real job in containers of the image:
// migrate, two consumers that become ready and healthy, billing-gen
// producing, one consumer killed with SIGKILL midway and restarted, the
// other stopped with SIGTERM while work goes on, and billing-verify finding
// the ledger exact. Every stop by SIGTERM must end cleanly (exit 0) within
// SHUTDOWN_TIMEOUT.
func TestContainerExactlyOnce(t *testing.T) {
	e := newCtrEngine(t)
	brokers := testenv.Kafka(t)
	topic := testenv.NewTopic(t, brokers, 6)
	dsn := testenv.NewDatabase(t)
	const shutdownTimeout = 20 * time.Second
	env := map[string]string{
		"KAFKA_BROKERS":           strings.Join(brokers, ","),
		"KAFKA_TOPIC":             topic,
		"KAFKA_GROUP":             "g-" + topic,
		"MYSQL_DSN":               dsn,
		"MYSQL_SHARD_DSNS":        "",
		"CHECKPOINT_INTERVAL":     "200ms",
		"CHECKPOINT_TIMEOUT":      "10s",
		"KAFKA_SESSION_TIMEOUT":   "6s",
		"KAFKA_REBALANCE_TIMEOUT": "15s",
		"RECOVERY_INTERVAL":       "2s",
		"SHUTDOWN_TIMEOUT":        shutdownTimeout.String(),
		"LOG_FORMAT":              "json",
	}

	// migrate, as a separate step, then the tables are there.
	e.must(t, append(e.oneOff(ctrName("migrate"), env), e.image, "migrate")...)
	db, err := sqlx.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var tables int
	if err := db.Get(&tables, `SELECT COUNT(*) FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_name IN ('partition_offsets', 'checkpoint_decisions', 'account_balances')`); err != nil {
		t.Fatal(err)
	}
	if tables != 3 {
		t.Fatalf("after billing migrate in the container: %d of the 3 ledger tables exist", tables)
	}

	// Two consumers, each with its HTTP port on the host's loopback.
	names := [2]string{ctrName("c1"), ctrName("c2")}
	addrs := [2]string{opsFreeAddr(t), opsFreeAddr(t)}
	for i, name := range names {
		e.startService(t, name, withEnv(env, "HTTP_ADDR", addrs[i]))
	}
	for i, name := range names {
		testenv.Eventually(t, 90*time.Second, name+" /readyz", func() (bool, string) {
			code, body := opsGet("http://" + addrs[i] + "/readyz")
			return code == 200, fmt.Sprintf("%d %s", code, body)
		})
		e.healthy(t, name)
	}
	// Non-root also at run time: the process's real uid, seen from the host
	// (a local engine: the container's processes are the host's).
	if pid := e.inspect(t, names[0], "{{.State.Pid}}"); pid != "0" {
		if status, err := os.ReadFile("/proc/" + pid + "/status"); err == nil {
			for _, line := range strings.Split(string(status), "\n") {
				if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" && f[1] != "65532" {
					t.Errorf("service process runs as uid %s, want 65532", f[1])
				}
			}
		}
	}

	// The generator, from the image too, rate-limited (about 21 s) so that
	// it is still producing when the consumer is killed, a few seconds in,
	// also on a loaded machine. Its expected-ledger file goes to a host
	// directory the image's nonroot user may write.
	data := t.TempDir()
	if err := os.Chmod(data, 0o777); err != nil {
		t.Fatal(err)
	}
	gen := ctrName("gen")
	genArgs := e.oneOff(gen, nil, "-v", data+":/data", "--entrypoint", "/usr/local/bin/billing-gen")
	genArgs = append(genArgs, e.image, "-brokers", strings.Join(brokers, ","), "-topic", topic,
		"-events", "20000", "-accounts", "300", "-rate", "1000", "-seed", "10",
		"-expected", "/data/expected.json", "-progress", "log")
	genProc := testenv.Start(t, "billing-gen container", e.bin, nil, genArgs...)
	t.Cleanup(func() { e.remove(t, gen) })

	// Midway: once checkpoints have committed offsets, and while the
	// generator still produces, SIGKILL the first consumer; then restart it.
	testenv.Eventually(t, time.Minute, "committed progress", func() (bool, string) {
		var next int64
		err := db.Get(&next, `SELECT COALESCE(SUM(next_offset), 0) FROM partition_offsets`)
		return err == nil && next > 0, fmt.Sprintf("offsets %d, err %v", next, err)
	})
	if genProc.Exited() {
		t.Fatalf("billing-gen finished before the kill; the kill must come midway:\n%s", genProc.Output())
	}
	e.must(t, "kill", "--signal", "KILL", names[0])
	if code := e.inspect(t, names[0], "{{.State.ExitCode}}"); code != "137" {
		t.Fatalf("killed container exit code %s, want 137 (SIGKILL)", code)
	}
	time.Sleep(2 * time.Second)
	e.must(t, "start", names[0])

	// SIGTERM to the second while it works: a clean stop within
	// SHUTDOWN_TIMEOUT. The engine's own timeout is longer, so a stop that
	// overran would show as its SIGKILL (137), not as exit 0.
	stopClean(t, e, names[1], shutdownTimeout)

	if err := genProc.Wait(t, 3*time.Minute); err != nil {
		t.Fatalf("billing-gen: %v\n%s", err, genProc.Output())
	}
	testenv.Eventually(t, 90*time.Second, names[0]+" /readyz after the restart", func() (bool, string) {
		code, body := opsGet("http://" + addrs[0] + "/readyz")
		return code == 200, fmt.Sprintf("%d %s", code, body)
	})

	verifyArgs := e.oneOff(ctrName("verify"), nil, "-v", data+":/data:ro", "--entrypoint", "/usr/local/bin/billing-verify")
	verifyArgs = append(verifyArgs, e.image, "-dsn", dsn, "-expected", "/data/expected.json", "-topic", topic, "-wait", "3m")
	out, code := e.run(t, verifyArgs...)
	if code != 0 || !strings.Contains(out, "EXACT") {
		t.Fatalf("billing-verify exited %d, want 0 and EXACT:\n%s", code, out)
	}
	t.Logf("billing-verify: %s", lastLine(out))

	stopClean(t, e, names[0], shutdownTimeout)
}

// stopClean sends SIGTERM (engine stop, with a grace period well beyond
// timeout) and checks the container exited 0 within timeout.
func stopClean(t *testing.T, e *ctrEngine, name string, timeout time.Duration) {
	t.Helper()
	grace := strconv.Itoa(int(3 * timeout / time.Second))
	start := time.Now()
	e.must(t, "stop", "-t", grace, name)
	took := time.Since(start)
	if code := e.inspect(t, name, "{{.State.ExitCode}}"); code != "0" {
		t.Fatalf("%s after SIGTERM: exit code %s, want 0 (clean shutdown)", name, code)
	}
	if took > timeout {
		t.Fatalf("%s took %s to stop after SIGTERM, over SHUTDOWN_TIMEOUT %s", name, took.Round(time.Millisecond), timeout)
	}
	t.Logf("%s stopped cleanly %s after SIGTERM", name, took.Round(time.Millisecond))
}

func withEnv(env map[string]string, k, v string) map[string]string {
	out := make(map[string]string, len(env)+1)
	for key, val := range env {
		out[key] = val
	}
	out[k] = v
	return out
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
