package testenv

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// EnvRegistryRun names the script that runs a schema registry
// (../shared/registry/run beside the clone, where make test finds it).
const EnvRegistryRun = "REGISTRY_RUN"

// OwnRegistry is a schema registry of one test's own: a real registry
// (Apicurio, Confluent-compatible, in-memory) on a free port, which the
// test may stop and start again on the same port, as the shared one at
// SCHEMA_REGISTRY_URL must never be. In-memory, it forgets its schemas
// when stopped.
type OwnRegistry struct {
	// URL is the base URL of its Confluent-compatible API.
	URL  string
	t    testing.TB
	run  string // the script
	work string // its REGISTRY_WORK: the pid file and log of this one
	port int
	up   bool
}

// StartOwnRegistry starts a registry of the test's own with the script of
// REGISTRY_RUN, else shared/registry/run in the working directory or one
// of its parents (the test is skipped, saying so, where there is none). The
// script keeps one registry per work folder (its pid file), so this one
// gets a folder of its own, and uses the build of the default one
// (${REGISTRY_WORK:-$TMPDIR/billing-registry}/build) when there is one
// instead of building again. The registry is stopped when the test ends.
func StartOwnRegistry(t testing.TB) *OwnRegistry {
	t.Helper()
	requireIntegration(t)
	run, err := registryScript()
	if err != nil {
		t.Skipf("integration test needs a registry of its own: %v", err)
	}
	r := &OwnRegistry{t: t, run: run, work: t.TempDir(), port: freePortPair(t)}
	shared := os.Getenv("REGISTRY_WORK")
	if shared == "" {
		shared = filepath.Join(cmp.Or(os.Getenv("TMPDIR"), "/tmp"), "billing-registry")
	}
	if _, err := os.Stat(filepath.Join(shared, "build", "target", "quarkus-app", "quarkus-run.jar")); err == nil {
		if err := os.Symlink(filepath.Join(shared, "build"), filepath.Join(r.work, "build")); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(r.Stop)
	r.Start()
	return r
}

// Start starts the registry (again) on its port; it answers when Start
// returns, holding no schema. A registry that does not come up (a slow
// start on a loaded machine, a port taken meanwhile) is tried again, on
// another port the first time (none was given out yet), on the same
// one after (the service knows it).
func (r *OwnRegistry) Start() {
	r.t.Helper()
	var errs []string
	for attempt := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // a first build takes about 90 s
		out, err := r.script(ctx, "start", strconv.Itoa(r.port))
		cancel()
		if err == nil {
			r.URL = strings.TrimSpace(string(out))
			r.up = true
			return
		}
		log, _ := os.ReadFile(filepath.Join(r.work, "registry.log"))
		errs = append(errs, fmt.Sprintf("attempt %d on port %d: %v\n%s", attempt+1, r.port, err, tail(string(log), 1500)))
		r.up = true
		r.Stop() // whatever of it runs
		if r.URL == "" {
			r.port = freePortPair(r.t)
		}
	}
	r.t.Fatalf("starting a registry of the test's own:\n%s", strings.Join(errs, "\n"))
}

// Stop stops the registry (a no-op when it is not running); it no longer
// answers when Stop returns.
func (r *OwnRegistry) Stop() {
	if !r.up {
		return
	}
	r.up = false
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := r.script(ctx, "stop"); err != nil {
		r.t.Errorf("stopping the registry on port %d: %v", r.port, err)
	}
}

func (r *OwnRegistry) script(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.run, args...)
	cmd.Env = append(os.Environ(), "REGISTRY_WORK="+r.work)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", r.run, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func registryScript() (string, error) {
	if p := os.Getenv(EnvRegistryRun); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", EnvRegistryRun, p, err)
		}
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "shared", "registry", "run")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no shared/registry/run in the working directory or a parent, and %s is not set", EnvRegistryRun)
		}
		dir = parent
	}
}

// freePortPair returns a port p free on 127.0.0.1 with p+1 free too (the
// registry's management port).
func freePortPair(t testing.TB) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		ln.Close()
		if err == nil {
			ln2.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
