// Package naive is the approach the billing service replaces, kept as the
// baseline that the tests and benchmarks compare the service against. It is
// written plainly, the way such a job is usually written, and is not meant
// to be used for billing.
//
// # What it does
//
// A franz-go consumer is assigned every partition of the topic directly (no
// consumer group) and starts each one at the next offset recorded in its own
// MySQL table, naive_offsets. In a loop it
//
//  1. reads a fixed batch: up to BatchRecords records, or what arrived
//     within BatchWait of the batch's first record;
//  2. decodes the records (invalid ones are skipped and counted) and drops
//     repeated event ids inside the batch, first arrival wins;
//  3. sums the batch per (account, currency) and per (account, currency,
//     billing window) and writes the sums, in one local MySQL transaction,
//     with the same upserts as the service (INSERT … ON DUPLICATE KEY
//     UPDATE c = c + VALUES(c)) into the same result tables,
//     account_balances and billing_windows;
//  4. then, separately and afterwards, records the batch's next offsets in
//     naive_offsets (at-least-once: results first, offsets second).
//
// # How it fails
//
// Those are the failure modes the service exists to remove; the tests of
// this package demonstrate the first two against real Kafka and MariaDB.
//
//   - A crash, a kill, a lost connection or a failed offset write between
//     step 3's COMMIT and step 4 leaves the results committed and the
//     offsets not: on restart the whole batch is read and counted again.
//     Every event of the batch is then double counted, silently.
//   - Duplicates are only caught inside one batch. A repeat that arrives in
//     a later batch (a producer retry after a timeout, a repeat keyed to
//     another partition that is read at a different pace) is counted a
//     second time. Remembering ids across batches in memory would not fix
//     it: the memory dies with the process and cannot see repeats handled
//     by another instance.
//   - Offsets are not fenced: two copies of the job (a deployment overlap, a
//     paused process that resumes) both count the same records.
//   - An amount sum that overflows BIGINT fails the whole results
//     transaction (error 1690) on every retry: the job is stuck on that
//     batch. Invalid records are skipped without a trace (no dead letters).
//
// What it does well is being cheap: one local transaction and one offset
// write per batch, no dedup state, no two-phase commit.
package naive
