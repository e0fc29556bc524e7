package pipeline

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/billing/ledger/internal/deadletters"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Isolation of the records the database refuses.
//
// A record can be valid by the contract and still be refused by a server:
// a CHECK constraint or trigger an operator added, a value a server with
// other settings cannot store. Replaying such a checkpoint fails forever
// and stalls every partition it covers. So when a checkpoint fails twice
// for a reason the server attributes to the data (driver.Data), the
// checkpointer looks for the records responsible with trials: the same
// writes for a part of the snapshot, in branches that are rolled back,
// never prepared. In arrival order, like overflow: it finds, by bisection,
// the shortest prefix of the snapshot's elements (its valid records, then
// its dead letters) whose writes fail; the prefix's last element is
// responsible and becomes a rejected_by_database dead letter carrying the
// server's message; then the rest is tried again. A record refused alone
// is found so, and so is one refused only together with earlier ones (a
// constraint on a sum): the one that tips it over, as with overflow.
//
// Isolation takes at most CheckpointTimeout and a bounded number of
// trials; what it found by then is kept, and whatever is left is found by
// the isolation of the replay. A trial that fails for any other reason (a
// lock wait, a lost connection) stops it: the checkpoint then fails as
// usual.

// maxCulprits bounds the records one isolation dead-letters.
const maxCulprits = 1000

// element is a snapshot's valid record (index into records) or dead letter
// (len(records) + index into dead).
type element = int

// isolate finds the elements of s responsible for cause and returns a
// snapshot in which they are rejected_by_database dead letters, and their
// number (0: nothing found, s unchanged).
func (c *Checkpointer) isolate(ctx context.Context, s *snapshot, careful bool, cause error) (*snapshot, int) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CheckpointTimeout)
	defer cancel()
	started := time.Now()
	all := make([]element, len(s.records)+len(s.dead))
	for i := range all {
		all[i] = i
	}
	rejected := map[element]string{}
	trials := 0
	// refused reports whether the writes of elems fail for the data, and
	// the server's message; err for any other failure.
	refused := func(elems []element) (bool, string, error) {
		trials++
		info := c.attempt(ctx, s.subset(elems), careful, true)
		if info.Err == nil {
			return false, "", nil
		}
		if code := c.sink.Code(info.Err); code == driver.Data || code == driver.Overflow {
			return true, info.Err.Error(), nil
		}
		return false, "", info.Err
	}
	rest := all
	for len(rejected) < maxCulprits {
		// Invariant: the empty prefix passes, rest as a whole fails (known
		// for the first round from the attempts that led here).
		if len(rejected) > 0 {
			bad, _, err := refused(rest)
			if err != nil {
				c.log.Warn("isolation of refused records interrupted", "err", err, "found", len(rejected))
				break
			}
			if !bad {
				break
			}
		}
		lo, hi := 0, len(rest) // rest[:lo] passes, rest[:hi] fails
		var msg string
		var interrupted error
		for hi-lo > 1 {
			mid := (lo + hi) / 2
			bad, m, err := refused(rest[:mid])
			if err != nil {
				interrupted = err
				break
			}
			if bad {
				hi, msg = mid, m
			} else {
				lo = mid
			}
		}
		if interrupted != nil {
			c.log.Warn("isolation of refused records interrupted", "err", interrupted, "found", len(rejected))
			break
		}
		if msg == "" {
			// The prefix of length hi was not tried alone: it is rest
			// itself; the cause is the last failure's.
			msg = cause.Error()
		}
		culprit := rest[hi-1]
		rejected[culprit] = msg
		rest = slices.Delete(slices.Clone(rest), hi-1, hi)
		if len(rest) == 0 {
			break
		}
	}
	if len(rejected) == 0 {
		c.log.Error("a checkpoint keeps failing for its data and no record could be isolated; it will be replayed",
			"offsets", offsetRanges(s), "trials", trials, "err", cause)
		return s, 0
	}
	next := s.reject(rejected, c.cfg.DeadLetterPayloadBytes)
	for e := range rejected {
		p, o := s.position(e)
		c.log.Error("the database refuses a record: dead-lettered as rejected_by_database", "partition", p, "offset", o, "reason", rejected[e])
	}
	c.log.Warn("isolated the records the database refuses", "rejected", len(rejected), "records", len(all), "trials", trials,
		"took", time.Since(started).Round(time.Millisecond), "offsets", offsetRanges(s))
	return next, len(rejected)
}

// subset is the snapshot of the given elements only (for a trial).
func (s *snapshot) subset(elems []element) *snapshot {
	sub := &snapshot{cuts: s.cuts}
	for _, e := range elems {
		if e < len(s.records) {
			sub.records = append(sub.records, s.records[e])
		} else {
			sub.dead = append(sub.dead, s.dead[e-len(s.records)])
		}
	}
	return sub
}

// position is where an element came from.
func (s *snapshot) position(e element) (int32, int64) {
	if e < len(s.records) {
		return s.records[e].partition, s.records[e].offset
	}
	d := &s.dead[e-len(s.records)]
	return d.Partition, d.Offset
}

// reject returns s with the rejected elements turned into
// rejected_by_database dead letters. A rejected dead letter is kept as a
// bare one (no payload, key or event id), in case the server refused what
// it held.
func (s *snapshot) reject(rejected map[element]string, prefix int) *snapshot {
	next := &snapshot{cuts: s.cuts, bytes: s.bytes}
	reason := string(event.ReasonRejectedByDatabase)
	for i := range s.records {
		r := &s.records[i]
		msg, ok := rejected[i]
		if !ok {
			next.records = append(next.records, *r)
			continue
		}
		next.dead = append(next.dead, deadletters.New(r.partition, r.offset, r.key, r.value, prefix, reason,
			fmt.Sprintf("the database refused this event: %s", msg), r.ev.EventID))
	}
	for i := range s.dead {
		d := s.dead[i]
		if msg, ok := rejected[len(s.records)+i]; ok {
			d = deadletters.Letter{Partition: d.Partition, Offset: d.Offset, Reason: reason, Payload: []byte{}, Size: d.Size, SHA256: d.SHA256,
				Detail: fmt.Sprintf("the database refused this record's dead letter (%s): %s", d.Reason, msg)}
		}
		next.dead = append(next.dead, d)
	}
	return next
}
