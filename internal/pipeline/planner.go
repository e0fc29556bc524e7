package pipeline

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The planner: one checkpoint attempt as a pure state machine over the
// barrier's snapshot. ready says what to do next (a step), the executor
// (executor.go) does it against the store and the sink and hands the
// results back with advance, and the planner works out the step after
// from them: the planner never does I/O, the executor never decides (as
// etcd-io/raft's Ready and Advance).
//
// The steps, in order, each one only when it has something to do:
//
//	eventTime  read the frontier and the partitions' watermarks
//	           (closing windows only); judge each record late or not,
//	           plan the frontier's raise and the windows to seal
//	generations read the dedup keys' generations (only with keys to
//	           claim); register this instance's key lifetime first if the
//	           state's is shorter (register), then read again
//	claim      claim the keys of the ids the cache does not know, each
//	           participant its share: insert them into the current
//	           generation, then lock-read them in the earlier generations
//	           that may hold live keys (dedup.ClaimAt)
//	lookup     look up the ids of the claim statements that met a stored
//	           key in the current generation, on their servers' pools
//	classify   decide every record: new, a repeat, a conflicting repeat
//	           (no I/O)
//	seed       read the stored sums of the risky keys under row locks
//	           (beside other instances, every key written up to the last
//	           risky one, participant after participant, the missing
//	           ones created at zero first: lockOrder)
//	aggregate  count the new events, checking overflow per event (no I/O)
//	uncounted  (beside other instances) a key the seed created counts no
//	           event: abort, to be retried without creating it
//	write      every participant's rows (dedup keys, journal, balances,
//	           windows, adjustments, entries, dead letters) and, on the
//	           first participant of each server, the sealing (beside
//	           other instances the sums of the participants from the last
//	           seeded one's on in turn: lockOrder)
//	decide     prepare, decide on the cuts, the frontier change and the
//	           generation claimed in, commit
//
// or skip (nothing to do at all: no record, no window to close or seal),
// or trialDone (a trial of isolate.go stops after the writes).

// stepKind names a step.
type stepKind int

const (
	stepEventTime stepKind = iota
	stepGenerations
	stepRegister
	stepClaim
	stepLookup
	stepClassify
	stepSeed
	stepAggregate
	stepUncounted
	stepWrite
	stepDecide
	stepSkip
	stepTrialDone
)

// phase is the name of the step's part of CheckpointInfo.Phases, and of
// FailedPhase when it fails (the decide step's three are the executor's).
func (k stepKind) phase() string {
	return [...]string{"eventtime", "dedup", "dedup", "dedup", "dedup", "dedup", "aggregate", "aggregate", "aggregate", "write", "decide", "", "trial"}[k]
}

func (k stepKind) String() string {
	return [...]string{"eventTime", "generations", "register", "claim", "lookup", "classify", "seed", "aggregate", "uncounted", "write", "decide", "skip", "trialDone"}[k]
}

// pure reports a step that needs no I/O: the executor advances at once.
func (k stepKind) pure() bool { return k == stepClassify || k == stepAggregate }

// step is what to do next.
type step struct {
	kind      stepKind
	lifetime  time.Duration       // register: this instance's key lifetime
	claim     dedup.Claim         // claim, lookup: the generations written and read
	claims    [][]driver.DedupKey // claim: by participant
	lookups   []lookup            // lookup: in participant order
	seeds     []seedKeys          // seed: by participant
	works     []work              // write: by participant
	seal      sealRange           // write: the windows to seal (to zero: none)
	decision  decision            // decide
	uncounted []lockKey           // uncounted: the keys created for nothing
	// turnFrom (write): the participants from this one on write their
	// sums one after the other, in participant order (beside other
	// instances: lockOrder); Participants() (alone): none do.
	turnFrom int
}

// lookup is one participant's contested ids, on its server's pool.
type lookup struct {
	server int
	ids    []string
}

