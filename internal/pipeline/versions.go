package pipeline

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/billing/ledger/internal/deadletters"
	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Versions of an event (docs/corrections.md): records with one event id
// and a revision each, of which the ledger counts the highest. A
// checkpoint whose records or stored keys hold no version but originals
// takes the path it always took (classify); one that does classifies as
// versions (dedup.ClassifyVersions) and applies each changed event as one
// item: the counted version's retraction (from its window, or the
// window's adjustments once that window is closed; from its balance) and
// the new version's addition, both or neither (overflow), in the same
// branches as every other sum, with the key's row taking the new version.

// versionItem is one event a checkpoint changes by its versions.
type versionItem struct {
	change  dedup.Change
	retract *record // the counted version, to take back (nil: nothing counted)
	add     *record // the new version's record (nil: a tombstone)
	rec     *record // the record that made the change: the dead letter if it overflows
	refused bool    // it would overflow: nothing applied, the key left as it was
}

// isVersion reports a record that is not an original: a revision, or a
// tombstone.
func isVersion(ev *event.Event) bool { return ev.Revision != 0 || ev.Cancelled }

// versionedIDs are the ids of the records that are versions, whose every
// arrival is claimed (a cache hit proves only an original's repeat); nil
// when there is none, as in a ledger without corrections.
func versionedIDs(records []record) map[string]struct{} {
	var ids map[string]struct{}
	for i := range records {
		if ev := &records[i].ev; isVersion(ev) {
			if ids == nil {
				ids = map[string]struct{}{}
			}
			ids[ev.EventID] = struct{}{}
		}
	}
	return ids
}

// storedVersion keeps the version of a stored key read by the claim or a
// lookup; one that is not an original's makes the checkpoint classify as
// versions.
func (cp *claimPlan) storedVersion(m *map[string]string, k driver.DedupKey) {
	if k.Version == "" {
		return
	}
	if *m == nil {
		*m = map[string]string{}
	}
	(*m)[k.ID] = k.Version
	if v, ok := dedup.DecodeVersion(k.Version); ok && (v.Revision != 0 || v.Cancelled) {
		cp.versioned = true
	}
}

// storedRows are the stored keys with their versions. A key without a
// version (stored before versions were kept, or proven by the cache,
// which only ever proves an original's repeat) is Unknown.
func storedRows(seen map[string]dedup.Seen, versions map[string]string) map[string]dedup.Stored {
	out := make(map[string]dedup.Stored, len(seen))
	for id, s := range seen {
		v, ok := dedup.DecodeVersion(versions[id])
		out[id] = dedup.Stored{Fingerprint: s.Fingerprint, ExpiresAt: s.ExpiresAt, Version: v, Unknown: !ok}
	}
	return out
}

