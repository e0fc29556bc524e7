package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/service"
	"github.com/billing/ledger/internal/shards"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

const shardsUsage = `Usage:
  billing shards status [--json]
  billing shards add --dsn DSN
  billing shards remove --dsn DSN

The ledger's layout: its servers (MYSQL_DSN, then MYSQL_SHARD_DSNS) in the
order accounts and event ids are placed over, stored in the ledger at its
first start. An instance configured with another list refuses to start
(exit 4).

Commands:
  status    the stored layout, each configured server (its identity, its
            host, an estimate of its tables' rows), how the configured list
            differs from the layout, and what is moving (read-only)
  add       adds a server to the ledger and moves its share of the rows to
            it, step by step, while the instances count (those configured
            without the new server stop: configure it first)
  remove    drains the ledger's last server: moves its rows to the others
            while the instances count; then configure them without it

billing shards COMMAND --help describes one command (docs/production.md).
`

// shardsCmd runs `billing shards ...`. It returns the exit status.
func shardsCmd(args []string, stdout, stderr io.Writer) int {
	return runSubcommand("billing shards", shardsUsage, map[string]command{
		"status": shardsStatus,
		"add":    shardsAdd,
		"remove": shardsRemove,
	}, args, stdout, stderr)
}

func shardsAdd(args []string, stdout, stderr io.Writer) int {
	return moveCmd("billing shards add", "Adds the server of DSN (an empty database, migrated here) to the ledger of the\n"+
		"configured servers (MYSQL_DSN, then MYSQL_SHARD_DSNS), and moves to it its share of\n"+
		"the accounts' and event ids' rows while the instances count: step by step, in key\n"+
		"order; a checkpoint that writes a key of the step under way waits for it. Configure\n"+
		"the instances with the new list first (the DSN last in MYSQL_SHARD_DSNS): an instance\n"+
		"without the new server stops when the move begins (exit 4). Interrupted, it is\n"+
		"resumed by running it again. Exit status: 0 the layout is complete, 4 the configured\n"+
		"servers are not the ledger's, 1 failure. See docs/production.md, Growing.\n",
		"the new server's DSN (go-sql-driver form, as MYSQL_DSN)", service.AddServer,
		"slot(s) on the new server", "", args, stdout, stderr)
}

func shardsRemove(args []string, stdout, stderr io.Writer) int {
	return moveCmd("billing shards remove", "Drains the ledger's last server (the last of MYSQL_SHARD_DSNS, which DSN must name):\n"+
		"a layout without it, and the move of its accounts' and event ids' rows to the\n"+
		"others, step by step while the instances count. Once it is done, configure the\n"+
		"instances without it; its dead letters and changelog outbox stay on it. Only the\n"+
		"last server can be removed. Interrupted, it is resumed by running it again. Exit\n"+
		"status: 0 done, 4 the configured servers are not the ledger's, 1 failure. See\n"+
		"docs/production.md, Growing.\n",
		"the DSN of the server to remove (the last configured one)", service.RemoveServer,
		"slot(s) moved off the removed server", "configure the instances without the removed server\n", args, stdout, stderr)
}

// moveCmd runs billing shards add or remove (name): their flags, the
// move by run, and the report's line (the slots moved, as slots says) and
// then, if any, then; or the failure's status.
func moveCmd(name, help, dsnHelp string,
	run func(context.Context, config.Config, string, shards.AddOptions, *slog.Logger) (*shards.AddReport, error),
	slots, then string, args []string, stdout, stderr io.Writer) int {
	fs := newFlags(name, "--dsn DSN [--step-rows N] [--rest R] [--rest-checkpoints N] [--drain D]", help)
	dsn := fs.String("dsn", "", dsnHelp)
	stepRows := fs.Int("step-rows", 5000, "a step moves the keys of at most this many rows of each table on each server")
	rest := fs.Float64("rest", 2, "rest after each step for at least this multiple of the step's time (0: none)")
	restCkpts := fs.Int("rest-checkpoints", 5, "and until each counting instance committed this many checkpoints (0: none; ends after 2 s without any)")
	drain := fs.Duration("drain", 2*time.Second, "after announcing a step, wait at most this long for the counting instances' checkpoints in flight to decide before freezing it (0: none)")
	if _, code, done := fs.parse(args, 0, stdout, stderr); done {
		return code
	}
	if *dsn == "" {
		fmt.Fprintln(stderr, name+": --dsn is required")
		return 2
	}
	return withConfig(stderr, nil, func(ctx context.Context, cfg config.Config, log *slog.Logger) int {
		if *rest == 0 {
			*rest = -1
		}
		if *drain == 0 {
			*drain = -1
		}
		r, err := run(ctx, cfg, *dsn, shards.AddOptions{StepRows: *stepRows, Rest: *rest, RestCheckpoints: restCheckpoints(*restCkpts), Drain: *drain}, log)
		if err != nil {
			fmt.Fprintln(stderr, name+":", err)
			var mismatch *shards.MismatchError
			if errors.As(err, &mismatch) {
				return exitSettings
			}
			return 1
		}
		fmt.Fprintf(stdout, "layout %s complete: %d %s, %d row(s) moved by this run in %d step(s) (longest %s, moving %s)\n%s",
			r.Layout.Describe(), r.Slots, slots, r.RowsMoved, r.Steps, r.Paused.Round(time.Millisecond), r.Moving.Round(time.Millisecond), then)
		return 0
	})
}

