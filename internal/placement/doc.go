// Package placement says on which of the ledger's servers a key's rows
// live (an account's balances, windows, adjustments and entries; an event
// id's dedup key), and how that changes when the ledger grows: pure
// functions, no I/O.
//
// A key is hashed once (Hash: FNV-1a, 64 bits) and the hash placed. The
// first ledgers placed it by the hash modulo the number of servers
// (Modulo); that cannot grow without moving almost every row, since hash
// mod n and hash mod n+1 agree for about one key in n+1. A placement by
// slots can: a fixed number of slots (SlotsPerServer times the servers the
// ledger had when it first stored slots), each owned by one server, a key
// in slot hash mod slots. Because that number is a multiple of the
// servers' n, hash mod slots mod n is hash mod n: the modulo placement of
// n servers is the slot placement whose slot s belongs to server s mod n
// (Placement.Slotted), and a ledger moves from one to the other without
// moving a row. Growing to n+1 servers then moves whole slots, about
// 1/(n+1) of the rows, to the new server, taken evenly from the others
// (Placement.Grow); the slot count never changes.
//
// Within a server the branch (an XA connection of a checkpoint) is
// another function of the hash (Placement.Branch): it only spreads the
// work, and may differ between instances.
package placement
