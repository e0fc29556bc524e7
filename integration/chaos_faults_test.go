package integration_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/billing/ledger/internal/shards"
	"github.com/billing/ledger/internal/testenv"
)

// faultKind names one kind of fault the chaos driver injects.
type faultKind string

// The faults. Instance faults hit one of the billing processes; service
// faults hit the one Kafka broker or the one MariaDB server that every
// instance shares.
const (
	// kill -9 an instance, restart it after a short delay.
	faultKill faultKind = "kill"
	// SIGTERM an instance (graceful shutdown: final checkpoint, leave the
	// group), restart it once it exited.
	faultTerm faultKind = "term"
	// SIGSTOP an instance for longer than its session timeout, then SIGCONT
	// it: the group has moved its partitions on, and whatever the thawed
	// process still tries to commit must be fenced.
	faultZombie faultKind = "zombie"
	// kill -9 an instance and restart it with a failpoint that kills it
	// (SIGKILL, from inside) when it reaches a given step of the commit
	// protocol for the n-th time: crashes at the exact protocol steps a
	// random kill rarely hits.
	faultStepKill faultKind = "step-kill"
	// Graceful restart of MariaDB (services.sh restart mariadb).
	faultRestartMariaDB faultKind = "restart-mariadb"
	// SIGKILL of mariadbd, then start: InnoDB crash recovery, prepared XA
	// branches must survive it.
	faultCrashMariaDB faultKind = "crash-mariadb"
	// Graceful restart of the Kafka broker.
	faultRestartKafka faultKind = "restart-kafka"
	// SIGKILL of the broker, then start: log recovery, group coordinator
	// and transaction coordinator reloaded.
	faultCrashKafka faultKind = "crash-kafka"
	// A burst of records at the limits of the input contract (junk of 1
	// MiB and more, padded invalid and valid records; see
	// chaos_hostile_test.go).
	faultHostile faultKind = "hostile"
	// A server added to the ledger (billing shards add, a new database
	// of the MariaDB server) while the instances count: each instance
	// restarted with the new server list first (SIGTERM, one after the
	// other), then the command killed at one of its steps by a failpoint
	// and run again to its end, an instance killed (SIGKILL) and the
	// MariaDB server restarted while it runs. Only with CHAOS_KINDS naming it; injected once per time it
	// is named.
	faultAddServer faultKind = "add-server"
)

var allFaultKinds = []faultKind{faultKill, faultTerm, faultZombie, faultStepKill,
	faultRestartMariaDB, faultCrashMariaDB, faultRestartKafka, faultCrashKafka, faultHostile, faultAddServer}

// defaultFaultKinds are the kinds a run injects unless CHAOS_KINDS says
// otherwise: all but add-server, which changes the ledger's layout for the
// rest of the run.
var defaultFaultKinds = slices.DeleteFunc(slices.Clone(allFaultKinds), func(k faultKind) bool { return k == faultAddServer })

// addServerSteps are the failpoints of billing shards add a fault kills it
// at, in its order.
var addServerSteps = []string{shards.FailAfterBegin, shards.FailAfterAnnounce + "=kill@2", shards.FailAfterFreeze + "=kill@3", shards.FailAfterSettle + "=kill@2", shards.FailBeforeCopy + "=kill@4",
	shards.FailAfterBatch + "=kill@5", shards.FailBeforeUnfreeze + "=kill@2", shards.FailAfterStep + "=kill@6", shards.FailAfterDone}

func (k faultKind) instanceFault() bool {
	return k == faultKill || k == faultTerm || k == faultZombie || k == faultStepKill
}

// protocolSteps are the failpoints of package txsink, in protocol order.
var protocolSteps = []string{"before-prepare", "between-prepares", "after-prepare", "after-decision", "between-commits", "after-commit"}

// plannedFault is one entry of the fault schedule. The schedule is derived
// from the fault seed alone, so a seed replays the same faults in the same
// order with the same parameters (the service's timing still varies).
type plannedFault struct {
	N    int
	Kind faultKind
	Slot int           // instance faults: which instance
	Gap  time.Duration // quiet time before the fault (after progress resumed)
	// Hold: kill, term, step-kill: restart delay; zombie: time stopped
	// beyond the session timeout; crash-*: downtime before the start.
	Hold time.Duration
	Step string // step-kill: failpoint step
	Nth  int    // step-kill: fire at the n-th time the step is reached
}

