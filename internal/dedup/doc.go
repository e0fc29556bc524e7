// Package dedup is the keyed, TTL-bounded state that drops repeated billing
// events.
//
// # Model
//
// An event id is "seen" from its first arrival until first arrival +
// DEDUP_TTL, measured in processing time (the ledger's clock, package
// ledgerclock, at the checkpoint that first counted it), not event time: a producer's retry arrives shortly
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
// alone. Keys are claimed inside the same XA checkpoint that counts their
// events, so a key is durable exactly when its event is counted: a
// checkpoint that aborts leaves neither.
//
// The table is the ledger store's (package driver: StoreTx.ClaimKeys and
// its siblings in a checkpoint's branches, Store.LookupKeys and
// Store.CleanupKeys on the pools; the statements are mysqldriver's
// dedup.go). This package decides; the store reads and writes.
//
// A claim inserts every candidate key with INSERT … ON DUPLICATE KEY UPDATE
// event_id = event_id, 1,000 per statement: a stored row is left as it was
// and not counted in the affected rows, so a statement that inserted all
// its rows proves all its ids new, without a lookup. Only the ids of a
// statement that met a stored row are looked up; nearly every id is new,
// so this replaces a lookup per id with one per rare statement. A key
// another instance holds uncommitted makes the claim wait for that
// checkpoint's outcome: committed, the key counts as stored; rolled back,
// it is claimed here. Exactly one checkpoint owns a key. This rests on
// affected rows counting changed rows only (no CLIENT_FOUND_ROWS, which
// mysqldriver.OpenDB turns off). A claimed key whose event is not counted
// after all (an overflow dead letter) is removed again (an unclaim).
//
// Memory holds a Cache of committed keys only, bounded by a budget of
// entries (oldest first out). A cache hit proves a repeat without a round
// trip, since a committed, unexpired key cannot have left the table; a miss
// proves nothing and is claimed.
//
// # Cleanup
//
// dedup_keys has no index on its expiry: a secondary entry per key cost
// 8-24% of the service's rate. Instead every checkpoint journals the keys it
// writes (StoreTx.JournalKeys): rows of dedup_expiry, each listing up to 8,192 ids under
// their common expiry, written in the same branch as the keys. Cleanup runs
// continuously, takes one due journal row at a time (FOR UPDATE SKIP LOCKED,
// so instances share the work), deletes its keys by primary key while they
// are still expired, then the row, each row its own short transaction, so
// that no long or range lock blocks the checkpoints. Keys are never deleted
// early: the delete re-checks the expiry, and an id re-inserted after it
// expired has a later expiry and a journal row of its own.
package dedup
