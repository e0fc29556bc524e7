package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// sourcePlanDir holds the source plan's specification (TestSourcePlan);
// TestScenarios leaves it out.
const sourcePlanDir = "testdata/source"

// TestSourcePlan runs the specification of the source's plan
// (sourceplan.go): every file in testdata/source/ states one rule of the
// rewind pass by example, over the partitions' state, with no I/O at all:
// the file answers each step the plan asks for, as the executor would
// (Pipeline.rewind), and the outcome is applied to the partitions as the
// executor applies it (applyRewind). Run with -rewrite to regenerate the
// expected output after a deliberate change, and read the diff.
//
// Times are on 29 November 2026 UTC ("14:00:01.5"); the host's clock starts
// at 14:00. This instance is "a".
//
// Commands:
//
//	assign                     partitions this member holds, one a line:
//	                           p0 epoch=1 at=7 [committed=5] [watermark=13:05] [caught-up]
//	                           [reclaim-after=T backoff=DUR]; never checkpointed: at=start
//	abort                      a checkpoint failed before its decision: every partition's
//	                           buffer is discarded, every partition rewinds (finishLocked)
//	revoke p=1                 the group takes a partition away
//	tick d=DUR                 the host's clock moves on
//	rewind                     a pass starts (what the poll loop does at every turn): its
//	                           first step
//	positions [error=E]        the stored positions read, one a line:
//	                           p0: next 5, epoch 1, owner a [, watermark 13:05] [, caught up]
//	                           (next start: never checkpointed); the next step
//	claim [error=E]            the positions claimed, as positions; the next step
//	settings [stop]            the settings check passed (or stops the instance)
//	starts [error=E]           the log start offsets listed, one a line: p0: 0
//	apply                      the outcome applied: where fetching restarts, the partitions
//	state                      the partitions, and when the next pass may start
func TestSourcePlan(t *testing.T) {
	datadriven.Walk(t, sourcePlanDir, func(t *testing.T, path string) {
		m := &sourceModel{now: planTime(t, "14:00"), parts: map[int32]*partition{}}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return m.run(t, d)
		})
	})
}

// sourceModel is the source's state a scenario drives, and the pass in
// progress.
type sourceModel struct {
	now   time.Time
	parts map[int32]*partition
	hold  rewindHold
	pass  *rewindPlan
}

func (m *sourceModel) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "assign":
		for _, line := range inputLines(d.Input) {
			pt := parsePartition(t, d, line)
			m.parts[pt.id] = pt
		}
		return m.state()
	case "abort":
		for _, pt := range m.parts {
			pt.records, pt.dead, pt.bytes = nil, nil, 0
			pt.rewind = true
		}
		return m.state()
	case "revoke":
		var p int
		d.ScanArgs(t, "p", &p)
		delete(m.parts, int32(p))
		return m.state()
	case "tick":
		var s string
		d.ScanArgs(t, "d", &s)
		dur, err := time.ParseDuration(s)
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		m.now = m.now.Add(dur)
		return m.now.UTC().Format("15:04:05.000")
	case "rewind":
		m.pass = newRewindPlan(rewindInputOf(m.parts, m.now, "a", m.hold))
		st := m.pass.ready()
		if st.kind == rewindNothing {
			m.pass = nil
		}
		return st.String()
	case "positions", "claim", "settings", "starts":
		return m.answer(t, d)
	case "apply":
		st := m.step(t, d, rewindApply)
		seeks := applyRewind(m.parts, st.out)
		m.hold, m.pass = st.out.hold, nil
		var b strings.Builder
		b.WriteString("seek:")
		if len(seeks) == 0 {
			b.WriteString(" none")
		}
		for _, id := range slices.Sorted(maps.Keys(seeks)) {
			fmt.Fprintf(&b, " p%d at %d", id, seeks[id])
		}
		return b.String() + "\n" + m.state()
	case "state":
		return m.state()
	}
	d.Fatalf(t, "unknown command %s", d.Cmd)
	return ""
}