func (f plannedFault) String() string {
	s := fmt.Sprintf("#%-3d %-15s", f.N, f.Kind)
	if f.Kind.instanceFault() {
		s += fmt.Sprintf(" billing-%d", f.Slot+1)
	} else {
		s += "          "
	}
	s += fmt.Sprintf(" after %-5s", f.Gap.Round(100*time.Millisecond))
	switch f.Kind {
	case faultKill, faultTerm:
		s += fmt.Sprintf(" restart after %s", f.Hold.Round(100*time.Millisecond))
	case faultZombie:
		s += fmt.Sprintf(" stopped for session timeout + %s", f.Hold.Round(100*time.Millisecond))
	case faultStepKill:
		s += fmt.Sprintf(" failpoint %s=kill@%d", f.Step, f.Nth)
	case faultAddServer:
		s += " the command killed at " + f.Step
	case faultCrashMariaDB, faultCrashKafka:
		s += fmt.Sprintf(" down for %s", f.Hold.Round(100*time.Millisecond))
	}
	return s
}

// planFaults draws the schedule: one fault of each required group (a
// group is a set of kinds, one of which is drawn), the rest drawn by
// weight, all in a seeded random order. Kinds not in allowed are never
// drawn.
func planFaults(seed uint64, p chaosProfile, allowed []faultKind, instances int) []plannedFault {
	rng := rand.New(rand.NewPCG(seed, 0x6368616f73)) // "chaos"
	var kinds []faultKind
	required := p.Required
	if slices.Contains(allowed, faultAddServer) {
		// First: a profile's required groups may fill every fault.
		required = append([][]faultKind{{faultAddServer}}, required...)
	}
	for _, group := range required {
		var in []faultKind
		for _, k := range group {
			if slices.Contains(allowed, k) {
				in = append(in, k)
			}
		}
		if len(in) > 0 && len(kinds) < p.Faults {
			kinds = append(kinds, in[rng.IntN(len(in))])
		}
	}
	var pool []faultKind
	total := 0
	for _, k := range allFaultKinds {
		if slices.Contains(allowed, k) {
			pool = append(pool, k)
			total += p.Weights[k]
		}
	}
	for len(kinds) < p.Faults && total > 0 {
		x := rng.IntN(total)
		for _, k := range pool {
			if x < p.Weights[k] {
				kinds = append(kinds, k)
				break
			}
			x -= p.Weights[k]
		}
	}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })

	between := func(lo, hi time.Duration) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + time.Duration(rng.Int64N(int64(hi-lo)))
	}
	// Failpoint steps: step-kills alternate between a step before the
	// commit decision and one after it, each group cycling through its
	// steps in a seeded order, so that even two step-kills cover both
	// sides of the commit point and a long run covers every step.
	pre, post := slices.Clone(protocolSteps[:3]), slices.Clone(protocolSteps[3:])
	rng.Shuffle(len(pre), func(i, j int) { pre[i], pre[j] = pre[j], pre[i] })
	rng.Shuffle(len(post), func(i, j int) { post[i], post[j] = post[j], post[i] })
	stepKills := 0
	out := make([]plannedFault, len(kinds))
	for i, k := range kinds {
		// Every field is drawn for every fault, in a fixed order, so that
		// the schedule of one kind does not shift the others' draws.
		f := plannedFault{N: i + 1, Kind: k, Slot: rng.IntN(instances), Gap: between(p.Gap[0], p.Gap[1])}
		hold := rng.Float64()
		f.Nth = 1 + rng.IntN(4)
		if k == faultStepKill {
			if stepKills%2 == 0 {
				f.Step = pre[(stepKills/2)%len(pre)]
			} else {
				f.Step = post[(stepKills/2)%len(post)]
			}
			stepKills++
		}
		switch k {
		case faultKill, faultTerm, faultStepKill:
			f.Hold = time.Duration(float64(3*time.Second) * hold)
		case faultZombie:
			f.Hold = time.Second + time.Duration(float64(5*time.Second)*hold)
		case faultCrashMariaDB, faultCrashKafka:
			f.Hold = time.Duration(float64(4*time.Second) * hold)
		}
		if k != faultStepKill {
			f.Step, f.Nth = "", 0
		}
		if k == faultAddServer {
			// The step of billing shards add it is killed at, from a
			// draw every fault makes (the schedule's other draws stay).
			f.Step = addServerSteps[int(hold*float64(len(addServerSteps)))%len(addServerSteps)]
		}
		if !k.instanceFault() {
			f.Slot = 0
		}
		out[i] = f
	}
	return out
}

// faultResult is what happened when a planned fault was injected.
type faultResult struct {
	plannedFault
	At       time.Duration // since the faults began
	Took     time.Duration // until the fault's own recovery step ended (restart, SIGCONT)
	Recovery time.Duration // then until the ledger moved again (or was caught up)
	Victim   string        // instance id, for instance faults
	Note     string
}

