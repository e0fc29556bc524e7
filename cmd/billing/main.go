// Command billing runs the exactly-once billing ledger: it consumes billing
// events from Kafka as a member of a consumer group and commits balances,
// billing windows, dead letters and its input offsets to MySQL atomically at
// every checkpoint.
//
// Usage:
//
//	billing                run the service (configured by environment variables)
//	billing migrate        apply the schema migrations and exit
//	billing deadletters …  list, show and reinject dead letters (see deadletters.go)
//	billing healthcheck    probe /readyz of the local instance (container health check)
//	billing --help         print the environment variables, defaults and meanings
//
// Exit status: 0 after a clean shutdown, 1 on a runtime failure (or a
// refused dead-letter operation), 2 on a configuration or usage error, 130
// when a second SIGTERM/SIGINT cut a graceful shutdown short.
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

	"golang.org/x/term"

	"github.com/billing/ledger/internal/config"
)

// defaultMemoryLimit is the Go runtime's soft memory limit when GOMEMLIMIT
// is not set: the heap (dedup cache, buffered records, fetched batches)
// stays well below the 512 MiB a container of this service is sized for,
// because the collector works harder as the limit nears instead of letting
// the heap double between cycles. Set GOMEMLIMIT to override it.
const defaultMemoryLimit = 400 << 20

func main() {
	if _, ok := os.LookupEnv("GOMEMLIMIT"); !ok {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cmd := ""
	if len(args) > 0 {
		cmd = args[0]
	}
	switch cmd {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, helpText)
		if err := config.Usage(stdout); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return 0
	case "healthcheck":
		return healthcheck(args[1:], stdout, stderr)
	case "deadletters":
		if len(args) < 2 || slices.Contains([]string{"-h", "-help", "--help", "help"}, args[1]) {
			fmt.Fprint(stdout, deadLettersUsage)
			if len(args) < 2 {
				return 2
			}
			return 0
		}
	case "", "run", "migrate":
	default:
		fmt.Fprintf(stderr, "billing: unknown command %q (try --help)\n", cmd)
		return 2
	}

	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintln(stderr, "billing:", err)
		var ce *config.Error
		if errors.As(err, &ce) {
			return 2
		}
		return 1
	}
	log := newLogger(cfg, stderr)

	ctx, stop := signalContext(log)
	defer stop()

	if cmd == "deadletters" {
		return deadLetters(ctx, cfg, log, args[1:], stdout, stderr)
	}
	if cmd == "migrate" {
		if err := migrate(ctx, cfg, log); err != nil {
			log.Error("migration failed", "err", err)
			return 1
		}
		return 0
	}
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("billing stopped", "err", err)
		return 1
	}
	return 0
}

const helpText = `billing: exactly-once Kafka → MySQL billing ledger.

Usage:
  billing                run the service
  billing migrate        apply the schema migrations to every server and exit
  billing deadletters    list | show ID | reinject ID  (billing deadletters help)
  billing healthcheck    GET /readyz on HTTP_ADDR's port: exit 0 on 200, 1 otherwise
                         (--path /healthz for liveness); for container health checks
  billing --help         this text

Exit status: 0 clean shutdown, 1 runtime failure, 2 configuration or usage
error, 130 second signal during shutdown.

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

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(strings.ToUpper(cfg.LogLevel)))
	opts := &slog.HandlerOptions{Level: level}
	format := cfg.LogFormat
	if format == "auto" {
		format = "json"
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			format = "text"
		}
	}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