// step is the pass's next step, which must be of kind want.
func (m *sourceModel) step(t *testing.T, d *datadriven.TestData, want rewindStepKind) rewindStep {
	if m.pass == nil {
		d.Fatalf(t, "no pass in progress")
	}
	st := m.pass.ready()
	if st.kind != want {
		d.Fatalf(t, "the plan asks for: %s", st)
	}
	return st
}

// answer hands the pass the result of its step, and returns the next one.
func (m *sourceModel) answer(t *testing.T, d *datadriven.TestData) string {
	kind := map[string]rewindStepKind{"positions": rewindPositions, "claim": rewindClaim, "settings": rewindSettings, "starts": rewindStarts}[d.Cmd]
	m.step(t, d, kind)
	r := rewindResult{now: m.now}
	if d.HasArg("error") {
		var e string
		d.ScanArgs(t, "error", &e)
		r.err = errors.New(e)
	}
	switch {
	case r.err != nil:
	case kind == rewindPositions || kind == rewindClaim:
		r.positions = map[int32]txsink.Position{}
		for _, line := range inputLines(d.Input) {
			id, ps := parsePosition(t, d, line)
			r.positions[id] = ps
		}
	case kind == rewindSettings && d.HasArg("stop"):
		r.err = errors.New("billing periods changed")
	case kind == rewindStarts:
		r.starts = map[int32]int64{}
		for _, line := range inputLines(d.Input) {
			p, o, ok := strings.Cut(line, ":")
			r.starts[int32(atoi(t, d, strings.TrimPrefix(p, "p")))] = int64(atoi(t, d, strings.TrimSpace(o)))
			if !ok {
				d.Fatalf(t, "start offset %q: want p0: 0", line)
			}
		}
	}
	m.pass.advance(r)
	return m.pass.ready().String()
}

// state describes the partitions and the hold on the next pass.
func (m *sourceModel) state() string {
	var ls []string
	for _, id := range slices.Sorted(maps.Keys(m.parts)) {
		pt := m.parts[id]
		s := fmt.Sprintf("p%d epoch %d at %s committed %s", id, pt.epoch, offsetText(pt.position), offsetText(pt.committed))
		if !pt.watermark.IsZero() {
			s += ", watermark " + pt.watermark.UTC().Format("15:04")
		}
		if pt.committedUp {
			s += ", caught up"
		}
		if len(pt.records) > 0 {
			s += fmt.Sprintf(", %d buffered", len(pt.records))
		}
		if pt.rewind {
			s += ", rewinding"
		}
		if !pt.reclaimAfter.IsZero() {
			s += fmt.Sprintf(", no re-claim before %s (backoff %s)", pt.reclaimAfter.UTC().Format("15:04:05.000"), pt.reclaimBackoff)
		}
		ls = append(ls, s)
	}
	if len(ls) == 0 {
		ls = append(ls, "no partitions")
	}
	if m.hold.after.After(m.now) {
		ls = append(ls, fmt.Sprintf("next pass after %s (backoff %s)", m.hold.after.UTC().Format("15:04:05.000"), m.hold.backoff))
	}
	return strings.Join(ls, "\n")
}

// parsePartition reads "p0 epoch=1 at=7 [committed=5] [watermark=13:05]
// [caught-up] [buffered=N] [reclaim-after=T backoff=DUR]".
func parsePartition(t *testing.T, d *datadriven.TestData, line string) *partition {
	fs := strings.Fields(line)
	pt := &partition{id: int32(atoi(t, d, strings.TrimPrefix(fs[0], "p"))), end: -1}
	committed := false
	for _, f := range fs[1:] {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "epoch":
			pt.epoch = int64(atoi(t, d, v))
		case "at":
			pt.position = parseOffset(t, d, v)
		case "committed":
			pt.committed, committed = parseOffset(t, d, v), true
		case "watermark":
			pt.watermark = planTime(t, v)
		case "caught-up":
			pt.committedUp = true
		case "buffered":
			for i := range atoi(t, d, v) {
				pt.records = append(pt.records, record{partition: pt.id, offset: int64(i)})
			}
		case "reclaim-after":
			pt.reclaimAfter = planTime(t, v)
		case "backoff":
			dur, err := time.ParseDuration(v)
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			pt.reclaimBackoff = dur
		default:
			d.Fatalf(t, "partition %q: unknown %s", line, k)
		}
	}
	if !committed {
		pt.committed = pt.position
	}
	return pt
}

