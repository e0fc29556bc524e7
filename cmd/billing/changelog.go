package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/publisher"
	"github.com/billing/ledger/internal/service"
)

const changelogUsage = `Usage:
  billing changelog recover-progress [--dry-run] [--json] [--timeout D]

recover-progress is the way back from a lost progress record of the
changelog (the publisher logs "the progress topic holds less than MySQL's
published hint" and publishes nothing; billing status lists it among the
waits). It rebuilds the record from what the changelog's topics hold (each
change event names its checkpoint and commit_seq: the last ones say how far
the changelog is published) and MySQL's published hint, and writes it to
the progress topic, creating that topic (one partition, compacted) if it is
missing. Nothing a consumer already has is published again. Safe while
instances run: it fences their publisher for a moment, and it changes
nothing when the record is not lost. The publisher goes on by itself
within seconds.

A progress topic of several partitions is refused: delete it first
(docs/production.md, "The changelog's topics").

Reads the MySQL, Kafka and CHANGELOG_* settings.
`

// changelogCmd runs `billing changelog ...`.
func changelogCmd(args []string, stdout, stderr io.Writer) int {
	return runSubcommand("billing changelog", changelogUsage, map[string]command{
		"recover-progress": recoverProgressCmd,
	}, args, stdout, stderr)
}

func recoverProgressCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing changelog recover-progress", "[--dry-run] [--json] [--timeout D]",
		"Rebuilds a lost progress record of the changelog from the changelog's topics and\nwrites it (billing changelog --help).\n")
	dryRun := fs.Bool("dry-run", false, "say what would be written, write nothing")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	timeout := fs.Duration("timeout", 2*time.Minute, "bound on the whole command")
	if _, code, done := fs.parse(args, 0, stdout, stderr); done {
		return code
	}
	if *timeout <= 0 {
		return fs.fail(stderr, fmt.Errorf("--timeout must be positive"))
	}
	scope := slices.Concat(config.MySQLSettings(), config.KafkaSettings(), config.LogSettings(), config.Scope{"CHANGELOG_"})
	return withConfig(stderr, scope, func(ctx context.Context, cfg config.Config, log *slog.Logger) int {
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		rec, err := service.RecoverChangelogProgress(ctx, cfg, log, !*dryRun)
		if err != nil {
			fmt.Fprintln(stderr, "billing changelog recover-progress:", err)
			return 1
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(rec); err != nil {
				fmt.Fprintln(stderr, "billing changelog recover-progress:", err)
				return 1
			}
			return 0
		}
		printRecovery(stdout, rec)
		return 0
	})
}

// printRecovery says what recover-progress found and did.
func printRecovery(w io.Writer, r publisher.Recovery) {
	switch {
	case !r.Lost && r.Found == nil:
		fmt.Fprintf(w, "no progress record, and none is lost (MySQL's published hint %d: nothing published since the enabling): nothing to recover\n", r.Hint)
		return
	case !r.Lost:
		fmt.Fprintf(w, "the progress record is there (%s): nothing to recover\n", progressText(r.Found))
		return
	}
	last := "no change event"
	if r.LastCommitSeq > 0 {
		last = fmt.Sprintf("checkpoint %d", r.LastCommitSeq)
		if r.LastEvents > 0 {
			last += fmt.Sprintf(" (%d events of it)", r.LastEvents)
		}
	}
	fmt.Fprintf(w, "the progress record is lost (found: %s; MySQL's published hint: %d; the topics' last change event: %s)\n",
		progressText(r.Found), r.Hint, last)
	if r.Written {
		fmt.Fprintf(w, "rebuilt and written: %s; the publisher goes on from there\n", progressText(r.Rebuilt))
	} else {
		fmt.Fprintf(w, "would be rebuilt as: %s (--dry-run: nothing written)\n", progressText(r.Rebuilt))
	}
}

func progressText(p *publisher.Progress) string {
	switch {
	case p == nil:
		return "none"
	case p.Snapshot != nil:
		return fmt.Sprintf("the snapshot of the rows before %d, at server %d table %s", p.From, p.Snapshot.Server, p.Snapshot.Table)
	case p.Parts > 0:
		return fmt.Sprintf("published through checkpoint %d and the first %d outbox rows of checkpoint %d", p.Seq, p.Parts, p.Seq+1)
	}
	return fmt.Sprintf("published through checkpoint %d", p.Seq)
}
