package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// EnvJVMTests turns on the tests that run the JVM harness (JVM): they
// build integration/jvm from Maven Central (minutes from an empty local
// repository) and start JVMs, so they run only when asked for.
const EnvJVMTests = "JVM_TESTS"

// JVMHarness runs the tools of integration/jvm through scripts/jvm.sh:
// flink-read (Flink SQL reading the changelog topics) and debezium-capture
// (Debezium reading a database's binary log).
type JVMHarness struct {
	script string
}

var jvmOnce once[*JVMHarness]

// JVM returns the JVM harness, built once per test binary. The test is
// skipped unless JVM_TESTS is set (and in -short mode); where Java or
// Maven are missing it is skipped too, or fails with CI=true. A build that
// fails fails the test.
func JVM(t testing.TB) *JVMHarness {
	t.Helper()
	requireIntegration(t)
	if os.Getenv(EnvJVMTests) == "" {
		t.Skipf("JVM harness test: set %s=1 to run it (scripts/jvm.sh builds integration/jvm from Maven Central "+
			"into .services/jvm/m2 first; Java 17 and Maven needed)", EnvJVMTests)
	}
	jvmOnce.Do(func() { jvmOnce.val, jvmOnce.err = buildJVM() })
	check(t, "Java and Maven (the JVM harness)", jvmOnce.err)
	return jvmOnce.val
}

func buildJVM() (*JVMHarness, error) {
	for _, tool := range []string{"java", "javac", "mvn"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%w: %s not found (Debian packages openjdk-17-jdk-headless and maven)", errAbsent, tool)
		}
	}
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	h := &JVMHarness{script: filepath.Join(root, "scripts", "jvm.sh")}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, h.script, "build").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s build: %w\n%s", h.script, err, out)
	}
	return h, nil
}

// JVMRun is the outcome of one run of a tool.
type JVMRun struct {
	Stdout, Stderr []byte
	// ExitCode is the tool's exit status (-1 when it was killed).
	ExitCode int
	Took     time.Duration
}

// Run runs tool with args to its end, or until ctx ends (then the JVM is
// killed and Run returns ctx's error). A non-zero exit status is no error:
// it is in the result.
func (h *JVMHarness) Run(ctx context.Context, tool string, args ...string) (JVMRun, error) {
	var stdout, stderr bytes.Buffer
	// scripts/jvm.sh execs java, so killing the command kills the JVM.
	cmd := exec.CommandContext(ctx, h.script, append([]string{"run", tool}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := JVMRun{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), Took: time.Since(start)}
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return r, fmt.Errorf("%s %s: %w\n%s", h.script, tool, ctx.Err(), stderr.Bytes())
	case errors.As(err, &exit):
		r.ExitCode = exit.ExitCode()
	case err != nil:
		return r, fmt.Errorf("%s %s: %w", h.script, tool, err)
	}
	return r, nil
}

// Start starts tool with args as a Process (killed when the test ends);
// its Stdout is the tool's data.
func (h *JVMHarness) Start(t testing.TB, tool string, args ...string) *Process {
	t.Helper()
	return Start(t, tool, h.script, nil, append([]string{"run", tool}, args...)...)
}
