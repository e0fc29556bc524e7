package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/service"
)

// cliFlags is a subcommand's flag set and its help. Every subcommand parses
// its arguments with it before it reads the configuration or connects to
// anything, so that -h/--help only prints help (exit 0) and a bad argument
// only prints the problem (exit 2).
type cliFlags struct {
	*flag.FlagSet
	name     string // "billing status"
	synopsis string // "billing status [--json]"
	about    string // what the command does, a few lines
}

// newFlags starts the flag set of the command name ("billing status"),
// whose arguments are summarised by args ("[--json]").
func newFlags(name, args, about string) *cliFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors and help are printed by parse
	return &cliFlags{FlagSet: fs, name: name, synopsis: strings.TrimSpace(name + " " + args), about: about}
}

// usage writes the command's help: synopsis, description and flags.
func (f *cliFlags) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage:\n  %s\n\n%s", f.synopsis, f.about)
	if !strings.HasSuffix(f.about, "\n") {
		fmt.Fprintln(w)
	}
	var flags bytes.Buffer
	f.SetOutput(&flags)
	f.PrintDefaults()
	f.SetOutput(io.Discard)
	if flags.Len() > 0 {
		fmt.Fprintf(w, "\nFlags:\n%s", flags.String())
	}
}

// parse parses flags placed before, between or after the positional
// arguments and checks that there are exactly positional of those (any
// number when positional < 0). When done is true the command must return
// code at once: 0 after -h/--help (help on stdout), 2 after a usage error
// (the problem and the help on stderr).
func (f *cliFlags) parse(args []string, positional int, stdout, stderr io.Writer) (pos []string, code int, done bool) {
	for {
		if err := f.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				f.usage(stdout)
				return nil, 0, true
			}
			return nil, f.fail(stderr, err), true
		}
		args = f.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if positional >= 0 && len(pos) != positional {
		return nil, f.fail(stderr, fmt.Errorf("want %d argument(s), got %d", positional, len(pos))), true
	}
	return pos, 0, false
}

// fail reports a usage error and returns its exit status, 2.
func (f *cliFlags) fail(stderr io.Writer, err error) int {
	fmt.Fprintf(stderr, "%s: %v\n\n", f.name, err)
	f.usage(stderr)
	return 2
}

// usageError is a problem with the arguments found after parsing (a
// malformed id, a value out of range): exit status 2, like a bad flag.
type usageError struct{ error }

// withConfig reads the configuration, builds the logger and a context
// cancelled by SIGTERM/SIGINT, and runs fn. A configuration error exits 2.
// scope names the settings the command reads (nil: every one, the
// service); the others are neither required nor checked.
func withConfig(stderr io.Writer, scope config.Scope, fn func(ctx context.Context, cfg config.Config, log *slog.Logger) int) int {
	cfg, err := config.LoadScope(scope)
	if err != nil {
		fmt.Fprintln(stderr, "billing:", err)
		var ce *config.Error
		if errors.As(err, &ce) {
			return 2
		}
		return 1
	}
	log := service.NewLogger(cfg, stderr)
	ctx, stop := signalContext(log)
	defer stop()
	return fn(ctx, cfg, log)
}
