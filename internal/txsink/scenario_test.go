package txsink

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

	"github.com/billing/ledger/internal/testenv"

	"github.com/cockroachdb/datadriven"

	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// TestScenarios runs the protocol's specification: every file in
// testdata/ states one rule by example, over in-memory servers (package
// memdriver) and a clock the file drives. Run with -rewrite to regenerate
// the expected output after a deliberate change, and read the diff.
//
// Commands:
//
//	server name=S [attach] [txvisible]        a server (MariaDB-like with attach)
//	ledger name=L control=S [shards=S2,S3]    a ledger: identity on its control server
//	instance name=i ledger=L [branches=n] [changelog]
//	                                          a process of the ledger (txsink.Sink), whose
//	                                          checkpoints write the changelog or not
//	changelog ledger=L [enable=PREFIX] [published=N] [off]
//	                                          the ledger's changelog state: enabled,
//	                                          its publisher's hint raised, turned off
//	tick d=DUR                                advance the clock
//	claim instance=i partitions=0,1           Claim
//	positions instance=i partitions=0,1       Positions
//	begin instance=i ckpt=n                   Begin; the transaction is named i/n
//	write txn=i/n participant=p key=k         a write in the branch of p
//	prepare|commit|abort txn=i/n [fail=name]  a protocol step (failpoint name armed as error)
//	decide txn=i/n cuts=p:epoch:next[:wm[:up]],... [openfrom=D] [closed=D] [sealed=D]
//	                                          Decide; wm, D: event time as a duration since
//	                                          the epoch; up: 1 if caught up; with openfrom,
//	                                          closed or sealed, a frontier change
//	eventtime instance=i                      the frontier and the partitions' event time
//	crash instance=i                          the process dies: every connection dropped
//	recover instance=i minage=DUR             a recovery pass
//	branches server=S                         the server's XA branches
//	get server=S key=k                        a committed value
//	decisions ledger=L                        the ledger's decision table
//	commits ledger=L                          the ledger's commit log
//	position instance=i                       CommitPosition
//	prune instance=i retention=DUR [limit=n]  PruneCommitLog (limit 100 by default)
//	forge server=S user=u xid=GTRID/BQUAL     another account prepares a branch
//	replay server=S user=u txn=i/n p=p        another account re-creates a real xid
//	restart server=S                          the server restarts
//	fail server=S op=OP code=CODE             the next OP on S fails (see memdriver.Fail)
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		w := newWorld()
		datadriven.RunTest(t, path, w.run)
	})
}

type world struct {
	now       time.Time
	servers   map[string]*memdriver.Cluster
	ledgers   map[string]ledgerSpec
	instances map[string]*Sink
	txns      map[string]*Txn
	failpts   map[string]*failpoint.Set
}

type ledgerSpec struct {
	control string
	servers []string // control first
}

func newWorld() *world {
	return &world{
		now:     time.UnixMilli(0).UTC(),
		servers: map[string]*memdriver.Cluster{}, ledgers: map[string]ledgerSpec{},
		instances: map[string]*Sink{}, txns: map[string]*Txn{}, failpts: map[string]*failpoint.Set{},
	}
}

func (w *world) clock() time.Time { return w.now }

// command is one command of a scenario file being run.
type command struct {
	w   *world
	t   *testing.T
	d   *datadriven.TestData
	ctx context.Context
}

func (cm *command) arg(key string) string {
	a, ok := cm.d.Arg(key)
	if !ok {
		cm.d.Fatalf(cm.t, "%s: missing %s=", cm.d.Cmd, key)
	}
	return strings.Join(a.Vals, ",")
}

func (cm *command) opt(key string) string {
	if a, ok := cm.d.Arg(key); ok {
		return strings.Join(a.Vals, ",")
	}
	return ""
}

func (cm *command) txn() *Txn {
	tx, ok := cm.w.txns[cm.arg("txn")]
	if !ok {
		cm.d.Fatalf(cm.t, "unknown transaction %s", cm.arg("txn"))
	}
	return tx
}

