package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/billing/ledger/internal/deadletters"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/stmt"
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
// never prepared.
//
// A record is blamed only on evidence that it is the cause:
//
//  1. The empty case first: the checkpoint with no record in it (what
//     every trial runs whatever its records: the event-time reads and the
//     sealing of closed windows). If that fails, the cause is not a
//     record (a trigger on a statement every checkpoint runs, a setting):
//     nothing is dead-lettered, the checkpoint fails loudly (an error log,
//     billing_isolations_total{outcome="not_a_record"}, the alert
//     BillingFailureNotCausedByARecord) and is replayed as usual.
//  2. The whole snapshot, as a trial, must fail too. If it passes, the
//     failure is not in the writes (the decision's statements, which no
//     trial runs) or it came and went: nothing is dead-lettered either
//     (outcome "not_reproduced").
//  3. In arrival order, like overflow: bisection finds the shortest prefix
//     of the snapshot's elements (its valid records, then its dead
//     letters) whose writes fail; the prefix's last element is the
//     suspect. A record refused alone is found so, and so is one refused
//     only together with earlier ones (a constraint on a sum): the one
//     that tips it over, as with overflow.
//  4. The suspect is confirmed before it is blamed: the prefix ending with
//     it fails again and the empty case still passes. A failure that does
//     not keep to its records (one that started or stopped during the
//     trials) fails a confirmation, and then nothing found by this
//     isolation is dead-lettered ("not_reproduced").
//
// A confirmed suspect becomes a rejected_by_database dead letter carrying
// the server's message; then the rest is tried again. A row over its
// statement's budget (*stmt.TooLargeError, a bug: every row is sized below
// its budget by construction) is isolated the same way, so that a bug in a
// size computation costs one record's dead letter, not a stalled
// partition.
//
// Isolation takes at most CheckpointTimeout and a bounded number of
// trials; what it found by then is kept, and whatever is left is found by
// the isolation of the replay. A trial that fails for any other reason (a
// lock wait, a lost connection) stops it: the checkpoint then fails as
// usual.

// maxCulprits bounds the records one isolation dead-letters.
const maxCulprits = 1000

// Outcomes of an isolation (CheckpointInfo.Isolation, the label of
// billing_isolations_total).
const (
	// IsolationRejected: records were found responsible and
	// dead-lettered as rejected_by_database.
	IsolationRejected = "rejected"
	// IsolationNotARecord: the checkpoint fails with no record in it.
	IsolationNotARecord = "not_a_record"
	// IsolationNotReproduced: the trials do not reproduce the failure, or
	// not consistently: no record can be blamed.
	IsolationNotReproduced = "not_reproduced"
	// IsolationInterrupted: a trial failed for another reason (a lock
	// wait, a lost connection) or time ran out before anything was found.
	IsolationInterrupted = "interrupted"
)

// IsolationOutcomes lists the outcomes, in a stable order.
func IsolationOutcomes() []string {
	return []string{IsolationRejected, IsolationNotARecord, IsolationNotReproduced, IsolationInterrupted}
}

// element is a snapshot's valid record (index into records) or dead letter
// (len(records) + index into dead).
type element = int

// refusedForData reports whether err is a refusal of the data that a
// trial can reproduce and isolation can attribute: the server's (Data,
// Overflow) or a row over its statement budget.
func (c *Checkpointer) refusedForData(err error) bool {
	code := c.sink.Code(err)
	return code == driver.Data || code == driver.Overflow || oversized(err)
}

// oversized reports a row over its statement's budget (a bug).
func oversized(err error) bool {
	var tl *stmt.TooLargeError
	return errors.As(err, &tl)
}

// isolation is one isolation's trials.
type isolation struct {
	c       *Checkpointer
	s       *snapshot
	careful bool
	cause   error
	trials  int
}

// refused reports whether the writes of elems fail for the data, and why;
// err for any other failure.
func (is *isolation) refused(ctx context.Context, elems []element) (bool, refusal, error) {
	is.trials++
	info := is.c.attempt(ctx, is.s.subset(elems), is.careful, true, nil)
	if info.Err == nil {
		return false, refusal{}, nil
	}
	if is.c.refusedForData(info.Err) {
		return true, refusalOf(info.Err), nil
	}
	return false, refusal{}, info.Err
}

// notRecords ends an isolation that found no record to blame.
func (is *isolation) notRecords(outcome, why string, err error) (*snapshot, int, string) {
	is.c.log.Error("a checkpoint keeps failing for a data reason that no record causes; nothing is dead-lettered and it will be replayed: "+why,
		"outcome", outcome, "offsets", offsetRanges(is.s), "trials", is.trials, "err", err)
	return is.s, 0, outcome
}

func (is *isolation) interrupted(err error) (*snapshot, int, string) {
	is.c.log.Warn("isolation of refused records interrupted", "err", err, "trials", is.trials)
	return is.s, 0, IsolationInterrupted
}

