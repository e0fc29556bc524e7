package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/ledgerstatus"
	"github.com/billing/ledger/internal/safetext"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// statusCmd runs `billing status [--json] [--timeout D] [--instance URL]...`: where the ledger
// stands. It needs only the Kafka and MySQL settings, runs only SELECT and
// XA RECOVER, and joins no group (it lists offsets and describes the group
// with admin requests). A part that could not be read is shown as unknown
// with its error (exit 3); the rest is printed.
func statusCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing status", "[--json] [--timeout D] [--instance URL]...",
		`Prints where the ledger of KAFKA_TOPIC and KAFKA_GROUP stands, changing nothing:
per partition the log start (the oldest record retention kept), the stored
position (partition_offsets.next_offset; "start" = from the start of the log,
"-" = never claimed), the log end (last stable offset), the lag, the owner
(instance id) and its epoch, and the group member it is assigned to; the last
committed checkpoint and its age; the commit log's visible position; the XA
branches in doubt; and the dead letters not re-injected, by reason. Needs only the Kafka and MySQL settings;
with EVENT_FORMAT avro, protobuf or json-schema, the text report also says whether
SCHEMA_REGISTRY_URL answers (while it does not, records naming a schema the
service has not compiled yet wait, and nothing is counted).

It also lists what instances wait for, and since when (their /waits endpoint:
the commit log settling at a start, an open Kafka transaction, the changelog's
backlog holding checkpoints, a changelog waiting for an operator's repair),
and the records each skipped since it started (their /records endpoint:
CloudEvents of a type EVENT_CLOUDEVENT_TYPES does not select, which no table
of the ledger holds; shown when some were, or when EVENT_CLOUDEVENT_TYPES is
set): the instances given with --instance (the base URL of their HTTP_ADDR),
else the one on this host's HTTP_ADDR (as billing healthcheck), whose
silence is only said.

A part that could not be read (MySQL refused the account, a broker did not
answer) is shown as "unknown" with its error, never guessed. A topic the
brokers do not know, or a group without positions in a ledger that holds
other groups' positions (a wrong KAFKA_GROUP), is said plainly, with the
groups the ledger holds.

Exit status:
  0  the whole report was read
  1  the topic does not exist on the brokers, or KAFKA_GROUP has no
     positions of KAFKA_TOPIC in a ledger that holds other groups' positions
  2  usage or configuration error
  3  part of the report could not be read (it is shown as unknown)
`)
	asJSON := fs.Bool("json", false, "print the report as JSON (a document is printed whatever could be read)")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on collecting the report")
	var instances stringsFlag
	fs.Var(&instances, "instance", "base URL of an instance's HTTP endpoints whose waits to list (repeatable); unanswered: part unknown")
	if _, code, done := fs.parse(args, 0, stdout, stderr); done {
		return code
	}
	if *timeout <= 0 {
		return fs.fail(stderr, fmt.Errorf("--timeout must be positive"))
	}
	return withConfig(stderr, statusScope(), func(ctx context.Context, cfg config.Config, log *slog.Logger) int {
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		r, err := collectStatus(ctx, cfg, log)
		if err != nil {
			fmt.Fprintln(stderr, "billing status:", err)
			return exitUnreadable
		}
		asked, required := []string(instances), true
		if len(asked) == 0 {
			if base, ok := localInstance(); ok {
				asked, required = []string{base}, false
			}
		}
		r.AddWaits(ctx, &http.Client{Timeout: 5 * time.Second}, asked, required)
		r.CloudEventTypes = cfg.EventCloudEventTypes
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			err = enc.Encode(r)
		} else {
			err = printStatus(stdout, r)
			if line := registryStatus(ctx, cfg); err == nil && line != "" {
				_, err = fmt.Fprintln(stdout, line)
			}
		}
		if err != nil {
			fmt.Fprintln(stderr, "billing status:", err)
			return 1
		}
		return statusExit(r, stderr)
	})
}

// Exit statuses of billing status beyond exitEqual (0, complete) and
// exitUnreadable (3, part unknown).
const exitStatusAbsent = 1 // the topic, or the group's positions, do not exist

