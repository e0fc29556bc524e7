package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/ledgerclock"
	"github.com/billing/ledger/internal/periods"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/service"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// The world of one scenario file: an in-process Kafka (kfake) with one
// topic, a ledger on in-memory servers (memdriver), the clock, and the
// instances of the service, each a pipeline.Pipeline configured by
// service.PipelineConfig from config.Defaults and the file's settings, run
// by Run as cmd/billing runs it. Checkpoints happen when the file says
// (CHECKPOINT_INTERVAL is an hour; see Pipeline.ForceCheckpoint), or when
// the buffer reaches CHECKPOINT_MAX_RECORDS or CHECKPOINT_MAX_BYTES, or
// when partitions are revoked and at shutdown, as in the service.

// harnessSettings are the settings every instance starts with, before the
// file's: checkpoints, recovery passes and cleanup passes only when the
// file says (or at start), a group that notices a silent member within
// seconds.
var harnessSettings = map[string]string{
	"CHECKPOINT_INTERVAL":     "1h",
	"RECOVERY_INTERVAL":       "1h",
	"DEDUP_CLEANUP_INTERVAL":  "1h",
	"CHECKPOINT_TIMEOUT":      "20s",
	"SHUTDOWN_TIMEOUT":        "20s",
	"KAFKA_SESSION_TIMEOUT":   "3s",
	"KAFKA_REBALANCE_TIMEOUT": "4s",
	"LOG_PROGRESS_INTERVAL":   "0s",
}

// settleTimeout bounds every wait of the harness: a scenario that does not
// reach the state it waits for fails, naming what it waited for.
const settleTimeout = 30 * time.Second

type world struct {
	t     *testing.T
	ctx   context.Context
	clock *clock
	log   *slog.Logger

	kc    *kfake.Cluster
	topic string
	parts int
	prod  *kgo.Client
	adm   *kadm.Client
	ends  []int64 // each partition's log end, as produced

	servers     []*memdriver.Cluster // the ledger's, the control server first
	constraints []constraint         // refused rows (refuse)
	defaults    map[string]string    // the file's settings for every start

	instances map[string]*instance // by name, the latest start
	starts    map[string]int
	offline   map[string]*offline
	claimers  map[string]*txsink.Sink

	mu       sync.Mutex
	attempts []attempt // every checkpoint attempt reported, in order
	printed  int       // of attempts, those a command has shown
}

// attempt is one checkpoint attempt an instance reported.
type attempt struct {
	name string // the instance's name in the file
	info pipeline.CheckpointInfo
}

func newWorld(t *testing.T) *world {
	return &world{t: t, ctx: context.Background(), clock: newClock(), log: testenv.Logger(), defaults: map[string]string{},
		instances: map[string]*instance{}, starts: map[string]int{}, offline: map[string]*offline{}, claimers: map[string]*txsink.Sink{}}
}

// close ends every instance (releasing what the file held) and the
// servers.
func (w *world) close() {
	for _, in := range w.instances {
		in.paused.Store(false)
		in.releaseHold()
		if in.running() {
			in.cancel()
		}
	}
	for _, in := range w.instances {
		select {
		case <-in.done:
		case <-time.After(settleTimeout):
			w.t.Errorf("instance %s did not stop", in.name)
		}
		in.sink.Close()
	}
	for _, s := range w.claimers {
		s.Close()
	}
	for _, o := range w.offline {
		o.sink.Close()
	}
	if w.prod != nil {
		w.prod.Close()
	}
	if w.kc != nil {
		w.kc.Close()
	}
}

func (w *world) report(name string, info pipeline.CheckpointInfo) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.attempts = append(w.attempts, attempt{name, info})
}

// flush renders the attempts reported since the last flush (every one is
// shown once, by the first command that waits after it), each instance's
// in its order, the instances by name (two instances' checkpoints in one
// rebalance run concurrently).
func (w *world) flush() []string {
	w.mu.Lock()
	as := slices.Clone(w.attempts[w.printed:])
	w.printed = len(w.attempts)
	w.mu.Unlock()
	slices.SortStableFunc(as, func(a, b attempt) int { return strings.Compare(a.name, b.name) })
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = attemptLine(a.info)
	}
	return out
}

// handles are the ledger's servers as the service's account sees them.
func (w *world) handles() []*memdriver.Server {
	out := make([]*memdriver.Server, len(w.servers))
	for i, c := range w.servers {
		out[i] = c.As("billing")
	}
	return out
}