// seedKeys are the risky keys one participant reads under row locks, in
// key order (the order every writer locks in); beside other instances
// they are in create, to be created where missing and read, but for
// those an earlier attempt created for nothing (planConfig.uncreated),
// only read.
type seedKeys struct {
	balances         []driver.BalanceKey
	windows, adjusts []driver.WindowKey
	create           createKeys
}

type createKeys struct {
	balances         []driver.BalanceKey
	windows, adjusts []driver.WindowKey
}

func (s *seedKeys) empty() bool {
	return len(s.balances)+len(s.windows)+len(s.adjusts)+len(s.create.balances)+len(s.create.windows)+len(s.create.adjusts) == 0
}

// sealRange is the windows [from, to) whose rows a checkpoint seals, at
// most max rows per server.
type sealRange struct {
	from, to time.Time
	max      int
}

// decision is what the commit decision writes: the cuts, and the frontier
// change (nil: the frontier is not touched), and checks: the generation the
// keys were claimed in (nil: none claimed).
type decision struct {
	cuts     []txsink.PartitionCut
	frontier *txsink.FrontierChange
	keys     *driver.Generation
}

// result is what the executor found doing a step.
type result struct {
	eventTime   txsink.EventTime      // eventTime
	generations driver.KeyGenerations // generations
	contested   [][]driver.Contested  // claim: by participant
	earlier     []driver.DedupKey     // claim: what the locking reads of earlier generations found
	found       []driver.DedupKey     // lookup
	seeded      []seededSums          // seed: by participant
	sealed      []sealResult          // write: by participant
}

// seededSums are the stored rows a seed read found, whole, and the keys
// whose rows it created (found among them, at zero).
type seededSums struct {
	balances []driver.BalanceRow
	windows  []driver.WindowRow
	adjusts  []driver.AdjustmentRow
	created  createKeys
}

// sealResult is what one participant's sealing did: the rows it sealed,
// as they were.
type sealResult struct {
	rows []driver.WindowRow
	done bool
}

// planConfig is what a plan depends on besides its snapshot.
type planConfig struct {
	window     event.Windows
	closeAfter time.Duration // 0: windows never close
	skew       time.Duration // MaxEventTimeSkew
	ttl        time.Duration // of dedup keys
	horizon    time.Duration // of versions, from an event's first (versions.go)
	prefix     int           // DeadLetterPayloadBytes
	entries    bool          // LedgerEntries
	route      placement
	servers    int
	careful    bool // every key seeded (the retry after an overflow)
	trial      bool // stop after the writes (isolation)
	// shared: other instances hold partitions of the topic, so their
	// checkpoints may lock the same rows; every lock is then taken in one
	// order (executor.go, claim; lockOrder).
	shared bool
	// changelog: every key is seeded (its row before is the change's
	// before image), written absolute or inserted, and the changes go to
	// the outbox (changes.go).
	changelog bool
	// uncreated: keys the seed does not create (shared) where they are
	// missing: an earlier attempt of the snapshot created them, and no
	// event counted on them.
	uncreated []lockKey
}

// placement places keys on participants (txsink.Sink).
type placement interface {
	router
	ServerOf(participant int) int
}

// cacheView is what the plan reads of the dedup cache (memory, not I/O).
type cacheView interface {
	Get(id string, now time.Time) (dedup.Seen, bool)
}

// tally is what the plan counted so far, for CheckpointInfo.
type tally struct {
	duplicates, counted, late, sealed int
	deadLetters                       map[string]int
	careful                           bool
}

// planner is one attempt's plan.
type planner struct {
	cfg   planConfig
	now   time.Time
	snap  *snapshot
	cache cacheView
	next  step

	et        eventTimePlan
	cp        claimPlan
	claimed   *dedup.Claim // nil until the keys are claimed
	recheck   []recheck    // contested statements looked up in part (afterClaims)
	o         outcomes
	agg       *aggregate
	risky     riskySet
	seeded    []seededSums
	images    images // changelog: the rows before
	openFrom  time.Time
	allSealed bool
	tally     tally
}

