// Package changelogtest checks the ledger's changelog
// (docs/changelog.md) as a consumer that is not the service would: the
// format itself is package changelog's.
//
//   - Model: what a read_committed consumer must end up with, applying the
//     committed events and checking their chains as the spec's consumer
//     check does;
//   - Writer: events to topics in Kafka transactions, committed or aborted,
//     partitioned by the key as Kafka's default partitioner does (tests
//     that need a changelog the service did not write: a broken one, for
//     the checker's own tests);
//   - the readings of the JVM harness's flink-read (ParseReadings), the
//     acceptance check that consumers which are not the project's own code
//     read the changelog (integration's TestFlinkReadsDebeziumJSON, Flink
//     SQL through internal/testenv.JVM).
package changelogtest
