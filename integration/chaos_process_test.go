package integration_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one OS process of the chaos suite (a billing incarnation, the
// generator, the verifier) whose output goes to its own log file, so that a
// long run keeps gigabytes of logs out of the test's memory and a failure
// can show the last lines of each.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	logf    *os.File
	started time.Time
	done    chan struct{}
	err     error // exit error, set before done closes
	ended   time.Time
}

// startProc starts bin with args and env (added to the test's environment).
// The child gets SIGKILL if the test binary dies (Pdeathsig), so a timed-out
// or interrupted run leaves no service process behind.
func startProc(name, logPath, bin string, env []string, args ...string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &proc{name: name, logPath: logPath, cmd: cmd, logf: f, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p.started = time.Now()
	go func() {
		err := cmd.Wait()
		p.ended = time.Now()
		p.err = err
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// signal sends sig unless the process has exited.
func (p *proc) signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(sig)
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits for the exit until ctx ends; ok is false on timeout.
func (p *proc) wait(ctx context.Context) (err error, ok bool) {
	select {
	case <-p.done:
		return p.err, true
	case <-ctx.Done():
		return nil, false
	}
}

// waitFor is wait bounded by timeout.
func (p *proc) waitFor(ctx context.Context, timeout time.Duration) (err error, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return p.wait(ctx)
}

// exitText describes how the process ended ("exit 0", "signal: killed").
func (p *proc) exitText() string {
	if p.err == nil {
		return "exit 0"
	}
	return p.err.Error()
}

// tail returns the last n lines of a log file.
func tail(path string, n int) []string {
	f, err := os.Open(path)
	if err != nil {
		return []string{fmt.Sprintf("(cannot read %s: %v)", path, err)}
	}
	defer f.Close()
	// Read at most the last 256 KiB: lines of a service log are short.
	const window = 256 << 10
	if st, err := f.Stat(); err == nil && st.Size() > window {
		_, _ = f.Seek(st.Size()-window, io.SeekStart)
	}
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > 4*n {
			lines = append(lines[:0], lines[len(lines)-n:]...)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

// exitRecord is one ended incarnation of an instance.
type exitRecord struct {
	Slot, N    int
	Instance   string // the instance id it logged, if any
	Expected   string // the fault that ended it; empty if it exited on its own
	Exit       string
	Lived      time.Duration
	LastLine   string // last line of its log, for exits on their own
	Failpoints string
}

// instance is one of the suite's billing "containers": a slot that is
// always running an incarnation of the service, restarted when it ends, as
// a container runtime with restart policy "always" would. The fault driver
// ends incarnations on purpose (saying so first, so the exit is counted as
// expected); any other exit is counted as the instance exiting on its own,
// restarted with a back-off, and reported.
type instance struct {
	slot   int
	name   string
	bin    string
	logDir string
	env    func(tag string) []string

	mu       sync.Mutex
	cur      *incarnation
	n        int
	expect   string        // reason the current incarnation is expected to end
	delay    time.Duration // restart delay after an expected end
	nextEnv  []string      // extra environment of the next incarnation only
	stopping bool
	history  []exitRecord
	changed  chan struct{} // closed and replaced whenever cur changes

	wg sync.WaitGroup
}

type incarnation struct {
	*proc
	n          int
	tag        string // writer tag in the MySQL session (chaos audit)
	failpoints string
}

func newInstance(slot int, bin, logDir string, env func(tag string) []string) *instance {
	return &instance{slot: slot, name: fmt.Sprintf("billing-%d", slot), bin: bin, logDir: logDir, env: env, changed: make(chan struct{})}
}

// run starts the first incarnation and its supervisor; it returns at once.
func (in *instance) run() error {
	in.mu.Lock()
	inc, err := in.startLocked(nil)
	in.mu.Unlock()
	if err != nil {
		return err
	}
	in.wg.Add(1)
	go in.supervise(inc)
	return nil
}

// startLocked starts the next incarnation with extra environment; in.mu is
// held.
func (in *instance) startLocked(extra []string) (*incarnation, error) {
	in.n++
	tag := fmt.Sprintf("s%d.%d", in.slot, in.n)
	env := in.env(tag)
	env = append(env, extra...)
	fps := "" // the last one set, as the process sees it
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "BILLING_FAILPOINTS="); ok {
			fps = v
		}
	}
	p, err := startProc(fmt.Sprintf("%s#%d", in.name, in.n), in.logPath(in.n), in.bin, env)
	if err != nil {
		return nil, err
	}
	inc := &incarnation{proc: p, n: in.n, tag: tag, failpoints: fps}
	in.cur = inc
	close(in.changed)
	in.changed = make(chan struct{})
	return inc, nil
}

// supervise restarts the instance whenever its incarnation ends, until stop.
func (in *instance) supervise(inc *incarnation) {
	defer in.wg.Done()
	backoff := time.Second
	for {
		<-inc.done
		in.mu.Lock()
		rec := exitRecord{Slot: in.slot, N: inc.n, Instance: instanceID(inc.logPath), Expected: in.expect,
			Exit: inc.exitText(), Lived: inc.ended.Sub(inc.started), Failpoints: inc.failpoints}
		if rec.Expected == "" && inc.failpoints != "" && strings.Contains(rec.Exit, "killed") {
			rec.Expected = "failpoint " + inc.failpoints
		}
		delay := in.delay
		if rec.Expected == "" {
			if l := tail(inc.logPath, 1); len(l) > 0 {
				rec.LastLine = l[0]
			}
			// Back off like a container runtime: doubling up to 10s,
			// reset once an incarnation stayed up for a while.
			if rec.Lived > 30*time.Second {
				backoff = time.Second
			}
			delay = backoff
			backoff = min(2*backoff, 10*time.Second)
		}
		in.history = append(in.history, rec)
		in.expect, in.delay = "", 0
		stopping := in.stopping
		in.mu.Unlock()
		if stopping {
			return
		}
		time.Sleep(delay)
		in.mu.Lock()
		if in.stopping {
			in.mu.Unlock()
			return
		}
		extra := in.nextEnv
		in.nextEnv = nil
		next, err := in.startLocked(extra)
		for err != nil {
			// Cannot even fork: the machine is in trouble; keep trying
			// like a runtime would, slowly.
			in.mu.Unlock()
			time.Sleep(2 * time.Second)
			in.mu.Lock()
			if in.stopping {
				in.mu.Unlock()
				return
			}
			next, err = in.startLocked(extra)
		}
		in.mu.Unlock()
		inc = next
	}
}

// current returns the running incarnation and a channel closed when it is
// replaced.
func (in *instance) current() (*incarnation, <-chan struct{}) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.cur, in.changed
}

// end signals the current incarnation with sig, recording the exit as
// caused by reason; the supervisor restarts it after delay, with extra
// environment for that next incarnation only. It returns the incarnation
// signalled, or nil if it had already exited (nothing is signalled then).
func (in *instance) end(reason string, sig syscall.Signal, delay time.Duration, nextEnv []string) *incarnation {
	in.mu.Lock()
	defer in.mu.Unlock()
	inc := in.cur
	if inc == nil || inc.exited() {
		return nil
	}
	in.expect, in.delay, in.nextEnv = reason, delay, nextEnv
	if sig == syscall.SIGKILL {
		inc.signal(syscall.SIGCONT) // a stopped process dies of SIGKILL too, but be explicit
	}
	inc.signal(sig)
	return inc
}

// expectEnd records that the current incarnation is to end by itself, for
// reason (it is not signalled): its exit is counted as expected and it is
// restarted at once. It returns that incarnation, or nil if none runs.
func (in *instance) expectEnd(reason string) *incarnation {
	in.mu.Lock()
	defer in.mu.Unlock()
	inc := in.cur
	if inc == nil || inc.exited() {
		return nil
	}
	in.expect, in.delay = reason, 0
	return inc
}

// awaitNext waits until an incarnation after inc runs; it returns it.
func (in *instance) awaitNext(ctx context.Context, inc *incarnation) (*incarnation, error) {
	for {
		cur, changed := in.current()
		if cur != inc && !cur.exited() {
			return cur, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: not restarted: %w", in.name, context.Cause(ctx))
		}
	}
}

// stop ends the supervision: the current incarnation gets sig (SIGTERM for
// a graceful shutdown) and is not restarted. It waits up to grace for the
// exit and then kills. It returns the last incarnation and how it ended.
func (in *instance) stop(ctx context.Context, sig syscall.Signal, grace time.Duration) (*incarnation, error) {
	in.mu.Lock()
	in.stopping = true
	inc := in.cur
	if inc != nil && !inc.exited() {
		in.expect = "final shutdown"
		inc.signal(syscall.SIGCONT)
		inc.signal(sig)
	}
	in.mu.Unlock()
	var err error
	if inc != nil {
		wctx, cancel := context.WithTimeout(ctx, grace)
		var ok bool
		err, ok = inc.wait(wctx)
		cancel()
		if !ok {
			inc.signal(syscall.SIGKILL)
			<-inc.done
			err = fmt.Errorf("%s did not exit within %s of %s; killed", inc.name, grace, sig)
		}
	}
	in.wg.Wait()
	return inc, err
}

// exits returns the ended incarnations so far.
func (in *instance) exits() []exitRecord {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]exitRecord(nil), in.history...)
}

