//go:build !linux

package failpoint

import (
	"os"
	"syscall"
)

// stopSelf stops the process (see stop_linux.go for why Linux targets the
// calling thread).
func stopSelf() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
}