// isolate finds the elements of s responsible for cause and returns a
// snapshot in which they are rejected_by_database dead letters, their
// number (0: nothing found, s unchanged) and the outcome.
func (c *Checkpointer) isolate(ctx context.Context, s *snapshot, careful bool, cause error) (*snapshot, int, string) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CheckpointTimeout)
	defer cancel()
	started := time.Now()
	is := &isolation{c: c, s: s, careful: careful, cause: cause}
	all := make([]element, len(s.records)+len(s.dead))
	for i := range all {
		all[i] = i
	}
	// 1 and 2: the empty case fails, or the whole does not.
	if bad, msg, err := is.refused(ctx, nil); err != nil {
		return is.interrupted(err)
	} else if bad {
		return is.notRecords(IsolationNotARecord, "it fails with no record in it (a trigger, constraint or setting on a statement every checkpoint runs)", errors.New(msg.msg))
	}
	if len(all) == 0 {
		// Nothing but the empty case, which passed this time.
		return is.notRecords(IsolationNotReproduced, "it has no record, and it passed when tried again", cause)
	}
	if bad, _, err := is.refused(ctx, all); err != nil {
		return is.interrupted(err)
	} else if !bad {
		return is.notRecords(IsolationNotReproduced, "its writes alone do not fail (a statement of the decision, or a failure that came and went)", cause)
	}
	rejected, kept := is.culprits(ctx, all)
	if !kept {
		return is.notRecords(IsolationNotReproduced, "the failure did not keep to the records the trials found", cause)
	}
	if len(rejected) == 0 {
		c.log.Error("a checkpoint keeps failing for its data and no record could be isolated; it will be replayed",
			"offsets", offsetRanges(s), "trials", is.trials, "err", cause)
		return s, 0, IsolationInterrupted
	}
	next := s.reject(rejected, c.cfg.DeadLetterPayloadBytes)
	for e := range rejected {
		p, o := s.position(e)
		if rejected[e].oversized {
			c.log.Error("bug: a row exceeded the statement budget its size was computed for; its record is dead-lettered as rejected_by_database, please report",
				"partition", p, "offset", o, "err", rejected[e].msg)
			continue
		}
		c.log.Error("the database refuses a record: dead-lettered as rejected_by_database", "partition", p, "offset", o, "reason", rejected[e].msg)
	}
	c.log.Warn("isolated the records the database refuses", "rejected", len(rejected), "records", len(all), "trials", is.trials,
		"took", time.Since(started).Round(time.Millisecond), "offsets", offsetRanges(s))
	return next, len(rejected), IsolationRejected
}

// culprits finds, one after the other, the elements whose writes fail
// (3 and 4 above), up to maxCulprits. kept is false when a confirmation
// failed: nothing found is then to be blamed. A trial that fails for
// another reason stops it with what it found so far.
func (is *isolation) culprits(ctx context.Context, all []element) (rejected map[element]refusal, kept bool) {
	rejected = map[element]refusal{}
	rest := all
	for len(rejected) < maxCulprits {
		// Invariant: the empty prefix passes, rest as a whole fails.
		if len(rejected) > 0 {
			bad, _, err := is.refused(ctx, rest)
			if err != nil {
				is.c.log.Warn("isolation of refused records interrupted", "err", err, "found", len(rejected))
				break
			}
			if !bad {
				break
			}
		}
		hi, err := is.shortestFailing(ctx, rest)
		if err != nil {
			is.c.log.Warn("isolation of refused records interrupted", "err", err, "found", len(rejected))
			break
		}
		// 4: confirmed, or nothing of this isolation is blamed.
		bad, msg, err := is.refused(ctx, rest[:hi])
		if err == nil && bad {
			var empty bool
			empty, _, err = is.refused(ctx, nil)
			bad = !empty
		}
		if err != nil {
			is.c.log.Warn("isolation of refused records interrupted", "err", err, "found", len(rejected))
			break
		}
		if !bad {
			return nil, false
		}
		rejected[rest[hi-1]] = msg
		rest = slices.Delete(slices.Clone(rest), hi-1, hi)
		if len(rest) == 0 {
			break
		}
	}
	return rejected, true
}

// shortestFailing bisects rest, which fails as a whole while its empty
// prefix passes, for the shortest prefix that fails: rest[:hi].
func (is *isolation) shortestFailing(ctx context.Context, rest []element) (int, error) {
	lo, hi := 0, len(rest) // rest[:lo] passes, rest[:hi] fails
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		bad, _, err := is.refused(ctx, rest[:mid])
		if err != nil {
			return 0, err
		}
		if bad {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}

// refusal is why an element was refused: the server's message, or its row
// over its statement's budget.
type refusal struct {
	msg       string
	oversized bool
}

func refusalOf(err error) refusal { return refusal{msg: err.Error(), oversized: oversized(err)} }

// detail is the dead letter's detail for a refused subject ("this event").
func (r refusal) detail(subject string) string {
	if r.oversized {
		return fmt.Sprintf("%s was not stored: its row exceeds the statement budget its size was computed for (a bug, reported in the error log): %s", subject, r.msg)
	}
	return fmt.Sprintf("the database refused %s: %s", subject, r.msg)
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
func (s *snapshot) reject(rejected map[element]refusal, prefix int) *snapshot {
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
			msg.detail("this event"), r.ev.EventID))
	}
	for i := range s.dead {
		d := s.dead[i]
		if msg, ok := rejected[len(s.records)+i]; ok {
			d = deadletters.Letter{Partition: d.Partition, Offset: d.Offset, Reason: reason, Payload: []byte{}, Size: d.Size, SHA256: d.SHA256,
				Detail: msg.detail(fmt.Sprintf("this record's dead letter (%s)", d.Reason))}
		}
		next.dead = append(next.dead, d)
	}
	return next
}
