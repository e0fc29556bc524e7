// Package kafkaconn turns the service's Kafka connection settings (brokers,
// TLS, SASL) into franz-go client options, shared by the pipeline's consumer
// and the dead-letter tooling's producer.
//
// # Guarantees
//
//   - A misconfiguration (unreadable file, unknown mechanism, a password
//     without a user) is an error from [Config.Opts] at start, never a
//     silent fallback to plaintext or to no authentication.
//   - Secrets are read once, at [Config.Opts]; they appear in no error and
//     in no log value ([Config.LogValue] names the mechanism and the user,
//     never the password).
//   - TLS is 1.2 or newer and verifies the brokers' certificates against the
//     system roots or the given CA bundle, and their names against the
//     address dialled (or KAFKA_TLS_SERVER_NAME). There is deliberately no
//     option to skip verification.
//
// SASL/PLAIN sends the password as is: use it only with TLS. SCRAM never
// sends the password but, without TLS, the session itself is in clear.
package kafkaconn
