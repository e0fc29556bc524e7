package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binaries caches built commands per test binary: one go build per package.
var binaries sync.Map // import path -> *builtBinary

type builtBinary struct {
	once sync.Once
	path string
	err  error
}

// Binary builds the main package at the import path (for example
// "github.com/billing/ledger/cmd/billing") once per test process and returns
// the executable's path.
func Binary(t testing.TB, pkg string) string {
	t.Helper()
	v, _ := binaries.LoadOrStore(pkg, &builtBinary{})
	b := v.(*builtBinary)
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "billing-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, filepath.Base(pkg))
		out, err := exec.Command("go", "build", "-o", b.path, pkg).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// Process is a command under test, running as a separate OS process so
// that tests can SIGKILL, SIGSTOP and SIGCONT it like an operator or a
// crash would.
type Process struct {
	Name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer // stdout and stderr, interleaved as written
	// stdout alone, for a process whose output is data (Stdout).
	stdout bytes.Buffer
	done   chan struct{}
	err    error
}

// Start runs bin with args and the current environment plus env. Its output
// is kept and printed when the test fails. The process is killed at the end
// of the test if still running.
func Start(t testing.TB, name, bin string, env map[string]string, args ...string) *Process {
	t.Helper()
	p := &Process{Name: name, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = os.Environ()
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout = (*stdoutWriter)(p)
	p.cmd.Stderr = (*lockedWriter)(p)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Signal(syscall.SIGCONT)
		p.Signal(syscall.SIGKILL)
		<-p.done
		if t.Failed() || os.Getenv("TEST_LOG") != "" {
			t.Logf("---- output of %s ----\n%s", name, p.Output())
		}
	})
	return p
}

type lockedWriter Process

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.Write(b)
}

type stdoutWriter Process

func (w *stdoutWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stdout.Write(b)
	return w.out.Write(b)
}

// Stdout is what the process wrote to its standard output so far.
func (p *Process) Stdout() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdout.String()
}

// Output is everything the process wrote so far.
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// Signal sends sig; it is a no-op once the process exited.
func (p *Process) Signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(sig)
	}
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits up to timeout for the process to end and returns its exit
// error (nil for status 0). It fails the test on timeout.
func (p *Process) Wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		t.Fatalf("%s still running after %s", p.Name, timeout)
		return nil
	}
}

// WaitOutput waits until the output contains substr, the process exits, or
// the timeout passes; it reports whether substr appeared.
func (p *Process) WaitOutput(ctx context.Context, substr string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if strings.Contains(p.Output(), substr) {
			return true
		}
		if p.Exited() {
			return strings.Contains(p.Output(), substr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}
