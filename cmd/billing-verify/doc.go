// Command billing-verify compares the billing service's result tables with
// the expected ledger written by billing-gen, exactly.
//
// It reads account_balances, billing_windows, window_adjustments and
// dead_letters (and ledger_entries when the expected ledger has them) from
// the server of -dsn and from every -shard-dsns server (accounts are
// sharded: the union of the rows is compared; a row found on two servers is
// itself a difference), and compares every balance (amount and event
// count), every window, and the number of dead letters per reason: no
// missing rows, no extra rows, no different values.
//
// With windows that close (the expected file's close_after), each window
// is compared with its adjustment: exactly when the file splits them (a run
// on one partition), else as their sum, since which events are late then
// depends on the timing of the partitions. The contract's invariants are
// checked either way: every window before the expected frontier is sealed
// and every later one open, a sealed row was not updated after it was
// sealed, adjustments exist only for closed windows. Ledger entries are
// checked for one row per counted event (count, distinct ids, a digest of
// their content) and, per window, against the window's row (entries counted
// in it) and its adjustment (late entries). It prints the first -max-diffs
// differences and a one-line verdict:
//
//	EXACT: 1000 balances, 5312 windows, 1234 dead letters, 100000 events
//	MISMATCH: 3 differences (lost 2 events, counted twice 1 event); actual ...
//
// "lost N" sums the events that balance rows count fewer times than
// expected, "counted twice N" those they count more times.
//
// With -wait it polls every -interval until the tables match or the wait is
// over, printing progress; use it while the service catches up.
//
// The period settings (windows, whether they close) are the ledger's own,
// stored in it: they must be the expected file's, or billing-verify cannot
// compare (exit 3, naming each one that differs); a ledger without any
// stored yet is compared under the file's, with a warning.
//
// Exit status: 0 exact, 1 a difference remains, 2 usage error (a bad flag),
// 3 could not compare: the expected file or a database could not be read,
// or the ledger's period settings are not the file's (with -wait: if the
// last attempt failed so).
package main
