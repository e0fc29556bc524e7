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
// A key's row also keeps the version of its event the ledger counts
// (Version, EncodeVersion): records with one id and a revision each are
// versions of one event, of which the ledger counts the highest
// (ClassifyVersions, docs/corrections.md). A version replaces the row's
// fingerprint and version, never its expiry: versions are accepted
// while the key lives, up to a horizon after the first.
//
// # Where the state lives
//
// MySQL's dedup key tables are the arbiter: a repeat may arrive on another
// partition, owned by another instance, so no instance's memory can decide
// alone. Keys are claimed inside the same XA checkpoint that counts their
// events, so a key is durable exactly when its event is counted: a
// checkpoint that aborts leaves neither.
//
// The tables are the ledger store's (package driver: StoreTx.ClaimKeys,
// LockKeys and their siblings in a checkpoint's branches, Store.LookupKeys
// and Store.EmptyKeys on the pools; the statements are mysqldriver's
// dedup.go). This package decides (ClaimAt, Keep, Classify); the store
// reads and writes.
//
// A claim inserts every candidate key into the current generation's table
// with INSERT … ON DUPLICATE KEY UPDATE event_id = event_id, 1,000 per
// statement: a stored row is left as it was and not counted in the
// affected rows, so a statement that inserted all its rows proves all its
// ids new in that table, without a lookup. Only the ids of a statement
// that met a stored row are looked up; nearly every id is new, so this
// replaces a lookup per id with one per rare statement. A key another
// instance holds uncommitted makes the claim wait for that checkpoint's
// outcome: committed, the key counts as stored; rolled back, it is claimed
// here. This rests on affected rows counting changed rows only (no
// CLIENT_FOUND_ROWS, which mysqldriver.OpenDB turns off). A claimed key
// whose event is not counted after all (an overflow dead letter, or a
// repeat of a live key of an earlier generation) is removed again (an
// unclaim).
//
// Memory holds a Cache of committed keys only, bounded by a budget of
// entries (oldest first out). (A read-ahead, package pipeline's
// readahead.go, brings the tables' pages of live ids into the server's
// buffer pool before their claim; it reads without locks and decides
// nothing.) A cache hit proves a repeat without a round
// trip, since a committed, unexpired key cannot have left its table (a
// table is emptied only once every key in it has expired); a miss proves
// nothing and is claimed.
//
// # Expiry by generations
//
// Keys are not deleted one by one. They are written to the table of the
// current generation, and a whole table is emptied (TRUNCATE TABLE) once
// every key in it has expired: generation g writes table g mod 3
// (driver.KeyTables: dedup_keys, dedup_keys_g1, dedup_keys_g2; migration
// 00008), and a table is written again only once it was emptied. The state
// is one row on the control server (driver.KeyGenerations: the current
// generation and when it and the one before became current, the last
// generation emptied, the longest key lifetime any instance registered).
//
// A claim (ClaimAt) inserts into the current generation's table and then
// reads its ids, under shared locks, in each earlier generation that may
// still hold a live key: the one before, and the one before that until
// its keys have expired (generation 0's table, dedup_keys, is read until
// it is emptied: it holds the keys of the version before generations). A
// live key found there makes the event a repeat (Classify); the key just
// inserted is taken back, so that a repeat never extends a key's life.
//
// No key is counted twice. The commit decision of a checkpoint that
// claimed keys reads the current generation under a shared lock held to
// its COMMIT and is refused (driver.ErrKeysMoved; the checkpoint is
// retried at once) unless it is still the one the keys were claimed in; a
// rotation takes the row exclusively without waiting (NOWAIT) and records
// the new generation's start, Since, after every decision under the old
// one committed. So every committed key of generation g was inserted
// before g+1 became current. Two claims of one key in one table meet in
// the INSERT's duplicate check. Claims in g and in a later generation h:
// the claim in g was decided before h existed, so it inserted before the
// claim in h read g's table; the locking read waits for it (uncommitted:
// until its branch ends) and sees it. The order "insert into mine, then
// lock-read the others" is what makes this hold even without the
// decision's check (drivertest: two branches each taking another
// generation for current never both own a key); the check is what bounds
// a generation's expiry.
//
// No key is forgotten early (LiveUntil, Keep). A key of generation g was
// decided before Since(g+1) by the control server's clock, and its
// processing time, read before that on an instance's ledger clock, is at
// most Since(g+1) plus that clock's error; its expiry is at most that plus
// the registered lifetime (an instance registers DEDUP_TTL plus the clock
// margin before its first claim). Generation g's table is emptied only
// when the control server's clock has passed Since(g+1) + lifetime +
// ledgerclock.Margin: by then every instance's clock is past every expiry
// in it, whatever the skew between instances (within the margin), and a
// key lives at least DEDUP_TTL by any clock. A claim stops reading g by
// the same bound on its own clock (a key found there would be expired for
// it anyway). The next generation becomes current once the current one
// has been for a lifetime plus the margin, and only once its table was
// emptied: a table that cannot be emptied yet holds up the rotation, never
// the claims (keys then live longer, never shorter). In steady state keys
// live between one lifetime and about two before their table is emptied,
// and claims read one earlier generation.
//
// Emptying never waits long on a checkpoint. It runs on a cleanup
// connection with lock_wait_timeout at 1 s: a transaction that touched the
// table holds its metadata lock until it ends (a prepared XA branch until
// it is resolved), and while TRUNCATE waits, new statements on that table
// queue behind it. The table emptied is one no claim reads any more, so
// what can hold it is a straggler (a checkpoint that claimed under the
// generation before and whose decision is refused) or a branch in doubt;
// the TRUNCATE then gives up after a second, changes nothing, and is
// tried again at the next pass. The exception is generation 0's table,
// read by every claim until it is emptied: in the upgrade's first cycle
// its TRUNCATE competes with the claims, may hold them up to a second per
// attempt, and succeeds when it falls between checkpoints. While a table is emptied, the upkeep holds
// the state row shared, so that no rotation can hand the table to a newer
// generation meanwhile; decisions go on (they take the row shared too).
//
// The keys of the version before generations (dedup_keys, with their
// expiry in the journal dedup_expiry) need no rebuild: dedup_keys is
// generation 0's table, read by every claim until it is emptied, and it is
// emptied (with the journal) only once no journal row expires after the
// control server's clock minus the margin (driver.ErrKeysLive until then).
// Every instance must run this version before the first rotation (a
// DEDUP_TTL after the first claim of this version): the version before
// neither reads the newer tables nor checks the generation.
//
// The operator sees the upkeep in the log ("dedup generations: next
// generation current", "table emptied", and a warning when a table could
// not be emptied yet, with the error); the service's account needs DROP on
// the key tables for TRUNCATE (docs/operations.md).
package dedup
