package dedup

import (
	"time"

	"github.com/billing/ledger/internal/ledgerclock"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The rules of the generations (see the package documentation, "Expiry by
// generations"): which tables a claim writes and reads, when a table may
// be emptied, when the next generation may begin. Pure functions of the
// state the control server holds (driver.KeyGenerations) and of a clock.

// Claim is where a checkpoint claims its keys: it inserts into Write's
// table, then lock-reads every generation of Read, in that order.
type Claim struct {
	Write driver.Generation
	Read  []driver.Generation
}

// ClaimAt is where a checkpoint whose processing time is now (the ledger's
// clock as this instance estimates it) claims, under state s: it writes
// the current generation and reads each earlier one that may still hold a
// key live at now. A generation older than Current-2 was emptied before
// its table was taken again (RotateKeys requires it), so it is never read.
// Generation 0's table is dedup_keys, where the version before
// generations wrote keys of any lifetime: it is read until it is emptied.
func ClaimAt(s driver.KeyGenerations, now time.Time) Claim {
	c := Claim{Write: s.Current}
	for g := s.Current - 1; g >= 0 && g >= s.Current-(driver.KeyTables-1); g-- {
		if g <= s.Emptied {
			break
		}
		if end, ok := LiveUntil(s, g); g == 0 || !ok || now.Before(end) {
			c.Read = append(c.Read, g)
		}
	}
	return c
}

// LiveUntil bounds the keys of generation g, once it is no longer current:
// no key of g is live, by any instance's clock, at or after end. ok is
// false when there is no bound yet (g is current, or its successor's Since
// is not in the state any more).
//
// Why: a key of g was claimed by a checkpoint whose decision found g
// current (driver.Control.Commit, keys), so it was decided before
// RotateKeys took the state from g, and its processing time, read before
// the decision, was at most g+1's Since plus the instance's clock error.
// Its expiry is that time plus the instance's lifetime, at most the
// registered Lifetime (an instance registers its lifetime before its first
// claim, and it only grows). So every key of g expires before g+1's Since
// plus Lifetime plus one clock error; an instance whose clock reads end
// (or the control server at end) is past it by another clock error.
func LiveUntil(s driver.KeyGenerations, g driver.Generation) (end time.Time, ok bool) {
	var next time.Time
	switch g {
	case s.Current - 1:
		next = s.Since
	case s.Current - 2:
		next = s.PreviousSince
	default:
		return time.Time{}, false
	}
	if next.IsZero() {
		return time.Time{}, false
	}
	return next.Add(s.Lifetime + ledgerclock.Margin), true
}

// Keeping is what the generations' upkeep may do under state s (read
// with the control server's clock, s.Now): empty the table of Empty,
// Rotate to the next generation, both, or nothing.
type Keeping struct {
	Empty  driver.Generation // -1: none
	Rotate bool
}

// Keep is what the upkeep may do, by the control server's clock:
//
//   - the oldest generation not emptied yet, once it is no longer current
//     and no key of it can be live (LiveUntil), is emptied;
//   - else, once the current generation has been current for a lifetime
//     plus the clock margin and the table of the next one is empty, the
//     next one becomes current. By then, the one before the current
//     expired (LiveUntil: the current's Since plus a lifetime and the
//     margin), so claims read one earlier generation at most; and keys
//     live between one lifetime and about two before their table is
//     emptied.
//
// Nothing rotates before an instance has registered a lifetime (no key
// was written).
func Keep(s driver.KeyGenerations) Keeping {
	k := Keeping{Empty: -1}
	if g := s.Emptied + 1; g < s.Current {
		if end, ok := LiveUntil(s, g); ok && !s.Now.Before(end) {
			k.Empty = g
		}
	}
	if s.Lifetime > 0 && s.Current+1-driver.KeyTables <= s.Emptied && !s.Now.Before(s.Since.Add(s.Lifetime+ledgerclock.Margin)) {
		k.Rotate = true
	}
	return k
}
