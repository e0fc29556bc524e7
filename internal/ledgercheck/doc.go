// Package ledgercheck models the billing service's contract independently of
// the service, so that a load generator can predict the result tables and a
// verifier can compare them exactly: the model (Model), the expected-ledger
// file billing-gen writes (Expected), the reading of a ledger's result
// tables (ReadActual) and the exact comparison of the two (Compare).
//
// A ledger, here as everywhere in this repository, is one deployment's
// tables on its MySQL servers (ledgerstatus says where one stands,
// ledgerclock is its clock, ledgercompare compares two); the model of
// what they must hold is a Model (it was named Ledger, which read as the
// tables themselves).
//
// # The model
//
// A [Model] is fed the records of one run in the order the service will see
// them for each account: Kafka key = account, so one account's records share
// a partition and are consumed in produced order. [Model.Add] applies the
// contract to one well-formed event:
//
//   - an event id already counted with identical content (account, amount,
//     currency and the UTC instant of occurred_at) is dropped: not counted,
//     no dead letter;
//   - an event id already counted with different content is dead-lettered
//     as conflicting_duplicate and not counted;
//   - an event whose amount would overflow int64 in its account balance or
//     in its window sum is dead-lettered as amount_overflow and counts
//     nowhere (neither balance nor window);
//   - otherwise the event is counted in its (account, currency) balance and
//     in its (account, currency, window) sum, and its id is remembered.
//
// Windows are fixed or calendar periods ([Period], computed independently
// of the service). With windows that close ([Options].CloseAfter) every
// event added, whatever becomes of it, moves the watermark; on one
// partition ([Options].SplitExact) the model judges each counted event late
// or not against the frontier of the events before and including it, as the
// service judges a partition's events, and keeps windows and adjustments
// apart; otherwise it keeps each window's total, and [Compare] checks the
// split by the contract's invariants (sealed before the final frontier,
// open after, sealed rows unchanged, adjustments only of closed windows,
// ledger entries one per counted event and summing to the rows).
//
// An event dated later than the service's processing time plus its
// MAX_EVENT_TIME_SKEW ([InFuture]) is dead-lettered as event_time_in_future
// before anything else: the model is given [Model.DeadLetter] for it, never
// [Model.Add], so it moves no watermark and its id is not remembered. The
// generator only produces such records far in the future (and refuses runs
// whose other events would come near the bound), so that model and service
// agree whenever the service runs.
//
// Dead-lettered events are not remembered, so a later record with the same id
// is judged afresh. [Model.DeadLetter] records a malformed record that the
// decoder rejects; [MalformedKind.Reason] is the single table that maps each
// malformed kind the generator produces to the reason the decoder stores.
//
// The model assumes a whole run is processed within the service's DEDUP_TTL
// (the generator repeats ids only a bounded number of records later), and it
// does not model Kafka transactions: records in aborted transactions are
// never shown to it, because the service reads read_committed.
//
// Results only depend on per-account order: exact duplicates may be consumed
// from another partition before or after their original, which changes which
// copy counts but not the totals; a conflicting duplicate must share its
// original's partition and follow it, so the original always counts.
//
// # Files and tables
//
// [Expected] is the expected-ledger file written by cmd/billing-gen and read
// by cmd/billing-verify (JSON, written atomically by [WriteFile], read and
// validated by [ReadFile]). [ReadActual] reads the service's tables from one
// or more MySQL servers (accounts are sharded, each account on one server)
// and [Compare] diffs them against the expectation row by row.
package ledgercheck
