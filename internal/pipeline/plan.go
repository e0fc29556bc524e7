package pipeline

import (
	"fmt"
	"time"

	"github.com/billing/ledger/internal/deadletters"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/event"
)

// The checkpoint's plan: what to claim, what each record becomes, and what
// each participant writes, computed without I/O from what the checkpoint
// knows at each step. The Checkpointer executes it (checkpointer.go).

// router places keys on participants (txsink.Sink.Route).
type router interface {
	Route(key string) int
	Participants() int
}

// claimPlan is the dedup step's plan: every record's dedup key, what the
// cache proves already, and the ids to claim on each participant (each id
// once, the first arrival's fingerprint).
type claimPlan struct {
	keys   []dedup.Key
	known  map[string]dedup.Seen
	claims [][]dedup.Insert // per participant
}

func planClaims(records []record, cache *dedup.Cache, now time.Time, ttl time.Duration, r router) claimPlan {
	cp := claimPlan{keys: make([]dedup.Key, len(records)), known: map[string]dedup.Seen{}, claims: make([][]dedup.Insert, r.Participants())}
	queued := make(map[string]struct{}, len(records))
	expires := now.Add(ttl)
	for i := range records {
		ev := &records[i].ev
		cp.keys[i] = dedup.Key{ID: ev.EventID, Fingerprint: ev.Fingerprint()}
		if seen, ok := cache.Get(ev.EventID, now); ok {
			cp.known[ev.EventID] = seen
			continue
		}
		if _, ok := queued[ev.EventID]; !ok {
			queued[ev.EventID] = struct{}{}
			at := r.Route(ev.EventID)
			cp.claims[at] = append(cp.claims[at], dedup.Insert{ID: ev.EventID, Fingerprint: cp.keys[i].Fingerprint, ExpiresAt: expires})
		}
	}
	return cp
}

// outcomes is what the records of a checkpoint became once classified and
// aggregated: counted (in agg), dropped as repeats, or dead letters.
type outcomes struct {
	verdicts   []dedup.Verdict
	inserts    []dedup.Insert       // the keys this checkpoint keeps or replaces
	fresh      []*record            // the new events, in arrival order
	dead       []deadletters.Letter // the snapshot's and this checkpoint's
	duplicates int
	counted    int
	overflowed map[string]bool // ids refused as amount_overflow
}

// classify decides every record against what is known (dedup.Classify) and
// turns conflicting repeats into dead letters.
func classify(records []record, dead []deadletters.Letter, cp claimPlan, now time.Time, ttl time.Duration, prefix int) outcomes {
	verdicts, inserts := dedup.Classify(now, ttl, cp.keys, cp.known)
	o := outcomes{verdicts: verdicts, inserts: inserts, dead: append([]deadletters.Letter(nil), dead...), overflowed: map[string]bool{}}
	for i, v := range verdicts {
		r := &records[i]
		switch v {
		case dedup.Duplicate:
			o.duplicates++
		case dedup.Conflict:
			o.dead = append(o.dead, deadletters.New(r.partition, r.offset, r.key, r.value, prefix, string(event.ReasonConflictingDuplicate),
				fmt.Sprintf("event_id %q was first seen with different content (account, amount, currency or occurred_at)", r.ev.EventID), r.ev.EventID))
		case dedup.New:
			o.fresh = append(o.fresh, r)
		}
	}
	return o
}

// events are the new events, for the aggregate.
func (o *outcomes) events() []*event.Event {
	evs := make([]*event.Event, len(o.fresh))
	for i, r := range o.fresh {
		evs[i] = &r.ev
	}
	return evs
}

// count adds the new events to agg (seeded with the stored values of its
// risky keys), in arrival order; an event that would overflow a sum becomes
// an amount_overflow dead letter.
func (o *outcomes) count(agg *aggregate, prefix int) {
	for _, r := range o.fresh {
		if agg.add(&r.ev) {
			o.counted++
			continue
		}
		o.overflowed[r.ev.EventID] = true
		o.dead = append(o.dead, deadletters.New(r.partition, r.offset, r.key, r.value, prefix, string(event.ReasonAmountOverflow),
			fmt.Sprintf("adding amount_minor %d to account %q %s would overflow a signed 64-bit sum", r.ev.AmountMinor, r.ev.AccountID, r.ev.Currency), r.ev.EventID))
	}
}

// work is what one participant writes in a checkpoint.
type work struct {
	inserts  []dedup.Insert // expired rows to replace
	unclaim  []string       // claimed keys of events that became dead letters
	journal  []string       // every key this checkpoint keeps, for the janitor
	balances []balanceRow
	windows  []windowRow
	dead     []deadletters.Letter
}

func (w *work) empty() bool {
	return len(w.journal)+len(w.unclaim)+len(w.balances)+len(w.windows)+len(w.dead) == 0
}

// planWrites routes everything the checkpoint writes to its participant:
// dedup keys by event id (claimed keys are written already; expired rows are
// replaced here, and the claimed keys of events that became dead letters are
// taken back), aggregates by account, dead letters by partition.
func planWrites(o *outcomes, agg *aggregate, r router) []work {
	works := make([]work, r.Participants())
	for _, in := range o.inserts {
		at := r.Route(in.ID)
		switch {
		case o.overflowed[in.ID]:
			if !in.Replace {
				works[at].unclaim = append(works[at].unclaim, in.ID)
			}
		case in.Replace:
			works[at].inserts = append(works[at].inserts, in)
			works[at].journal = append(works[at].journal, in.ID)
		default:
			works[at].journal = append(works[at].journal, in.ID)
		}
	}
	for _, row := range agg.balanceRows() {
		at := r.Route(row.account)
		works[at].balances = append(works[at].balances, row)
	}
	for _, row := range agg.windowRows() {
		at := r.Route(row.account)
		works[at].windows = append(works[at].windows, row)
	}
	for _, d := range o.dead {
		at := int(d.Partition) % len(works)
		works[at].dead = append(works[at].dead, d)
	}
	return works
}

func nonEmpty[T any](by [][]T) []int {
	var out []int
	for i, v := range by {
		if len(v) > 0 {
			out = append(out, i)
		}
	}
	return out
}