// statusExit is the report's exit status; it repeats on stderr what made
// it other than 0.
func statusExit(r *ledgerstatus.Report, stderr io.Writer) int {
	if !r.Complete() {
		fmt.Fprintf(stderr, "billing status: %d part(s) of the report could not be read (shown as unknown):\n  %s\n", len(r.Problems), strings.Join(r.Problems, "\n  "))
	}
	absent := r.Absent()
	if absent != "" {
		fmt.Fprintf(stderr, "billing status: %s\n", absent)
	}
	switch {
	case !r.Complete():
		return exitUnreadable
	case absent != "":
		return exitStatusAbsent
	}
	return exitEqual
}

// statusScope: status reads the ledger's servers and the brokers, for
// KAFKA_TOPIC and KAFKA_GROUP.
func statusScope() config.Scope {
	return slices.Concat(config.MySQLSettings(), config.KafkaSettings(), config.LogSettings(), config.Scope{"KAFKA_TOPIC", "KAFKA_GROUP", "EVENT_", "SCHEMA_REGISTRY_"})
}

// registryStatus says whether the schema registry of EVENT_FORMAT answers
// ("" when the format needs none).
func registryStatus(ctx context.Context, cfg config.Config) string {
	if !format.NeedsRegistry(cfg.EventFormat) {
		return ""
	}
	o, err := cfg.EventDecoderOptions()
	if err != nil {
		return "schema registry: " + safetext.Text(err.Error(), 512)
	}
	url := safetext.Text(o.Registry.URL, 256)
	if err := format.PingRegistry(ctx, o.Registry); err != nil {
		return fmt.Sprintf("schema registry: %s does not answer: %s (records naming a schema not yet compiled wait for it; nothing is dead-lettered for it)", url, safetext.Text(err.Error(), 512))
	}
	return "schema registry: " + url + " answers"
}