// riskySet are the keys whose overflow the server could miss (aggregate).
type riskySet struct {
	balances         map[balanceKey]bool
	windows, adjusts map[windowKey]bool
}

// newPlanner plans an attempt on s at processing time now: the records
// later than now plus the skew become dead letters first (admit).
func newPlanner(cfg planConfig, s *snapshot, now time.Time, cache cacheView) *planner {
	p := &planner{cfg: cfg, now: now, snap: admit(s, now, cfg.skew, cfg.prefix), cache: cache,
		tally: tally{deadLetters: map[string]int{}, careful: cfg.careful}}
	if cfg.closeAfter > 0 {
		p.next = step{kind: stepEventTime}
	} else {
		p.planClaims()
	}
	return p
}

// snapshot is the snapshot the attempt commits (admitted).
func (p *planner) snapshot() *snapshot { return p.snap }

// ready is the next step. The writes are planned when they are asked for.
func (p *planner) ready() step {
	if p.next.kind == stepWrite && p.next.works == nil {
		p.planWrites()
	}
	return p.next
}

// advance takes the results of the step ready returned and plans the next.
func (p *planner) advance(r result) {
	switch p.next.kind {
	case stepEventTime:
		p.afterEventTime(r.eventTime)
	case stepGenerations:
		p.afterGenerations(r.generations)
	case stepRegister:
		p.next = step{kind: stepGenerations}
	case stepClaim:
		p.afterClaims(r.contested, r.earlier)
	case stepLookup:
		p.afterLookups(r.found)
	case stepClassify:
		p.classify()
	case stepSeed:
		p.seeded, p.next = r.seeded, step{kind: stepAggregate}
		if p.cfg.changelog {
			p.images = newImages(r.seeded)
		}
	case stepAggregate:
		p.aggregate()
	case stepWrite:
		p.afterWrites(r.sealed)
	}
}

func (p *planner) afterEventTime(et txsink.EventTime) {
	p.et = planEventTime(p.cfg.window, p.cfg.closeAfter, et, p.snap.records, p.snap.cuts)
	if len(p.snap.records)+len(p.snap.dead)+len(p.snap.cuts) == 0 && p.et.noWork() {
		p.next = step{kind: stepSkip}
		return
	}
	p.planClaims()
}

func (p *planner) planClaims() {
	p.cp = planClaims(p.snap.records, p.cache, p.now, p.cfg.ttl, p.cfg.route)
	if len(nonEmpty(p.cp.claims)) == 0 {
		p.afterClaims(nil, nil)
		return
	}
	p.next = step{kind: stepGenerations}
}

// afterGenerations plans the claims under the generations' state s, read
// after the attempt's processing time was (so that its keys' expiry is
// bounded by the state's, dedup.LiveUntil), once this instance's key
// lifetime is registered.
func (p *planner) afterGenerations(s driver.KeyGenerations) {
	if s.Lifetime < p.cfg.ttl {
		p.next = step{kind: stepRegister, lifetime: p.cfg.ttl}
		return
	}
	claims := make([][]driver.DedupKey, len(p.cp.claims))
	for i, c := range p.cp.claims {
		if len(c) > 0 {
			claims[i] = toDedupKeys(c)
		}
	}
	c := dedup.ClaimAt(s, p.now)
	p.claimed = &c
	p.next = step{kind: stepClaim, claim: c, claims: claims}
}

