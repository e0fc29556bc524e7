// Package changelogtest writes and checks the ledger's changelog in the
// format of issue 20 (the lead's spec, docs/changelog.md once the service
// publishes it): the Debezium change-event envelope in JSON, keyed by a JSON
// object of the primary key, in Kafka transactions, one topic per table.
//
// It is the writing side of the acceptance check that consumers which are
// not the project's own code read that changelog (integration's
// TestFlinkReadsDebeziumJSON, Flink SQL through internal/testenv.JVM):
//
//   - Tables: the spec's tables, their columns and primary keys;
//   - Event and Encode: a change event as Go values, and its key and value
//     bytes as the spec lays them out;
//   - Writer: events to topics in Kafka transactions, committed or aborted,
//     partitioned by the key as Kafka's default partitioner does;
//   - Model: what a read_committed consumer must end up with, applying the
//     committed events and checking their chains as the spec's consumer
//     check does.
//
// Once the service publishes the changelog, the test's generated events
// give way to the service's topics and the model to the rows in MySQL;
// Tables, the model's comparison and the reading stay.
package changelogtest
