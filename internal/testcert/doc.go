// Package testcert generates throwaway certificates for tests: a CA, a
// server certificate for localhost / 127.0.0.1 signed by it, and a client
// certificate. Keys are ECDSA P-256, valid for one day. Not for production.
package testcert
