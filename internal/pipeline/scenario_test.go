package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/service"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// TestScenarios runs the pipeline's specification: every file in testdata/
// states one rule by example, with the service's pipeline (Run, as
// cmd/billing runs it) on an in-process Kafka (kfake) and in-memory
// servers (memdriver), no server of any kind, and a clock the file drives.
// Run with -rewrite to regenerate the expected output after a deliberate
// change, and read the diff.
//
// Times are written as on 29 November 2026 UTC ("13:05"), or in RFC 3339;
// the ledger's clock starts at 14:00 that day. Settings are the service's
// variables (README), KEY=VALUE on start, checkpointer and settings.
//
// Commands (name= names an instance):
//
//	kafka partitions=N                  the topic (billing-events), N partitions
//	ledger [servers=N] [packet=BYTES]   the ledger on N in-memory servers (max_allowed_packet)
//	settings KEY=VALUE ...              settings of every later start
//	start name=a [KEY=VALUE ...] [skew=DUR [clock=host]]
//	                                    an instance joins the group; waits until the world settles;
//	                                    skew: its host's clock is off (it runs on the ledger's
//	                                    clock, measured as the service does; clock=host: on its own)
//	stop name=a                         a graceful shutdown (SIGTERM)
//	kill name=a                         it dies: polling ends, nothing more is checkpointed
//	wait name=a                         until it stops on its own; its error
//	pause name=a | resume name=a        the group hears nothing from it (its heartbeats answered
//	                                    for it): it loses its partitions without knowing
//	hold name=a | release name=a        its next commit decision waits, branches prepared
//	expire name=a                       until the held decision times out (CHECKPOINT_TIMEOUT)
//	produce                             records, one a line (see recordLine)
//	checkpoint name=a                   its next checkpoint, now; waits until it ends and the
//	                                    world settles (or the decision is held)
//	settle                              until the world is at rest (the checkpoints meanwhile)
//	tick d=DUR                          the ledger's clock moves on
//	tables [only=(balances,windows,adjustments,entries,deadletters,keys)] [all] [sums]
//	                                    all: every row, however many; sums: dead letters' SHA-256
//	positions [group=G]                 the stored partition rows
//	eventtime                           the closing frontier and the partitions' event time
//	commits                             the commit log
//	old-commits n=N                     N applied commit log records decided now by a process
//	                                    long gone (old-1 …), as an old ledger's log holds
//	prune-commits name=a                one pass of its commit log retention (COMMIT_LOG_RETENTION);
//	                                    what it deleted and the commit position after it
//	branches                            prepared branches on every server
//	stats name=a                        the instance's totals and dedup cache
//	group-offsets                       the Kafka group's offsets, once they follow the store's
//	upkeep name=a                       its upkeep of the dedup keys' generations, until nothing is due
//	retention name=a                    its cleanup of old entries, until done
//	refuse table=T [account=A] [above=N] [sealed] | refuse off
//	                                    a trigger on every server refuses those rows (Data)
//	fail op=OP code=C [times=N] [server=S]  the next N OP on S fail (memdriver.Fail)
//	packet bytes=N [server=S] [refresh] the server's max_allowed_packet (SET GLOBAL)
//	claim as=x partitions=(0,1)         another process claims partitions (raises their epochs)
//	recover as=r [skew=DUR [clock=host]] another process's recovery pass (its clock as start's)
//	change-periods KEY=VALUE ... [fence]  billing periods change (fence: every partition's epoch + 1)
//	checkpointer name=c [KEY=VALUE ...] a Checkpointer alone; feed name=c: records fed to it
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if strings.HasPrefix(path, "testdata/source/") {
			t.Skip("the source's plan alone: TestSourcePlan")
		}
		w := newWorld(t)
		defer w.close()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			fn, ok := commands[d.Cmd]
			if !ok {
				d.Fatalf(t, "unknown command %s", d.Cmd)
			}
			started := time.Now()
			defer func() { t.Logf("%s: %s", d.Pos, time.Since(started)) }()
			return fn(&command{w: w, t: t, d: d})
		})
	})
}

