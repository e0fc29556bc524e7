package pipeline

import (
	"fmt"
	"time"

	"github.com/billing/ledger/internal/deadletters"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The pieces of the checkpoint's plan: what to claim, what each record
// becomes, and what each participant writes, computed without I/O from
// what the checkpoint knows at each step. The planner (planner.go) puts
// them in order; the executor (executor.go) runs the steps.

// router places keys on participants (txsink.Sink.Route).
type router interface {
	Route(key string) int
	Participants() int
}

// claimPlan is the dedup step's plan: every record's dedup key, what the
// cache proves already (and, once claimed, what the lookups found in the
// current generation), what the claims' locking reads found in earlier
// generations, and the ids to claim on each participant (each id once,
// the first arrival's fingerprint).
type claimPlan struct {
	keys    []dedup.Key
	known   map[string]dedup.Seen
	earlier map[string]dedup.Seen
	claims  [][]dedup.Insert // per participant
	// versioned: a record or a stored key is a version other than an
	// original (versions.go); then the stored rows' versions, by id, of
	// the current generation (knownV) and the earlier ones (earlierV).
	versioned        bool
	knownV, earlierV map[string]string
	// versions: the ids of the records that are versions (nil: none).
	versions map[string]struct{}
}

// lookupFirst splits a contested claim statement's ids into those to
// look up first and the rest: its versions first, when they may be all
// the keys it met stored; else all of them.
func (cp *claimPlan) lookupFirst(c driver.Contested) (first, rest []string) {
	if cp.versions == nil {
		return c.IDs, nil
	}
	for _, id := range c.IDs {
		if _, ok := cp.versions[id]; ok {
			first = append(first, id)
		} else {
			rest = append(rest, id)
		}
	}
	if len(first) < c.Stored || len(rest) == 0 {
		return c.IDs, nil
	}
	return first, rest
}

func planClaims(records []record, cache cacheView, now time.Time, ttl time.Duration, r router) claimPlan {
	cp := claimPlan{keys: make([]dedup.Key, len(records)), known: map[string]dedup.Seen{}, earlier: map[string]dedup.Seen{},
		claims: make([][]dedup.Insert, r.Participants())}
	queued := make(map[string]struct{}, len(records))
	expires := now.Add(ttl)
	uncached := versionedIDs(records)
	cp.versioned, cp.versions = uncached != nil, uncached
	// The claims' versions share one allocation: their bytes, then the
	// string of them all, cut at ends.
	arena := make([]byte, 0, 32*len(records)) // a typical version's bytes
	ends := make([]int, 0, len(records))
	slots := make([][2]int, 0, len(records))
	for i := range records {
		ev := &records[i].ev
		cp.keys[i] = dedup.Key{ID: ev.EventID, Fingerprint: ev.Fingerprint()}
		if _, skip := uncached[ev.EventID]; !skip {
			if seen, ok := cache.Get(ev.EventID, now); ok && !seen.Versioned {
				cp.known[ev.EventID] = seen
				continue
			} else if ok {
				// Stored with a version: claimed, and looked up first.
				if cp.versions == nil {
					cp.versions = map[string]struct{}{}
				}
				cp.versions[ev.EventID] = struct{}{}
			}
		}
		if _, ok := queued[ev.EventID]; !ok {
			queued[ev.EventID] = struct{}{}
			at := r.Route(ev.EventID)
			slots = append(slots, [2]int{at, len(cp.claims[at])})
			cp.claims[at] = append(cp.claims[at], dedup.Insert{ID: ev.EventID, Fingerprint: cp.keys[i].Fingerprint, ExpiresAt: expires})
			arena = dedup.AppendVersion(arena, dedup.VersionOf(ev))
			ends = append(ends, len(arena))
		}
	}
	setVersions(cp.claims, string(arena), slots, ends)
	return cp
}

// setVersions gives the queued claims their versions: all of them in one
// string, the i-th queued (at slots[i]: participant, index) ending at
// ends[i].
func setVersions(claims [][]dedup.Insert, all string, slots [][2]int, ends []int) {
	from := 0
	for i, at := range slots {
		claims[at[0]][at[1]].Version = all[from:ends[i]]
		from = ends[i]
	}
}

// outcomes is what the records of a checkpoint became once classified and
// aggregated: counted (in agg), dropped as repeats, or dead letters.
type outcomes struct {
	verdicts   []dedup.Verdict
	inserts    []dedup.Insert       // the keys this checkpoint keeps or replaces
	takeBack   []string             // claimed keys that repeat a live key of an earlier generation
	fresh      []*record            // the new events, in arrival order
	dead       []deadletters.Letter // the snapshot's and this checkpoint's
	duplicates int
	counted    int
	late       int             // of counted: in window_adjustments
	overflowed map[string]bool // ids refused as amount_overflow
	entries    []entryOf       // the counted events and versions' changes, when ledger entries are kept
	// items are the changes of events by versions (versions.go), counted
	// after fresh; stale the arrivals dropped for a lower revision.
	items []versionItem
	stale int
}

// classify decides every record against what is known (dedup.Classify) and
// turns conflicting repeats into dead letters.
func classify(records []record, dead []deadletters.Letter, cp claimPlan, now time.Time, ttl time.Duration, prefix int) outcomes {
	verdicts, inserts, takeBack := dedup.Classify(now, ttl, cp.keys, cp.known, cp.earlier)
	o := outcomes{verdicts: verdicts, inserts: inserts, takeBack: takeBack, dead: append([]deadletters.Letter(nil), dead...), overflowed: map[string]bool{}}
	j := 0 // inserts are the New verdicts', in order
	for i, v := range verdicts {
		if v == dedup.New {
			if in := &inserts[j]; in.Replace {
				// Claimed keys carry their version already.
				in.Version = dedup.EncodeVersion(dedup.VersionOf(&records[i].ev))
			}
			j++
		}
	}
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

// count adds the new events to agg (seeded with the stored values of its
// risky keys), in arrival order, each to its window or, late, to its
// adjustment; an event that would overflow a sum becomes an
// amount_overflow dead letter. With entries, every counted event is kept
// for its ledger_entries row.
func (o *outcomes) count(agg *aggregate, prefix int, entries bool) {
	for _, r := range o.fresh {
		if agg.add(&r.ev, r.late) {
			o.counted++
			if r.late {
				o.late++
			}
			if entries {
				o.entries = append(o.entries, entryOf{r, driver.EntryEvent})
			}
			continue
		}
		o.overflowed[r.ev.EventID] = true
		o.dead = append(o.dead, deadletters.New(r.partition, r.offset, r.key, r.value, prefix, string(event.ReasonAmountOverflow),
			fmt.Sprintf("adding amount_minor %d to account %q %s would overflow a signed 64-bit sum", r.ev.AmountMinor, r.ev.AccountID, r.ev.Currency), r.ev.EventID))
	}
	o.countVersions(agg, prefix, entries)
}

// work is what one participant writes in a checkpoint, as the store's
// rows.
type work struct {
	replace  []driver.DedupKey // keys whose expired rows are replaced
	update   []driver.DedupKey // keys whose rows take a new version (versions.go)
	unclaim  []string          // claimed keys it does not keep (dead letters, repeats of an earlier generation)
	balances []driver.Balance
	windows  []driver.WindowSum
	adjusts  []driver.WindowSum // window_adjustments
	entries  []driver.Entry     // ledger_entries
	dead     []deadletters.Letter
	seal     bool // seal the closed windows' rows of this participant's server
}

func (w *work) empty() bool {
	return len(w.replace)+len(w.update)+len(w.unclaim)+len(w.balances)+len(w.windows)+len(w.adjusts)+len(w.entries)+len(w.dead) == 0 && !w.seal
}

// planWrites routes everything the checkpoint writes to its participant:
// dedup keys by event id (claimed keys are written already; expired rows are
// replaced here, and the claimed keys of events that became dead letters or
// that repeat a live key of an earlier generation are taken back),
// aggregates and ledger entries by account (one branch holds an account's
// sums and entries), dead letters by partition.
func planWrites(o *outcomes, agg *aggregate, period event.Windows, r router) []work {
	works := make([]work, r.Participants())
	for _, in := range o.inserts {
		at := r.Route(in.ID)
		switch {
		case o.overflowed[in.ID]:
			if !in.Replace {
				works[at].unclaim = append(works[at].unclaim, in.ID)
			}
		case in.Replace:
			works[at].replace = append(works[at].replace, toDedupKeys([]dedup.Insert{in})...)
		}
	}
	for _, id := range o.takeBack {
		at := r.Route(id)
		works[at].unclaim = append(works[at].unclaim, id)
	}
	planVersionKeys(o.items, works, r)
	for _, row := range toBalances(agg.balanceRows()) {
		at := r.Route(row.Account)
		works[at].balances = append(works[at].balances, row)
	}
	for _, row := range toWindows(agg.windowRows()) {
		at := r.Route(row.Account)
		works[at].windows = append(works[at].windows, row)
	}
	for _, row := range toWindows(agg.adjustRows()) {
		at := r.Route(row.Account)
		works[at].adjusts = append(works[at].adjusts, row)
	}
	for _, e := range toEntries(period, o.entries) {
		at := r.Route(e.Account)
		works[at].entries = append(works[at].entries, e)
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

// earliestOpen is the start of the earliest window the works write to as
// open (billing_windows; zero: none): the decision checks that none of
// them was closed since the checkpoint read the frontier. Rows are in key
// order (account first), not in window order.
func earliestOpen(works []work) time.Time {
	var first time.Time
	for i := range works {
		for _, w := range works[i].windows {
			if first.IsZero() || w.Start.Before(first) {
				first = w.Start
			}
		}
	}
	return first
}