func (w *world) view() *memdriver.View { return memdriver.NewView(w.handles()...) }

// sinkFor opens a sink of the ledger for instance id, its decisions going
// through control.
func (w *world) sinkFor(cfg txsink.Config, control driver.Control) (*txsink.Sink, []driver.Store, error) {
	hs := w.handles()
	servers := make([]driver.Server, len(hs))
	stores := make([]driver.Store, len(hs))
	for i, h := range hs {
		servers[i], stores[i] = h, h
	}
	if control == nil {
		control = hs[0]
	}
	sink, err := txsink.New(w.ctx, cfg, control, servers)
	return sink, stores, err
}

// instance is one start of the service.
type instance struct {
	w        *world
	name, id string // the file's name; the owner id (the name, then name2, name3 at later starts)
	group    string
	cfg      config.Config
	sink     *txsink.Sink
	stores   []driver.Store
	p        *pipeline.Pipeline
	now      func() time.Time // its processing time (the ledger's clock, or its host's)
	cancel   context.CancelFunc
	done     chan struct{}
	err      error // Run's, once done is closed

	paused atomic.Bool // the group hears nothing from it
	hold   hold
}

func (in *instance) running() bool {
	select {
	case <-in.done:
		return false
	default:
		return true
	}
}

// hold stops the instance's next commit decision before its statement,
// its branches prepared, until released: a process frozen between prepare
// and decision.
type hold struct {
	mu      sync.Mutex
	armed   bool
	gtrid   string        // the checkpoint held
	held    chan struct{} // closed once one is held
	release chan struct{}
}

func (in *instance) armHold() {
	in.hold.mu.Lock()
	defer in.hold.mu.Unlock()
	in.hold.armed, in.hold.gtrid = true, ""
	in.hold.held, in.hold.release = make(chan struct{}), make(chan struct{})
}

// heldGtrid is the checkpoint held at its decision, if one is.
func (in *instance) heldGtrid() string {
	in.hold.mu.Lock()
	defer in.hold.mu.Unlock()
	if in.hold.held == nil {
		return ""
	}
	select {
	case <-in.hold.held:
		select {
		case <-in.hold.release:
			return ""
		default:
			return in.hold.gtrid
		}
	default:
		return ""
	}
}

func (in *instance) releaseHold() {
	in.hold.mu.Lock()
	defer in.hold.mu.Unlock()
	in.hold.armed = false
	if in.hold.release != nil {
		select {
		case <-in.hold.release:
		default:
			close(in.hold.release)
		}
	}
}

// heldControl is the control server as an instance sees it: its commit
// decisions wait while the instance is held.
type heldControl struct {
	*memdriver.Server
	in *instance
}

func (c heldControl) Commit(ctx context.Context, d driver.Decision, scope driver.Scope, cuts []driver.Cut, fence func([]driver.Stored) error, f *driver.FrontierChange, keys *driver.Generation, layout func(driver.MoveCursor) error, applied bool) (int64, error) {
	h := &c.in.hold
	h.mu.Lock()
	armed := h.armed
	if armed {
		h.armed, h.gtrid = false, d.Gtrid
		close(h.held)
	}
	release := h.release
	h.mu.Unlock()
	if armed {
		select {
		case <-release:
		case <-ctx.Done(): // CHECKPOINT_TIMEOUT: the hold ends with it
			c.in.releaseHold()
			return 0, ctx.Err()
		}
	}
	return c.Server.Commit(ctx, d, scope, cuts, fence, f, keys, layout, applied)
}

// settings are the service's configuration of a start: the defaults, the
// harness's, the file's and the command's.
func (w *world) settings(args map[string]string) (config.Config, error) {
	vars := maps.Clone(harnessSettings)
	maps.Copy(vars, w.defaults)
	maps.Copy(vars, args)
	cfg, err := config.Defaults().With(vars)
	if err != nil {
		return cfg, err
	}
	cfg.KafkaTopic = w.topic
	return cfg, nil
}