// afterClaims takes what the claims' locking reads found in earlier
// generations and plans the lookups: only the ids of claim statements that
// met a stored row in the current generation, on a pooled connection
// outside the branches, which sees the committed rows and not this
// checkpoint's own inserts. Of a statement that holds versions (stored,
// most likely: their events came before) only those are looked up at
// first; when they are not all the stored keys the statement met, its
// other ids are looked up after (afterLookups), so that the originals
// beside the versions are not read in vain.
func (p *planner) afterClaims(contested [][]driver.Contested, earlier []driver.DedupKey) {
	for _, k := range earlier {
		// Of an id's rows in several earlier generations, a live one; of
		// two live ones, the first arrival's (it expires first).
		old, ok := p.cp.earlier[k.ID]
		live, oldLive := p.now.Before(k.ExpiresAt), ok && p.now.Before(old.ExpiresAt)
		if !ok || live && !oldLive || live == oldLive && k.ExpiresAt.Before(old.ExpiresAt) {
			p.cp.earlier[k.ID] = dedup.Seen{Fingerprint: k.Fingerprint, ExpiresAt: k.ExpiresAt}
			p.cp.storedVersion(&p.cp.earlierV, k)
		}
	}
	var ls []lookup
	for i, statements := range contested {
		var ids []string
		for _, c := range statements {
			first, rest := p.cp.lookupFirst(c)
			ids = append(ids, first...)
			if len(rest) > 0 {
				p.recheck = append(p.recheck, recheck{participant: i, looked: first, rest: rest, stored: c.Stored})
			}
		}
		if len(ids) > 0 {
			ls = append(ls, lookup{server: p.cfg.route.ServerOf(i), ids: ids})
		}
	}
	if len(ls) == 0 {
		p.afterLookups(nil)
		return
	}
	p.next = step{kind: stepLookup, claim: *p.claimed, lookups: ls}
}

// recheck is a contested claim statement whose versions were looked up
// first: if they are not all the keys it met stored, the rest of its ids
// are looked up too.
type recheck struct {
	participant int
	looked      []string
	rest        []string
	stored      int // of the statement's keys
}

func (p *planner) afterLookups(found []driver.DedupKey) {
	for _, k := range found {
		p.cp.known[k.ID] = dedup.Seen{Fingerprint: k.Fingerprint, ExpiresAt: k.ExpiresAt}
		p.cp.storedVersion(&p.cp.knownV, k)
	}
	if len(p.recheck) > 0 {
		rs := p.recheck
		p.recheck = nil
		byParticipant := map[int][]string{}
		for _, r := range rs {
			n := 0
			for _, id := range r.looked {
				if _, ok := p.cp.known[id]; ok {
					n++
				}
			}
			if n < r.stored {
				byParticipant[r.participant] = append(byParticipant[r.participant], r.rest...)
			}
		}
		var ls []lookup
		for i := range p.cfg.route.Participants() {
			if ids := byParticipant[i]; len(ids) > 0 {
				ls = append(ls, lookup{server: p.cfg.route.ServerOf(i), ids: ids})
			}
		}
		if len(ls) > 0 {
			p.next = step{kind: stepLookup, claim: *p.claimed, lookups: ls}
			return
		}
	}
	p.next = step{kind: stepClassify}
}

// classify decides every record and finds the keys to seed.
func (p *planner) classify() {
	if p.cp.versioned {
		var closed time.Time // windows before it are closed (none without closing)
		if p.cfg.closeAfter > 0 {
			closed = p.et.read.Closed
		}
		p.o = classifyVersions(p.snap.records, p.snap.dead, p.cp, p.now, p.cfg.ttl, p.cfg.horizon, p.cfg.prefix, p.cfg.window, closed)
	} else {
		p.o = classify(p.snap.records, p.snap.dead, p.cp, p.now, p.cfg.ttl, p.cfg.prefix)
	}
	p.tally.duplicates = p.o.duplicates
	p.agg = newAggregate(p.cfg.window)
	p.agg.images = p.cfg.changelog
	rb, rw, ra := p.agg.riskyKeys(p.o.applied(), p.cfg.careful)
	if len(rb)+len(rw)+len(ra) > 0 {
		p.tally.careful = true
	}
	if p.cfg.changelog {
		rb, rw, ra = p.agg.riskyKeys(p.o.applied(), true)
	}
	if len(rb)+len(rw)+len(ra) == 0 {
		p.next = step{kind: stepAggregate}
		return
	}
	p.risky = riskySet{rb, rw, ra}
	if p.cfg.shared && !p.cfg.changelog {
		p.risky = lockOrder(p.risky, p.agg, p.o.applied(), p.cfg.route)
	}
	p.next = step{kind: stepSeed, seeds: p.seedKeys()}
}

