package pipeline

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
	"github.com/twmb/franz-go/pkg/kfake"
)

// lockGate orders two instances' locking statements key by key: for each
// key one instance locks first, and the other one's statement over it
// waits (at most hold) until that statement returned. Keys are event ids
// (claims) and "balance/" + account (seeds and balance writes).
type lockGate struct {
	hold time.Duration
	// beforeWrite, if set, runs before each balance write of inst
	beforeWrite func(inst string)
	mu          sync.Mutex
	first       map[string]string        // key → the instance that locks it first
	claimed     map[string]chan struct{} // instance/key → closed once its statement returned
}

func (g *lockGate) ch(inst, key string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := inst + "/" + key
	if g.claimed[k] == nil {
		g.claimed[k] = make(chan struct{})
	}
	return g.claimed[k]
}

func (g *lockGate) before(inst string, keys []string) {
	for _, k := range keys {
		if f := g.first[k]; f != "" && f != inst {
			select {
			case <-g.ch(f, k):
			case <-time.After(g.hold):
			}
		}
	}
}

// after marks inst's statements over keys returned (a retry's again).
func (g *lockGate) after(inst string, keys []string) {
	for _, k := range keys {
		ch := g.ch(inst, k)
		g.mu.Lock()
		select {
		case <-ch:
		default:
			close(ch)
		}
		g.mu.Unlock()
	}
}

// gatedServer, gatedConn and gatedStore pass one instance's claims and
// balance seeds (creations and locking reads) through the gate.
type gatedServer struct {
	driver.Server
	gate *lockGate
	inst string
}

func (s gatedServer) Conn(ctx context.Context) (driver.Conn, error) {
	c, err := s.Server.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return gatedConn{c, s.gate, s.inst}, nil
}

type gatedConn struct {
	driver.Conn
	gate *lockGate
	inst string
}

func (c gatedConn) Store() driver.StoreTx { return gatedStore{c.Conn.Store(), c.gate, c.inst} }

type gatedStore struct {
	driver.StoreTx
	gate *lockGate
	inst string
}

func (s gatedStore) ClaimKeys(ctx context.Context, g driver.Generation, keys []driver.DedupKey) ([]driver.Contested, error) {
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = k.ID
	}
	s.gate.before(s.inst, ids)
	defer s.gate.after(s.inst, ids)
	return s.StoreTx.ClaimKeys(ctx, g, keys)
}

func (s gatedStore) WriteBalances(ctx context.Context, rows []driver.Balance, now time.Time) error {
	if s.gate.beforeWrite != nil {
		s.gate.beforeWrite(s.inst)
	}
	ks := make([]string, len(rows))
	for i, r := range rows {
		ks[i] = "balance/" + r.Account
	}
	s.gate.before(s.inst, ks)
	defer s.gate.after(s.inst, ks)
	return s.StoreTx.WriteBalances(ctx, rows, now)
}

func (s gatedStore) CreateBalances(ctx context.Context, keys []driver.BalanceKey) ([]driver.BalanceRow, []driver.BalanceKey, error) {
	ks := make([]string, len(keys))
	for i, k := range keys {
		ks[i] = "balance/" + k.Account
	}
	s.gate.before(s.inst, ks)
	defer s.gate.after(s.inst, ks)
	return s.StoreTx.CreateBalances(ctx, keys)
}

func (s gatedStore) LockBalances(ctx context.Context, keys []driver.BalanceKey) ([]driver.BalanceRow, error) {
	ks := make([]string, len(keys))
	for i, k := range keys {
		ks[i] = "balance/" + k.Account
	}
	s.gate.before(s.inst, ks)
	defer s.gate.after(s.inst, ks)
	return s.StoreTx.LockBalances(ctx, keys)
}