// classifyVersions decides every record as a version of its event
// (dedup.ClassifyVersions) and turns each changed event into an item. A
// retraction counts in the adjustments of its window when that window
// is before closed (the frontier the checkpoint read: such a window's
// row may be sealed), else in its window.
func classifyVersions(records []record, dead []deadletters.Letter, cp claimPlan, now time.Time, ttl, horizon time.Duration, prefix int,
	w event.Windows, closed time.Time) outcomes {
	arrivals := make([]dedup.Arrival, len(records))
	for i := range records {
		arrivals[i] = dedup.Arrival{ID: records[i].ev.EventID, Fingerprint: cp.keys[i].Fingerprint, Version: dedup.VersionOf(&records[i].ev)}
	}
	verdicts, changes, takeBack := dedup.ClassifyVersions(now, ttl, horizon, arrivals, storedRows(cp.known, cp.knownV), storedRows(cp.earlier, cp.earlierV))
	o := outcomes{verdicts: verdicts, takeBack: takeBack, dead: append([]deadletters.Letter(nil), dead...), overflowed: map[string]bool{},
		items: make([]versionItem, 0, len(changes))}
	for i, v := range verdicts {
		r := &records[i]
		switch v {
		case dedup.Duplicate:
			o.duplicates++
		case dedup.Stale:
			o.duplicates++
			o.stale++
		case dedup.Conflict:
			o.dead = append(o.dead, deadletters.New(r.partition, r.offset, r.key, r.value, prefix, string(event.ReasonConflictingDuplicate),
				fmt.Sprintf("event_id %q revision %d was first seen with different content (account, amount, currency, occurred_at or cancelled)", r.ev.EventID, r.ev.Revision), r.ev.EventID))
		case dedup.PastHorizon:
			o.dead = append(o.dead, deadletters.New(r.partition, r.offset, r.key, r.value, prefix, string(event.ReasonVersionPastHorizon),
				fmt.Sprintf("event_id %q revision %d arrived past the version horizon (%s after the event's first version), or its key keeps no version to retract", r.ev.EventID, r.ev.Revision, horizon), r.ev.EventID))
		}
	}
	for _, c := range changes {
		r := &records[c.Arrival] // the record that set the change's version
		it := versionItem{change: c, rec: r}
		if c.Old != nil {
			it.retract = &record{ev: event.Event{EventID: c.ID, Revision: c.Old.Revision, AccountID: c.Old.Account, Currency: c.Old.Currency, AmountMinor: c.Old.Amount, OccurredAt: c.Old.OccurredAt},
				partition: r.partition, offset: r.offset, retract: true, late: !closed.IsZero() && w.Start(c.Old.OccurredAt).Before(closed)}
		}
		if !c.New.Cancelled {
			it.add = r
		}
		o.items = append(o.items, it)
	}
	return o
}

// applied is every record the aggregate takes, in the order it takes
// them: the new events, then each item's retraction and addition.
func (o *outcomes) applied() []*record {
	if len(o.items) == 0 {
		return o.fresh
	}
	out := slices.Clone(o.fresh)
	for _, it := range o.items {
		if it.retract != nil {
			out = append(out, it.retract)
		}
		if it.add != nil {
			out = append(out, it.add)
		}
	}
	return out
}

// countVersions applies the items after the new events: each its
// retraction and its addition, both or neither; an item that would
// overflow a sum is refused, an amount_overflow dead letter of the record
// that made it. When entries are kept, an item writes the entries that
// explain it, so that they still sum to the balances and windows: a new
// event's (nothing to retract) is the event's entry, an amendment's a
// retraction and an addition, a tombstone's a retraction. A retraction of
// the one amount whose negation has no 64-bit value (math.MinInt64) has
// no entry, and is refused as an overflow too.
func (o *outcomes) countVersions(agg *aggregate, prefix int, entries bool) {
	for i := range o.items {
		it := &o.items[i]
		if it.retract == nil && it.add == nil {
			continue // a tombstone of an event that counts nothing
		}
		if !(entries && it.retract != nil && it.retract.ev.AmountMinor == math.MinInt64) && agg.apply(it.retract, it.add) {
			if it.add != nil {
				o.counted++
				if it.add.late {
					o.late++
				}
			}
			if entries {
				switch {
				case it.retract == nil:
					o.entries = append(o.entries, entryOf{it.add, driver.EntryEvent})
				case it.add == nil:
					o.entries = append(o.entries, entryOf{it.retract, driver.EntryRetraction})
				default:
					o.entries = append(o.entries, entryOf{it.retract, driver.EntryRetraction}, entryOf{it.add, driver.EntryAddition})
				}
			}
			continue
		}
		it.refused = true
		r := it.rec
		o.dead = append(o.dead, deadletters.New(r.partition, r.offset, r.key, r.value, prefix, string(event.ReasonAmountOverflow),
			fmt.Sprintf("applying revision %d of event_id %q (retracting the counted version, adding amount_minor %d to account %q %s) would overflow a signed 64-bit sum",
				r.ev.Revision, r.ev.EventID, r.ev.AmountMinor, r.ev.AccountID, r.ev.Currency), r.ev.EventID))
	}
}