// faultDriver injects the schedule, one fault at a time: wait the gap, inject,
// then wait until the service makes progress again before the next one, so
// that every fault hits a working system and a stuck service is noticed
// (bounded by the profile's Progress deadline) instead of masked by the
// next fault.
type faultDriver struct {
	r       *chaosRun
	hostile *hostileSource
	results []faultResult
}

func (d *faultDriver) run(ctx context.Context, schedule []plannedFault) error {
	r := d.r
	began := time.Now()
	how, err := r.awaitProgress(ctx, 0)
	if err != nil {
		return fmt.Errorf("before the first fault: %w", err)
	}
	r.logf("service running (%s after %s)", how, time.Since(began).Round(100*time.Millisecond))
	for _, f := range schedule {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(f.Gap):
		}
		res := faultResult{plannedFault: f, At: time.Since(began)}
		r.logf("fault %s", f)
		t0 := time.Now()
		err := d.inject(ctx, f, &res)
		res.Took = time.Since(t0)
		if err != nil {
			d.results = append(d.results, res)
			return fmt.Errorf("fault #%d %s: %w", f.N, f.Kind, err)
		}
		// Progress counts from the end of the fault (services back, the
		// victim restarted or thawed): a checkpoint committed while a
		// server was still going down proves nothing.
		t1 := time.Now()
		base, err := r.offsetSum(ctx)
		if err != nil {
			base = -1 // not answering yet: any progress after the first read
		}
		how, err := r.awaitProgress(ctx, base)
		res.Recovery = time.Since(t1)
		if err != nil {
			d.results = append(d.results, res)
			return fmt.Errorf("after fault #%d %s: %w", f.N, f.Kind, err)
		}
		r.logf("fault #%d %s done in %s (%s), %s after %s", f.N, f.Kind, res.Took.Round(time.Millisecond), res.Note, how, res.Recovery.Round(time.Millisecond))
		d.results = append(d.results, res)
	}
	return nil
}

// inject applies one fault and its recovery step.
func (d *faultDriver) inject(ctx context.Context, f plannedFault, res *faultResult) error {
	r := d.r
	switch f.Kind {
	case faultKill, faultTerm, faultZombie, faultStepKill:
		in := r.instances[f.Slot]
		inc, err := r.running(ctx, in)
		if err != nil {
			return err
		}
		res.Victim = instanceID(inc.logPath)
		switch f.Kind {
		case faultKill:
			return d.kill(ctx, in, inc, "kill -9", f.Hold, nil, res)
		case faultTerm:
			return d.term(ctx, in, inc, f.Hold, res)
		case faultZombie:
			return d.zombie(ctx, inc, f.Hold, res)
		case faultStepKill:
			return d.stepKill(ctx, in, inc, f, res)
		}
	case faultRestartMariaDB:
		return d.services(ctx, res, []string{"restart", "mariadb"})
	case faultCrashMariaDB:
		return d.services(ctx, res, []string{"kill", "mariadb"}, f.Hold, []string{"start", "mariadb"})
	case faultRestartKafka:
		return d.services(ctx, res, []string{"restart", "kafka"})
	case faultCrashKafka:
		return d.services(ctx, res, []string{"kill", "kafka"}, f.Hold, []string{"start", "kafka"})
	case faultAddServer:
		return d.addServer(ctx, f, res)
	case faultHostile:
		d.r.endsMu.Lock()
		defer d.r.endsMu.Unlock()
		note, err := d.hostile.burst(ctx)
		res.Note = note
		if err != nil {
			return err
		}
		return d.r.retarget(ctx)
	}
	return fmt.Errorf("unknown fault kind %q", f.Kind)
}

// kill sends SIGKILL and waits until the supervisor has started the next
// incarnation (with nextEnv).
func (d *faultDriver) kill(ctx context.Context, in *instance, inc *incarnation, reason string, delay time.Duration, nextEnv []string, res *faultResult) error {
	if in.end(reason, syscall.SIGKILL, delay, nextEnv) == nil {
		res.Note = "had already exited"
	}
	<-inc.done
	next, err := in.awaitNext(ctx, inc)
	if err != nil {
		return err
	}
	if res.Note == "" {
		res.Note = fmt.Sprintf("%s, restarted as #%d", inc.exitText(), next.n)
	}
	return nil
}

