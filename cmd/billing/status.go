package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/ledgerstatus"
	"github.com/billing/ledger/internal/periods"
	"github.com/billing/ledger/internal/txsink"
)

// statusCmd runs `billing status [--json] [--timeout D]`: where the ledger
// stands. It needs only the Kafka and MySQL settings, runs only SELECT and
// XA RECOVER, and joins no group (it lists offsets and describes the group
// with admin requests). Exit status 1 when part of the report could not be
// read (the rest is printed).
func statusCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing status", "[--json] [--timeout D]",
		`Prints where the ledger of KAFKA_TOPIC and KAFKA_GROUP stands, changing nothing:
per partition the log start (the oldest record retention kept), the stored
position (partition_offsets.next_offset; "start" = from the start of the log,
"-" = never claimed), the log end (last stable offset), the lag, the owner
(instance id) and its epoch, and the group member it is assigned to; the last committed checkpoint and its age; the XA branches in doubt; and the
dead letters not re-injected, by reason. Needs only the Kafka and MySQL settings.
`)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on collecting the report")
	if _, code, done := fs.parse(args, 0, stdout, stderr); done {
		return code
	}
	if *timeout <= 0 {
		return fs.fail(stderr, fmt.Errorf("--timeout must be positive"))
	}
	return withConfig(stderr, func(ctx context.Context, cfg config.Config, log *slog.Logger) int {
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		r, err := collectStatus(ctx, cfg, log)
		if err != nil {
			fmt.Fprintln(stderr, "billing status:", err)
			return 1
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			err = enc.Encode(r)
		} else {
			err = printStatus(stdout, r)
		}
		if err != nil {
			fmt.Fprintln(stderr, "billing status:", err)
			return 1
		}
		if len(r.Problems) > 0 {
			fmt.Fprintf(stderr, "billing status: %d part(s) of the report could not be read:\n  %s\n", len(r.Problems), strings.Join(r.Problems, "\n  "))
			return 1
		}
		return 0
	})
}

func collectStatus(ctx context.Context, cfg config.Config, log *slog.Logger) (*ledgerstatus.Report, error) {
	dbs, c, err := openServers(cfg, log)
	if err != nil {
		return nil, err
	}
	defer closeAll(dbs)
	cl, err := kgo.NewClient(append(c.kopts, kgo.WithLogger(kgo.BasicLogger(io.Discard, kgo.LogLevelNone, nil)))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	servers := make([]*sql.DB, len(dbs))
	for i, db := range dbs {
		servers[i] = db.DB
	}
	r, err := ledgerstatus.Collect(ctx, ledgerstatus.Sources{Servers: servers, Kafka: kadm.NewClient(cl), Topic: cfg.KafkaTopic, Group: cfg.KafkaGroup})
	if err != nil {
		return nil, err
	}
	// The period settings are the ledger's; the environment's only for a
	// ledger that has none stored.
	switch stored, err := periods.Read(ctx, dbs[0]); {
	case err != nil:
		r.Problems = append(r.Problems, "period settings: "+err.Error())
	case len(stored) > 0:
		r.Periods = &ledgerstatus.Periods{Source: "ledger", Windows: stored.Describe(), WindowsClose: stored.Current().Close}
	default:
		log.Warn("this ledger has no period settings stored (never started by this version): showing this environment's")
		r.Periods = &ledgerstatus.Periods{Source: "environment", Windows: cfg.Period().String(), WindowsClose: cfg.WindowCloseAfter > 0}
	}
	return r, nil
}

// printStatus renders the report for a terminal. Identifiers that come
// from outside (instance ids, hosts, xids) go through safeText.
func printStatus(w io.Writer, r *ledgerstatus.Report) error {
	ago := func(secs float64) string {
		return (time.Duration(secs * float64(time.Second))).Round(time.Millisecond).String()
	}
	fmt.Fprintf(w, "topic %s, group %s (%s, %d members), at %s\n\n", safeText(r.Topic, 256), safeText(r.Group, 256),
		orDash(r.GroupState), len(r.Members), r.At.Format(time.RFC3339))
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tLOG_START\tSTORED\tLOG_END\tLAG\tOWNER\tEPOCH\tUPDATED\tMEMBER")
	for _, p := range r.Partitions {
		stored, owner, epoch, updated := "-", "-", "-", "-"
		if p.Claimed {
			stored = strconv.FormatInt(p.StoredOffset, 10)
			if p.StoredOffset == txsink.StartOffset {
				stored = "start"
			}
			owner, epoch = safeText(p.Owner, 64), strconv.FormatInt(p.Epoch, 10)
			updated = ago(r.At.Sub(*p.UpdatedAt).Seconds()) + " ago"
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", p.Partition, p.LogStart, stored, p.LogEnd, p.Lag, owner, epoch, updated, orDash(safeText(p.Member, 128)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "total lag: %d records\n\n", r.TotalLag)

	if c := r.LastCheckpoint; c != nil {
		fmt.Fprintf(w, "last committed checkpoint: %s by %s at %s (%s ago)\n\n", safeText(c.Gtrid, 64), safeText(c.DecidedBy, 64),
			c.DecidedAt.Format(time.RFC3339Nano), ago(c.AgeSeconds))
	} else {
		fmt.Fprint(w, "last committed checkpoint: none recorded\n\n")
	}

	others := ""
	if r.OtherLedgersInDoubt > 0 {
		others = fmt.Sprintf(" (and %d of other ledgers sharing these servers, theirs to resolve)", r.OtherLedgersInDoubt)
	}
	if len(r.InDoubt) == 0 {
		fmt.Fprintf(w, "branches in doubt: none%s\n\n", others)
	} else {
		fmt.Fprintf(w, "branches in doubt: %d%s\n", len(r.InDoubt), others)
		tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "SERVER\tGTRID\tBQUAL\tAGE\tDECISION")
		for _, b := range r.InDoubt {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", b.Server, safeText(b.Gtrid, 64), safeText(b.Bqual, 64), ago(b.AgeSeconds), orDash(b.Decision))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}

	printStatusPeriods(w, r.Periods)
	if len(r.DeadLetters) == 0 {
		fmt.Fprintln(w, "dead letters not re-injected: none")
		return nil
	}
	var total int64
	for _, d := range r.DeadLetters {
		total += d.Count
	}
	fmt.Fprintf(w, "dead letters not re-injected: %d (billing deadletters list --pending)\n", total)
	tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "REASON\tCOUNT\tOLDEST")
	for _, d := range r.DeadLetters {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", safeText(d.Reason, 64), d.Count, d.Oldest.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

// printStatusPeriods prints the ledger's period settings, and where they
// come from.
func printStatusPeriods(w io.Writer, p *ledgerstatus.Periods) {
	if p == nil {
		fmt.Fprint(w, "periods: unknown (could not be read)\n\n")
		return
	}
	closing := "windows never close"
	if p.WindowsClose {
		closing = "windows close"
	}
	from := "stored in the ledger; billing periods show"
	if p.Source != "ledger" {
		from = "none stored in the ledger: this environment's"
	}
	fmt.Fprintf(w, "periods: %s; %s (%s)\n\n", p.Windows, closing, from)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