// lockOrder widens the risky keys so that the seed locks, in one order
// over every participant (participant, then the table in the order the
// writes take them: balances, windows, adjustments, then the key), every
// key the checkpoint will write up to its last risky one: every key of
// the participants before that key's, and of its participant every
// balance when a window is risky, every balance and window when an
// adjustment is. The seed runs participant after participant, and the
// writes of the participants from the last risky key's on take their
// rows one participant after the other (executor.go, write), so every
// lock a checkpoint takes is after every one it holds.
//
// Seeded alone, the risky keys are a subset of the written ones, and two
// instances' checkpoints that count on the same accounts (a repeat on
// another partition, counted by whoever claims it first) can lock them in
// two orders: B's seed locks Y, A's seed locks X and waits for Y, B's
// write of X waits for A. On one participant InnoDB ends one of them with
// a deadlock (1213); across two participants (two branches: two
// transactions, on two servers or one) no server sees the cycle, and both
// wait out the lock wait timeout. Widened, B's seed waits for X holding
// nothing. The widened keys are seeded like risky ones: a stored row is
// written as an absolute value (it is locked).
//
// READ COMMITTED locks no row that does not exist: a key without a row,
// only read, would be locked when the write step inserts it, after the
// seed's later keys. Beside other instances the seed therefore first
// inserts, in the same order, a row at zero for every key it seeds that
// has none (driver.StoreTx.CreateBalances, an upsert that changes no
// stored row, with the changelog as well: it seeds every key), so that it
// holds each key, stored or not, before it waits for a later one; a
// created row is then written as an absolute value, as a stored one, and
// its change is still a create (changes.go). Events summing to zero
// already leave a row (their count), so only a created row no counted
// event writes (every event on it refused for overflow) would differ from
// the checkpoint alone, which writes no row there: the attempt is aborted
// (its branch rolls the row back) and retried without creating that key
// (planConfig.uncreated), which is then locked when it is inserted, as
// before (docs/performance.md: what the order does not cover). In the
// write step every absolute row is one the seed holds and every delta row
// a key after all of them, so the order of those statements takes no
// lock out of order.
func lockOrder(r riskySet, agg *aggregate, fresh []*record, route router) riskySet {
	last := r.last(route)
	if last == nil {
		return r
	}
	var all riskySet
	all.balances, all.windows, all.adjusts = agg.riskyKeys(fresh, true)
	out := riskySet{balances: map[balanceKey]bool{}, windows: map[windowKey]bool{}, adjusts: map[windowKey]bool{}}
	all.each(route, func(k lockKey) {
		if k.compare(*last) <= 0 {
			out.add(k)
		}
	})
	return out
}

// lockKey is a row's place in the one lock order: its participant, the
// table, in the order the writes take them, then the key (a balance's as
// a window key without a start).
type lockKey struct {
	participant int
	table       int // 0: balances, 1: windows, 2: adjustments
	key         windowKey
}

func (x lockKey) compare(y lockKey) int {
	return cmp.Or(cmp.Compare(x.participant, y.participant), cmp.Compare(x.table, y.table), compareWindowKey(x.key, y.key))
}

func (s riskySet) each(route router, fn func(lockKey)) {
	for k := range s.balances {
		fn(lockKey{route.Route(k.account), 0, windowKey{k.account, k.currency, 0}})
	}
	for k := range s.windows {
		fn(lockKey{route.Route(k.account), 1, k})
	}
	for k := range s.adjusts {
		fn(lockKey{route.Route(k.account), 2, k})
	}
}

// last is the set's last key in the lock order (nil: it is empty).
func (s riskySet) last(route router) *lockKey {
	var last *lockKey
	s.each(route, func(k lockKey) {
		if last == nil || k.compare(*last) > 0 {
			last = &k
		}
	})
	return last
}

