// Package format decodes Kafka records of every supported wire format into
// the billing [event.Event]: JSON (the contract of package event, read by
// its fast decoder when the default mapping applies), and CloudEvents in
// the Kafka protocol binding, structured mode (application/cloudevents+json)
// and binary mode (ce_* headers, the data in the configured format).
//
// Every format decodes a record into a tree of values and reads the
// contract values from it through one [event.Mapping], so the same event
// carried in any format, or re-encoded, yields the same Event and the same
// fingerprint: a repeat is a repeat whatever its bytes.
//
// The registry formats read the common shape of an event's schema on a
// shorter way to the same tree (plans: avroPlan, protoPlan, quickSchema),
// and take the general way for any other schema, and for any record the
// short way does not read cleanly, so that a dead letter's reason and
// detail are the general way's. The tests hold the two ways to the same
// events and dead letters (plans_test.go).
//
// Errors: a record that cannot be decoded or does not fit the mapping gives
// an *event.DecodeError (a dead letter with its reason); a CloudEvent whose
// type the filter excludes gives ErrSkipped (counted, not a dead letter).
package format
