// Package ledgerclock is the ledger's one clock: the control server's UTC
// clock, as each instance estimates it.
//
// Ages and expiries are judged by one instance against instants another
// wrote: a dedup key's expiry is written by the checkpoint that counted
// its event and judged by any instance's claims (the tables of expired
// keys are emptied by the control server's own clock, package dedup); a
// gtrid carries its
// coordinator's creation time and any instance's recovery judges its age.
// With each host's own clock, a skew of a few seconds between two hosts
// shortens the dedup TTL by the skew (a repeat in the last seconds of the
// TTL counts twice) and makes a recoverer whose clock is ahead abort the
// healthy checkpoints of others. So every instance measures the offset of
// its host's clock to the control server's UTC_TIMESTAMP(6) and judges
// every age and expiry by the corrected clock (Clock.Now): the hosts'
// clocks may then be off by any amount; only the control server's clock
// matters, and it is one clock.
//
// The estimate is anchored to the host's monotonic clock (a step of the
// host's wall clock does not move it) and measured again every minute.
// It is off by at most half the round trip of the sample it rests on plus
// the drift since: MaxError bounds it (a sample with a longer round trip is
// not used). Two instances' estimates differ by at most Margin, which
// every judgement between instances adds in the safe direction: a dedup
// key lives DEDUP_TTL plus Margin, an undecided branch is aborted once
// older than CHECKPOINT_TIMEOUT plus Margin. A key may live longer than
// DEDUP_TTL, never shorter.
package ledgerclock
