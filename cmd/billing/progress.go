package main

import (
	"io"
	"os"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// termProgress shows how far a long command is (rows of a big ledger read
// by compare, dead letters re-injected) on a terminal, and nothing
// elsewhere: a script that reads the command's output gets only the
// output. A nil *termProgress is valid and shows nothing.
type termProgress struct {
	mu  sync.Mutex
	bar *progressbar.ProgressBar
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// newTermProgress starts a display of what on w when show is true (see
// isTerminal), counting units up to total (a spinner with the count and
// rate when total is unknown, -1). It returns nil when show is false.
func newTermProgress(w io.Writer, show bool, what, units string, total int64) *termProgress {
	if !show {
		return nil
	}
	return &termProgress{bar: progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString(units),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetPredictTime(total > 0),
		progressbar.OptionClearOnFinish(),
	)}
}

// set shows n units done.
func (p *termProgress) set(n int64) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.bar.Set64(n)
}

// describe changes what the display says is being done.
func (p *termProgress) describe(what string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bar.Describe(what)
}

// done clears the display, so that what the command prints next starts on
// a clean line.
func (p *termProgress) done() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.bar.Finish()
}