// command is one command of a scenario file being run.
type command struct {
	w *world
	t *testing.T
	d *datadriven.TestData
}

var commands = map[string]func(*command) string{
	"kafka":          (*command).kafka,
	"ledger":         (*command).ledger,
	"settings":       (*command).settings,
	"settle":         (*command).settleCmd,
	"start":          (*command).start,
	"stop":           (*command).stop,
	"kill":           (*command).kill,
	"wait":           (*command).wait,
	"pause":          (*command).pause,
	"resume":         (*command).resume,
	"hold":           (*command).hold,
	"release":        (*command).release,
	"expire":         (*command).expire,
	"produce":        (*command).produce,
	"checkpoint":     (*command).checkpoint,
	"tick":           (*command).tick,
	"tables":         (*command).tables,
	"positions":      (*command).positions,
	"eventtime":      (*command).eventtime,
	"commits":        (*command).commits,
	"old-commits":    (*command).oldCommits,
	"prune-commits":  (*command).pruneCommits,
	"branches":       (*command).branches,
	"stats":          (*command).stats,
	"group-offsets":  (*command).groupOffsets,
	"upkeep":         (*command).upkeep,
	"retention":      (*command).retention,
	"refuse":         (*command).refuse,
	"fail":           (*command).fail,
	"packet":         (*command).packet,
	"claim":          (*command).claim,
	"recover":        (*command).recover,
	"change-periods": (*command).changePeriods,
	"checkpointer":   (*command).checkpointer,
	"feed":           (*command).feed,
}

func (cm *command) fatalf(format string, args ...any) { cm.d.Fatalf(cm.t, format, args...) }

func (cm *command) arg(key string) string {
	a, ok := cm.d.Arg(key)
	if !ok {
		cm.fatalf("%s: missing %s=", cm.d.Cmd, key)
	}
	return strings.Join(a.Vals, ",")
}

func (cm *command) opt(key, def string) string {
	if a, ok := cm.d.Arg(key); ok {
		return strings.Join(a.Vals, ",")
	}
	return def
}

func (cm *command) int(key string, def int) int {
	s := cm.opt(key, "")
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		cm.fatalf("%s=%s: %v", key, s, err)
	}
	return n
}

// vars are the command's settings: its arguments named in upper case.
func (cm *command) vars() map[string]string {
	out := map[string]string{}
	for _, a := range cm.d.CmdArgs {
		if a.Key == strings.ToUpper(a.Key) {
			out[a.Key] = strings.Join(a.Vals, ",")
		}
	}
	return out
}

func (cm *command) instance() *instance {
	in, ok := cm.w.instances[cm.arg("name")]
	if !ok {
		cm.fatalf("unknown instance %s", cm.arg("name"))
	}
	return in
}

func (cm *command) settle() {
	if err := cm.w.settle(); err != nil {
		cm.fatalf("%v\n(%s)", err, cm.w.assigned())
	}
}

func lines(ls []string, none string) string {
	if len(ls) == 0 {
		return none
	}
	return strings.Join(ls, "\n")
}

func (cm *command) kafka() string {
	w := cm.w
	w.parts = cm.int("partitions", 1)
	w.topic = "billing-events"
	var err error
	w.kc, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(w.parts), w.topic), kfake.GroupMinSessionTimeout(100*time.Millisecond),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(8 << 20)}))
	if err != nil {
		cm.fatalf("%v", err)
	}
	if w.prod, err = kgo.NewClient(kgo.SeedBrokers(w.kc.ListenAddrs()...), kgo.DefaultProduceTopic(w.topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(8<<20)); err != nil {
		cm.fatalf("%v", err)
	}
	w.adm = kadm.NewClient(w.prod)
	w.ends = make([]int64, w.parts)
	return "ok"
}

func (cm *command) ledger() string {
	w := cm.w
	for range cm.int("servers", 1) {
		w.servers = append(w.servers, memdriver.New(memdriver.Options{AttachPrepared: true, TxVisible: true, LockWait: 2 * time.Second,
			MaxAllowedPacket: cm.int("packet", 0), Now: w.clock.Now}))
	}
	w.servers[0].SeedIdentity("5ce0a1105ce0a110", []byte("the scenario ledger's own secret"))
	return "ok"
}

