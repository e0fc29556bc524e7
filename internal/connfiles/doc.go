// Package connfiles reads the files an operator mounts into a container to
// configure connections: secrets (a password file) and TLS material (a CA
// bundle, a client certificate and its key). Errors name the file, never its
// content.
package connfiles
