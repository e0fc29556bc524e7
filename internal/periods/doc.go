// Package periods keeps a ledger's period settings in the ledger: stored
// by the first instance that starts on it and compared at every start
// (Ensure, Verify), shown (Show, through the read-only view), and changed
// deliberately with every instance stopped (ChangeStopped, Apply, the
// plan of a change: PlanChange); ledger_periods' SQL is mysqldriver's.
//
// BILLING_WINDOW and BILLING_TIMEZONE name every row's window_start, and
// whether windows close (WINDOW_CLOSE_AFTER set) decides whether rows are
// ever sealed: an instance that ran with other values than the ledger was
// built with would write rows of another definition of a window beside
// them, upsert into rows other instances sealed (an instance without
// closing skips the frontier check), or close at once every window of a
// longer period. So the ledger stores them, in ledger_periods on its
// control server (migration 00005), when they are first used: by the
// first instance of this version that starts on it, with that instance's
// settings (which is what the ledger ran with, unless the settings changed
// under an older version: see Ensure). From then on an instance whose
// settings differ refuses to start (MismatchError), naming each setting
// with the ledger's value and its own.
//
// A deliberate change is an operation of its own (billing periods
// change), run with every instance stopped. It appends a definition, in
// force from an instant: the first window start of the new period
// strictly after the latest event time the ledger has counted (the
// partitions' watermarks) and after the closing frontier. Every counted
// event lies before it and keeps its window under the old definition, and
// every sealed or closed window ends at or before it; events from that
// instant on get the new windows, and the last old window ends there (it
// is cut short; it held nothing after it). So no sealed row and no counted
// event changes meaning. The ledger's windows are then a schedule
// (event.Schedule) that the service runs on. Closing, once windows have
// closed, stays on: turning it off would leave sealed rows beside open
// ones of the same kind of window, and a checkpoint without closing skips
// the frontier check that keeps sealed rows unchanged; a large
// WINDOW_CLOSE_AFTER delays closing instead. WINDOW_CLOSE_AFTER itself is
// not stored: it may differ between instances and change at any restart.
// The frontier only rises and every decision checks against the stored
// frontier, whoever raised it, so instances with several values act as
// the smallest one does, and sealed rows stay unchanged under any mix.
package periods
