// Package dedup is the keyed, TTL-bounded state that drops repeated billing
// events.
//
// # Model
//
// An event id is "seen" from its first arrival until first arrival +
// DEDUP_TTL, measured in processing time (the clock of the checkpoint that
// first counted it), not event time: a producer's retry arrives shortly
// after the original whatever its occurred_at says, and processing time
// keeps the state bounded even for events with wild timestamps. A repeat
// within the TTL is a Duplicate when its fingerprint (account, amount,
// currency, occurred_at) matches the first arrival's, and a Conflict
// otherwise. After the TTL the id is forgotten: a repeat then counts again.
// Choose DEDUP_TTL longer than the longest time a producer may retry.
//
// # Where the state lives
//
// MySQL's dedup_keys table is the arbiter: a repeat may arrive on another
// partition, owned by another instance, so no instance's memory can decide
// alone. New keys are inserted inside the same XA checkpoint that counts
// their events, so a key is durable exactly when its event is counted: a
// checkpoint that aborts leaves neither. Two instances inserting the same key
// concurrently collide on the primary key; one checkpoint aborts and its
// replay sees the key.
//
// Memory holds a Cache of committed keys only, bounded by a budget of
// entries (oldest first out). A cache hit proves a repeat without a round
// trip, since a committed, unexpired key cannot have left the table; a miss
// proves nothing and is looked up in MySQL in batches.
//
// # Cleanup
//
// Expired keys are deleted continuously by Cleanup, in small batches of
// point deletes by primary key, each its own short transaction, so that no
// long or range lock blocks the checkpoints.
package dedup