func (s riskySet) add(k lockKey) {
	switch k.table {
	case 0:
		s.balances[balanceKey{k.key.account, k.key.currency}] = true
	case 1:
		s.windows[k.key] = true
	default:
		s.adjusts[k.key] = true
	}
}

// seedKeys groups the risky keys by the participant that owns the account,
// in key order.
func (p *planner) seedKeys() []seedKeys {
	seeds := make([]seedKeys, p.cfg.route.Participants())
	for k := range p.risky.balances {
		at := p.cfg.route.Route(k.account)
		seeds[at].balances = append(seeds[at].balances, k.row())
	}
	for k := range p.risky.windows {
		at := p.cfg.route.Route(k.account)
		seeds[at].windows = append(seeds[at].windows, k.row())
	}
	for k := range p.risky.adjusts {
		at := p.cfg.route.Route(k.account)
		seeds[at].adjusts = append(seeds[at].adjusts, k.row())
	}
	for i := range seeds {
		slices.SortFunc(seeds[i].balances, func(x, y driver.BalanceKey) int {
			return cmp.Or(strings.Compare(x.Account, y.Account), strings.Compare(x.Currency, y.Currency))
		})
		slices.SortFunc(seeds[i].windows, compareWindowKeys)
		slices.SortFunc(seeds[i].adjusts, compareWindowKeys)
	}
	if p.cfg.shared {
		no := map[lockKey]bool{}
		for _, k := range p.cfg.uncreated {
			no[k] = true
		}
		for i := range seeds {
			s := &seeds[i]
			s.balances, s.create.balances = split(s.balances, func(k driver.BalanceKey) bool { return no[lockKey{i, 0, windowKey{k.Account, k.Currency, 0}}] })
			s.windows, s.create.windows = split(s.windows, func(k driver.WindowKey) bool {
				return no[lockKey{i, 1, windowKey{k.Account, k.Currency, k.Start.Unix()}}]
			})
			s.adjusts, s.create.adjusts = split(s.adjusts, func(k driver.WindowKey) bool {
				return no[lockKey{i, 2, windowKey{k.Account, k.Currency, k.Start.Unix()}}]
			})
		}
	}
	return seeds
}

// split splits xs into the elements that keep holds for and the others.
func split[T any](xs []T, keep func(T) bool) (kept, others []T) {
	for _, x := range xs {
		if keep(x) {
			kept = append(kept, x)
		} else {
			others = append(others, x)
		}
	}
	return kept, others
}

func compareWindowKeys(x, y driver.WindowKey) int {
	return cmp.Or(strings.Compare(x.Account, y.Account), strings.Compare(x.Currency, y.Currency), x.Start.Compare(y.Start))
}

// aggregate seeds the aggregate with what the seed step read (a risky key
// without a stored row starts at zero) and counts the new events.
func (p *planner) aggregate() {
	for k := range p.risky.balances {
		p.agg.seedBalance(k, total{})
	}
	for k := range p.risky.windows {
		p.agg.seedWindow(k, total{}, false)
	}
	for k := range p.risky.adjusts {
		p.agg.seedWindow(k, total{}, true)
	}
	for _, s := range p.seeded {
		for _, b := range s.balances {
			p.agg.seedBalance(balanceKey{b.Account, b.Currency}, total{amount: b.Amount, count: b.Count, exists: true})
		}
		for _, w := range s.windows {
			p.agg.seedWindow(windowKey{w.Account, w.Currency, w.Start.Unix()}, total{amount: w.Amount, count: w.Count, exists: true}, false)
		}
		for _, w := range s.adjusts {
			p.agg.seedWindow(windowKey{w.Account, w.Currency, w.Start.Unix()}, total{amount: w.Amount, count: w.Count, exists: true}, true)
		}
	}
	p.o.count(p.agg, p.cfg.prefix, p.cfg.entries)
	p.tally.counted, p.tally.late = p.o.counted, p.o.late
	p.next = step{kind: stepWrite}
	if u := p.uncounted(); len(u) > 0 && !p.cfg.trial {
		p.next = step{kind: stepUncounted, uncounted: u}
	}
}