// logs returns the log paths of every incarnation so far, oldest first.
func (in *instance) logs() []string {
	in.mu.Lock()
	n := in.n
	in.mu.Unlock()
	var out []string
	for i := 1; i <= n; i++ {
		out = append(out, in.logPath(i))
	}
	return out
}

func (in *instance) logPath(n int) string {
	return filepath.Join(in.logDir, fmt.Sprintf("%s.%03d.log", in.name, n))
}

// writers maps the writer tag of every incarnation to the instance id it
// logged: the audit trail names writers by tag.
func (in *instance) writers() map[string]string {
	in.mu.Lock()
	n := in.n
	in.mu.Unlock()
	m := map[string]string{}
	for i := 1; i <= n; i++ {
		if id := instanceID(in.logPath(i)); id != "" {
			m[fmt.Sprintf("s%d.%d", in.slot, i)] = id
		}
	}
	return m
}

// instanceID returns the instance id an incarnation logged at start
// ("starting ... instance=<id>"), or "" if it never got that far.
func instanceID(logPath string) string {
	f, err := os.Open(logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "msg=starting") {
			continue
		}
		if _, rest, ok := strings.Cut(line, " instance="); ok {
			id, _, _ := strings.Cut(rest, " ")
			return id
		}
	}
	return ""
}