// Two instances of one ledger (one server, two branches per checkpoint)
// each checkpoint the same two events, repeats on their two partitions,
// whose keys route to different participants: k0 to participant 0, k1 to
// participant 1. Instance A claims k0 first, B claims k1 first, and each
// claims the other key only after the other instance holds it. Were the
// participants' claims run in parallel, A would hold k0 and wait for k1
// while B holds k1 and waits for k0: four branches, four transactions, a
// cycle no server sees, ended only by the lock wait timeout, each
// checkpoint aborted. Claimed in participant order, B waits for k0 holding
// nothing, A's checkpoint commits, then B's, which finds both events
// counted: no attempt fails, each event counts once.
func TestClaimsOfTwoInstancesCannotDeadlockAcrossBranches(t *testing.T) {
	const lockWait = time.Second
	cl := memdriver.New(memdriver.Options{AttachPrepared: true, LockWait: lockWait})
	gate := &lockGate{hold: lockWait / 2, first: map[string]string{}, claimed: map[string]chan struct{}{}}
	a, b := gatedInstance(t, cl, gate, "A", 2), gatedInstance(t, cl, gate, "B", 2)
	var ids [2]string
	for i := 0; ids[0] == "" || ids[1] == ""; i++ {
		id := fmt.Sprintf("ev-%d", i)
		if p := a.sink.Route(id); ids[p] == "" {
			ids[p] = id
		}
	}
	gate.first[ids[0]], gate.first[ids[1]] = "A", "B"

	checkpointTogether(t, []*memLedger{a, b}, [][]Record{
		{event1(ids[0], "acct-1", 5, 0, 0), event1(ids[1], "acct-2", 7, 0, 0)},
		{event1(ids[0], "acct-1", 5, 1, 0), event1(ids[1], "acct-2", 7, 1, 0)},
	})
	if b1, b2 := a.balance("acct-1"), a.balance("acct-2"); b1.Amount != 5 || b1.Count != 1 || b2.Amount != 7 || b2.Count != 1 {
		t.Errorf("balances %+v and %+v, want 5 and 7, each counted once", b1, b2)
	}
}

// gatedInstance is one of several instances of the ledger on cl, with
// branches participants, its statements passed through gate.
func gatedInstance(t *testing.T, cl *memdriver.Cluster, gate *lockGate, inst string, branches int) *memLedger {
	t.Helper()
	return gatedInstanceOn(t, []*memdriver.Cluster{cl}, gate, inst, branches)
}

// gatedInstanceOn is gatedInstance on the servers cls (the first one the
// control server), with branches participants on each.
func gatedInstanceOn(t *testing.T, cls []*memdriver.Cluster, gate *lockGate, inst string, branches int) *memLedger {
	t.Helper()
	m := &memLedger{servers: cls, epoch: map[int32]int64{}, offsets: map[int32]int64{}}
	var servers []driver.Server
	var stores []driver.Store
	for _, cl := range cls {
		s := cl.As("billing")
		servers, stores = append(servers, gatedServer{s, gate, inst}), append(stores, s)
	}
	sink, err := txsink.New(context.Background(), txsink.Config{Branches: branches, Group: "g", Topic: "billing", StepTimeout: 5 * time.Second, Logger: testenv.Logger()},
		cls[0].As("billing"), servers)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sink.Close)
	if m.ck, err = NewCheckpointer(memConfig(m), sink, stores); err != nil {
		t.Fatal(err)
	}
	m.ck.alone.Store(false) // instances of one ledger: each holds some partitions
	m.sink = sink
	return m
}

// checkpointTogether checkpoints recs[i] on instance ms[i], all at once,
// and fails the test unless every checkpoint is decided without a failed
// attempt.
func checkpointTogether(t *testing.T, ms []*memLedger, recs [][]Record) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(ms))
	decided := make([]bool, len(ms))
	for i, m := range ms {
		wg.Go(func() { decided[i], errs[i] = m.checkpoint(t, recs[i]...) })
	}
	wg.Wait()
	for i, m := range ms {
		if !decided[i] || errs[i] != nil {
			t.Errorf("instance %c: decided %v, %v", 'A'+i, decided[i], errs[i])
		}
		for _, info := range m.attempts() {
			if info.Err != nil {
				t.Errorf("instance %c: an attempt failed in %s: %v", 'A'+i, info.FailedPhase, info.Err)
			}
		}
	}
}

