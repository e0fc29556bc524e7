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
	}
	return "unknown"
}

// Insert is a key to write to dedup_keys. Replace is set when an expired
// row for the id still exists and must be deleted first.
type Insert struct {
	ID          string
	Fingerprint Fingerprint
	ExpiresAt   time.Time
	Replace     bool
}

// Classify decides every arrival of one checkpoint, in arrival order.
// known holds what was already seen before this checkpoint: cache hits and
// the rows looked up in MySQL (expired rows included: they are replaced).
// Within the checkpoint the first arrival of an id wins; later arrivals
// compare with it.
//
// It returns a verdict per key and the keys to insert, one per New id.
func Classify(now time.Time, ttl time.Duration, keys []Key, known map[string]Seen) ([]Verdict, []Insert) {
	verdicts := make([]Verdict, len(keys))
	inserts := make([]Insert, 0, len(keys))
	batch := make(map[string]Fingerprint, len(keys))
	for i, k := range keys {
		if fp, ok := batch[k.ID]; ok {
			verdicts[i] = verdict(fp, k.Fingerprint)
			continue
		}
		s, ok := known[k.ID]
		if ok && now.Before(s.ExpiresAt) {
			verdicts[i] = verdict(s.Fingerprint, k.Fingerprint)
			continue
		}
		verdicts[i] = New
		batch[k.ID] = k.Fingerprint
		inserts = append(inserts, Insert{ID: k.ID, Fingerprint: k.Fingerprint, ExpiresAt: now.Add(ttl), Replace: ok})
	}
	return verdicts, inserts
}

func verdict(first, again Fingerprint) Verdict {
	if first == again {
		return Duplicate
	}
	return Conflict
}
