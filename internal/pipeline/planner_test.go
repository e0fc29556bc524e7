package pipeline

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
)

// shards places keys on servers × branches participants, as the sink does
// (participant p is on server p / branches).
type shards struct{ servers, branches int }

func (s shards) Participants() int            { return s.servers * s.branches }
func (s shards) Route(key string) int         { return hashRouter(s.Participants()).Route(key) }
func (s shards) ServerOf(participant int) int { return participant / s.branches }

func planCfg(s shards, closeAfter time.Duration) planConfig {
	return planConfig{window: hourly, closeAfter: closeAfter, skew: time.Hour, ttl: time.Hour, prefix: 64, entries: true, route: s, servers: s.servers}
}

// kinds runs a plan to its end with results, recording every step it asks
// for; results answers each step.
func kinds(t *testing.T, p *planner, results func(step) result) ([]stepKind, []step) {
	t.Helper()
	var ks []stepKind
	var steps []step
	for range 12 {
		st := p.ready()
		ks, steps = append(ks, st.kind), append(steps, st)
		switch st.kind {
		case stepDecide, stepSkip, stepTrialDone:
			return ks, steps
		}
		p.advance(results(st))
	}
	t.Fatalf("the plan did not end: %v", ks)
	return nil, nil
}

// noResults answers every step with nothing found, the generations' read
// with a state whose registered lifetime covers every key (no register).
func noResults(st step) result {
	if st.kind == stepGenerations {
		return registered
	}
	return result{}
}

var registered = result{generations: driver.KeyGenerations{Lifetime: 365 * 24 * time.Hour}}

// The plan asks for each step that needs I/O only when it has something
// to do: a snapshot whose ids the cache knows has no claims, one with no
// stored key no lookups, one with no risky sum no seeding; without closing
// windows there is no event-time read; a snapshot with nothing at all and
// no window to close or seal is skipped. Classification and aggregation
// (no I/O) are steps of their own, so that the executor times them.
func TestPlannerAsksOnlyForStepsWithWork(t *testing.T) {
	now := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
	s := shards{2, 2}
	cache := dedup.NewCache(10)
	cached := rec("cached", "acct-1", 5, 0, 0)
	cache.Add("cached", dedup.Seen{Fingerprint: cached.ev.Fingerprint(), ExpiresAt: now.Add(time.Hour)}, now)
	cuts := []txsink.PartitionCut{{Partition: 0, Epoch: 1, NextOffset: 2}}
	for _, c := range []struct {
		name       string
		closeAfter time.Duration
		snap       *snapshot
		want       []stepKind
	}{
		{"new events", 0, &snapshot{cuts: cuts, records: []record{rec("a", "acct-1", 5, 0, 0), rec("b", "acct-2", 7, 0, 1)}},
			[]stepKind{stepGenerations, stepClaim, stepClassify, stepAggregate, stepWrite, stepDecide}},
		{"a cached repeat only", 0, &snapshot{cuts: cuts, records: []record{cached}}, []stepKind{stepClassify, stepAggregate, stepWrite, stepDecide}},
		{"closing windows", time.Hour, &snapshot{cuts: cuts, records: []record{rec("a", "acct-1", 5, 0, 0)}},
			[]stepKind{stepEventTime, stepGenerations, stepClaim, stepClassify, stepAggregate, stepWrite, stepDecide}},
		{"a risky sum", 0, &snapshot{cuts: cuts, records: []record{rec("a", "acct-1", 5, 0, 0), rec("b", "acct-1", -9, 0, 1)}},
			[]stepKind{stepGenerations, stepClaim, stepClassify, stepSeed, stepAggregate, stepWrite, stepDecide}},
		{"nothing at all", time.Hour, &snapshot{}, []stepKind{stepEventTime, stepSkip}},
	} {
		p := newPlanner(planCfg(s, c.closeAfter), c.snap, now, cache)
		got, _ := kinds(t, p, noResults)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: steps %v, want %v", c.name, got, c.want)
		}
	}
	trial := planCfg(s, 0)
	trial.trial = true
	p := newPlanner(trial, &snapshot{cuts: cuts, records: []record{rec("a", "acct-1", 5, 0, 0)}}, now, cache)
	if got, _ := kinds(t, p, noResults); !slices.Equal(got, []stepKind{stepGenerations, stepClaim, stepClassify, stepAggregate, stepWrite, stepTrialDone}) {
		t.Errorf("a trial: steps %v, want it to stop after the writes", got)
	}
}

