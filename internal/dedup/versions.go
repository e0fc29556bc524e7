package dedup

import (
	"time"

	"github.com/billing/ledger/internal/event"
)

// Versions of an event (docs/corrections.md): records with one event id
// and a revision each. The ledger counts an event's highest revision
// seen; a cancelled version (a tombstone) counts nothing. A key's row
// keeps its current version (Version) so that a later one can retract
// it, and its expiry stays the first version's: a version never extends
// a key's life.

// Version is what the dedup state keeps of an event's current version:
// its revision and what retracting it needs.
type Version struct {
	Revision   int64
	Cancelled  bool
	Account    string
	Currency   string
	Amount     int64
	OccurredAt time.Time
}

// VersionOf is what the dedup state keeps of ev.
func VersionOf(ev *event.Event) Version {
	if ev.Cancelled {
		return Version{Revision: ev.Revision, Cancelled: true}
	}
	return Version{Revision: ev.Revision, Account: ev.AccountID, Currency: ev.Currency, Amount: ev.AmountMinor, OccurredAt: ev.OccurredAt}
}

// Arrival is one arriving record as a version of its event.
type Arrival struct {
	ID          string
	Fingerprint Fingerprint // of the version's content
	Version     Version
}

// Stored is a stored key with the version it holds.
type Stored struct {
	Fingerprint Fingerprint
	ExpiresAt   time.Time
	Version     Version
	// Unknown: the row keeps no version (a key stored before versions,
	// or one only the cache proves, whose arrivals are all revision 0):
	// an arrival of another revision cannot retract what it counted, and
	// is PastHorizon.
	Unknown bool
}

// Write is how a changed key reaches the current generation's table.
type Write uint8

const (
	// WriteNone: the claim inserted the key with this version already.
	WriteNone Write = iota
	// WriteReplace: an expired row of the id is stored there: delete it,
	// insert this one.
	WriteReplace
	// WriteUpdate: the row there (stored live, or inserted by this
	// checkpoint's claim) takes this version and expiry.
	WriteUpdate
)

// Change is what a checkpoint does to one event: retract Old (nil:
// nothing is counted, the event is new or its counted version was a
// tombstone) and count New (nothing when it is a tombstone). Several
// versions of one event in a checkpoint collapse to one change.
type Change struct {
	ID          string
	Fingerprint Fingerprint // New's
	ExpiresAt   time.Time   // the first version's
	Old         *Version
	New         Version
	Write       Write
	// Claimed: the row in the current generation's table is this
	// checkpoint's claim, to be taken back if the change is not kept.
	Claimed bool
	// Arrival is the index of the arrival that made New the event's
	// version.
	Arrival int
}

// Verdicts of versions, beside New, Duplicate and Conflict (a repeat of
// the stored revision).
const (
	Amend       Verdict = iota + Conflict + 1 // a higher revision than the current one: applied
	Stale                                     // a lower revision than the current one: dropped
	PastHorizon                               // a new revision later than the horizon after the first: dead-lettered
)

// ClassifyVersions decides every arrival of one checkpoint, in arrival
// order, as versions: known and earlier are what Classify reads (their
// rows with the versions they hold), horizon how long after an event's
// first version (its key's expiry minus ttl) another revision is still
// applied. Against the event's current version (stored, or made current
// by an earlier arrival of the checkpoint), an arrival of the same
// revision is a Duplicate or a Conflict as in Classify; past the
// horizon, one of another revision is PastHorizon; before it, a lower
// one is Stale and a higher one Amend. An arrival with no live key is
// New, whatever its revision (a tombstone then counts nothing, and keeps
// later lower revisions from counting).
//
// With every revision 0 and nothing cancelled, the verdicts and the ids
// taken back are Classify's, and every change is a New one.
func ClassifyVersions(now time.Time, ttl, horizon time.Duration, arrivals []Arrival, known, earlier map[string]Stored) ([]Verdict, []Change, []string) {
	verdicts := make([]Verdict, len(arrivals))
	// A checkpoint's arrivals are mostly new events, each a change: the
	// changes and the states are allocated once, at their bound.
	changes := make([]Change, 0, len(arrivals))
	var takeBack []string
	type state struct {
		cur     Stored
		change  int  // index in changes, -1: none yet
		earlier bool // the live row is an earlier generation's
		stored  bool // a row of the id is stored in the current table
	}
	states := make([]state, 0, len(arrivals))
	batch := make(map[string]int, len(arrivals)) // index in states
	expires := now.Add(ttl)
	var order []string
	for i, a := range arrivals {
		var st *state
		at, ok := batch[a.ID]
		if ok {
			st = &states[at]
		} else {
			s, stored := known[a.ID]
			e, before := earlier[a.ID]
			live, liveBefore := stored && now.Before(s.ExpiresAt), before && now.Before(e.ExpiresAt)
			switch {
			case live && (!liveBefore || !e.ExpiresAt.Before(s.ExpiresAt)):
				states = append(states, state{cur: s, change: -1, stored: true})
			case liveBefore:
				states = append(states, state{cur: e, change: -1, earlier: true, stored: stored})
			default:
				verdicts[i] = New
				w := WriteNone
				if stored {
					w = WriteReplace
				}
				changes = append(changes, Change{ID: a.ID, Fingerprint: a.Fingerprint, ExpiresAt: expires, New: a.Version, Write: w, Claimed: !stored, Arrival: i})
				states = append(states, state{cur: Stored{Fingerprint: a.Fingerprint, ExpiresAt: expires, Version: a.Version}, change: len(changes) - 1, stored: stored})
				batch[a.ID] = len(states) - 1
				continue
			}
			batch[a.ID] = len(states) - 1
			st = &states[len(states)-1]
			order = append(order, a.ID)
		}
		switch {
		case a.Version.Revision == st.cur.Version.Revision:
			verdicts[i] = verdict(st.cur.Fingerprint, a.Fingerprint)
		case st.cur.Unknown || !now.Before(st.cur.ExpiresAt.Add(horizon-ttl)):
			verdicts[i] = PastHorizon
		case a.Version.Revision < st.cur.Version.Revision:
			verdicts[i] = Stale
		default:
			verdicts[i] = Amend
			if st.change < 0 {
				c := Change{ID: a.ID, ExpiresAt: st.cur.ExpiresAt, Write: WriteUpdate, Claimed: !st.stored}
				if !st.cur.Version.Cancelled {
					old := st.cur.Version
					c.Old = &old
				}
				if st.earlier && st.stored {
					c.Write = WriteReplace
				}
				changes = append(changes, c)
				st.change = len(changes) - 1
			}
			c := &changes[st.change]
			c.Fingerprint, c.New, c.Arrival = a.Fingerprint, a.Version, i
			if c.Write == WriteNone {
				// A new event amended within the checkpoint: its
				// claimed row holds the first arrival.
				c.Write = WriteUpdate
			}
			st.cur.Fingerprint, st.cur.Version = a.Fingerprint, a.Version
		}
	}
	for _, id := range order {
		if st := &states[batch[id]]; st.earlier && !st.stored && st.change < 0 {
			// Neither cached nor stored in the current table before:
			// this checkpoint's claim inserted it there, and nothing
			// changed the event.
			takeBack = append(takeBack, id)
		}
	}
	return verdicts, changes, takeBack
}