// term sends SIGTERM and waits for the graceful shutdown, which is bounded
// by SHUTDOWN_TIMEOUT; a shutdown that hangs far beyond it is killed and
// reported.
func (d *faultDriver) term(ctx context.Context, in *instance, inc *incarnation, delay time.Duration, res *faultResult) error {
	t0 := time.Now()
	if in.end("SIGTERM", syscall.SIGTERM, delay, nil) == nil {
		res.Note = "had already exited"
	}
	if _, ok := inc.waitFor(ctx, d.r.prof.ShutdownGrace); !ok {
		d.r.anomaly("billing-%d#%d (%s) did not exit within %s of SIGTERM; killed", in.slot, inc.n, res.Victim, d.r.prof.ShutdownGrace)
		inc.signal(syscall.SIGKILL)
		<-inc.done
	} else if inc.err != nil && res.Note == "" {
		// A graceful shutdown should end with status 0: not a data
		// problem, but worth a look.
		d.r.anomaly("billing-%d#%d (%s) ended with %q after SIGTERM", in.slot, inc.n, res.Victim, inc.exitText())
	}
	next, err := in.awaitNext(ctx, inc)
	if err != nil {
		return err
	}
	if res.Note == "" {
		res.Note = fmt.Sprintf("%s after %s, restarted as #%d", inc.exitText(), inc.ended.Sub(t0).Round(10*time.Millisecond), next.n)
	}
	return nil
}

// zombie freezes the process beyond its session timeout and thaws it.
//
// It freezes the process just after one of its checkpoints committed (seen
// in the audit trail, polled every 10 ms for up to 5 s): then no
// checkpoint is in flight, records are buffered, and the thawed process
// seals a new checkpoint at once, built under the epochs it held before.
// Frozen at a random moment it would often be mid-checkpoint, and that
// checkpoint dies of its own timeout after the thaw, which proves nothing
// about fencing.
func (d *faultDriver) zombie(ctx context.Context, inc *incarnation, hold time.Duration, res *faultResult) error {
	timing := "at a random moment (no commit of its own within 5s)"
	if d.r.awaitCommitBy(ctx, inc.tag, 5*time.Second) {
		timing = "right after a commit of its own"
	}
	stopFor := d.r.sessionTimeout + hold
	inc.signal(syscall.SIGSTOP)
	select {
	case <-ctx.Done():
	case <-time.After(stopFor):
	}
	inc.signal(syscall.SIGCONT)
	res.Note = fmt.Sprintf("stopped for %s, %s", stopFor.Round(100*time.Millisecond), timing)
	return ctx.Err()
}

// stepKill restarts the instance with a failpoint that kills it at a
// protocol step, waits for the failpoint to fire and for the clean restart
// after it. An incarnation that never reaches the step within the
// profile's deadline (it may have been given no partition) is restarted
// without the failpoint, and that is noted.
func (d *faultDriver) stepKill(ctx context.Context, in *instance, inc *incarnation, f plannedFault, res *faultResult) error {
	spec := fmt.Sprintf("%s=kill@%d", f.Step, f.Nth)
	if err := d.kill(ctx, in, inc, "kill -9 (to arm a failpoint)", f.Hold, []string{"BILLING_FAILPOINTS=" + spec}, res); err != nil {
		return err
	}
	armed, _ := in.current()
	// Wait for the failpoint; give up early once everything produced is
	// consumed, since then no checkpoint will reach the step.
	fired, idle := false, false
	for deadline := time.Now().Add(d.r.prof.FailpointWait); !fired && !idle && time.Now().Before(deadline) && ctx.Err() == nil; {
		_, fired = armed.waitFor(ctx, time.Second)
		if !fired {
			idle, _, _ = d.r.caughtUp(ctx)
		}
	}
	if !fired {
		in.end("SIGTERM (failpoint "+spec+" did not fire)", syscall.SIGTERM, 0, nil)
		if _, ok := armed.waitFor(ctx, d.r.prof.ShutdownGrace); !ok {
			armed.signal(syscall.SIGKILL)
			<-armed.done
		}
		res.Note = fmt.Sprintf("failpoint %s did not fire within %s", spec, d.r.prof.FailpointWait)
		if idle {
			res.Note = fmt.Sprintf("failpoint %s did not fire: everything produced was consumed, no checkpoint to reach it", spec)
		}
	} else {
		res.Note = fmt.Sprintf("#%d armed with %s: %s after %s", armed.n, spec, armed.exitText(), armed.ended.Sub(armed.started).Round(time.Millisecond))
		if !strings.Contains(armed.exitText(), "killed") {
			d.r.anomaly("billing-%d#%d armed with %s ended with %q, not by the failpoint", in.slot, armed.n, spec, armed.exitText())
		}
	}
	_, err := in.awaitNext(ctx, armed)
	return err
}

