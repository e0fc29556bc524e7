package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/metrics"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/service"
)

// Several instances (the three-instances variant): the service mode, but
// as v.instances service processes in one consumer group on one backlog
// and one ledger, as production runs it. Each process is a child of its
// own (modeInstance), so that its peak RSS is its own; none of them can
// tell alone when the backlog is done, so each streams its checkpoints to
// the parent, which sums them:
//
//	child → parent (stdout): "BENCH assigned {live,n}" when its partitions
//	  change, "BENCH ckpt <instCkpt>" per checkpoint attempt, "BENCH
//	  result <childResult>" at the end
//	parent → child (stdin): "live" (stop the catch-up's service, start one
//	  on the live topic), "stop"
//
// The catch-up is measured as in the service mode, over the checkpoints
// of all of them merged in commit order; so is the live phase. Aborted
// attempts are grouped by cause, as the service's
// billing_checkpoint_aborts_total labels them (metrics.AbortCause), and
// phase.

// modeInstance is a child running one of several service instances.
const modeInstance = "instance"

// instCkpt is one checkpoint attempt of one instance.
type instCkpt struct {
	Live    bool      `json:"live,omitempty"`
	EndNs   int64     `json:"end_ns"`
	DurMs   float64   `json:"dur_ms"`
	Records int       `json:"records"`
	Counted int       `json:"counted"`
	Decided bool      `json:"decided"`
	Failed  bool      `json:"failed,omitempty"` // aborted: not decided, with an error
	Cause   string    `json:"cause,omitempty"`  // metrics.AbortCause of a failed one, and its phase
	Err     string    `json:"err,omitempty"`
	LatMs   []float64 `json:"lat_ms,omitempty"` // live: timestamp → commit of its records
}

// instancesResult is what the parent reports beside the merged figures.
type instancesResult struct {
	N          int                `json:"instances"`
	PeakRSSMiB []float64          `json:"peak_rss_mib"`
	Records    []int64            `json:"records_committed"` // catch-up, per instance
	Aborted    []causeCount       `json:"aborted_by_cause"`
	LiveAbort  []causeCount       `json:"live_aborted_by_cause,omitempty"`
	FirstErrs  []string           `json:"first_errors,omitempty"`
	Cores      map[string]float64 `json:"cores"` // catch-up: every instance, mysql, kafka
	// AllInS: seconds from the processes' start until every one of them
	// held partitions (0: never); WholeRate: the catch-up's rate including
	// the time before, as summarize takes it over every checkpoint.
	AllInS    float64 `json:"all_in_s"`
	WholeRate float64 `json:"whole_rate"`
}

// sharedUnits is the checkpoints of units (in commit order) that ended
// after every instance held partitions (at allIn), with the last one
// before it first, as summarize's starting point; all of them when allIn
// is zero (never) or before the first.
func sharedUnits(units []unit, allIn time.Time) []unit {
	if allIn.IsZero() {
		return units
	}
	i, _ := slices.BinarySearchFunc(units, allIn, func(u unit, t time.Time) int { return u.end.Compare(t) })
	return units[max(i-1, 0):]
}

// causeCount is how many aborted attempts one cause (in one phase of the
// protocol) had.
type causeCount struct {
	Cause string `json:"cause"`
	Count int    `json:"count"`
}

// groupCauses counts the failed attempts of cs by cause, the most frequent
// first (ties by name).
func groupCauses(cs []instCkpt) []causeCount {
	n := map[string]int{}
	for _, c := range cs {
		if c.Failed {
			n[c.Cause]++
		}
	}
	out := make([]causeCount, 0, len(n))
	for cause, k := range n {
		out = append(out, causeCount{cause, k})
	}
	slices.SortFunc(out, func(a, b causeCount) int { return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Cause, b.Cause)) })
	return out
}

func causesLine(cs []causeCount) string {
	if len(cs) == 0 {
		return "none"
	}
	var parts []string
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s %d", c.Cause, c.Count))
	}
	return strings.Join(parts, ", ")
}

// lockedOut serialises the child's report lines: checkpoints are reported
// from the service's goroutines.
type lockedOut struct{ mu sync.Mutex }