// Two instances of one ledger count on the same two accounts, X before Y
// in key order, on one participant (a repeat on another partition is
// counted by whoever claims it first). A's checkpoint seeds both (each
// account's running sum goes up and back: risky, aggregate.go), B's only
// Y, and B seeds first. Had B seeded only its risky key, it would hold Y
// and write X, which A's seed holds while it waits for Y: a cycle, and
// the server ends one attempt with a deadlock (1213 on InnoDB; memdriver
// reports it as well). B's seed locks every key its writes take up to its
// last risky one (lockOrder), so A waits for X holding nothing (and B
// writes once it does): no attempt fails, and every event counts once.
func TestSeedsOfTwoInstancesLockInWriteOrder(t *testing.T) {
	const lockWait = 2 * time.Second
	cl := memdriver.New(memdriver.Options{AttachPrepared: true, LockWait: lockWait})
	gate := &lockGate{hold: lockWait / 2, first: map[string]string{}, claimed: map[string]chan struct{}{}}
	a, b := gatedInstance(t, cl, gate, "A", 1), gatedInstance(t, cl, gate, "B", 1)
	// The rows exist: a locking read of a missing row locks nothing.
	if ok, err := a.checkpoint(t, event1("x-0", "acct-x", 1, 0, 0), event1("y-0", "acct-y", 1, 0, 0)); !ok || err != nil {
		t.Fatalf("first checkpoint: decided %v, %v", ok, err)
	}
	gate.first["balance/acct-y"] = "B"
	gate.beforeWrite = func(inst string) { // B writes once A's seed waits for it
		for end := time.Now().Add(gate.hold); inst == "B" && cl.LockWaits() == 0 && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
	}

	checkpointTogether(t, []*memLedger{a, b}, [][]Record{
		{event1("a-1", "acct-x", 5, 0, 0), event1("a-2", "acct-x", -5, 0, 0), event1("a-3", "acct-y", 5, 0, 0), event1("a-4", "acct-y", -5, 0, 0)},
		{event1("b-1", "acct-x", 3, 1, 0), event1("b-2", "acct-y", 5, 1, 0), event1("b-3", "acct-y", -5, 1, 0)},
	})
	if x, y := a.balance("acct-x"), a.balance("acct-y"); x.Amount != 4 || x.Count != 4 || y.Amount != 1 || y.Count != 5 {
		t.Errorf("balances %+v and %+v, want 4 in 4 events and 1 in 5", x, y)
	}
}

// twoServers is a ledger on two in-memory servers (a branch on each: two
// participants) for two gated instances A and B, and an account whose
// balance routes to each participant: acct[0] to server 0, acct[1] to
// server 1. Both balances exist (a locking read of a missing row locks
// nothing).
func twoServers(t *testing.T, gate *lockGate, lockWait time.Duration) (a, b *memLedger, acct [2]string) {
	t.Helper()
	cls := []*memdriver.Cluster{memdriver.New(memdriver.Options{AttachPrepared: true, LockWait: lockWait}),
		memdriver.New(memdriver.Options{AttachPrepared: true, LockWait: lockWait})}
	a, b = gatedInstanceOn(t, cls, gate, "A", 1), gatedInstanceOn(t, cls, gate, "B", 1)
	for i := 0; acct[0] == "" || acct[1] == ""; i++ {
		id := fmt.Sprintf("acct-%d", i)
		if p := a.sink.Route(id); acct[p] == "" {
			acct[p] = id
		}
	}
	if ok, err := a.checkpoint(t, event1("first-0", acct[0], 1, 0, 0), event1("first-1", acct[1], 1, 0, 0)); !ok || err != nil {
		t.Fatalf("first checkpoint: decided %v, %v", ok, err)
	}
	gate.claimed = map[string]chan struct{}{} // its statements are not the ones the test orders
	return a, b, acct
}