func (cm *command) settings() string {
	maps.Copy(cm.w.defaults, cm.vars())
	return "ok"
}

// settleCmd waits until the world is at rest, and shows the checkpoints
// taken meanwhile (a buffer full: CHECKPOINT_MAX_RECORDS or _BYTES).
func (cm *command) settleCmd() string {
	cm.settle()
	return lines(append(cm.w.flush(), cm.w.assigned()), "")
}

// skew is the command's skew= (a host clock that is off), zero if none.
func (cm *command) skew() time.Duration {
	s := cm.opt("skew", "")
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		cm.fatalf("%v", err)
	}
	return d
}

func (cm *command) start() string {
	w := cm.w
	cm.settle()
	in, err := w.start(cm.arg("name"), cm.vars(), cm.skew(), cm.opt("clock", "ledger") == "host")
	if err != nil {
		return "refused: " + err.Error()
	}
	if err := w.waitFor(in.name+" to join or stop", func() (bool, string) {
		return !in.running() || w.unsettled() == "", w.unsettled()
	}); err != nil {
		cm.fatalf("%v\n(%s)", err, w.assigned())
	}
	out := w.flush()
	if !in.running() {
		return lines(append(out, fmt.Sprintf("%s stopped: %v", in.name, in.err)), "")
	}
	return lines(append(out, w.assigned()), "")
}

func (cm *command) stop() string {
	in := cm.instance()
	cm.settle()
	in.cancel()
	return cm.stopped(in)
}

func (cm *command) kill() string {
	in := cm.instance()
	cm.settle()
	in.p.Kill(errors.New("killed"))
	return cm.stopped(in)
}

// stopped waits for Run to return, then for the others to settle.
func (cm *command) stopped(in *instance) string {
	w := cm.w
	if err := w.waitFor(in.name+" to stop", func() (bool, string) { return !in.running(), "" }); err != nil {
		cm.fatalf("%v", err)
	}
	in.sink.Close()
	cm.settle()
	out := w.flush()
	if in.err != nil {
		out = append(out, fmt.Sprintf("%s stopped: %v", in.name, in.err))
	} else {
		out = append(out, in.name+" stopped")
	}
	if a := w.assigned(); a != "" {
		out = append(out, a)
	}
	return lines(out, "")
}

func (cm *command) wait() string {
	return cm.stopped(cm.instance())
}

func (cm *command) pause() string {
	w, in := cm.w, cm.instance()
	cm.settle()
	member, _ := in.p.Client().GroupMetadata()
	in.paused.Store(true)
	w.kc.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		hb, ok := req.(*kmsg.HeartbeatRequest)
		if !in.paused.Load() {
			w.kc.DropControl()
			return nil, nil, false
		}
		if !ok || hb.MemberID != member {
			return nil, nil, false
		}
		w.kc.KeepControl()
		return hb.ResponseKind(), nil, true
	})
	return "ok"
}

func (cm *command) resume() string {
	w, in := cm.w, cm.instance()
	in.paused.Store(false)
	cm.settle()
	return lines(append(w.flush(), w.assigned()), "")
}

func (cm *command) hold() string {
	cm.instance().armHold()
	return "ok"
}

func (cm *command) release() string {
	cm.instance().releaseHold()
	return cm.collect()
}

// expire waits, without releasing it, until the held decision gives up
// on its own (CHECKPOINT_TIMEOUT, in real time), then as release.
func (cm *command) expire() string {
	in := cm.instance()
	if err := cm.w.waitFor(in.name+"'s held decision to time out", func() (bool, string) { return in.heldGtrid() == "", "held" }); err != nil {
		cm.fatalf("%v", err)
	}
	return cm.collect()
}

