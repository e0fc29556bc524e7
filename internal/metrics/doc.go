// Package metrics exposes the pipeline's state to Prometheus: running totals
// read from pipeline.Stats, per-checkpoint observations fed by
// pipeline.Config.OnCheckpoint, and sampled values (consumer lag, dedup
// table size) refreshed in the background by a [Sampler].
//
// # Guarantees
//
//   - Every metric lives in the [Metrics]' own registry
//     (prometheus.NewRegistry); nothing is registered globally, so several
//     instances (tests) coexist.
//   - Label values come from small fixed sets (dead-letter reasons of
//     event.AllReasons, checkpoint phases, MySQL error kinds, partition
//     numbers, server indexes): never a DSN, a secret, an event id or a
//     payload. Unknown values are folded into "other".
//   - A scrape never waits for Kafka or MySQL: sampled values are read from
//     memory. When sampling fails, the previous values stay and
//     billing_metrics_sample_failures_total grows.
//
// See docs/operations.md for the list of metrics and their meanings.
package metrics