// Two instances of one ledger on two servers count on the same two
// accounts, X on server 0 and Y on server 1, both risky in both
// checkpoints (each account's running sum goes up and back). A seeds X
// first, B seeds Y first. Had the participants seeded in parallel, A
// would hold X and wait for Y on server 1 while B holds Y and waits for X
// on server 0: two waits on two servers, a cycle neither sees, ended only
// by the lock wait timeout, both attempts aborted. The seeds take one
// order over every participant (server 0's locks before server 1's), so B
// waits for X holding nothing: no attempt fails, and every event counts
// once.
func TestSeedsOfTwoInstancesLockInOneOrderAcrossServers(t *testing.T) {
	const lockWait = 2 * time.Second
	// hold: A's seed and A's write each wait it out once, within B's wait
	gate := &lockGate{hold: lockWait / 4, first: map[string]string{}, claimed: map[string]chan struct{}{}}
	a, b, acct := twoServers(t, gate, lockWait)
	x, y := acct[0], acct[1]
	gate.first["balance/"+x], gate.first["balance/"+y] = "A", "B"

	checkpointTogether(t, []*memLedger{a, b}, [][]Record{
		{event1("a-1", x, 5, 0, 0), event1("a-2", x, -5, 0, 0), event1("a-3", y, 5, 0, 0), event1("a-4", y, -5, 0, 0)},
		{event1("b-1", x, 5, 1, 0), event1("b-2", x, -5, 1, 0), event1("b-3", x, 3, 1, 0), event1("b-4", y, 5, 1, 0), event1("b-5", y, -5, 1, 0)},
	})
	if bx, by := a.balance(x), a.balance(y); bx.Amount != 4 || bx.Count != 6 || by.Amount != 1 || by.Count != 5 {
		t.Errorf("balances %+v and %+v, want 4 in 6 events and 1 in 5", bx, by)
	}
}

// A seed and another instance's writes across two servers: A's checkpoint
// seeds X (server 0, risky) and adds to Y (server 1); B's only adds to X
// and Y. A seeds X first, B writes Y first. Had B written its
// participants in parallel, B would hold Y and wait for X while A's write
// of Y waits for B: a cycle no server sees, ended by the lock wait
// timeout. Beside other instances the writes that take rows no seed
// locked go participant after participant, after the seeds: B waits for X
// holding nothing, and no attempt fails.
func TestWritesOfTwoInstancesLockInOneOrderAcrossServers(t *testing.T) {
	const lockWait = 2 * time.Second
	// hold: A's seed and A's write each wait it out once, within B's wait
	gate := &lockGate{hold: lockWait / 4, first: map[string]string{}, claimed: map[string]chan struct{}{}}
	a, b, acct := twoServers(t, gate, lockWait)
	x, y := acct[0], acct[1]
	gate.first["balance/"+x], gate.first["balance/"+y] = "A", "B"

	checkpointTogether(t, []*memLedger{a, b}, [][]Record{
		{event1("a-1", x, 5, 0, 0), event1("a-2", x, -5, 0, 0), event1("a-3", y, 2, 0, 0)},
		{event1("b-1", x, 3, 1, 0), event1("b-2", y, 4, 1, 0)},
	})
	if bx, by := a.balance(x), a.balance(y); bx.Amount != 4 || bx.Count != 4 || by.Amount != 7 || by.Count != 3 {
		t.Errorf("balances %+v and %+v, want 4 in 4 events and 7 in 3", bx, by)
	}
}

// The seed widens over participants: A's checkpoint has a risky key on Y
// (server 1) and adds to X (server 0), which comes before Y in the lock
// order; B's only adds to X and Y. B writes X first, A seeds Y first. Had
// A seeded Y alone, it would hold Y and then write X, which B holds while
// it waits for Y: a cycle across the servers. A's seed locks every key up
// to its last risky one over every participant, X too, in order: A waits
// for X holding nothing, and no attempt fails.
func TestSeedsWidenOverParticipants(t *testing.T) {
	const lockWait = 2 * time.Second
	// hold: A's seed and A's write each wait it out once, within B's wait
	gate := &lockGate{hold: lockWait / 4, first: map[string]string{}, claimed: map[string]chan struct{}{}}
	a, b, acct := twoServers(t, gate, lockWait)
	x, y := acct[0], acct[1]
	gate.first["balance/"+x], gate.first["balance/"+y] = "B", "A"

	checkpointTogether(t, []*memLedger{a, b}, [][]Record{
		{event1("a-1", x, 2, 0, 0), event1("a-2", y, 5, 0, 0), event1("a-3", y, -5, 0, 0)},
		{event1("b-1", x, 3, 1, 0), event1("b-2", y, 4, 1, 0)},
	})
	if bx, by := a.balance(x), a.balance(y); bx.Amount != 6 || bx.Count != 3 || by.Amount != 5 || by.Count != 4 {
		t.Errorf("balances %+v and %+v, want 6 in 3 events and 5 in 4", bx, by)
	}
}

