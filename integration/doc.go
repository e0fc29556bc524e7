// Package integration holds end-to-end tests that run against real Kafka
// and MySQL-compatible servers; see package testenv (internal/testenv) for where those come
// from. `make test` starts local ones; `make test-unit` (-short) skips
// these tests.
package integration