// commands are the scenario files' commands, by name.
var commands = map[string]func(*command) string{
	"server":    (*command).server,
	"ledger":    (*command).ledger,
	"instance":  (*command).instance,
	"tick":      (*command).tick,
	"claim":     (*command).claim,
	"positions": (*command).claim,
	"begin":     (*command).begin,
	"write":     (*command).write,
	"prepare":   (*command).protocol,
	"decide":    (*command).protocol,
	"commit":    (*command).protocol,
	"abort":     (*command).protocol,
	"eventtime": (*command).eventtime,
	"crash":     (*command).crash,
	"recover":   (*command).recover,
	"branches":  (*command).branches,
	"get":       (*command).get,
	"decisions": (*command).decisions,
	"commits":   (*command).commits,
	"position":  (*command).position,
	"prune":     (*command).prune,
	"forge":     (*command).forge,
	"replay":    (*command).forge,
	"restart":   (*command).restart,
	"fail":      (*command).fail,
	"changelog": (*command).changelog,
}

func (w *world) run(t *testing.T, d *datadriven.TestData) string {
	fn, ok := commands[d.Cmd]
	if !ok {
		d.Fatalf(t, "unknown command %s", d.Cmd)
	}
	return fn(&command{w: w, t: t, d: d, ctx: context.Background()})
}

func (cm *command) server() string {
	w := cm.w
	d := cm.d
	w.servers[cm.arg("name")] = memdriver.New(memdriver.Options{AttachPrepared: d.HasArg("attach"), TxVisible: d.HasArg("txvisible"), Now: w.clock})
	return "ok"
}

func (cm *command) ledger() string {
	w := cm.w
	t := cm.t
	d := cm.d
	name := cm.arg("name")
	spec := ledgerSpec{control: cm.arg("control"), servers: []string{cm.arg("control")}}
	if s := cm.opt("shards"); s != "" {
		spec.servers = append(spec.servers, strings.Split(s, ",")...)
	}
	w.ledgers[name] = spec
	w.server(t, d, spec.control).SeedIdentity((strings.ToLower(name) + strings.Repeat("0", 16))[:16], []byte("secret of " + name + strings.Repeat(".", 32))[:32])
	return "ok"
}

func (cm *command) instance() string {
	w := cm.w
	t := cm.t
	d := cm.d
	ctx := cm.ctx
	name := cm.arg("name")
	spec := w.ledgers[cm.arg("ledger")]
	branches := 1
	if b := cm.opt("branches"); b != "" {
		branches, _ = strconv.Atoi(b)
	}
	var servers []driver.Server
	for _, s := range spec.servers {
		servers = append(servers, w.server(t, d, s).As("billing"))
	}
	fp, _ := failpoint.Parse("")
	w.failpts[name] = fp
	s, err := New(ctx, Config{Branches: branches, Group: "g", Topic: "t", StepTimeout: time.Second, Now: w.clock,
		Instance: name, Logger: testenv.Logger(), Changelog: d.HasArg("changelog")}, w.server(t, d, spec.control).As("billing"), servers)
	if err != nil {
		return "error: " + err.Error()
	}
	w.instances[name] = s
	return "ok"
}

func (cm *command) tick() string {
	w := cm.w
	t := cm.t
	d := cm.d
	dur, err := time.ParseDuration(cm.arg("d"))
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	w.now = w.now.Add(dur)
	return "now " + w.now.Sub(time.UnixMilli(0)).String()
}

func (cm *command) claim() string {
	w := cm.w
	t := cm.t
	d := cm.d
	ctx := cm.ctx
	s := w.instance(t, d, cm.arg("instance"))
	var parts []int32
	for _, p := range strings.Split(cm.arg("partitions"), ",") {
		n, _ := strconv.Atoi(p)
		parts = append(parts, int32(n))
	}
	var pos map[int32]Position
	var err error
	if d.Cmd == "claim" {
		pos, err = s.Claim(ctx, parts)
	} else {
		pos, err = s.Positions(ctx, parts)
	}
	if err != nil {
		return "error: " + err.Error()
	}
	var out []string
	for _, p := range parts {
		if ps, ok := pos[p]; ok {
			out = append(out, fmt.Sprintf("p%d: next %d, epoch %d, owner %s", p, ps.NextOffset, ps.Epoch, ps.Owner))
		} else {
			out = append(out, fmt.Sprintf("p%d: none", p))
		}
	}
	return strings.Join(out, "\n")
}