// services runs services.sh steps; a time.Duration between steps is a
// pause.
func (d *faultDriver) services(ctx context.Context, res *faultResult, steps ...any) error {
	var notes []string
	for _, s := range steps {
		switch s := s.(type) {
		case time.Duration:
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(s):
			}
		case []string:
			t0 := time.Now()
			out, err := d.r.svc.run(ctx, d.r.prof.ServiceTimeout, s...)
			if err != nil {
				return fmt.Errorf("services.sh %s: %w\n%s", strings.Join(s, " "), err, out)
			}
			notes = append(notes, fmt.Sprintf("%s %s", s[0], time.Since(t0).Round(100*time.Millisecond)))
		}
	}
	res.Note = strings.Join(notes, ", ")
	return nil
}

// addServer adds a server to the ledger while the instances count: a new
// database; every instance restarted with the new server list, one after
// the other; billing shards add killed at one of its steps (f.Step,
// drawn), then run to its end, with an instance (f.Slot) killed and
// restarted while it runs.
func (d *faultDriver) addServer(ctx context.Context, f plannedFault, res *faultResult) error {
	r := d.r
	dsn := testenv.NewDatabaseOn(r.t, r.admin, testenv.RandomName("t_"))
	step := f.Step
	if !strings.Contains(step, "=") {
		step += "=kill"
	}
	// The command runs with the ledger's servers as they were (the new
	// one is its --dsn), both times.
	n := len(r.shardDSNs()) + 1
	envs := [][]string{r.moverEnv(fmt.Sprintf("add%d.1", n)), r.moverEnv(fmt.Sprintf("add%d.2", n))}
	// Instances started from now on have the new server, last: a rolling
	// restart gives it to those running.
	r.addShard(dsn)
	for _, in := range r.instances {
		inc := in.end("restarted with the new server list", syscall.SIGTERM, 0, nil)
		if inc == nil {
			continue
		}
		if _, ok := inc.waitFor(ctx, r.prof.ShutdownGrace); !ok {
			inc.signal(syscall.SIGKILL)
			<-inc.done
		}
		if _, err := in.awaitNext(ctx, inc); err != nil {
			return err
		}
	}
	var notes []string
	for run, fps := range []string{step, ""} {
		tag := fmt.Sprintf("add%d.%d", n, run+1)
		env := append(envs[run], "BILLING_FAILPOINTS="+fps)
		p, err := startProc("billing shards add", filepath.Join(r.logDir, tag+".log"), r.billingBin, env, "shards", "add", "--dsn", dsn, "--step-rows", "500")
		if err != nil {
			return err
		}
		if fps == "" && len(r.instances) > 0 {
			// A counting instance killed while the move runs, then the
			// MariaDB server restarted under it (the ledger's servers and
			// the new one): the command goes on from the stored cursor.
			in := r.instances[f.Slot%len(r.instances)]
			time.Sleep(500 * time.Millisecond)
			if inc := in.end("SIGKILL during billing shards add", syscall.SIGKILL, time.Second, nil); inc != nil {
				<-inc.done
				notes = append(notes, fmt.Sprintf("billing-%d killed during the move", in.slot))
			}
			if !p.exited() {
				var restart faultResult
				if err := d.services(ctx, &restart, []string{"restart", "mariadb"}); err != nil {
					return err
				}
				notes = append(notes, "MariaDB restarted during the move ("+restart.Note+")")
			}
		}
		werr, ok := p.waitFor(ctx, r.prof.Settle)
		if !ok {
			p.signal(syscall.SIGKILL)
			return fmt.Errorf("billing shards add (%s) did not end within %s", tag, r.prof.Settle)
		}
		switch {
		case fps == "" && werr != nil:
			return fmt.Errorf("billing shards add, run again: %s\n%s", p.exitText(), strings.Join(tail(p.logPath, 20), "\n"))
		case fps != "" && !strings.Contains(p.exitText(), "killed") && werr != nil:
			return fmt.Errorf("billing shards add armed with %s: %s\n%s", fps, p.exitText(), strings.Join(tail(p.logPath, 20), "\n"))
		}
		notes = append(notes, fmt.Sprintf("%s: %s", map[bool]string{true: "armed with " + fps, false: "run again"}[fps != ""], p.exitText()))
	}
	for _, in := range r.instances {
		cur, _ := in.current()
		if cur == nil || cur.exited() {
			if _, err := in.awaitNext(ctx, cur); err != nil {
				return err
			}
		}
	}
	res.Note = fmt.Sprintf("server %d added while counting (%s)", n, strings.Join(notes, "; "))
	return nil
}
