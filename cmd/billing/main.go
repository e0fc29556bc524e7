package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/periods"
	"github.com/billing/ledger/internal/service"
	"github.com/billing/ledger/internal/shards"
)

// exitSettings is the exit status of an instance whose period settings or
// servers are not its ledger's (periods.MismatchError,
// shards.MismatchError): the configuration is valid, but not for this
// ledger.
const exitSettings = 4

func main() {
	if _, ok := os.LookupEnv("GOMEMLIMIT"); !ok { // GOMEMLIMIT overrides it
		debug.SetMemoryLimit(service.DefaultMemoryLimit)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return runService(nil, stdout, stderr)
	}
	switch args[0] {
	case "-h", "-help", "--help":
		return printHelp(stdout, stderr)
	case "help":
		if len(args) > 1 { // billing help status = billing status --help
			return run([]string{args[1], "--help"}, stdout, stderr)
		}
		return printHelp(stdout, stderr)
	case "-version", "--version", "version":
		return versionCmd(args[1:], stdout, stderr)
	case "run":
		return runService(args[1:], stdout, stderr)
	case "migrate":
		return migrateCmd(args[1:], stdout, stderr)
	case "status":
		return statusCmd(args[1:], stdout, stderr)
	case "compare":
		return compareCmd(args[1:], stdout, stderr)
	case "deadletters":
		return deadLetters(args[1:], stdout, stderr)
	case "periods":
		return periodsCmd(args[1:], stdout, stderr)
	case "shards":
		return shardsCmd(args[1:], stdout, stderr)
	case "changelog":
		return changelogCmd(args[1:], stdout, stderr)
	case "healthcheck":
		return healthcheck(args[1:], stdout, stderr)
	}
	if strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "billing: unknown flag %q (try billing --help)\n", args[0])
	} else {
		fmt.Fprintf(stderr, "billing: unknown command %q (try billing --help)\n", args[0])
	}
	return 2
}

func printHelp(stdout, stderr io.Writer) int {
	fmt.Fprint(stdout, helpText)
	if err := config.Usage(stdout); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// runService runs `billing [run]`: the service, until SIGTERM/SIGINT.
func runService(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing run", "", "Runs the service: consumes KAFKA_TOPIC as a member of KAFKA_GROUP and commits the\nledger to MySQL at every checkpoint, until SIGTERM or SIGINT. `billing` alone does\nthe same. Configured by environment variables only (billing --help lists them).\n")
	if _, code, done := fs.parse(args, 0, stdout, stderr); done {
		return code
	}
	return withConfig(stderr, nil, func(ctx context.Context, cfg config.Config, log *slog.Logger) int {
		if err := service.Run(ctx, cfg, service.Options{Logger: log}); err != nil {
			log.Error("billing stopped", "err", err)
			var mismatch *periods.MismatchError
			var layout *shards.MismatchError
			if errors.As(err, &mismatch) || errors.As(err, &layout) {
				return exitSettings
			}
			return 1
		}
		return 0
	})
}

// migrateCmd runs `billing migrate`.
func migrateCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing migrate", "", "Applies the pending schema migrations to every server (MYSQL_DSN and\nMYSQL_SHARD_DSNS) under goose's lock, then exits. Needs an account allowed to\nrun DDL (see docs/operations.md).\n")
	if _, code, done := fs.parse(args, 0, stdout, stderr); done {
		return code
	}
	return withConfig(stderr, slices.Concat(config.MySQLSettings(), config.LogSettings()), func(ctx context.Context, cfg config.Config, log *slog.Logger) int {
		if err := service.Migrate(ctx, cfg, log); err != nil {
			log.Error("migration failed", "err", err)
			return 1
		}
		return 0
	})
}

const helpText = `billing: exactly-once Kafka → MySQL billing ledger.

Usage:
  billing [run]          run the service
  billing migrate        apply the schema migrations to every server and exit
  billing status         where the ledger stands: positions, lag, owners, the last
                         checkpoint, branches in doubt, dead letters waiting (--json)
  billing compare        compare this ledger with another, exactly (--other-dsn DSN):
                         tells when a rebuilt ledger has caught up
  billing deadletters    list | show ID | reinject ID  (billing deadletters --help)
  billing periods        show | change: the ledger's period settings, stored in the
                         ledger; change them with every instance stopped
  billing shards         status: the ledger's layout, its servers in order, stored in
                         the ledger (billing shards --help)
  billing changelog     recover-progress: rebuild a lost progress record of the
                         changelog from its topics (billing changelog --help)
  billing healthcheck    GET /readyz on HTTP_ADDR's port: exit 0 on 200, 1 otherwise
                         (--path /healthz for liveness); for container health checks
  billing version        version, commit and Go version of this build (also --version)
  billing --help         this text; billing COMMAND --help (or billing help COMMAND)
                         describes one command and never runs it

Exit status: 0 success or clean shutdown, 1 runtime failure or refusal, 2
configuration or usage error, 4 period settings or servers not the ledger's
(billing periods show, billing shards status), 130 second signal during
shutdown.

Environment (every setting; DSNs and secrets are never logged):
`

// signalContext is cancelled by the first SIGTERM or SIGINT, which starts a
// graceful shutdown. A second signal exits at once: safe, since nothing is
// counted until its checkpoint commits and an interrupted checkpoint is
// resolved by recovery.
func signalContext(log *slog.Logger) (context.Context, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s, ok := <-ch
		if !ok {
			return
		}
		log.Info("shutting down; a second signal exits at once", "signal", s.String())
		cancel()
		if s, ok = <-ch; ok {
			log.Warn("second signal: exiting now", "signal", s.String())
			os.Exit(130)
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		cancel()
	}
}