// parsePosition reads "p0: next 5, epoch 1, owner a[, watermark 13:05][,
// caught up]" (next start: never checkpointed).
func parsePosition(t *testing.T, d *datadriven.TestData, line string) (int32, txsink.Position) {
	p, rest, ok := strings.Cut(line, ":")
	if !ok {
		d.Fatalf(t, "position %q: want p0: next 5, epoch 1, owner a", line)
	}
	var ps txsink.Position
	for _, f := range strings.Split(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(f), " ")
		switch k {
		case "next":
			ps.NextOffset = parseOffset(t, d, v)
		case "epoch":
			ps.Epoch = int64(atoi(t, d, v))
		case "owner":
			ps.Owner = v
		case "watermark":
			ps.Watermark = planTime(t, v)
		case "caught":
			ps.CaughtUp = true
		default:
			d.Fatalf(t, "position %q: unknown %s", line, k)
		}
	}
	return int32(atoi(t, d, strings.TrimPrefix(p, "p"))), ps
}

func parseOffset(t *testing.T, d *datadriven.TestData, s string) int64 {
	if s == "start" {
		return txsink.StartOffset
	}
	return int64(atoi(t, d, s))
}

func atoi(t *testing.T, d *datadriven.TestData, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	return n
}

// planTime reads a time of 29 November 2026 UTC: "14:00", "14:00:01.5".
func planTime(t *testing.T, s string) time.Time {
	for _, layout := range []string{"15:04", "15:04:05.999999999"} {
		if c, err := time.Parse(layout, s); err == nil {
			return time.Date(2026, 11, 29, c.Hour(), c.Minute(), c.Second(), c.Nanosecond(), time.UTC)
		}
	}
	t.Fatalf("time %q: want 15:04 or 15:04:05.000", s)
	return time.Time{}
}

func inputLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// The executor of the source's plan does the pass's I/O outside the
// pipeline's lock, and holds a revoke until the pass is applied: a
// re-claim raises the partition's epoch, which must happen while the group
// still gives the partition here. The pass is stopped in the settings
// check that follows a re-claim (after the claim's I/O): meanwhile the
// pipeline's state can be read, and a revoke or a loss waits.
func TestRewindDoesItsIOOutsideTheLockAndHoldsRevokes(t *testing.T) {
	for _, cb := range []struct {
		name string
		take func(p *Pipeline, ctx context.Context, parts map[string][]int32)
	}{
		{"revoked", func(p *Pipeline, ctx context.Context, parts map[string][]int32) { p.onRevoked(ctx, nil, parts) }},
		{"lost", func(p *Pipeline, ctx context.Context, parts map[string][]int32) { p.onLost(ctx, nil, parts) }},
	} {
		t.Run(cb.name, func(t *testing.T) { testRewindHoldsTakeAways(t, cb.take) })
	}
}

// rewindRig is a pipeline on kfake and memdriver, one partition, whose
// settings check waits in the pass once armed.
type rewindRig struct {
	t       *testing.T
	server  *memdriver.Cluster
	p       *Pipeline
	prod    *kgo.Client
	armed   atomic.Bool
	entered chan struct{} // closed when the armed check is entered
	release func()        // lets it return
}