func (l *lockedOut) report(kind string, v any) {
	b, _ := json.Marshal(v)
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Printf("BENCH %s %s\n", kind, b)
}

// instanceChild runs one service instance on the workload topic until
// "live", then one on the live topic until "stop".
func instanceChild(spec childSpec, cfg config.Config, cmds <-chan string) (childResult, error) {
	var res childResult
	if _, ok := os.LookupEnv("GOMEMLIMIT"); !ok && spec.MemLimit > 0 {
		debug.SetMemoryLimit(spec.MemLimit) // as cmd/billing does
	}
	var out lockedOut
	run := func(topic, group string, live bool) (stop func() error) {
		c := cfg
		c.KafkaTopic, c.KafkaGroup = topic, group
		ctx, cancel := context.WithCancel(context.Background())
		var started atomic.Pointer[pipeline.Pipeline]
		o := service.Options{Logger: childLogger(), OnStart: func(p *pipeline.Pipeline) { started.Store(p) },
			OnCheckpoint: func(info pipeline.CheckpointInfo) {
				logCheckpoint(info)
				now := time.Now()
				ck := instCkpt{Live: live, EndNs: now.UnixNano(), DurMs: ms(info.Duration), Records: info.Records, Counted: info.Counted, Decided: info.Decided}
				if info.Err != nil {
					ck.Err = info.Err.Error()
				}
				if cause := metrics.AbortCause(info); cause != "" {
					ck.Failed, ck.Cause = true, cause
					if info.FailedPhase != "" {
						ck.Cause += " in " + info.FailedPhase
					}
					ck.Records = 0
				}
				if live && !ck.Failed {
					for _, ts := range info.RecordTimes {
						ck.LatMs = append(ck.LatMs, ms(now.Sub(ts)))
					}
				}
				out.report("ckpt", ck)
			}}
		runErr := make(chan error, 1)
		go func() { runErr <- service.Run(ctx, c, o) }()
		done := make(chan struct{})
		var watch sync.WaitGroup
		watch.Go(func() { // the partitions it holds, as they change
			last := int64(-1)
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case <-t.C:
				}
				if p := started.Load(); p != nil {
					if n := p.Stats().AssignedParts.Load(); n != last {
						last = n
						out.report("assigned", map[string]any{"live": live, "n": n})
					}
				}
			}
		})
		return func() error {
			cancel()
			close(done)
			watch.Wait()
			select {
			case err := <-runErr:
				return err
			case <-time.After(time.Minute):
				return errors.New("did not stop within a minute")
			}
		}
	}
	stop := run(spec.Topic, spec.Group, false)
	for cmd := range cmds {
		switch cmd {
		case "live":
			if err := stop(); err != nil && !errors.Is(err, context.Canceled) {
				res.Err = "catch-up instance: " + err.Error()
			}
			stop = run(spec.LiveTopic, spec.Group+"-live", true)
		case "stop":
			if err := stop(); err != nil && !errors.Is(err, context.Canceled) && res.Err == "" {
				res.Err = err.Error()
			}
			return res, nil
		}
	}
	return res, stop()
}

// instChild is the parent's end of one instance process.
type instChild struct {
	cmd   *exec.Cmd
	stdin interface {
		Write([]byte) (int, error)
		Close() error
	}
	log *os.File
}

type instEvent struct {
	idx  int
	kind string // "assigned", "ckpt", "result"; "exit" when its output ends
	body []byte
}

