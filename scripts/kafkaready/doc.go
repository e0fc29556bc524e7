// Command kafkaready waits until a Kafka cluster answers metadata requests.
//
// scripts/services.sh runs it after launching the broker: a KRaft broker
// only serves client requests once it is registered with the controller
// and unfenced, so a metadata response that lists at least one broker means
// producers, consumers and admin requests can start. An open TCP port alone
// does not mean that.
//
//	go run ./scripts/kafkaready -brokers 127.0.0.1:9092 -timeout 60s [-pid N]
//
// It exits 0 once ready, 1 when the deadline passes or the process given by
// -pid (the broker's JVM) exits first, so a crash is reported at once
// instead of after the whole timeout.
package main
