// Package failpoint lets tests stop the service at a named step of the commit
// protocol: kill the process (as kill -9 would), return an error, or pause.
//
// Failpoints are armed from a specification string, usually the
// BILLING_FAILPOINTS environment variable of a process under test:
//
//	name=action[@n][,name=action[@n]...]
//
// where action is one of
//
//	kill        SIGKILL this process: no deferred function, no flush, no goodbye
//	stop        SIGSTOP this process, as a pause would (GC, a frozen VM): it
//	            goes on where it stopped when sent SIGCONT
//	exit        os.Exit(3) without running deferred functions
//	error       the step fails with an error wrapping ErrInjected
//	sleep:DUR   the step pauses for DUR (time.ParseDuration)
//
// and @n fires the action on the n-th time the step is reached only (1-based;
// without it every time). A nil *Set is valid and never fires, so production
// code calls Inject unconditionally.
package failpoint
