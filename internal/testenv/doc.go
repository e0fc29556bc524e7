// Package testenv is the project's one test environment: the Kafka cluster
// and the MySQL-compatible servers tests run against, throwaway databases
// (ledger databases migrated by migrations.Up) and topics so that tests
// never share state, the service's binaries as processes to kill, and the
// helpers every test needs (Eventually, Produce, Logger, InDoubt).
//
// Where the services come from, in order:
//
//  1. KAFKA_BROKERS (comma-separated host:port list) and MYSQL_DSN (an admin
//     DSN without a database, e.g. root:root@tcp(127.0.0.1:3306)/). `make
//     test` starts local services with scripts/services.sh and sets both.
//  2. Containers through testcontainers-go when a Docker engine (or Podman's
//     Docker API, through DOCKER_HOST) is reachable: Kafka
//     (TESTCONTAINERS_KAFKA_IMAGE, default confluentinc/confluent-local:7.6.0)
//     and a MySQL-compatible server as root (TESTCONTAINERS_MYSQL_IMAGE,
//     default mysql:8.4; a second one for MySQL2), with the server settings
//     of scripts/services.sh. They are started at most once per test binary
//     and removed by Main, which the package's TestMain must call: the
//     reaper (Ryuk) may be unavailable (TESTCONTAINERS_RYUK_DISABLED=true
//     where no registry answers). `make test-containers` runs this path
//     with locally built images (docs/docker.md).
//  3. Otherwise the test is skipped, telling how to run it. With CI=true a
//     missing service fails the test instead: CI must never pass by
//     silently skipping the integration suite.
//
// A variable that is set but points at a service that does not answer
// always fails the test: that is a broken setup, not an absent one.
//
// In -short mode (`make test-unit`) every test that asks for a service is
// skipped.
package testenv
