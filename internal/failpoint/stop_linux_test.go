package failpoint

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The stop action stops the caller before its next step, even when it runs
// on a thread other than the process's first (the one a process-directed
// signal goes to): the child process below prints "after" right after the
// failpoint, and nothing may come out until it is continued.
func TestStopHoldsTheCallerAtOnce(t *testing.T) {
	if os.Getenv("FAILPOINT_STOP_CHILD") != "" {
		s, err := Parse("p=stop")
		if err != nil {
			t.Fatal(err)
		}
		// Run the failpoint on a thread that is not the leader (whose id
		// is the process id): a goroutine that lands on the leader keeps
		// it, asleep, and another one tries.
		park := make(chan struct{})
		defer close(park)
		done := make(chan struct{})
		for ran := false; !ran; {
			try := make(chan bool)
			go func() {
				runtime.LockOSThread()
				if syscall.Gettid() == os.Getpid() {
					try <- false
					<-park
					return
				}
				try <- true
				_ = s.Inject("p")
				_, _ = os.Stdout.WriteString("after\n")
				close(done)
			}()
			ran = <-try
		}
		<-done
		return
	}
	for round := range 20 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestStopHoldsTheCallerAtOnce$", "-test.count=1")
		cmd.Env = append(os.Environ(), "FAILPOINT_STOP_CHILD=1")
		var out bytes.Buffer
		cmd.Stdout = &out
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		stopped := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				if strings.Contains(sc.Text(), "failpoint p: SIGSTOP") {
					stopped <- true
				}
			}
			close(stopped)
		}()
		if !<-stopped {
			t.Fatalf("round %d: the child never reached the failpoint", round)
		}
		// Wait until the kernel reports the child stopped; then nothing
		// after the failpoint may have run.
		for deadline := time.Now().Add(5 * time.Second); procState(t, cmd.Process.Pid) != "T"; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the child did not stop", round)
			}
		}
		if strings.Contains(out.String(), "after") {
			_ = cmd.Process.Kill()
			t.Fatalf("round %d: the caller ran on past the stop failpoint", round)
		}
		_ = cmd.Process.Signal(syscall.SIGCONT)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("round %d: child: %v\n%s", round, err, out.String())
		}
		if !strings.Contains(out.String(), "after") {
			t.Fatalf("round %d: the child did not go on after SIGCONT:\n%s", round, out.String())
		}
	}
}

// procState is the state letter of /proc/pid/stat ("T": stopped).
func procState(t *testing.T, pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return strings.Fields(s[i+1:])[0]
}
