// Package shards keeps the ledger's layout in the ledger: which servers
// hold it, in which order. Accounts and event ids are placed by hash over
// that order (txsink.Sink.Route), so an instance configured with another
// list (MYSQL_DSN then MYSQL_SHARD_DSNS) would write rows where no other
// instance reads them, and a list with another server first would take a
// shard server for the control server: its decisions, its positions.
//
// A server is known by its own identity, not by its DSN (which changes with
// a password, a host name, an alias): migration 00010 writes a UUID
// (UUID()) into every server's schema (ledger_server), one per database,
// since several ledgers may share a MySQL server, and MariaDB has no
// @@server_uuid. The first instance of this version that starts on a
// ledger claims every server for the ledger (ledger_server.ledger_id, the
// control server's ledger identity) and stores the layout, version 1,
// on the control server (ledger_layout): the servers' UUIDs in order. A
// ledger that predates the layout adopts the list it runs with, as the
// period settings are adopted (package periods); what it can check then
// is that no server belongs to another ledger and that no server but the
// first is a control server (holds a ledger identity).
//
// From then on every start compares (Compare) the configured servers with
// the stored layout and refuses (MismatchError, exit 4) any difference: a
// server missing, in another place, listed twice, or another ledger's,
// each named with what to do. A fresh server listed after the layout's is
// one to add: accepted, and placed on by nothing until a move begins. MYSQL_BRANCHES is not part of the
// layout: within a server it only spreads the work, and may differ between
// instances. Status shows the layout (billing shards status).
//
// A server is added by a new layout version (Add, billing shards add):
// its placement by slots (package placement, stored as runs in
// ledger_placement), the move to it recorded in ledger_moves, while the
// instances count. The move goes through the keys in byte order along a
// cursor (driver.MoveCursor, ledger_move_cursor): step by step it freezes
// a range of keys, waits until the checkpoints decided before the freeze
// are applied, moves the rows of those keys whose slot moves, and moves
// the cursor past them, each change of the cursor a compare-and-set. The
// instances place keys by the cursor (txsink: Sink.Refresh, Txn.Route),
// and every decision refuses a checkpoint that placed a key the cursor
// froze or passed since (txsink.ErrLayoutMoved): the decisions and the
// steps are ordered by the cursor row's locks. An instance without the
// new server stops (Verify after every claim, txsink.ErrNotPlaceable at
// its next checkpoint). Remove drains the last server the same way (its
// slots given back by placement.ShrinkLast). docs/production.md
// ("Growing") describes both.
package shards
