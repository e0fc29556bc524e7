// Package changelog publishes the ledger's changes to Kafka exactly once
// (the design and the format are in docs/changelog.md).
//
// The format: Tables are the topics' tables, their columns and primary
// keys; a change is kept in the outbox in a binary form (Change, rows of
// Value, packed into blobs with Pack) and turned into a Kafka record, the
// Debezium change-event envelope in JSON keyed by the primary key's JSON,
// by an Encoder. Encode does the same from Go values (Event, Row), for
// tests and checkers.
package changelog