func (cm *command) collect() string {
	w, in := cm.w, cm.instance()
	// The released checkpoint ends and is collected, and its instance
	// rewinds if it must, paused or not; then the others settle.
	if err := w.waitFor(in.name+"'s checkpoint to end", func() (bool, string) {
		st := in.p.State()
		for _, ps := range st.Partitions {
			if ps.Rewind {
				return false, fmt.Sprintf("p%d rewinds", ps.ID)
			}
		}
		return !in.running() || !st.InFlight, "in flight"
	}); err != nil {
		cm.fatalf("%v", err)
	}
	cm.settle()
	return lines(w.flush(), "nothing")
}

func (cm *command) produce() string {
	w := cm.w
	recs, err := parseRecords(cm.d.Input)
	if err != nil {
		cm.fatalf("%v", err)
	}
	krs := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		krs[i] = &kgo.Record{Topic: w.topic, Partition: r.partition, Key: r.key, Value: r.value}
	}
	res := w.prod.ProduceSync(context.Background(), krs...)
	if err := res.FirstErr(); err != nil {
		cm.fatalf("produce: %v", err)
	}
	lo, hi := map[int32]int64{}, map[int32]int64{}
	for _, r := range res {
		p, o := r.Record.Partition, r.Record.Offset
		if _, ok := lo[p]; !ok || o < lo[p] {
			lo[p] = o
		}
		hi[p] = max(hi[p], o)
		w.ends[p] = max(w.ends[p], o+1)
	}
	var out []string
	for _, p := range slices.Sorted(maps.Keys(lo)) {
		if lo[p] == hi[p] {
			out = append(out, fmt.Sprintf("p%d %d", p, lo[p]))
		} else {
			out = append(out, fmt.Sprintf("p%d %d-%d", p, lo[p], hi[p]))
		}
	}
	return strings.Join(out, ", ")
}

func (cm *command) checkpoint() string {
	w, in := cm.w, cm.instance()
	cm.settle()
	in.p.ForceCheckpoint()
	if err := w.waitFor(in.name+"'s checkpoint", func() (bool, string) {
		st := in.p.State()
		return in.heldGtrid() != "" || !in.running() || st.Sealed && !st.InFlight, fmt.Sprintf("%+v", st)
	}); err != nil {
		cm.fatalf("%v", err)
	}
	held := in.heldGtrid()
	if held == "" {
		cm.settle()
	}
	out := w.flush()
	if held != "" {
		out = append(out, checkpointName(held)+" held at its decision")
	}
	return lines(out, "nothing to checkpoint")
}

func (cm *command) tick() string {
	d, err := time.ParseDuration(cm.arg("d"))
	if err != nil {
		cm.fatalf("%v", err)
	}
	return "now " + at(cm.w.clock.add(d))
}

func (cm *command) tables() string {
	w := cm.w
	only := map[string]bool{}
	if a, ok := cm.d.Arg("only"); ok {
		for _, v := range a.Vals {
			only[v] = true
		}
	}
	var out []string
	for i, s := range w.servers {
		ls := ledgerLines(s.Tables(), only, cm.d.HasArg("all"), cm.d.HasArg("sums"))
		if len(w.servers) > 1 {
			if len(ls) == 0 {
				ls = []string{"  empty"}
			}
			out = append(out, fmt.Sprintf("server %d:", i))
			for _, l := range ls {
				out = append(out, "  "+l)
			}
			continue
		}
		out = append(out, ls...)
	}
	return lines(out, "empty")
}

func (cm *command) positions() string {
	w := cm.w
	cfg, _ := w.settings(nil)
	pos, err := w.view().Positions(context.Background(), driver.Scope{Group: cm.opt("group", cfg.KafkaGroup), Topic: w.topic})
	if err != nil {
		cm.fatalf("%v", err)
	}
	var out []string
	for _, p := range slices.Sorted(maps.Keys(pos)) {
		out = append(out, positionLine(pos[p].Stored))
	}
	return lines(out, "none")
}

func (cm *command) eventtime() string {
	w := cm.w
	cfg, _ := w.settings(nil)
	f, stored, err := w.view().EventTime(context.Background(), driver.Scope{Group: cfg.KafkaGroup, Topic: w.topic})
	if err != nil {
		cm.fatalf("%v", err)
	}
	out := []string{fmt.Sprintf("frontier: closed before %s, sealed before %s", at(f.Closed), at(f.Sealed))}
	slices.SortFunc(stored, func(a, b driver.Stored) int { return int(a.Partition - b.Partition) })
	for _, s := range stored {
		out = append(out, positionLine(s))
	}
	return strings.Join(out, "\n")
}

