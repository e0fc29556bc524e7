// Package service assembles one instance of the billing service from its
// configuration (internal/config) and runs it: the connections (TLS,
// secrets from files), the migrations, the grants checked before anything
// is written, the sink on the ledger's clock, the topic and period
// settings checked, the Kafka client's options, the pipeline, the metrics
// and their sampler, the health endpoints over HTTP, the background work,
// and the order of the shutdown. cmd/billing parses its command line and
// calls Run; the benchmark's children run the service through the same
// Run (and its MySQL side through OpenLedger and PipelineConfig), so what
// is measured is what ships; tests take their settings from
// config.Defaults through the same functions.
package service
