// Command billing runs the exactly-once billing ledger: it consumes billing
// events from Kafka as a member of a consumer group and commits balances,
// billing windows, dead letters and its input offsets to MySQL atomically at
// every checkpoint.
//
// Usage:
//
//	billing [run]          run the service (configured by environment variables)
//	billing migrate        apply the schema migrations and exit
//	billing status         where the ledger stands (read-only; --json)
//	billing compare        compare this ledger with another, exactly
//	billing deadletters …  list, show and reinject dead letters (see deadletters.go)
//	billing periods …      show and change the ledger's period settings (periods.go)
//	billing shards status  the ledger's layout, its servers in order (shards.go)
//	billing healthcheck    probe /readyz of the local instance (container health check)
//	billing version        version, commit and Go version (also --version)
//	billing --help         print the environment variables, defaults and meanings
//
// Every command parses its arguments before it reads the configuration:
// -h/--help prints help and exits 0 without connecting to anything, an
// unknown flag or command exits 2.
//
// Exit status: 0 after a clean shutdown, 1 on a runtime failure (or a
// refused dead-letter operation), 2 on a configuration or usage error, 4
// when the period settings or the servers are not the ledger's (billing
// periods show, billing shards status), 130 when a second SIGTERM/SIGINT cut a graceful shutdown short.
package main