func (cm *command) commits() string {
	recs, err := cm.w.handles()[0].Commits(context.Background(), 0, false, 10000)
	if err != nil {
		cm.fatalf("%v", err)
	}
	var out []string
	for _, r := range recs {
		s := fmt.Sprintf("%d %s", r.Seq, checkpointName(r.Gtrid))
		if !r.Applied {
			s += " not applied"
		}
		if !r.SealedBefore.IsZero() {
			s += ", sealed before " + at(r.SealedBefore)
		}
		out = append(out, s)
	}
	return lines(out, "none")
}

// oldCommits writes n commit log records through the control server's
// commit point, with no cut (of a group long gone), applied, dated now.
func (cm *command) oldCommits() string {
	ctrl := cm.w.handles()[0]
	scope := driver.Scope{Group: "gone", Topic: cm.w.topic}
	none := func([]driver.Stored) error { return nil }
	n := cm.int("n", 0)
	var first, last int64
	for i := range n {
		seq, err := ctrl.Commit(context.Background(), driver.Decision{Gtrid: fmt.Sprintf("old-%d", i+1), Outcome: driver.Committed, By: "gone", At: cm.w.clock.Now()},
			scope, nil, none, nil, nil, nil,
			true)

		if err != nil {
			cm.fatalf("%v", err)
		}
		if i == 0 {
			first = seq
		}
		last = seq
	}
	return fmt.Sprintf("records %d-%d, applied, at %s", first, last, at(cm.w.clock.Now()))
}

// pruneCommits runs one pass of the instance's commit log retention,
// as its housekeeping does after each recovery pass.
func (cm *command) pruneCommits() string {
	in := cm.instance()
	n := pipeline.PruneCommitLog(context.Background(), in.sink, in.cfg.CommitLogRetention, cm.w.log)
	p, err := in.sink.CommitPosition(context.Background())
	if err != nil {
		cm.fatalf("%v", err)
	}
	return fmt.Sprintf("deleted %d; visible %d, decided %d, retained from %d", n, p.Visible, p.Decided, p.RetainedFrom)
}

func (cm *command) branches() string {
	var out []string
	for i, s := range cm.w.servers {
		for _, b := range s.Branches() {
			f := strings.Fields(b) // gtrid bqual state holder...
			participant, _, _ := strings.Cut(f[1], "-")
			out = append(out, fmt.Sprintf("server %d: %s %s %s", i, checkpointName(f[0]), participant, f[2]))
		}
	}
	return lines(out, "none")
}

func (cm *command) stats() string {
	in := cm.instance()
	st := in.p.Stats()
	return fmt.Sprintf("counted %d, repeats dropped %d, dead letters %d, checkpoints %d, aborted attempts %d, dedup cache %d keys",
		st.Counted.Load(), st.Duplicates.Load(), st.DeadLetters.Load(), st.Checkpoints.Load(), st.Aborts.Load(), in.p.DedupCacheKeys())
}

func (cm *command) groupOffsets() string {
	w := cm.w
	cfg, _ := w.settings(nil)
	scope := driver.Scope{Group: cfg.KafkaGroup, Topic: w.topic}
	var got string
	err := w.waitFor("the group's offsets to follow the store", func() (bool, string) {
		pos, err := w.view().Positions(context.Background(), scope)
		if err != nil {
			return false, err.Error()
		}
		offs, err := w.adm.FetchOffsets(context.Background(), scope.Group)
		if err != nil {
			return false, err.Error()
		}
		var ls []string
		same := true
		for _, p := range slices.Sorted(maps.Keys(pos)) {
			o, ok := offs.Lookup(w.topic, p)
			if pos[p].NextOffset < 0 {
				continue // never checkpointed
			}
			same = same && ok && o.At == pos[p].NextOffset
			ls = append(ls, fmt.Sprintf("p%d %d", p, o.At))
		}
		got = strings.Join(ls, ", ")
		return same, got
	})
	if err != nil {
		return err.Error()
	}
	return got
}

