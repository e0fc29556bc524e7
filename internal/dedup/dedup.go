package dedup

import (
	"time"
)

// Fingerprint identifies an event's billable content.
type Fingerprint = [16]byte

// Key is one arriving event as the dedup operator sees it.
type Key struct {
	ID          string
	Fingerprint Fingerprint
}

// Seen is the remembered first arrival of an event id.
type Seen struct {
	Fingerprint Fingerprint
	ExpiresAt   time.Time
	// Versioned (in the cache only): the key holds a version other than
	// an original, so a hit proves no repeat, only that the key is
	// stored: its arrivals are claimed and read as a version's.
	Versioned bool
}

// Verdict classifies one arrival.
type Verdict uint8

const (
	New       Verdict = iota // first arrival within the TTL: count it
	Duplicate                // same id, same content, within the TTL: drop it
	Conflict                 // same id, different content, within the TTL: dead-letter it
)

func (v Verdict) String() string {
	switch v {
	case New:
		return "new"
	case Duplicate:
		return "duplicate"
	case Conflict:
		return "conflicting_duplicate"
	case Amend:
		return "amended"
	case Stale:
		return "stale_revision"
	case PastHorizon:
		return "version_past_horizon"
	}
	return "unknown"
}

// Insert is a key to write to the current generation's table. Replace is
// set when an expired row for the id is stored there and must be deleted
// first.
type Insert struct {
	ID          string
	Fingerprint Fingerprint
	ExpiresAt   time.Time
	Replace     bool
	Version     string // the event's version, encoded (EncodeVersion)
	Versioned   bool   // for the cache: Seen.Versioned
}

// Classify decides every arrival of one checkpoint, in arrival order.
// known holds what was already seen before this checkpoint in the current
// generation: cache hits and the rows looked up in its table (expired
// rows included: they are replaced). earlier holds the rows the claim's
// locking reads found in earlier generations' tables. Within the
// checkpoint the first arrival of an id wins; later arrivals compare with
// it. Of two live rows of one id, the one that expires first is the first
// arrival.
//
// It returns a verdict per key, the keys to insert (one per New id), and
// the ids the claim inserted into the current generation that are repeats
// of a live key of an earlier one: those are taken back (unclaimed), so
// that a repeat never extends a key's life.
func Classify(now time.Time, ttl time.Duration, keys []Key, known, earlier map[string]Seen) ([]Verdict, []Insert, []string) {
	verdicts := make([]Verdict, len(keys))
	inserts := make([]Insert, 0, len(keys))
	var takeBack []string
	batch := make(map[string]Fingerprint, len(keys))
	decided := make(map[string]bool)
	for i, k := range keys {
		if fp, ok := batch[k.ID]; ok {
			verdicts[i] = verdict(fp, k.Fingerprint)
			continue
		}
		s, stored := known[k.ID]
		e, before := earlier[k.ID]
		live, liveBefore := stored && now.Before(s.ExpiresAt), before && now.Before(e.ExpiresAt)
		switch {
		case live && (!liveBefore || !e.ExpiresAt.Before(s.ExpiresAt)):
			verdicts[i] = verdict(s.Fingerprint, k.Fingerprint)
		case liveBefore:
			verdicts[i] = verdict(e.Fingerprint, k.Fingerprint)
			if !stored && !decided[k.ID] {
				// Neither cached nor stored in the current table before:
				// this checkpoint's claim inserted it there.
				takeBack = append(takeBack, k.ID)
			}
			decided[k.ID] = true
		default:
			verdicts[i] = New
			batch[k.ID] = k.Fingerprint
			inserts = append(inserts, Insert{ID: k.ID, Fingerprint: k.Fingerprint, ExpiresAt: now.Add(ttl), Replace: stored})
		}
	}
	return verdicts, inserts, takeBack
}

func verdict(first, again Fingerprint) Verdict {
	if first == again {
		return Duplicate
	}
	return Conflict
}