func collectStatus(ctx context.Context, cfg config.Config, log *slog.Logger) (*ledgerstatus.Report, error) {
	kopts, err := cfg.KafkaConn().Opts()
	if err != nil {
		return nil, err
	}
	dbs, dsns, err := openServers(cfg, log)
	if err != nil {
		return nil, err
	}
	defer closeAll(dbs)
	cl, err := kgo.NewClient(append(kopts, kgo.WithLogger(kgo.BasicLogger(io.Discard, kgo.LogLevelNone, nil)))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	letters := make(ledgerstatus.ServerLetters, len(dbs))
	for i, db := range dbs {
		letters[i] = mysqldriver.NewLetters(db)
	}
	r := ledgerstatus.Collect(ctx, ledgerstatus.Sources{View: mysqldriver.NewView(dbs...), Letters: letters,
		Kafka: kadm.NewClient(cl), Topic: cfg.KafkaTopic, Group: cfg.KafkaGroup, Log: log,
		Environment: ledgerstatus.Periods{Windows: cfg.Period().String(), WindowsClose: cfg.WindowCloseAfter > 0},
		ServerError: func(i int, err error) error { return mysqldriver.AccessDenied(dsns[i], err) }})
	return r, nil
}

// unknown is how the text report shows a value that could not be read.
const unknown = "unknown"

// printStatus renders the report for a terminal. Identifiers that come
// from outside (instance ids, hosts, xids) go through safetext.Text. A part
// that could not be read says "unknown" and why, never a value.
func printStatus(w io.Writer, r *ledgerstatus.Report) error {
	ago := func(secs float64) string {
		return (time.Duration(secs * float64(time.Second))).Round(time.Millisecond).String()
	}
	num := func(v *int64) string {
		if v == nil {
			return unknown
		}
		return strconv.FormatInt(*v, 10)
	}
	state := orDash(r.GroupState)
	if r.GroupError != "" {
		state = unknown
	}
	fmt.Fprintf(w, "topic %s, group %s (%s, %d members), at %s\n\n", safetext.Text(r.Topic, 256), safetext.Text(r.Group, 256),
		state, len(r.Members), r.At.Format(time.RFC3339))
	if a := r.Absent(); a != "" {
		fmt.Fprintf(w, "NOT FOUND: %s\n\n", safetext.Text(a, 4096))
	}
	if r.GroupError != "" {
		fmt.Fprintf(w, "group: unknown (%s)\n\n", safetext.Text(r.GroupError, 1024))
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tLOG_START\tSTORED\tLOG_END\tLAG\tOWNER\tEPOCH\tUPDATED\tMEMBER")
	for _, p := range r.Partitions {
		stored, owner, epoch, updated := "-", "-", "-", "-"
		switch p.Stored {
		case ledgerstatus.StoredUnknown:
			stored, owner, epoch, updated = unknown, unknown, unknown, unknown
		case ledgerstatus.StoredStart:
			stored = "start"
		case ledgerstatus.StoredAt:
			stored = num(p.StoredOffset)
		}
		if p.Claimed {
			owner, epoch = safetext.Text(p.Owner, 64), strconv.FormatInt(p.Epoch, 10)
			updated = ago(r.At.Sub(*p.UpdatedAt).Seconds()) + " ago"
		}
		logStart, logEnd := num(p.LogStart), num(p.LogEnd)
		if r.LogError == "" && !p.InLog {
			logStart, logEnd = "not in the topic", "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Partition, logStart, stored, logEnd, num(p.Lag), owner, epoch, updated, orDash(safetext.Text(p.Member, 128)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.TotalLag != nil {
		fmt.Fprintf(w, "total lag: %d records\n\n", *r.TotalLag)
	} else {
		var why []string
		for _, e := range []string{r.LogError, r.PositionsError} {
			if e != "" {
				why = append(why, safetext.Text(e, 1024))
			}
		}
		fmt.Fprintf(w, "total lag: unknown (%s)\n\n", strings.Join(why, "; "))
	}
	if r.PositionsError == "" && len(r.StoredGroups) == 0 {
		fmt.Fprint(w, "no positions stored in this ledger yet: no instance has claimed a partition\n\n")
	}

	switch c := r.LastCheckpoint; {
	case r.LastCheckpointError != "":
		fmt.Fprintf(w, "last committed checkpoint: unknown (%s)\n\n", safetext.Text(r.LastCheckpointError, 1024))
	case c != nil:
		whose := ""
		if r.PositionsError == "" && !r.GroupStored {
			whose = fmt.Sprintf(" (of this ledger; group %s has no positions in it)", safetext.Text(r.Group, 256))
		}
		fmt.Fprintf(w, "last committed checkpoint: %s by %s at %s (%s ago)%s\n\n", safetext.Text(c.Gtrid, 64), safetext.Text(c.DecidedBy, 64),
			c.DecidedAt.Format(time.RFC3339Nano), ago(c.AgeSeconds), whose)
	default:
		fmt.Fprint(w, "last committed checkpoint: none recorded\n\n")
	}
	if r.CommitLogError != "" {
		fmt.Fprintf(w, "commit log: unknown (%s)\n\n", safetext.Text(r.CommitLogError, 1024))
	} else if c := r.CommitLog; c != nil {
		sealed := "none"
		if c.SealedBefore != nil {
			sealed = c.SealedBefore.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "commit log: visible %d of %d decided (%d not applied), retained from %d; sealed and visible before %s\n\n",
			c.VisibleSeq, c.DecidedSeq, c.Unapplied, c.RetainedFrom, sealed)
	}
	writeChangelog(w, r)
	if err := writeWaits(w, r); err != nil {
		return err
	}

	switch {
	case r.InDoubtError != "":
		fmt.Fprintf(w, "branches in doubt: unknown (%s)\n\n", safetext.Text(r.InDoubtError, 1024))
	case len(r.InDoubt) == 0:
		fmt.Fprintf(w, "branches in doubt: none%s\n\n", otherLedgers(r))
	default:
		fmt.Fprintf(w, "branches in doubt: %d%s\n", len(r.InDoubt), otherLedgers(r))
		tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "SERVER\tGTRID\tBQUAL\tAGE\tDECISION")
		for _, b := range r.InDoubt {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", b.Server, safetext.Text(b.Gtrid, 64), safetext.Text(b.Bqual, 64), ago(b.AgeSeconds), orDash(b.Decision))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}

	printStatusPeriods(w, r)
	switch {
	case r.DeadLettersError != "":
		fmt.Fprintf(w, "dead letters not re-injected: unknown (%s)\n", safetext.Text(r.DeadLettersError, 1024))
		return nil
	case len(r.DeadLetters) == 0:
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
		fmt.Fprintf(tw, "%s\t%d\t%s\n", safetext.Text(d.Reason, 64), d.Count, d.Oldest.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

// otherLedgers says how many branches in doubt belong to other ledgers.
func otherLedgers(r *ledgerstatus.Report) string {
	if r.OtherLedgersInDoubt == nil || *r.OtherLedgersInDoubt == 0 {
		return ""
	}
	return fmt.Sprintf(" (and %d of other ledgers sharing these servers, theirs to resolve)", *r.OtherLedgersInDoubt)
}

// printStatusPeriods prints the ledger's period settings, and where they
// come from.
func printStatusPeriods(w io.Writer, r *ledgerstatus.Report) {
	p := r.Periods
	if p == nil {
		fmt.Fprintf(w, "periods: unknown (%s)\n\n", safetext.Text(r.PeriodsError, 1024))
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

// writeChangelog writes the changelog's line: off, or its prefix, how far
// it is published, a snapshot pending, and who publishes.
func writeChangelog(w io.Writer, r *ledgerstatus.Report) {
	c := r.Changelog
	switch {
	case r.ChangelogError != "":
		fmt.Fprintf(w, "changelog: unknown (%s)\n\n", safetext.Text(r.ChangelogError, 1024))
		return
	case c == nil || !c.On:
		fmt.Fprint(w, "changelog: off\n\n")
		return
	}
	behind := "unknown"
	if c.Behind != nil {
		behind = fmt.Sprint(*c.Behind)
	}
	fmt.Fprintf(w, "changelog: on, prefix %s, published through %d (%s checkpoints behind)", safetext.Text(c.Prefix, 256), c.PublishedSeq, behind)
	if c.SnapshotPending {
		fmt.Fprintf(w, "; the snapshot of the rows before %d is pending", c.From)
	}
	if c.Publisher != "" && c.LeaseLeftSeconds > 0 {
		fmt.Fprintf(w, "; publisher %s (lease %.1fs left)", safetext.Text(c.Publisher, 64), c.LeaseLeftSeconds)
	} else {
		fmt.Fprint(w, "; no publisher holds the lease")
	}
	fmt.Fprint(w, "\n\n")
}

// stringsFlag is a repeatable string flag.
type stringsFlag []string

func (f *stringsFlag) String() string { return strings.Join(*f, ",") }

func (f *stringsFlag) Set(s string) error {
	*f = append(*f, s)
	return nil
}

// localInstance is the base URL of the instance on this host, from
// HTTP_ADDR as billing healthcheck reads it; false when HTTP_ADDR is empty
// (no endpoints).
func localInstance() (string, bool) {
	u, err := healthURL(config.Unchecked().HTTPAddr, "/")
	if err != nil {
		return "", false
	}
	return strings.TrimSuffix(u, "/"), true
}

// writeWaits writes what each instance asked waits for, and since when,
// and the records it skipped.
func writeWaits(w io.Writer, r *ledgerstatus.Report) error {
	for _, iw := range r.Waits {
		who := safetext.Text(iw.Instance, 256)
		if rec := iw.Records; rec != nil && (rec.Skipped > 0 || len(r.CloudEventTypes) > 0) {
			since := "its start"
			if !rec.Since.IsZero() {
				since = rec.Since.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(w, "records skipped by %s since %s: %d of %d consumed (CloudEvents of a type EVENT_CLOUDEVENT_TYPES does not select; in no table of the ledger)\n",
				who, since, rec.Skipped, rec.Consumed)
		}
		switch {
		case iw.Error != "" && iw.Optional:
			fmt.Fprintf(w, "waits: no instance answered at %s (%s); --instance URL asks one\n\n", who, safetext.Text(iw.Error, 512))
			continue
		case iw.Error != "":
			fmt.Fprintf(w, "waits of %s: unknown (%s)\n\n", who, safetext.Text(iw.Error, 1024))
			continue
		case len(iw.Waits) == 0:
			fmt.Fprintf(w, "waits of %s: none\n\n", who)
			continue
		}
		fmt.Fprintf(w, "waits of %s: %d\n", who, len(iw.Waits))
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "WAITING FOR\tSINCE\tFOR\tLAST SEEN")
		for _, x := range iw.Waits {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", safetext.Text(x.What, 256), x.Since.UTC().Format(time.RFC3339),
				(time.Duration(x.Seconds * float64(time.Second))).Round(time.Second), orDash(safetext.Text(x.Detail, 512)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	return nil
}