func (cm *command) begin() string {
	w := cm.w
	t := cm.t
	d := cm.d
	s := w.instance(t, d, cm.arg("instance"))
	n, _ := strconv.ParseUint(cm.arg("ckpt"), 10, 64)
	tx := s.Begin(n)
	w.txns[cm.arg("instance")+"/"+cm.arg("ckpt")] = tx
	return tx.Gtrid()
}

func (cm *command) write() string {
	ctx := cm.ctx
	tx := cm.txn()
	p, _ := strconv.Atoi(cm.arg("participant"))
	err := tx.Each(ctx, []int{p}, func(ctx context.Context, b *Branch) error {
		return b.WriteConn(func(c driver.Conn) error { return c.(*memdriver.Conn).Put(cm.arg("key"), tx.Gtrid()) })
	})
	return result(err)
}

func (cm *command) protocol() string {
	w := cm.w
	t := cm.t
	d := cm.d
	ctx := cm.ctx
	tx := cm.txn()
	if f := cm.opt("fail"); f != "" {
		fp, _ := failpoint.Parse(f + "=error")
		tx.s.cfg.Failpoints = fp
		defer func() { tx.s.cfg.Failpoints = nil }()
	}
	var err error
	switch d.Cmd {
	case "prepare":
		err = tx.Prepare(ctx)
	case "decide":
		var cuts []PartitionCut
		for _, c := range strings.Split(cm.opt("cuts"), ",") {
			if c == "" {
				continue
			}
			f := strings.Split(c, ":")
			if len(f) < 3 {
				d.Fatalf(t, "cut %q: want p:epoch:next[:wm[:up]]", c)
			}
			p, _ := strconv.Atoi(f[0])
			e, _ := strconv.ParseInt(f[1], 10, 64)
			n, _ := strconv.ParseInt(f[2], 10, 64)
			cut := PartitionCut{Partition: int32(p), Epoch: e, NextOffset: n}
			if len(f) > 3 {
				cut.Watermark = w.instant(t, d, f[3])
			}
			cut.CaughtUp = len(f) > 4 && f[4] == "1"
			cuts = append(cuts, cut)
		}
		var fc *FrontierChange
		if d.HasArg("openfrom") || d.HasArg("closed") || d.HasArg("sealed") {
			fc = &FrontierChange{OpenFrom: w.instant(t, d, cm.opt("openfrom")),
				Raise: driver.Frontier{Closed: w.instant(t, d, cm.opt("closed")), Sealed: w.instant(t, d, cm.opt("sealed"))}}
		}
		err = tx.Decide(ctx, cuts, fc, nil)
	case "commit":
		err = tx.Commit(ctx)
	case "abort":
		err = tx.Abort(ctx)
	}
	return result(err)
}

func (cm *command) eventtime() string {
	w := cm.w
	t := cm.t
	d := cm.d
	ctx := cm.ctx
	et, err := w.instance(t, d, cm.arg("instance")).EventTime(ctx)
	if err != nil {
		return "error: " + err.Error()
	}
	out := []string{fmt.Sprintf("frontier: closed %s, sealed %s", since(et.Frontier.Closed), since(et.Frontier.Sealed))}
	for _, p := range slices.Sorted(maps.Keys(et.Partitions)) {
		ps := et.Partitions[p]
		out = append(out, fmt.Sprintf("p%d: next %d, watermark %s, caught up %v", p, ps.NextOffset, since(ps.Watermark), ps.CaughtUp))
	}
	return strings.Join(out, "\n")
}