// start starts an instance: its sink, the ledger's period settings (stored
// at the first start, as periods.Ensure does), the pipeline, and Run.
func (w *world) start(name string, args map[string]string, skew time.Duration, hostClock bool) (*instance, error) {
	cfg, err := w.settings(args)
	if err != nil {
		return nil, err
	}
	w.starts[name]++
	id := name
	if n := w.starts[name]; n > 1 {
		id = fmt.Sprintf("%s%d", name, n)
	}
	in := &instance{w: w, name: name, id: id, group: cfg.KafkaGroup, cfg: cfg, done: make(chan struct{})}
	if in.now, err = w.clockOf(skew, hostClock); err != nil {
		return nil, err
	}
	scfg := service.SinkConfig(cfg, w.log)
	scfg.Instance, scfg.Now = id, in.now
	sink, stores, err := w.sinkFor(scfg, heldControl{Server: w.handles()[0], in: in})
	if err != nil {
		return nil, err
	}
	in.sink, in.stores = sink, stores
	schedule, check, err := w.periodSettings(cfg, id)
	if err != nil {
		sink.Close()
		return nil, err
	}
	kopts := []kgo.Opt{kgo.SeedBrokers(w.kc.ListenAddrs()...), kgo.Balancers(byName{name}), kgo.HeartbeatInterval(100 * time.Millisecond),
		// A fetch in flight when partitions are reassigned holds back the
		// new ones' fetch until it returns: long polls of 100 ms rather
		// than 5 s keep a rebalance's tail short.
		kgo.FetchMaxWait(100 * time.Millisecond), kgo.ClientID("billing-" + id)}
	pcfg := service.PipelineConfig(cfg, kopts, w.log, func(info pipeline.CheckpointInfo) { w.report(name, info) })
	pcfg.Clock, pcfg.Window, pcfg.CheckSettings = in.now, schedule, check
	if in.p, err = pipeline.New(pcfg, sink, stores); err != nil {
		sink.Close()
		return nil, err
	}
	in.p.DeferCheckpoint()
	ctx, cancel := context.WithCancel(w.ctx)
	in.cancel = cancel
	w.instances[name] = in
	go func() {
		defer close(in.done)
		in.err = in.p.Run(ctx)
		in.paused.Store(false)
	}()
	return in, nil
}

// clockOf is the processing time of a process whose host's clock is off
// by skew: the ledger's clock as the service measures it (package
// ledgerclock), or with hostClock its host's own.
func (w *world) clockOf(skew time.Duration, hostClock bool) (func() time.Time, error) {
	if skew == 0 && !hostClock {
		return w.clock.Now, nil
	}
	host := func() time.Time { return w.clock.Now().Add(skew) }
	if hostClock {
		return host, nil
	}
	lc := ledgerclock.New(host)
	if err := lc.Sync(w.ctx, serverClock{w.clock}); err != nil {
		return nil, err
	}
	return lc.Now, nil
}

// serverClock is the control server's clock, as ledgerclock reads it.
type serverClock struct{ c *clock }

func (s serverClock) UTCTime(context.Context) (time.Time, error) { return s.c.Now(), nil }

// periodSettings are the ledger's windows and the check that they stay
// the ledger's, as the service builds them (service.newPipeline): the
// settings are stored by the first instance that starts, and an instance
// stops once they changed since it started (periods.Verify).
func (w *world) periodSettings(cfg config.Config, by string) (event.Schedule, func(context.Context) error, error) {
	view := w.view()
	stored, err := periods.Read(w.ctx, view)
	if err != nil {
		return event.Schedule{}, nil, err
	}
	mine := periods.Settings{Period: cfg.Period(), Close: cfg.WindowCloseAfter > 0}
	if len(stored) == 0 {
		w.servers[0].StorePeriods(driver.PeriodRow{Seq: 1, Window: mine.Period.Unit(), Timezone: mine.Period.Zone(), Close: mine.Close,
			RecordedAt: w.clock.Now(), RecordedBy: by})
		if stored, err = periods.Read(w.ctx, view); err != nil {
			return event.Schedule{}, nil, err
		}
	} else if diffs := periods.Diff(stored.Current(), mine, time.Duration(cfg.WindowCloseAfter)); len(diffs) > 0 {
		return event.Schedule{}, nil, &periods.MismatchError{Differences: diffs}
	}
	schedule, err := stored.Schedule()
	if err != nil {
		return event.Schedule{}, nil, err
	}
	check := func(ctx context.Context) error {
		err := periods.Verify(ctx, view, stored)
		var changed *periods.MismatchError
		if errors.As(err, &changed) {
			return err
		}
		return nil
	}
	return schedule, check, nil
}

