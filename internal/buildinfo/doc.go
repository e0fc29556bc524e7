// Package buildinfo says which build of the service is running.
//
// Version and Commit are stamped at link time by `make image` and the
// Dockerfile:
//
//	go build -ldflags "-X github.com/billing/ledger/internal/buildinfo.Version=v1.2.3 \
//	    -X github.com/billing/ledger/internal/buildinfo.Commit=0123abc" ./cmd/billing
//
// A plain `go build` inside a git checkout leaves them empty; Get then falls
// back to what the Go toolchain recorded (the module version and
// vcs.revision from runtime/debug.ReadBuildInfo).
package buildinfo