// planVersionKeys routes the items' key writes: a kept change's row takes
// its version (replacing an expired row, or updating the stored or claimed
// one); a refused one leaves the stored row as it was and takes back the
// row its claim inserted.
func planVersionKeys(items []versionItem, works []work, r router) {
	for _, it := range items {
		c := it.change
		at := r.Route(c.ID)
		if it.refused {
			if c.Claimed {
				works[at].unclaim = append(works[at].unclaim, c.ID)
			}
			continue
		}
		k := driver.DedupKey{ID: c.ID, Fingerprint: c.Fingerprint, ExpiresAt: c.ExpiresAt, Version: dedup.EncodeVersion(c.New)}
		switch c.Write {
		case dedup.WriteReplace:
			works[at].replace = append(works[at].replace, k)
		case dedup.WriteUpdate:
			works[at].update = append(works[at].update, k)
		}
	}
}

// rememberVersions adds to the keys the cache learns those of the kept
// items: an original, new, as any new key (a cache hit proves only an
// original's repeat); a version as Versioned, which proves no repeat but
// that the key is stored (and replaces what the cache held of the event),
// so that a later arrival of the event, an original that came late
// among them, is looked up first as a version's.
func rememberVersions(out []dedup.Insert, items []versionItem) []dedup.Insert {
	for _, it := range items {
		c := it.change
		switch {
		case it.refused:
		case c.Old == nil && c.Write != dedup.WriteUpdate && c.New.Revision == 0 && !c.New.Cancelled:
			out = append(out, dedup.Insert{ID: c.ID, Fingerprint: c.Fingerprint, ExpiresAt: c.ExpiresAt})
		default:
			out = append(out, dedup.Insert{ID: c.ID, Fingerprint: c.Fingerprint, ExpiresAt: c.ExpiresAt, Versioned: true})
		}
	}
	return out
}

// apply takes records (nil ones skipped) into the sums, each a
// retraction or an addition, all or none: it reports whether none would
// overflow.
func (a *aggregate) apply(rs ...*record) bool {
	type saved struct {
		t *total
		v total
	}
	var undo []saved
	for _, r := range rs {
		if r == nil {
			continue
		}
		bk, wk := a.keys(&r.ev)
		b := a.balances[bk]
		if b == nil {
			b = &total{}
			a.balances[bk] = b
		}
		m := a.sums(r.late)
		w := m[wk]
		if w == nil {
			w = &total{}
			m[wk] = w
		}
		undo = append(undo, saved{b, *b}, saved{w, *w})
		if !b.take(r) || !w.take(r) {
			for i := len(undo) - 1; i >= 0; i-- {
				*undo[i].t = undo[i].v
			}
			return false
		}
	}
	return true
}

// take adds r to t, or takes it back when it is a retraction, unless that
// overflows.
func (t *total) take(r *record) bool {
	amount, ok1 := addInt64(t.amount, r.ev.AmountMinor)
	count, ok2 := addInt64(t.count, 1)
	if r.retract {
		amount, ok1 = subInt64(t.amount, r.ev.AmountMinor)
		count, ok2 = addInt64(t.count, -1)
	}
	if !ok1 || !ok2 {
		return false
	}
	t.amount, t.count, t.touched = amount, count, true
	return true
}

// stepOf follows r on the walk: a retraction takes its amount back.
func (w *walk) stepOf(r *record) {
	switch {
	case !r.retract:
		w.step(r.ev.AmountMinor)
	case r.ev.AmountMinor == math.MinInt64:
		w.broken = true // its negation does not fit: seed the key
	default:
		w.step(-r.ev.AmountMinor)
	}
}

// subInt64 returns a-b and whether it did not overflow.
func subInt64(a, b int64) (int64, bool) {
	s := a - b
	return s, (a >= 0) == (b >= 0) || (s >= 0) == (a >= 0)
}