// running are the instances whose Run has not returned, by name.
func (w *world) running() []*instance {
	var out []*instance
	for _, name := range slices.Sorted(maps.Keys(w.instances)) {
		if in := w.instances[name]; in.running() {
			out = append(out, in)
		}
	}
	return out
}

// waitFor polls cond, nudging every running instance's poll loop, until
// it holds or settleTimeout passes.
func (w *world) waitFor(what string, cond func() (bool, string)) error {
	deadline := time.Now().Add(settleTimeout)
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s (%s)", what, settleTimeout, state)
		}
		for _, in := range w.running() {
			in.p.Nudge()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// settle waits until the world is at rest: in every group, the members
// the group can hear from (not paused) are its only members, each holds
// its range of the partitions, and each has read every partition it holds
// to the log's end with no checkpoint in flight and nothing to reread (an
// instance held at its decision only holds its partitions).
func (w *world) settle() error {
	return w.waitFor("the world to settle", func() (bool, string) { return w.unsettled() == "", w.unsettled() })
}

func (w *world) unsettled() string {
	groups := map[string][]*instance{}
	for _, in := range w.running() {
		if !in.paused.Load() {
			groups[in.group] = append(groups[in.group], in)
		}
	}
	for _, g := range slices.Sorted(maps.Keys(groups)) {
		live := groups[g]
		names := make([]string, len(live))
		for i, in := range live {
			names[i] = in.name
		}
		described, err := w.adm.DescribeGroups(w.ctx, g)
		if err != nil {
			return fmt.Sprintf("group %s: %v", g, err)
		}
		d := described[g]
		if d.State != "Stable" || len(d.Members) != len(live) {
			return fmt.Sprintf("group %s is %s with %d members, want Stable with %v", g, d.State, len(d.Members), names)
		}
		for i, want := range assignment(names, w.parts) {
			in := live[i]
			st := in.p.State()
			var held []int32
			for _, ps := range st.Partitions {
				held = append(held, ps.ID)
			}
			if !slices.Equal(held, want) {
				return fmt.Sprintf("%s holds %v, want %v", in.name, held, want)
			}
			if in.heldGtrid() != "" {
				continue
			}
			if st.InFlight {
				return in.name + " has a checkpoint in flight"
			}
			for _, ps := range st.Partitions {
				end := w.ends[ps.ID]
				switch {
				case ps.Rewind:
					return fmt.Sprintf("%s rewinds p%d", in.name, ps.ID)
				case ps.Position == txsink.StartOffset && end > 0 || ps.Position != txsink.StartOffset && ps.Position < end:
					return fmt.Sprintf("%s read p%d to %s of %d", in.name, ps.ID, offset(ps.Position), end)
				}
			}
		}
	}
	return ""
}

// assigned describes which partitions each running instance holds.
func (w *world) assigned() string {
	var out []string
	for _, in := range w.running() {
		var ps []string
		for _, p := range in.p.State().Partitions {
			ps = append(ps, fmt.Sprintf("p%d", p.ID))
		}
		if len(ps) == 0 {
			ps = []string{"nothing"}
		}
		state := ""
		if in.paused.Load() {
			state = " (paused)"
		}
		out = append(out, fmt.Sprintf("%s holds %s%s", in.name, strings.Join(ps, " "), state))
	}
	return strings.Join(out, "; ")
}

// offline is a Checkpointer used alone, as benchmarks use it: records
// that did not come from Kafka (what the decoder would refuse) are fed to
// it directly.
type offline struct {
	name    string
	sink    *txsink.Sink
	ck      *pipeline.Checkpointer
	epochs  map[int32]int64
	offsets map[int32]int64
}

// constraint refuses rows of a table: of an account (account), with an
// amount above a bound (above >= 0), sealed (closed_at set); every one
// given must hold.
type constraint struct {
	name, table, account string
	above                int64
	sealed               bool
}

func (c constraint) refuses(table string, row any) bool {
	if table != c.table {
		return false
	}
	var account string
	var amount int64
	var closed time.Time
	switch r := row.(type) {
	case driver.BalanceRow:
		account, amount = r.Account, r.Amount
	case driver.WindowRow:
		account, amount, closed = r.Account, r.Amount, r.ClosedAt
	case driver.AdjustmentRow:
		account, amount = r.Account, r.Amount
	case driver.EntryRow:
		account, amount = r.Account, r.Amount
	}
	return (c.account == "" || account == c.account) && (c.above < 0 || amount > c.above) && (!c.sealed || !closed.IsZero())
}