// cleanup runs pass (the retention of an instance) until
// nothing is due, and reports what it deleted.
func (cm *command) cleanup(what string, count func() (total, due int), pass func(ctx context.Context)) string {
	w := cm.w
	before, _ := count()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		pass(ctx)
	}()
	err := w.waitFor(what+" to delete everything due", func() (bool, string) {
		_, due := count()
		return due == 0, fmt.Sprintf("%d due", due)
	})
	cancel()
	<-done
	if err != nil {
		cm.fatalf("%v", err)
	}
	after, _ := count()
	return fmt.Sprintf("deleted %d, %d left", before-after, after)
}

// upkeep runs the instance's upkeep of the dedup keys' generations
// (pipeline.Keeper) until, by the control server's clock, nothing is due
// (dedup.Keep), and reports the state and the keys each table holds.
func (cm *command) upkeep() string {
	w, in := cm.w, cm.instance()
	state := func() driver.KeyGenerations {
		s, err := in.sink.KeyGenerations(w.ctx)
		if err != nil {
			cm.fatalf("%v", err)
		}
		return s
	}
	before := state()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		pipeline.Keeper(ctx, in.sink, in.stores, time.Hour, w.log)
	}()
	err := w.waitFor("the upkeep to take every step due", func() (bool, string) {
		k := dedup.Keep(state())
		return k.Empty < 0 && !k.Rotate, fmt.Sprintf("%+v", k)
	})
	cancel()
	<-done
	if err != nil {
		cm.fatalf("%v", err)
	}
	s := state()
	var keys [driver.KeyTables]int
	for _, srv := range w.servers {
		for t, ks := range srv.Tables().Keys {
			keys[t] += len(ks)
		}
	}
	var ks []string
	for t, n := range keys {
		ks = append(ks, fmt.Sprintf("%s %d", keyTableNames[t], n))
	}
	return fmt.Sprintf("generation %d current (table %d), was %d; emptied up to %d, was %d; keys: %s",
		s.Current, s.Current.Table(), before.Current, s.Emptied, before.Emptied, strings.Join(ks, ", "))
}

func (cm *command) retention() string {
	w, in := cm.w, cm.instance()
	retention := time.Duration(in.cfg.LedgerEntriesRetention)
	return cm.cleanup("the retention", func() (total, due int) {
		before := in.now().Add(-retention)
		for _, s := range w.servers {
			for _, e := range s.Tables().Entries {
				total++
				if e.CreatedAt.Before(before) {
					due++
				}
			}
		}
		return total, due
	}, func(ctx context.Context) {
		pipeline.Retention(ctx, in.stores, in.now, time.Hour, retention, in.cfg.DedupCleanupBatch, w.log)
	})
}

// refuse adds a CHECK constraint to the ledger's tables on every server
// (a trigger of memdriver): rows of table it matches are refused for a
// data reason, as MariaDB refuses them. Constraints add up; refuse off
// drops them all.
func (cm *command) refuse() string {
	w := cm.w
	if cm.d.HasArg("off") {
		w.constraints = nil
	} else {
		w.constraints = append(w.constraints, constraint{name: cm.arg("name"), table: cm.arg("table"), account: cm.opt("account", ""),
			above: int64(cm.int("above", -1)), sealed: cm.d.HasArg("sealed")})
	}
	cs := slices.Clone(w.constraints)
	for _, s := range w.servers {
		if len(cs) == 0 {
			s.SetTrigger(nil)
			continue
		}
		s.SetTrigger(func(table string, row any) error {
			for _, c := range cs {
				if c.refuses(table, row) {
					return memdriver.Refusal(fmt.Sprintf("CONSTRAINT `%s` failed for `billing`.`%s`", c.name, c.table))
				}
			}
			return nil
		})
	}
	return "ok"
}