func newRewindRig(t *testing.T) *rewindRig {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "billing"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	rg := &rewindRig{t: t, server: memdriver.New(memdriver.Options{AttachPrepared: true, LockWait: time.Second}), entered: make(chan struct{})}
	released := make(chan struct{})
	var once sync.Once
	rg.release = func() { once.Do(func() { close(released) }) }
	cfg := testConfig(&env{brokers: kc.ListenAddrs(), topic: "billing"})
	cfg.Group, cfg.RecoveryInterval = "g", time.Hour // no settings check but the claims'
	cfg.CheckSettings = func(context.Context) error {
		if rg.armed.CompareAndSwap(true, false) {
			close(rg.entered)
			<-released
		}
		return nil
	}
	if rg.p, err = New(cfg, rg.sink("a"), []driver.Store{rg.server.As("billing")}); err != nil {
		t.Fatal(err)
	}
	if rg.prod, err = kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.DefaultProduceTopic("billing")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rg.prod.Close)
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rg.p.Run(rctx) }()
	t.Cleanup(func() {
		rg.release()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return rg
}

// sink opens a sink on the ledger as instance.
func (rg *rewindRig) sink(instance string) *txsink.Sink {
	s := rg.server.As("billing")
	sink, err := txsink.New(context.Background(), txsink.Config{Branches: 1, Group: "g", Topic: "billing", StepTimeout: 5 * time.Second,
		Instance: instance, Logger: testenv.Logger()}, s, []driver.Server{s})
	if err != nil {
		rg.t.Fatal(err)
	}
	rg.t.Cleanup(sink.Close)
	return sink
}

// produce produces events e-from … e-(to-1) of one account.
func (rg *rewindRig) produce(from, to int) {
	var recs []*kgo.Record
	for i := from; i < to; i++ {
		b, _ := json.Marshal(ev{fmt.Sprintf("e-%d", i), "acct-1", 1, "EUR", t0})
		recs = append(recs, &kgo.Record{Value: b})
	}
	if err := rg.prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		rg.t.Fatal(err)
	}
}

// counted is the number of events the ledger counts.
func (rg *rewindRig) counted() int64 {
	var n int64
	for _, b := range rg.server.Tables().Balances {
		n += b.Count
	}
	return n
}

func testRewindHoldsTakeAways(t *testing.T, take func(p *Pipeline, ctx context.Context, parts map[string][]int32)) {
	rg, ctx := newRewindRig(t), context.Background()
	rg.produce(0, 3)
	testenv.Eventually(t, 30*time.Second, "the first events counted", func() (bool, string) {
		return rg.counted() == 3, fmt.Sprintf("%d counted", rg.counted())
	})
	// Another instance claims p0 while the group still gives it to a: a's
	// next checkpoint is fenced, its pass finds p0 taken and claims it
	// again, then checks the settings, and waits there.
	if _, err := rg.sink("woken").Claim(ctx, []int32{0}); err != nil {
		t.Fatal(err)
	}
	rg.armed.Store(true)
	rg.produce(3, 5)
	select {
	case <-rg.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no re-claim within 30s")
	}

	state := make(chan State, 1)
	go func() { state <- rg.p.State() }()
	select {
	case st := <-state:
		if len(st.Partitions) != 1 || !st.Partitions[0].Rewind {
			t.Errorf("during the pass: %+v, want p0 rewinding", st.Partitions)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the pipeline's lock is held during the pass's I/O")
	}

	taken := make(chan struct{})
	go func() {
		take(rg.p, ctx, map[string][]int32{"billing": {0}})
		close(taken)
	}()
	select {
	case <-taken:
		t.Fatal("the partition was taken away while a re-claim was in progress")
	case <-time.After(300 * time.Millisecond):
	}
	rg.release()
	select {
	case <-taken:
	case <-time.After(30 * time.Second):
		t.Fatal("the partition was not taken away once the pass was over")
	}
	if st := rg.p.State(); len(st.Partitions) != 0 {
		t.Errorf("taken away: %+v, want no partition", st.Partitions)
	}
	pos, err := rg.sink("reader").Positions(ctx, []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	// Claimed again, and every event below the stored position counted
	// once (a revoke checkpoints what was read again meanwhile).
	if ps := pos[0]; ps.Owner != "a" || ps.Epoch != 3 || ps.NextOffset != rg.counted() {
		t.Errorf("stored p0: %+v, %d events counted; want claimed again by a at epoch 3, its events counted", ps, rg.counted())
	}
}
