// Package ledgercompare compares two ledgers exactly (billing compare):
// every balance (amount and event count), every billing window with its
// adjustment, and the dead letters per reason, one ledger taken as the
// expectation of the other (as the verifier takes billing-gen's expected
// ledger: ledgercheck.Compare). It tells when a ledger rebuilt from the
// topic (blue/green) has caught up with the one it replaces.
//
// The windows are compared under the ledgers' own period settings, stored
// in each (ledger_periods), which must be the same; only for ledgers that
// have none stored (never started by this version) are the environment's
// used, with a warning. With windows that close, which events are late
// depends on when each ledger read which partition, so each window is
// compared as the sum of its row and its adjustment.
//
// A ledger is read through Ledger (Servers: its MySQL pools), so the
// comparison itself runs in tests without servers.
package ledgercompare