func (cm *command) fail() string {
	codes := map[string]driver.Code{"transient": driver.Transient, "unknown": driver.Unknown, "data": driver.Data}
	code, ok := codes[cm.arg("code")]
	if !ok {
		cm.fatalf("unknown code %s", cm.arg("code"))
	}
	cs := make([]driver.Code, cm.int("times", 1))
	for i := range cs {
		cs[i] = code
	}
	cm.w.servers[cm.int("server", 0)].Fail(cm.arg("op"), cs...)
	return "ok"
}

func (cm *command) packet() string {
	s := cm.w.servers[cm.int("server", 0)]
	s.SetMaxAllowedPacket(cm.int("bytes", 0))
	if cm.d.HasArg("refresh") {
		if err := s.As("billing").RefreshLimits(context.Background()); err != nil {
			return "error: " + err.Error()
		}
	}
	return "ok"
}

// recover runs one recovery pass of another process (a recoverer whose
// host's clock is off by skew), with the service's age after which an
// undecided checkpoint is aborted.
func (cm *command) recover() string {
	w := cm.w
	cfg, _ := w.settings(nil)
	now, err := w.clockOf(cm.skew(), cm.opt("clock", "ledger") == "host")
	if err != nil {
		cm.fatalf("%v", err)
	}
	scfg := service.SinkConfig(cfg, w.log)
	scfg.Instance, scfg.Now = cm.arg("as"), now
	sink, _, err := w.sinkFor(scfg, nil)
	if err != nil {
		cm.fatalf("%v", err)
	}
	defer sink.Close()
	pcfg := service.PipelineConfig(cfg, nil, w.log, nil)
	res, err := sink.Recover(w.ctx, pcfg.AbortAfter())
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("committed %d, rolled back %d, too young to abort %d, holders ended %d, in doubt %d", res.Committed, res.RolledBack, res.Skipped, res.Ended, len(res.Remaining))
}

// claimer is a sink of another process (a woken instance, billing periods
// change) that only claims.
func (cm *command) claimer(owner, group string) *txsink.Sink {
	w := cm.w
	if s, ok := w.claimers[owner+"/"+group]; ok {
		return s
	}
	cfg, _ := w.settings(nil)
	scfg := service.SinkConfig(cfg, w.log)
	scfg.Instance, scfg.Group, scfg.Now = owner, group, w.clock.Now
	s, _, err := w.sinkFor(scfg, nil)
	if err != nil {
		cm.fatalf("%v", err)
	}
	w.claimers[owner+"/"+group] = s
	return s
}

func (cm *command) claim() string {
	w := cm.w
	cfg, _ := w.settings(nil)
	var parts []int32
	for _, p := range strings.Split(cm.arg("partitions"), ",") {
		n, err := strconv.Atoi(p)
		if err != nil {
			cm.fatalf("%v", err)
		}
		parts = append(parts, int32(n))
	}
	pos, err := cm.claimer(cm.arg("as"), cfg.KafkaGroup).Claim(context.Background(), parts)
	if err != nil {
		return "error: " + err.Error()
	}
	var out []string
	for _, p := range parts {
		ps := pos[p]
		out = append(out, positionLine(driver.Stored{Partition: p, NextOffset: ps.NextOffset, Epoch: ps.Epoch, Owner: ps.Owner, Watermark: ps.Watermark, CaughtUp: ps.CaughtUp}))
	}
	return strings.Join(out, "\n")
}

