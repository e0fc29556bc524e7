// Package reinject re-injects dead letters: it produces a dead letter's
// payload (or a corrected one) again to the topic, with the original key,
// on the original partition, so that the pipeline counts it, once, and
// records who did it and what in the dead letter's row (`billing
// deadletters reinject`).
//
// A re-injection must not mint money, so each is a protocol of five steps
// over the dead-letter table, the dedup keys and the topic (Reinject):
// what to produce must decode; it must be the same event (the dead
// letter's event id and account; a tombstone's event id only); the
// pipeline must count it (an unexpired dedup key on any server refuses it
// unless its version amends the key's, as the pipeline judges versions);
// the row is marked first, atomically
// (of two concurrent re-injections one proceeds), with the audit, so that
// it outlives a crash before the produce; then the record is produced, and
// where it landed recorded, or the mark put back when the produce failed.
// Force overrides the identity, already-reinjected and already-counted
// checks, each with a warning; nothing overrides a payload that does not
// decode.
//
// The tables are reached through narrow interfaces (Letters, Keys), the
// topic through Producer (*kgo.Client), so the protocol runs in tests
// without servers; Pool gives a server's MySQL implementation.
package reinject
