package main

import (
	"fmt"
	"io"
)

// command runs one command of the billing binary with its arguments and
// returns its exit status.
type command func(args []string, stdout, stderr io.Writer) int

// runSubcommand runs the command of group name (billing deadletters,
// billing periods, ...) that args[0] names: with no command, or an unknown
// one, it prints usage to stderr and returns 2; --help prints it to stdout
// and returns 0.
func runSubcommand(name, usage string, cmds map[string]command, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	if run, ok := cmds[args[0]]; ok {
		return run(args[1:], stdout, stderr)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "%s: unknown command %q\n\n%s", name, args[0], usage)
	return 2
}