// changePeriods appends a definition of the ledger's period settings, as
// billing periods change does (with every instance stopped, which is the
// file's to respect or not), and with fence raises every partition's
// epoch, owners unchanged (mysqldriver's quiesce).
func (cm *command) changePeriods() string {
	w := cm.w
	cfg, err := w.settings(cm.vars())
	if err != nil {
		cm.fatalf("%v", err)
	}
	rows, err := w.view().Periods(context.Background())
	if err != nil {
		cm.fatalf("%v", err)
	}
	p := cfg.Period()
	w.servers[0].StorePeriods(driver.PeriodRow{Seq: len(rows) + 1, Window: p.Unit(), Timezone: p.Zone(), Close: cfg.WindowCloseAfter > 0,
		RecordedAt: w.clock.Now(), RecordedBy: "billing periods change"})
	out := []string{fmt.Sprintf("stored definition %d: %s, windows close: %v", len(rows)+1, p, cfg.WindowCloseAfter > 0)}
	if !cm.d.HasArg("fence") {
		return out[0]
	}
	scope := driver.Scope{Group: cfg.KafkaGroup, Topic: w.topic}
	pos, err := w.view().Positions(context.Background(), scope)
	if err != nil {
		cm.fatalf("%v", err)
	}
	byOwner := map[string][]int32{}
	for _, ps := range pos {
		byOwner[ps.Owner] = append(byOwner[ps.Owner], ps.Partition)
	}
	for _, owner := range slices.Sorted(maps.Keys(byOwner)) {
		if _, err := cm.claimer(owner, scope.Group).Claim(context.Background(), byOwner[owner]); err != nil {
			cm.fatalf("%v", err)
		}
	}
	return out[0] + "; every partition fenced"
}

func (cm *command) checkpointer() string {
	w := cm.w
	name := cm.arg("name")
	cfg, err := w.settings(cm.vars())
	if err != nil {
		cm.fatalf("%v", err)
	}
	scfg := service.SinkConfig(cfg, w.log)
	scfg.Instance, scfg.Now = name, w.clock.Now
	sink, stores, err := w.sinkFor(scfg, nil)
	if err != nil {
		cm.fatalf("%v", err)
	}
	schedule, _, err := w.periodSettings(cfg, name)
	if err != nil {
		return "refused: " + err.Error()
	}
	pcfg := service.PipelineConfig(cfg, nil, w.log, func(info pipeline.CheckpointInfo) { w.report(name, info) })
	pcfg.Clock, pcfg.Window = w.clock.Now, schedule
	ck, err := pipeline.NewCheckpointer(pcfg, sink, stores)
	if err != nil {
		cm.fatalf("%v", err)
	}
	w.offline[name] = &offline{name: name, sink: sink, ck: ck, epochs: map[int32]int64{}, offsets: map[int32]int64{}}
	return "ok"
}

// feed commits records as one checkpoint of an offline Checkpointer, at
// the next offsets of their partitions (claimed at first use).
func (cm *command) feed() string {
	w := cm.w
	o, ok := w.offline[cm.arg("name")]
	if !ok {
		cm.fatalf("unknown checkpointer %s", cm.arg("name"))
	}
	lines0, err := parseRecords(cm.d.Input)
	if err != nil {
		cm.fatalf("%v", err)
	}
	ctx := context.Background()
	var recs []pipeline.Record
	wm := map[int32]time.Time{}
	for _, l := range lines0 {
		if l.event == nil {
			cm.fatalf("feed takes events only")
		}
		if _, ok := o.epochs[l.partition]; !ok {
			pos, err := o.sink.Claim(ctx, []int32{l.partition})
			if err != nil {
				cm.fatalf("%v", err)
			}
			o.epochs[l.partition] = pos[l.partition].Epoch
			o.offsets[l.partition] = max(pos[l.partition].NextOffset, 0)
		}
		occurred, _ := time.Parse(time.RFC3339Nano, l.event.At)
		ev := event.Event{EventID: l.event.ID, AccountID: l.event.Account, AmountMinor: l.event.Amount, Currency: l.event.Currency, OccurredAt: occurred}
		recs = append(recs, pipeline.Record{Event: ev, Partition: l.partition, Offset: o.offsets[l.partition], Key: l.key, Value: l.value})
		o.offsets[l.partition]++
		if occurred.After(wm[l.partition]) {
			wm[l.partition] = occurred
		}
	}
	var cuts []txsink.PartitionCut
	for _, p := range slices.Sorted(maps.Keys(wm)) {
		cuts = append(cuts, txsink.PartitionCut{Partition: p, Epoch: o.epochs[p], NextOffset: o.offsets[p], Watermark: wm[p]})
	}
	decided, err := o.ck.Checkpoint(ctx, recs, cuts)
	out := w.flush()
	if !decided {
		out = append(out, fmt.Sprintf("not decided: %v", err))
	}
	return lines(out, "nothing")
}