func (cm *command) crash() string {
	w := cm.w
	t := cm.t
	d := cm.d
	name := cm.arg("instance")
	s := w.instance(t, d, name)
	for key, tx := range w.txns {
		if strings.HasPrefix(key, name+"/") {
			tx.Abandon()
			delete(w.txns, key)
		}
	}
	s.mu.Lock()
	for i, c := range s.idle {
		if c != nil {
			c.Close(false)
			s.idle[i] = nil
		}
	}
	s.mu.Unlock()
	delete(w.instances, name)
	return "ok"
}

func (cm *command) recover() string {
	w := cm.w
	t := cm.t
	d := cm.d
	ctx := cm.ctx
	s := w.instance(t, d, cm.arg("instance"))
	minAge, err := time.ParseDuration(cm.arg("minage"))
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	res, err := s.Recover(ctx, minAge)
	remaining := slices.Sorted(func(yield func(string) bool) {
		for g := range res.Remaining {
			if !yield(g) {
				return
			}
		}
	})
	applied := ""
	if res.Applied > 0 {
		applied = fmt.Sprintf(", applied %d", res.Applied)
	}
	out := fmt.Sprintf("committed %d, rolled back %d, skipped %d, ended %d%s; in doubt %v", res.Committed, res.RolledBack, res.Skipped, res.Ended, applied, remaining)
	if err != nil {
		out += "\nerror: " + err.Error()
	}
	return out
}

func (cm *command) branches() string {
	w := cm.w
	t := cm.t
	d := cm.d
	b := w.server(t, d, cm.arg("server")).Branches()
	if len(b) == 0 {
		return "none"
	}
	return strings.Join(b, "\n")
}

func (cm *command) get() string {
	w := cm.w
	t := cm.t
	d := cm.d
	v, ok := w.server(t, d, cm.arg("server")).Get(cm.arg("key"))
	if !ok {
		return "absent"
	}
	return v
}

