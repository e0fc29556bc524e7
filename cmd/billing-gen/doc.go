// Command billing-gen produces a reproducible billing workload to Kafka and
// writes the ledger the service must end up with.
//
// It produces -events valid, distinct events keyed by account (Zipf-skewed
// over -accounts accounts, several currencies, times spread over -windows
// windows before -base-time, some of them late), and around them: exact
// duplicates (half keyed to land on another partition), conflicting
// duplicates (same key as the original, after it), malformed records of
// every kind the decoder rejects, int64 overflow cases on dedicated
// accounts, records dated in the year 9000 (event_time_in_future dead
// letters, -future-ratio) each followed by its correction, and records
// inside Kafka transactions that are then aborted. A run whose other event
// times would reach past now plus -max-event-time-skew (the service's
// MAX_EVENT_TIME_SKEW) is refused: the service would dead-letter them.
// The committed records go through one idempotent producer (acks=all), so
// each partition keeps the produced order.
//
// The expected ledger (balances, windows, dead letters by reason) is
// computed while producing, by the contract model in internal/ledgercheck,
// and written atomically to -expected only if every record was acknowledged
// and every aborted transaction was aborted; any produce error exits 1 and
// leaves the expected file untouched (records already produced stay in the
// topic: use a fresh topic and database for the next run). Usage errors exit
// 2.
//
// The same -seed and flags (and the same partition count) produce the same
// records and the same expected file; the seed is printed at start. The
// model assumes the service consumes the whole run within its DEDUP_TTL
// (repeats follow their original within 1000 records), uses BILLING_WINDOW,
// BILLING_TIMEZONE and WINDOW_CLOSE_AFTER equal to -window, -timezone and
// -close-after (LEDGER_ENTRIES=true with -ledger-entries) and a maximum
// payload equal to -max-payload, and starts from empty tables. With closing
// windows and one partition the expected file splits each window and its
// adjustment exactly; with more partitions which events are late depends
// on the timing of the partitions, and it holds their sums (billing-verify
// checks the split by the contract's invariants).
//
// The run is bounded: -events (at most 1e9; the model keeps every event id,
// about 150 bytes each) and -timeout. -rate paces all records, committed and
// aborted, in records per second. Progress goes to stderr (-progress), the
// seed and the summary to stdout.
//
// Usage:
//
//	billing-gen -brokers 127.0.0.1:9092 -topic billing-events -create-topic -partitions 6 \
//	    -events 100000 -expected expected.json
package main