// Two instances claim one key: A first, and A's checkpoint then takes
// longer than the server's lock wait timeout to decide (it waits, as a
// checkpoint waiting for a third instance's would). B's claim waits for
// A's decision, not for the timeout: beside other instances claims wait up
// to the attempt's deadline (their order admits no cycle), so neither
// attempt fails, and the event counts once.
func TestClaimsWaitForTheHoldersDecisionPastTheLockWait(t *testing.T) {
	const lockWait = 300 * time.Millisecond
	cl := memdriver.New(memdriver.Options{AttachPrepared: true, LockWait: lockWait})
	gate := &lockGate{hold: time.Second, first: map[string]string{"ev-1": "A"}, claimed: map[string]chan struct{}{}}
	gate.beforeWrite = func(inst string) {
		if inst == "A" {
			time.Sleep(3 * lockWait)
		}
	}
	a, b := gatedInstance(t, cl, gate, "A", 1), gatedInstance(t, cl, gate, "B", 1)
	checkpointTogether(t, []*memLedger{a, b}, [][]Record{{event1("ev-1", "acct-1", 5, 0, 0)}, {event1("ev-1", "acct-1", 5, 1, 0)}})
	if got := a.balance("acct-1"); got.Amount != 5 || got.Count != 1 {
		t.Errorf("balance %+v, want 5 counted once", got)
	}
}

// An instance claims in parallel only while it holds every partition of
// the topic: alone at first, it claims in lock order once a second member
// took partitions, and in parallel again once that member left.
func TestClaimsInParallelOnlyWhileAlone(t *testing.T) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "billing"), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	server := memdriver.New(memdriver.Options{AttachPrepared: true, LockWait: time.Second})
	s := server.As("billing")
	ctx := context.Background()
	start := func() (*Pipeline, func()) {
		sink, err := txsink.New(ctx, txsink.Config{Branches: 2, Group: "g", Topic: "billing", StepTimeout: 5 * time.Second, Logger: testenv.Logger()},
			s, []driver.Server{s})
		if err != nil {
			t.Fatal(err)
		}
		e := &env{brokers: kc.ListenAddrs(), topic: "billing"}
		cfg := testConfig(e)
		cfg.Group = "g"
		p, err := New(cfg, sink, []driver.Store{s})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(rctx) }()
		return p, func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			sink.Close()
		}
	}
	held := func(p *Pipeline) (int, bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.parts), p.ckpt.alone.Load()
	}
	a, stopA := start()
	defer stopA()
	testenv.Eventually(t, 30*time.Second, "the first member holds all four partitions, alone", func() (bool, string) {
		n, alone := held(a)
		return n == 4 && alone, fmt.Sprintf("%d partitions, alone %v", n, alone)
	})
	b, stopB := start()
	testenv.Eventually(t, 30*time.Second, "two members share the partitions, neither alone", func() (bool, string) {
		na, aloneA := held(a)
		nb, aloneB := held(b)
		return na > 0 && nb > 0 && na+nb == 4 && !aloneA && !aloneB, fmt.Sprintf("A %d partitions (alone %v), B %d (alone %v)", na, aloneA, nb, aloneB)
	})
	stopB()
	testenv.Eventually(t, 30*time.Second, "the first member alone again", func() (bool, string) {
		n, alone := held(a)
		return n == 4 && alone, fmt.Sprintf("%d partitions, alone %v", n, alone)
	})
}