func (cm *command) decisions() string {
	w := cm.w
	t := cm.t
	d := cm.d
	ds := w.server(t, d, w.ledgers[cm.arg("ledger")].control).Decisions()
	if len(ds) == 0 {
		return "none"
	}
	var out []string
	for g, dec := range ds {
		out = append(out, fmt.Sprintf("%s %s by %s", g, dec.Outcome, dec.By))
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

func (cm *command) commits() string {
	w := cm.w
	t := cm.t
	d := cm.d
	ctx := cm.ctx
	ctl := w.server(t, d, w.ledgers[cm.arg("ledger")].control).As("billing")
	recs, err := ctl.Commits(ctx, 0, false, 1000)
	if err != nil {
		return "error: " + err.Error()
	}
	if len(recs) == 0 {
		return "none"
	}
	var out []string
	for _, r := range recs {
		state := "not applied"
		if r.Applied {
			state = "applied"
		}
		line := fmt.Sprintf("%d %s %s, committed %s", r.Seq, r.Gtrid, state, since(r.CommittedAt))
		if !r.SealedBefore.IsZero() {
			line += ", sealed before " + since(r.SealedBefore)
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

func (cm *command) position() string {
	w := cm.w
	t := cm.t
	d := cm.d
	ctx := cm.ctx
	p, err := w.instance(t, d, cm.arg("instance")).CommitPosition(ctx)
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("visible %d, decided %d, retained from %d, sealed before %s", p.Visible, p.Decided, p.RetainedFrom, since(p.SealedBefore))
}

func (cm *command) prune() string {
	w := cm.w
	t := cm.t
	d := cm.d
	ctx := cm.ctx
	retention, err := time.ParseDuration(cm.arg("retention"))
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	limit := 100
	if l := cm.opt("limit"); l != "" {
		limit, _ = strconv.Atoi(l)
	}
	n, err := w.instance(t, d, cm.arg("instance")).PruneCommitLog(ctx, retention, limit)
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("pruned %d", n)
}

func (cm *command) forge() string {
	w := cm.w
	t := cm.t
	d := cm.d
	ctx := cm.ctx
	sv := w.server(t, d, cm.arg("server")).As(cm.arg("user"))
	var x driver.Xid
	if d.Cmd == "forge" {
		g, b, _ := strings.Cut(cm.arg("xid"), "/")
		x = driver.Xid{Format: FormatID, Gtrid: g, Bqual: b}
	} else {
		tx := cm.txn()
		p, _ := strconv.Atoi(cm.arg("p"))
		b := tx.branches[p]
		if b == nil {
			d.Fatalf(t, "no branch p%d in %s", p, cm.arg("txn"))
		}
		x = b.xid
	}
	c, err := sv.Conn(ctx)
	if err != nil {
		return "error: " + err.Error()
	}
	for _, v := range []driver.Verb{driver.Start, driver.End, driver.Prepare} {
		if err := c.XA(ctx, v, x); err != nil {
			return fmt.Sprintf("%s: error: %v", v, err)
		}
	}
	return fmt.Sprintf("prepared %s %s on c%d as %s", x.Gtrid, x.Bqual, c.ID(), cm.arg("user"))
}

func (cm *command) restart() string {
	w := cm.w
	t := cm.t
	d := cm.d
	w.server(t, d, cm.arg("server")).Restart()
	return "ok"
}

func (cm *command) fail() string {
	w := cm.w
	t := cm.t
	d := cm.d
	codes := map[string]driver.Code{"transient": driver.Transient, "unknown": driver.Unknown, "data": driver.Data}
	code, ok := codes[cm.arg("code")]
	if !ok {
		d.Fatalf(t, "unknown code %s", cm.arg("code"))
	}
	w.server(t, d, cm.arg("server")).Fail(cm.arg("op"), code)
	return "ok"
}

// instant reads an event time written as a duration since the Unix epoch
// ("" is none).
func (w *world) instant(t *testing.T, d *datadriven.TestData, s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	dur, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "event time %q: %v", s, err)
	}
	return time.Unix(0, 0).UTC().Add(dur)
}

// since prints an event time as a duration since the Unix epoch.
func since(t time.Time) string {
	if t.IsZero() {
		return "none"
	}
	return t.Sub(time.Unix(0, 0)).String()
}

func (w *world) server(t *testing.T, d *datadriven.TestData, name string) *memdriver.Cluster {
	s, ok := w.servers[name]
	if !ok {
		d.Fatalf(t, "unknown server %s", name)
	}
	return s
}

func (w *world) instance(t *testing.T, d *datadriven.TestData, name string) *Sink {
	s, ok := w.instances[name]
	if !ok {
		d.Fatalf(t, "unknown instance %s", name)
	}
	return s
}

// result renders an error by its meaning: the protocol's sentinel errors
// by name, anything else as its text.
func result(err error) string {
	var fe *FencedError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &fe):
		return "fenced: " + fe.Error()
	case errors.Is(err, ErrFrontierMoved):
		return "frontier moved: " + err.Error()
	case errors.Is(err, ErrAborted):
		return "aborted: " + err.Error()
	case errors.Is(err, ErrOutcomeUnknown):
		return "outcome unknown: " + err.Error()
	case errors.Is(err, failpoint.ErrInjected):
		return "stopped: " + err.Error()
	}
	return "error: " + err.Error()
}

func (cm *command) changelog() string {
	w := cm.w
	ctx := cm.ctx
	control := w.server(cm.t, cm.d, w.ledgers[cm.arg("ledger")].control).As("billing")
	var err error
	switch {
	case cm.opt("enable") != "":
		_, err = control.EnableChangelog(ctx, cm.opt("enable"), w.now)
	case cm.opt("published") != "":
		n, _ := strconv.ParseInt(cm.opt("published"), 10, 64)
		err = control.ChangelogPublished(ctx, n)
	case cm.d.HasArg("off"):
		err = control.DisableChangelog(ctx)
	}
	if err != nil {
		return "error: " + err.Error()
	}
	st, err := control.Changelog(ctx)
	if err != nil {
		return "error: " + err.Error()
	}
	if !st.On {
		return "off"
	}
	return fmt.Sprintf("on, prefix %s, from %d, published %d, snapshot %v", st.Prefix, st.From, st.Published, st.Snapshot)
}
