// Package bench measures the billing service against its limits and
// against the naive approach it replaces, on one Kafka broker and one MySQL
// server (cmd/billing-bench, `make bench`; docs/performance.md has the
// method and the figures). Config is one run and Run performs it; Child is
// the side of the child processes Run starts.
//
// For each workload variant it produces the workload once into a fresh topic
// (by running billing-gen: Zipf-skewed accounts, 5% exact duplicates, 6
// partitions, no malformed records) and then runs, each in a child process
// of its own (the binary re-executed with -child: Child) and each into a
// fresh database:
//
//   - consume-only: a plain franz-go consumer that only reads the topic
//     (the Kafka side of the limit);
//   - sink-only: the service's checkpoint protocol (dedup, upserts, XA
//     prepare, fenced decision, XA commit) on the pre-decoded records,
//     without Kafka (the MySQL side of the limit); it runs after the
//     service and replays the service's checkpoints (replay.go);
//   - naive: package naive, the at-least-once batch job;
//   - service: the pipeline with exactly-once on, in-process.
//
// Each streaming variant first catches up with the backlog (throughput,
// checkpoint or batch durations, SQL round trips), is checked against the
// generator's expected ledger, and then follows a live phase in which the
// parent produces at a fixed rate (end-to-end latency: record timestamp →
// the commit that makes it visible). Peak RSS is the child's VmHWM. SQL
// round trips are counted by a dialer that sees every command the MySQL
// driver sends.
//
// The service runs as it ships, through internal/service (Run for the
// service mode: TLS, SASL and client id as configured, migrations and
// grants checked, the ledger's clock and period settings, metrics and
// health; OpenLedger and PipelineConfig for sink-only), with the
// service's own configuration: config.Defaults, overridden by the
// settings of the environment, then by -service-env and the variant's.
// The catch-up of the service is timed from its pipeline's start, after
// those start-up checks.
//
// The add-server variant (grow.go) runs billing shards add halfway
// through the service's catch-up, with the live phase lasting as long as
// the move when the catch-up ends first: the catch-up's events/s before
// and during the move, the e2e latency during it, the move's own figures,
// and the ledger exact over both servers at the end (the run fails if
// not).
//
// Aborted attempts of the service are named by the service's own
// classification (metrics.AbortCause, the cause label of
// billing_checkpoint_aborts_total).
//
// Everything is bounded: Events, Timeout per phase, LiveDuration. Topics
// and databases are deleted at the end unless Keep.
package bench
