// Command billing-bench measures the billing service against its limits and
// against the naive approach it replaces (`make bench`; docs/performance.md
// has the method and the figures; `billing-bench -h` lists the flags).
//
// The command only reads its flags into a bench.Config and calls bench.Run
// (internal/bench holds the measurements); with -child it is one of the
// child processes Run starts (bench.Child).
package main