// measureInstances measures the service as v.instances processes in one
// group (the service mode of the variant).
func measureInstances(ctx context.Context, o *options, v variant, runID, topic, expected string, ends map[int32]int64, total int64, env map[string]string, adm *kadmClient, rep int) (m measurement) {
	m = measurement{Variant: v.name, Mode: modeService, Rep: rep}
	start := time.Now()
	defer func() { m.WallS = time.Since(start).Seconds() }()
	fail := func(err error) measurement {
		m.Err = err.Error()
		return m
	}
	short := fmt.Sprintf("service%d", rep)
	dbName := strings.ReplaceAll(fmt.Sprintf("bench_%s_%s_%s", runID, v.name, short), "-", "_")
	if err := createDatabase(ctx, o.Admin, dbName); err != nil {
		return fail(err)
	}
	if !o.Keep {
		defer dropDatabase(o.Admin, dbName)
	}
	dsn, err := databaseDSN(o.Admin, dbName, true)
	if err != nil {
		return fail(err)
	}
	spec := childSpec{Mode: modeInstance, Brokers: o.Brokers, Topic: topic, Group: fmt.Sprintf("bench-%s-%s-%s", runID, v.name, short),
		DSN: dsn, Records: total, Ends: ends, ServiceEnv: env, Timeout: o.Timeout, MemLimit: o.MemLimit,
		LiveTopic: liveTopic(topic, short, runID, rep)}
	if err := createTopic(ctx, adm, spec.LiveTopic, len(ends)); err != nil {
		return fail(err)
	}
	if !o.Keep {
		defer deleteTopic(adm, spec.LiveTopic)
	}
	if waited, _, _, err := settle(ctx, o.Admin, 2*time.Minute); err != nil {
		return fail(err)
	} else if waited > time.Second {
		fmt.Printf("   (waited %s for the server's purge to catch up)\n", waited.Round(100*time.Millisecond))
	}
	specJSON, _ := json.Marshal(spec)
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	events := make(chan instEvent, 1024)
	var kids []*instChild
	var readers sync.WaitGroup
	defer func() {
		// Drain what the readers still send, so that they (and the
		// children writing to them) end.
		go func() {
			for range events {
			}
		}()
		for _, k := range kids {
			k.stdin.Close()
		}
		for _, k := range kids {
			done := make(chan struct{})
			go func() { _ = k.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				_ = k.cmd.Process.Kill()
				<-done
			}
			k.log.Close()
		}
		readers.Wait()
		close(events)
	}()
	watch := map[string]int{}
	for name, pid := range o.watch {
		watch[name] = pid
	}
	for i := range v.instances {
		logf, err := os.Create(filepath.Join(o.Out, fmt.Sprintf("%s-%s-i%d.log", v.name, short, i+1)))
		if err != nil {
			return fail(err)
		}
		cmd := exec.Command(self, "-"+ChildFlag, string(specJSON))
		cmd.Stderr = logf
		stdin, err := cmd.StdinPipe()
		if err != nil {
			logf.Close()
			return fail(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			logf.Close()
			return fail(err)
		}
		if err := cmd.Start(); err != nil {
			logf.Close()
			return fail(err)
		}
		kids = append(kids, &instChild{cmd: cmd, stdin: stdin, log: logf})
		watch[fmt.Sprintf("instance %d", i+1)] = cmd.Process.Pid
		readers.Go(func() {
			sc := bufio.NewScanner(stdout)
			sc.Buffer(make([]byte, 1<<20), 1<<24)
			for sc.Scan() {
				line, ok := strings.CutPrefix(sc.Text(), "BENCH ")
				if !ok {
					fmt.Fprintln(logf, sc.Text())
					continue
				}
				kind, body, _ := strings.Cut(line, " ")
				events <- instEvent{idx: i, kind: kind, body: []byte(body)}
			}
			events <- instEvent{idx: i, kind: "exit"}
		})
	}
	cpu := newCPUMeter(watch)
	began := time.Now() // the catch-up: from the processes' start
	ir := &instancesResult{N: v.instances, PeakRSSMiB: make([]float64, v.instances), Records: make([]int64, v.instances)}
	m.Instances = ir
	var catchUp, live []instCkpt
	var units []unit
	var liveUnits []unit
	assigned := map[int]int64{} // live phase: partitions per instance
	// The first member of the group holds every partition until the others
	// have joined (seconds: the group's join and rebalance): the rate is
	// taken from the first checkpoint after every instance held
	// partitions, summarize's rule for start-up.
	var joined []int
	var allIn time.Time
	var committed, liveCommitted int64
	exited := map[int]bool{}
	// handle takes one event; an error when a child ended before its time.
	handle := func(ev instEvent, wantResults bool) error {
		switch ev.kind {
		case "ckpt":
			var c instCkpt
			if err := json.Unmarshal(ev.body, &c); err != nil {
				return err
			}
			end := time.Unix(0, c.EndNs)
			if c.Live {
				live = append(live, c)
				if !c.Failed {
					liveCommitted += int64(c.Records)
					liveUnits = append(liveUnits, unit{end: end, dur: time.Duration(c.DurMs * float64(time.Millisecond)), records: c.Records})
				}
			} else {
				catchUp = append(catchUp, c)
				if !c.Failed {
					committed += int64(c.Records)
					ir.Records[ev.idx] += int64(c.Records)
					units = append(units, unit{end: end, dur: time.Duration(c.DurMs * float64(time.Millisecond)), records: c.Records, counted: c.Counted})
				}
			}
			if c.Failed && len(ir.FirstErrs) < 5 {
				ir.FirstErrs = append(ir.FirstErrs, fmt.Sprintf("instance %d: %s", ev.idx+1, c.Err))
			}
		case "assigned":
			var a struct {
				Live bool  `json:"live"`
				N    int64 `json:"n"`
			}
			if err := json.Unmarshal(ev.body, &a); err != nil {
				return err
			}
			if a.Live {
				assigned[ev.idx] = a.N
			} else if a.N > 0 && !slices.Contains(joined, ev.idx) {
				joined = append(joined, ev.idx)
				if len(joined) == len(kids) {
					allIn = time.Now()
				}
			}
		case "result":
			var r childResult
			if err := json.Unmarshal(ev.body, &r); err != nil {
				return err
			}
			ir.PeakRSSMiB[ev.idx] = r.PeakRSSMiB
			if r.Err != "" && m.Result.Err == "" {
				m.Result.Err = fmt.Sprintf("instance %d: %s", ev.idx+1, r.Err)
			}
		case "exit":
			exited[ev.idx] = true
			if !wantResults {
				return fmt.Errorf("instance %d exited early (see %s)", ev.idx+1, kids[ev.idx].log.Name())
			}
		}
		return nil
	}
	// wait handles events until cond holds or timeout.
	wait := func(cond func() bool, timeout time.Duration, wantResults bool) (bool, error) {
		deadline := time.After(timeout)
		for !cond() {
			select {
			case ev := <-events:
				if err := handle(ev, wantResults); err != nil {
					return false, err
				}
			case <-deadline:
				return false, nil
			case <-ctx.Done():
				return false, ctx.Err()
			}
		}
		return true, nil
	}
	send := func(cmd string) {
		for _, k := range kids {
			fmt.Fprintln(k.stdin, cmd)
		}
	}
	finish := func() {
		send("stop")
		_, _ = wait(func() bool { return len(exited) == len(kids) }, o.Timeout+time.Minute, true)
		ir.Aborted, ir.LiveAbort = groupCauses(catchUp), groupCauses(live)
		for _, r := range ir.PeakRSSMiB {
			m.Result.PeakRSSMiB = max(m.Result.PeakRSSMiB, r)
		}
		m.Result.Failed = 0
		for _, c := range ir.Aborted {
			m.Result.Failed += c.Count
		}
		for _, c := range ir.LiveAbort {
			m.Result.Failed += c.Count
		}
	}
	caughtUp, err := wait(func() bool { return committed >= total }, o.Timeout, false)
	m.Result.CatchUpS = time.Since(began).Seconds()
	ir.Cores = cpu.cores()
	m.Result.CPU = map[string]float64{"mysql": ir.Cores["mysql"], "kafka": ir.Cores["kafka"], "cpu stall": ir.Cores["cpu stall"]}
	for i := range v.instances {
		m.Result.CPU["bench process"] += ir.Cores[fmt.Sprintf("instance %d", i+1)] // all instances: "self"
	}
	slices.SortFunc(units, func(a, b unit) int { return a.end.Compare(b.end) })
	m.Result.Mode, m.Result.Records, m.Result.TimedOut = modeService, committed, !caughtUp
	m.Result.CatchUp = summarize(sharedUnits(units, allIn), began)
	ir.WholeRate = summarize(units, began).Rate
	if !allIn.IsZero() {
		ir.AllInS = allIn.Sub(began).Seconds()
	}
	if err != nil || !caughtUp {
		if err != nil {
			m.Err = err.Error()
		}
		finish()
		return m
	}
	send("live")
	parts := int64(len(ends))
	if ok, err := wait(func() bool {
		var n int64
		for _, a := range assigned {
			n += a
		}
		return n == parts
	}, time.Minute, false); err != nil || !ok {
		m.Err = fmt.Sprintf("live instances not assigned every partition within a minute (%v)", err)
		finish()
		return m
	}
	m.Ledger = check(ctx, []string{o.Admin}, dbName, expected, topic, "")
	n, err := liveProducer(ctx, o.Brokers, spec.LiveTopic, fmt.Sprintf("live-%s-%s", runID, short), v.live(o), o.LiveDuration, nil, "", v.accounts, o.DupRatio, o.Seed, v.randomIDs)
	if err != nil {
		m.Err = "live producer: " + err.Error()
	}
	m.Result.LiveRecords = n
	ok, err := wait(func() bool { return liveCommitted >= n }, o.Timeout, false)
	if err != nil {
		m.Err = err.Error()
	}
	m.Result.LiveTimeout = !ok
	var lat []float64
	for _, c := range live {
		lat = append(lat, c.LatMs...)
	}
	slices.SortFunc(liveUnits, func(a, b unit) int { return a.end.Compare(b.end) })
	m.Result.Live = summarize(liveUnits, time.Now())
	m.Result.LatP50, m.Result.LatP99 = quantile(lat, 0.5), quantile(lat, 0.99)
	if len(lat) > 0 {
		m.Result.LatMax = lat[len(lat)-1]
	}
	finish()
	return m
}

// instancesLines reports, for each measurement of several instances, its
// aborted attempts by cause and its rate over the single instance's
// (the default variant's service of the same repetition).
func instancesLines(ms []measurement) string {
	var b strings.Builder
	single := map[int]float64{}
	for _, m := range ms {
		if m.Variant == "default" && m.Mode == modeService && m.Instances == nil && !m.Result.TimedOut {
			single[m.Rep] = m.Result.CatchUp.Rate
		}
	}
	for _, m := range ms {
		ir := m.Instances
		if ir == nil {
			continue
		}
		ratio := "no single-instance service in this run"
		if s := single[m.Rep]; s > 0 {
			ratio = fmt.Sprintf("%.2f × the default variant's single instance (%s events/s)", m.Result.CatchUp.Rate/s, fmtRate(s))
		}
		var rss, recs []string
		for i := range ir.N {
			rss = append(rss, fmt.Sprintf("%.0f", ir.PeakRSSMiB[i]))
			recs = append(recs, fmt.Sprint(ir.Records[i]))
		}
		var cores []string
		for i := range ir.N {
			cores = append(cores, fmt.Sprintf("%.2f", ir.Cores[fmt.Sprintf("instance %d", i+1)]))
		}
		joined := fmt.Sprintf("all holding partitions %.1fs after start (%s events/s including the time before), from then", ir.AllInS, fmtRate(ir.WholeRate))
		if ir.AllInS == 0 {
			joined = "NOT ALL holding partitions during the catch-up (see records per instance):"
		}
		fmt.Fprintf(&b, "%s %s #%d: %d instances, %s %s events/s = %s; aborted attempts in the catch-up: %s; in the live phase: %s; e2e p99 %s; peak RSS %s MiB; catch-up records per instance %s; cores per instance %s, mysql %.2f, kafka %.2f\n",
			m.Variant, m.Mode, m.Rep, ir.N, joined, fmtRate(m.Result.CatchUp.Rate), ratio, causesLine(ir.Aborted), causesLine(ir.LiveAbort), fmtMs(m.Result.LatP99),
			strings.Join(rss, "/"), strings.Join(recs, "/"), strings.Join(cores, "/"), ir.Cores["mysql"], ir.Cores["kafka"])
		for _, e := range ir.FirstErrs {
			fmt.Fprintf(&b, "   first errors: %s\n", e)
		}
	}
	return b.String()
}
