package failpoint

import (
	"os"
	"runtime"
	"syscall"
)

// stopSelf stops the whole process, the calling goroutine before it takes
// another step. The signal goes to the calling thread (tgkill), not to the
// process: a process-directed SIGSTOP is taken by whichever thread the
// kernel picks, and until that thread runs, the caller runs on. On a loaded
// machine that was milliseconds: the claim after assign-before-claim had
// inserted its row and was reading it back when the process stopped, and
// its lock blocked the successor the test was about. A thread-directed
// SIGSTOP stops the caller as the syscall returns, and the group with it.
func stopSelf() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}