// restCheckpoints is --rest-checkpoints as AddOptions.RestCheckpoints
// (0 there is the default; none is negative).
func restCheckpoints(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

func shardsStatus(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing shards status", "[--json]", "Prints the ledger's layout and its configured servers (read-only; MySQL only).\n"+
		"Exit status: 0 the configured servers are the layout (or none is stored yet), 4 they\ndiffer (an instance configured so refuses to start), 1 failure.\n")
	asJSON := fs.Bool("json", false, "print it as JSON")
	if _, code, done := fs.parse(args, 0, stdout, stderr); done {
		return code
	}
	scope := slices.Concat(config.MySQLSettings(), config.LogSettings())
	return withConfig(stderr, scope, func(ctx context.Context, cfg config.Config, log *slog.Logger) int {
		r, err := readShards(ctx, cfg, log)
		if err != nil {
			fmt.Fprintln(stderr, "billing shards status:", err)
			return 1
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			err = enc.Encode(r)
		} else {
			err = printShards(stdout, r)
		}
		if err != nil {
			fmt.Fprintln(stderr, "billing shards status:", err)
			return 1
		}
		if len(r.Differences) > 0 {
			return exitSettings
		}
		return 0
	})
}

// readShards opens the configured servers and reads their report.
func readShards(ctx context.Context, cfg config.Config, log *slog.Logger) (*shards.Report, error) {
	dsns, err := service.ResolveDSNs(cfg, log)
	if err != nil {
		return nil, err
	}
	d, err := mysqldriver.Open(ctx, dsns, mysqldriver.Options{LockWaitTimeout: cfg.MySQLLockWaitTimeout, MaxConns: 2})
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return shards.Status(ctx, d, shards.Hosts(dsns))
}

func printShards(w io.Writer, r *shards.Report) error {
	var b strings.Builder
	if r.Version == 0 {
		b.WriteString("layout: none stored yet (the first instance of this version stores the configured list)\n")
	} else {
		fmt.Fprintf(&b, "layout: version %d, %d server(s), stored %s by %s\n", r.Version, len(r.Layout), r.RecordedAt.Format(time.RFC3339), r.RecordedBy)
		for i, u := range r.Layout {
			fmt.Fprintf(&b, "  %d  %s\n", i, u)
		}
	}
	b.WriteString("configured servers:\n")
	for _, s := range r.Servers {
		ordinal := "not in the layout"
		if s.Ordinal >= 0 {
			ordinal = fmt.Sprintf("ordinal %d", s.Ordinal)
		}
		ledger := s.Ledger
		if ledger == "" {
			ledger = "unclaimed"
		}
		fmt.Fprintf(&b, "  %d  %s  server %s, %s, ledger %s\n", s.Place, s.Host, s.UUID, ordinal, ledger)
		var rows []string
		for _, t := range s.Tables {
			if t.Rows > 0 {
				rows = append(rows, fmt.Sprintf("%s ~%d", t.Table, t.Rows))
			}
		}
		if len(rows) == 0 {
			rows = []string{"none"}
		}
		fmt.Fprintf(&b, "     rows (estimates): %s\n", strings.Join(rows, ", "))
	}
	switch {
	case r.Version == 0 && len(r.Differences) == 0:
		b.WriteString("the first instance to start stores the configured servers as the ledger's layout\n")
	case len(r.Differences) == 0:
		b.WriteString("the configured servers are the ledger's layout\n")
	default:
		b.WriteString("the configured servers differ from the ledger's layout (an instance configured so refuses to start):\n")
		for _, d := range r.Differences {
			fmt.Fprintf(&b, "  - %s\n", d)
		}
	}
	fmt.Fprintf(&b, "moving: %s\n", r.Moving)
	_, err := io.WriteString(w, b.String())
	return err
}