// The plan feeds on what the steps found: only the contested ids are
// looked up, on the server of the participant whose claim met them; a
// looked-up key makes its record a repeat; the risky keys are read on the
// participant that owns the account, in key order, and a stored sum makes
// its row absolute; the first participant of each server seals; the
// decision carries the snapshot's cuts and raises Sealed only when every
// server's sealing finished.
func TestPlannerFeedsOnResults(t *testing.T) {
	now := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
	s := shards{2, 2}
	// The stored id is one that lives on the second server.
	stored := "stored"
	for i := 0; s.ServerOf(s.Route(stored)) != 1; i++ {
		stored = fmt.Sprintf("stored-%d", i)
	}
	recs := []record{
		rec("new", "acct-1", 5, 0, 0),
		rec(stored, "acct-2", 7, 0, 1),
		rec("up", "acct-3", math.MaxInt64, 0, 2),
		rec("down", "acct-3", -1, 0, 3),
	}
	for i := range recs {
		recs[i].ev.OccurredAt = time.Date(2026, 11, 29, 10, 5, 0, 0, time.UTC)
	}
	cuts := []txsink.PartitionCut{{Partition: 0, Epoch: 3, NextOffset: 4, Watermark: recs[0].ev.OccurredAt}}
	p := newPlanner(planCfg(s, 30*time.Minute), &snapshot{cuts: cuts, records: recs}, now, dedup.NewCache(10))
	closed := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	storedAt := s.Route(stored)
	var seen []step
	_, steps := kinds(t, p, func(st step) result {
		seen = append(seen, st)
		switch st.kind {
		case stepGenerations:
			return registered
		case stepEventTime:
			return result{eventTime: txsink.EventTime{Frontier: driver.Frontier{Closed: closed, Sealed: closed.Add(-2 * time.Hour)}}}
		case stepClaim:
			contested := make([][]driver.Contested, s.Participants())
			for i, ks := range st.claims {
				for _, k := range ks {
					if k.ID == stored && i != storedAt {
						t.Errorf("id %s claimed on participant %d, routed to %d", stored, i, storedAt)
					}
				}
			}
			contested[storedAt] = []driver.Contested{{IDs: []string{stored}, Stored: 1}}
			return result{contested: contested}
		case stepLookup:
			if len(st.lookups) != 1 || st.lookups[0].server != s.ServerOf(storedAt) || !slices.Equal(st.lookups[0].ids, []string{stored}) {
				t.Errorf("lookups %+v, want the contested id on server %d", st.lookups, s.ServerOf(storedAt))
			}
			fp := recs[1].ev.Fingerprint()
			return result{found: []driver.DedupKey{{ID: stored, Fingerprint: fp, ExpiresAt: now.Add(time.Hour)}}}
		case stepSeed:
			return seedResult(t, s, st)
		case stepWrite:
			sealed := make([]sealResult, s.Participants())
			sealed[0] = sealResult{rows: make([]driver.WindowRow, 3), done: true}
			sealed[2] = sealResult{rows: make([]driver.WindowRow, 1), done: false}
			return result{sealed: sealed}
		}
		return result{}
	})
	checkWrites(t, s, seen[len(seen)-1], closed)
	d := steps[len(steps)-1]
	if d.kind != stepDecide || !slices.Equal(d.decision.cuts, cuts) {
		t.Fatalf("decision %+v, want the snapshot's cuts", d)
	}
	if f := d.decision.frontier; f == nil || !f.Raise.Sealed.IsZero() || !f.OpenFrom.Equal(time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("frontier change %+v: want Sealed left (server 1 did not finish), the 10:00 window written as open", f)
	}
	if p.tally.duplicates != 1 || p.tally.sealed != 4 || !p.tally.careful || p.tally.deadLetters["amount_overflow"] != 1 {
		t.Errorf("tally %+v", p.tally)
	}
	if !p.eventTimeDue() {
		t.Error("a checkpoint whose sealing did not finish leaves the next one due")
	}
}

// seedResult checks a seed step and answers it: acct-3's balance and
// window are stored at 10.
func seedResult(t *testing.T, s shards, st step) result {
	t.Helper()
	at := s.Route("acct-3")
	out := make([]seededSums, s.Participants())
	for i, k := range st.seeds {
		if i != at && !k.empty() {
			t.Errorf("participant %d reads %+v: the risky keys are acct-3's, on participant %d", i, k, at)
		}
	}
	k := st.seeds[at]
	if len(k.balances) != 1 || k.balances[0].Account != "acct-3" || len(k.windows) != 1 {
		t.Fatalf("seeds %+v, want acct-3's balance and window", k)
	}
	out[at].balances = []driver.BalanceRow{{BalanceKey: k.balances[0], Amount: 10, Count: 1}}
	out[at].windows = []driver.WindowRow{{WindowKey: k.windows[0], Amount: 10, Count: 1}}
	return result{seeded: out}
}

// checkWrites checks the write step of TestPlannerFeedsOnResults.
func checkWrites(t *testing.T, s shards, st step, closed time.Time) {
	t.Helper()
	if st.kind != stepWrite {
		t.Fatalf("last step %v, want the writes", st.kind)
	}
	if st.seal.to != closed || st.seal.max != maxSealRows {
		t.Errorf("seal range %+v, want up to %s", st.seal, closed)
	}
	var balances []string
	for i, w := range st.works {
		if w.seal != (i%s.branches == 0) {
			t.Errorf("participant %d seals %v: the first of each server seals", i, w.seal)
		}
		for _, b := range w.balances {
			balances = append(balances, fmt.Sprintf("%s=%d/%d abs=%v", b.Account, b.Amount, b.Count, b.Absolute))
			if s.Route(b.Account) != i {
				t.Errorf("balance of %s written by participant %d", b.Account, i)
			}
		}
	}
	slices.Sort(balances)
	// acct-3 from its stored 10: MaxInt64 overflows, -1 counts.
	want := []string{"acct-1=5/1 abs=false", "acct-3=9/2 abs=true"}
	if !slices.Equal(balances, want) {
		t.Errorf("balances %v, want %v (stored acct-2 is a repeat)", balances, want)
	}
}
