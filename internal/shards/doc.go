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
// server missing, added, in another place, listed twice, or another
// ledger's, each named with what to do. MYSQL_BRANCHES is not part of the
// layout: within a server it only spreads the work, and may differ between
// instances. Status shows the layout (billing shards status).
//
// A server is added by a new layout version (Add, billing shards add):
// its placement by slots (package placement, stored as runs in
// ledger_placement), the move to it recorded in ledger_moves. The move
// fences every instance (the partitions' epochs, as a change of the
// period settings does), waits for the checkpoints decided before it,
// moves the keyed tables' rows of the new server's slots, and is then
// done; an instance checks the layout after every claim (Verify) and
// stops on a newer one, and an instance configured with the new list
// waits at its start until the move is done. Counting pauses for the
// move; docs/production.md ("Growing") describes it and the live move
// that is not built.
package shards
