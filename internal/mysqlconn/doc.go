// Package mysqlconn applies the service's MySQL connection settings that do
// not belong in a DSN to every DSN: a password read from a file
// (MYSQL_PASSWORD_FILE) and TLS (MYSQL_TLS, MYSQL_TLS_CA_FILE, client
// certificates). It also redacts DSNs for logs.
//
// # Guarantees
//
//   - [Options.Apply] fails on any unreadable file or unknown mode; it never
//     falls back to plaintext when TLS was asked for.
//   - A custom CA or client certificate is registered with
//     go-sql-driver/mysql (mysql.RegisterTLSConfig, the driver's only way to
//     name a custom tls.Config in a DSN) under a name derived from a hash of
//     the mode and the certificates' contents. Registering is therefore
//     idempotent: the same settings always map to the same name and the same
//     configuration, and different settings never overwrite each other, so
//     tests and tools may call Apply any number of times.
//   - [Redact] never returns a password, and returns a fixed placeholder for
//     a DSN it cannot parse (which may contain one).
package mysqlconn
