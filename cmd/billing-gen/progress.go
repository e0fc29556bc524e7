package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress reports how far the run is: a progress bar on a terminal, a log
// line every few seconds otherwise, or nothing. The producing loop only
// stores counters; a goroutine renders them on a ticker, so reports keep
// coming while the loop is blocked (a full producer buffer, a slow broker).
type progress struct {
	valid, sent, acked atomic.Int64

	w       io.Writer
	bar     *progressbar.ProgressBar
	total   int64
	started time.Time
	stop    chan struct{}
	done    sync.WaitGroup
	once    sync.Once
}

// Render intervals.
const (
	logEvery = 5 * time.Second
	barEvery = 200 * time.Millisecond
)

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// newProgress starts a reporter for mode auto, bar, log or none, counting
// valid events against total. Call finish when done.
func newProgress(mode string, w io.Writer, total int64) *progress {
	p := &progress{w: w, total: total, started: time.Now(), stop: make(chan struct{})}
	if mode == "auto" {
		mode = "log"
		if isTerminal(w) {
			mode = "bar"
		}
	}
	var every time.Duration
	switch mode {
	case "bar":
		every = barEvery
		p.bar = progressbar.NewOptions64(max(total, 1),
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("producing"),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("events"),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
		)
	case "log":
		every = logEvery
	default:
		return p
	}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.render()
			}
		}
	}()
	return p
}

func (p *progress) render() {
	valid, sent, acked := p.valid.Load(), p.sent.Load(), p.acked.Load()
	if p.bar != nil {
		_ = p.bar.Set64(valid)
		return
	}
	el := time.Since(p.started)
	fmt.Fprintf(p.w, "billing-gen: %d/%d valid events, %d records sent, %d acknowledged (%.0f records/s)\n",
		valid, p.total, sent, acked, float64(sent)/max(el.Seconds(), 1e-3))
}

// finish stops the reporter and completes the bar; it is safe to call more
// than once.
func (p *progress) finish() {
	p.once.Do(func() {
		close(p.stop)
		p.done.Wait()
		if p.bar != nil {
			_ = p.bar.Set64(p.valid.Load())
			_ = p.bar.Finish()
		}
	})
}
