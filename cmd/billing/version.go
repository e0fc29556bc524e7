package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/billing/ledger/internal/buildinfo"
)

// versionCmd runs `billing version [--json]` (also `billing --version`): the
// version, commit and Go version of this build, from internal/buildinfo. It
// reads no configuration.
func versionCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing version", "[--json]", "Prints the version, the commit and the Go version of this build (stamped at link\ntime by `make image` and the Dockerfile; otherwise what the Go toolchain\nrecorded). The same values label the billing_build_info metric.\n")
	asJSON := fs.Bool("json", false, "print a JSON object instead of one line")
	if _, code, done := fs.parse(args, 0, stdout, stderr); done {
		return code
	}
	info := buildinfo.Get()
	if *asJSON {
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(info); err != nil {
			fmt.Fprintln(stderr, "billing version:", err)
			return 1
		}
		return 0
	}
	commit := info.Commit
	if info.Modified {
		commit += " (modified)"
	}
	fmt.Fprintf(stdout, "billing %s commit %s %s\n", info.Version, commit, info.GoVersion)
	return 0
}