// uncounted are the keys whose rows the seed created and no counted
// event writes (lockOrder): the attempt is not to leave them behind.
// A trial rolls back whatever it wrote.
func (p *planner) uncounted() []lockKey {
	var out []lockKey
	for i, s := range p.seeded {
		for _, k := range s.created.balances {
			if t := p.agg.balances[balanceKey{k.Account, k.Currency}]; t == nil || t.count == 0 {
				out = append(out, lockKey{i, 0, windowKey{k.Account, k.Currency, 0}})
			}
		}
		for j, ks := range [][]driver.WindowKey{s.created.windows, s.created.adjusts} {
			for _, k := range ks {
				wk := windowKey{k.Account, k.Currency, k.Start.Unix()}
				if t := p.agg.sums(j == 1)[wk]; t == nil || t.count == 0 {
					out = append(out, lockKey{i, 1 + j, wk})
				}
			}
		}
	}
	return out
}

// planWrites routes every row to its participant; the first participant of
// each server seals the closed windows' rows there.
func (p *planner) planWrites() {
	works := planWrites(&p.o, p.agg, p.cfg.window, p.cfg.route)
	var seal sealRange
	if !p.et.sealTo.IsZero() {
		seal = sealRange{from: p.et.sealFrom, to: p.et.sealTo, max: maxSealRows}
		per := p.cfg.route.Participants() / p.cfg.servers
		for i := range p.cfg.servers {
			works[i*per].seal = true
		}
	}
	p.openFrom = earliestOpen(works)
	for _, d := range p.o.dead {
		p.tally.deadLetters[d.Reason]++
	}
	p.next = step{kind: stepWrite, works: works, seal: seal, turnFrom: p.turnFrom()}
}

// turnFrom is the first participant whose writes take rows no seed
// locked: beside other instances, from it on the participants write
// their sums in turn, in participant order, after every row the seed
// locked (lockOrder); the ones before it hold every row they write.
func (p *planner) turnFrom() int {
	if !p.cfg.shared {
		return p.cfg.route.Participants()
	}
	if l := p.risky.last(p.cfg.route); l != nil {
		return l.participant
	}
	return 0
}

// afterWrites plans the decision: the frontier is raised to what the
// records saw, and Sealed to the sealed bound when every server's sealing
// finished.
func (p *planner) afterWrites(sealed []sealResult) {
	if p.cfg.trial {
		p.next = step{kind: stepTrialDone}
		return
	}
	works := p.next.works
	p.allSealed = !p.et.sealTo.IsZero()
	for i := range works {
		if i < len(sealed) {
			p.tally.sealed += len(sealed[i].rows)
		}
		if works[i].seal && (i >= len(sealed) || !sealed[i].done) {
			p.allSealed = false
		}
	}
	d := decision{cuts: p.snap.cuts, frontier: p.et.change(p.openFrom, p.allSealed)}
	if p.claimed != nil {
		d.keys = &p.claimed.Write
	}
	p.next = step{kind: stepDecide, decision: d}
}

// generation is the generation the keys are claimed in (written).
func (p *planner) generation() driver.Generation {
	if p.claimed == nil {
		return 0
	}
	return p.claimed.Write
}

// remember is what the dedup cache learns once the checkpoint committed:
// the keys it kept (not those of events that overflowed).
func (p *planner) remember() []dedup.Insert {
	var out []dedup.Insert
	for _, in := range p.o.inserts {
		if !p.o.overflowed[in.ID] {
			out = append(out, in)
		}
	}
	return rememberVersions(out, p.o.items)
}

// eventTimeDue reports whether, once the checkpoint committed, the next
// one is due even without records: windows it closed are to be sealed, or
// its sealing did not finish.
func (p *planner) eventTimeDue() bool {
	return p.et.enabled && (p.et.raise.After(p.et.read.Closed) || !p.et.sealTo.IsZero() && !p.allSealed)
}
