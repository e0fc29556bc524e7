package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/deadletters"
	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/reinject"
	"github.com/billing/ledger/internal/safetext"
	"github.com/billing/ledger/internal/service"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

const deadLettersUsage = `Usage:
  billing deadletters list [--reason R] [--limit N] [--pending]
  billing deadletters show ID [--max-bytes N] [--payload-out FILE]
  billing deadletters reinject ID [ID...] [--payload-file FILE] [--by NAME] [--force] [--timeout D]

ID is the one printed by list: N for a row of the control server (MYSQL_DSN),
S:N for a row of shard server S (MYSQL_SHARD_DSNS[S-1]).

reinject produces the stored payload (or FILE's, corrected) again to
KAFKA_TOPIC, with the original key, on the original partition, and records
who did it, whether it was forced, where the record landed and the SHA-256 of
what was produced, in the row and in the log. It refuses a payload that does
not decode, a payload whose event id or account differs from the dead
letter's (or when the dead letter names none), a row already reinjected, and
an event id that is already counted (present and unexpired in a dedup key table);
--force overrides all but the first, with a warning each.

billing deadletters COMMAND --help describes one command.
`

// deadLetters runs `billing deadletters ...`. It returns the exit status.
func deadLetters(args []string, stdout, stderr io.Writer) int {
	return runSubcommand("billing deadletters", deadLettersUsage, map[string]command{
		"list": dlList, "show": dlShow, "reinject": dlReinject,
	}, args, stdout, stderr)
}

// dlRun runs a dead-letter command once its arguments are parsed: it reads
// the configuration and maps fn's error to the exit status (a usageError
// 2, anything else 1).
func dlRun(fs *cliFlags, scope config.Scope, stdout, stderr io.Writer, fn func(ctx context.Context, cfg config.Config, log *slog.Logger) error) int {
	return withConfig(stderr, scope, func(ctx context.Context, cfg config.Config, log *slog.Logger) int {
		err := fn(ctx, cfg, log)
		var ue usageError
		switch {
		case err == nil:
			return 0
		case errors.As(err, &ue):
			return fs.fail(stderr, err)
		default:
			fmt.Fprintf(stderr, "billing deadletters: %v\n", err)
			return 1
		}
	})
}

// openServers resolves the MySQL connection settings and opens a small
// pool on every server (DSNs with the password file and TLS applied; the
// DSNs are returned in the same order, never to be logged unredacted).
func openServers(cfg config.Config, log *slog.Logger) ([]*sqlx.DB, []string, error) {
	dsns, err := service.ResolveDSNs(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	var dbs []*sqlx.DB
	for i, dsn := range dsns {
		db, err := mysqldriver.OpenDB(dsn, cfg.MySQLLockWaitTimeout, 2)
		if err != nil {
			closeAll(dbs)
			return nil, nil, fmt.Errorf("server %d: %w", i, err)
		}
		dbs = append(dbs, db)
	}
	return dbs, dsns, nil
}

// Scopes of the dead-letter commands: list and show read MySQL only;
// reinject also produces to KAFKA_TOPIC and decodes with MAX_PAYLOAD_BYTES.
func dlScope() config.Scope { return slices.Concat(config.MySQLSettings(), config.LogSettings()) }

func dlReinjectScope() config.Scope {
	return slices.Concat(dlScope(), config.KafkaSettings(), config.Scope{"KAFKA_TOPIC", "MAX_PAYLOAD_BYTES", "EVENT_", "SCHEMA_REGISTRY_"})
}

func closeAll(dbs []*sqlx.DB) {
	for _, db := range dbs {
		_ = db.Close()
	}
}

// dlRow is a dead letter and the server it is on.
type dlRow struct {
	deadletters.Row
	server int
}

func dlList(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing deadletters list", "[--reason R] [--limit N] [--pending]",
		"Lists dead letters of every server, newest first.\n")
	reason := fs.String("reason", "", "only this reason")
	limit := fs.Int("limit", 50, "at most this many rows, newest first (1 to 100000)")
	pending := fs.Bool("pending", false, "only rows not yet reinjected")
	if _, code, done := fs.parse(args, 0, stdout, stderr); done {
		return code
	}
	if *limit < 1 || *limit > 100000 {
		return fs.fail(stderr, errors.New("--limit must be between 1 and 100000"))
	}
	return dlRun(fs, dlScope(), stdout, stderr, func(ctx context.Context, cfg config.Config, log *slog.Logger) error {
		return listDeadLetters(ctx, cfg, log, *reason, *limit, *pending, stdout)
	})
}

func listDeadLetters(ctx context.Context, cfg config.Config, log *slog.Logger, reason string, limit int, pending bool, stdout io.Writer) error {
	dbs, _, err := openServers(cfg, log)
	if err != nil {
		return err
	}
	defer closeAll(dbs)
	servers := make([]letterLister, len(dbs))
	for i, db := range dbs {
		servers[i] = mysqldriver.NewLetters(db)
	}
	return printDeadLetters(ctx, servers, reason, limit, pending, stdout)
}

// letterLister lists one server's dead letters (mysqldriver.Letters,
// memdriver's Server.Letters).
type letterLister interface {
	List(ctx context.Context, f deadletters.Filter) ([]deadletters.Row, error)
}

// printDeadLetters lists the dead letters of servers (the control server
// first), newest first, at most limit.
func printDeadLetters(ctx context.Context, servers []letterLister, reason string, limit int, pending bool, stdout io.Writer) error {
	var all []dlRow
	for i, l := range servers {
		rows, err := l.List(ctx, deadletters.Filter{Reason: reason, Pending: pending, Limit: limit})
		if err != nil {
			return fmt.Errorf("server %d: %w", i, err)
		}
		for _, r := range rows {
			all = append(all, dlRow{r, i})
		}
	}
	slices.SortStableFunc(all, func(a, b dlRow) int { return b.CreatedAt.Compare(a.CreatedAt) })
	all = all[:min(len(all), limit)]

	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCREATED\tREASON\tSOURCE\tEVENT_ID\tBYTES\tREINJECTED")
	for _, r := range all {
		reinj := "-"
		if r.ReinjectedAt.Valid {
			reinj = r.ReinjectedAt.Time.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%d/%d\t%s\t%d\t%s\n", reinject.ID{Server: r.server, N: r.ID}, r.CreatedAt.UTC().Format(time.RFC3339),
			safetext.Text(r.Reason, 64), safetext.Text(r.Topic, 64), r.Partition, r.Offset, safetext.Bytes(r.EventID, 40), r.PayloadSize, reinj)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(all) == limit {
		fmt.Fprintf(stdout, "(first %d; raise --limit for more)\n", limit)
	}
	return nil
}

// pools are the servers' dead letters and dedup keys (package reinject).
func pools(dbs []*sqlx.DB) []reinject.Server {
	out := make([]reinject.Server, len(dbs))
	for i, db := range dbs {
		out[i] = reinject.Pool(db)
	}
	return out
}

func dlShow(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing deadletters show", "ID [--max-bytes N] [--payload-out FILE]",
		"Shows one dead letter: where it came from, why, the re-injection audit, and its\npayload (verbatim when printable, Go-quoted otherwise; with EVENT_FORMAT avro, protobuf\nor json-schema also its schema id and, if it decodes, the decoded record as JSON).\n")
	maxBytes := fs.Int("max-bytes", 64<<10, "print at most this many bytes of the payload")
	out := fs.String("payload-out", "", "write the stored payload, byte for byte, to this new file (for correction and reinject --payload-file)")
	pos, code, done := fs.parse(args, 1, stdout, stderr)
	if done {
		return code
	}
	id, err := reinject.ParseID(pos[0])
	if err != nil {
		return fs.fail(stderr, err)
	}
	return dlRun(fs, slices.Concat(dlScope(), config.Scope{"EVENT_", "SCHEMA_REGISTRY_", "KAFKA_TOPIC", "MAX_PAYLOAD_BYTES"}), stdout, stderr, func(ctx context.Context, cfg config.Config, log *slog.Logger) error {
		return showDeadLetter(ctx, cfg, log, id, *maxBytes, *out, stdout)
	})
}

func showDeadLetter(ctx context.Context, cfg config.Config, log *slog.Logger, id reinject.ID, maxBytes int, out string, stdout io.Writer) error {
	dbs, _, err := openServers(cfg, log)
	if err != nil {
		return err
	}
	defer closeAll(dbs)
	return printDeadLetter(ctx, cfg, pools(dbs), id, maxBytes, out, stdout)
}

// printDeadLetter shows dead letter id of servers (the control server
// first), decoded by cfg's event format where it decodes.
func printDeadLetter(ctx context.Context, cfg config.Config, servers []reinject.Server, id reinject.ID, maxBytes int, out string, stdout io.Writer) error {
	r, err := reinject.Load(ctx, servers, id)
	if err != nil {
		return err
	}
	reinj := "-"
	if r.ReinjectedAt.Valid {
		reinj = r.ReinjectedAt.Time.UTC().Format(time.RFC3339Nano) + " by " + safetext.Text(r.ReinjectedBy.String, 255)
		if r.ReinjectedForced.Bool {
			reinj += " (forced)"
		}
		if r.ReinjectedPartition.Valid && r.ReinjectedOffset.Valid {
			reinj += fmt.Sprintf(" to %s/%d/%d", safetext.Text(r.Topic, 256), r.ReinjectedPartition.Int32, r.ReinjectedOffset.Int64)
		} else {
			reinj += " (produce not confirmed)"
		}
		if len(r.ReinjectedSHA256) > 0 {
			reinj += ", sha256 " + hex.EncodeToString(r.ReinjectedSHA256)
		}
	}
	tw := tabwriter.NewWriter(stdout, 0, 8, 1, ' ', 0)
	for _, kv := range [][2]string{
		{"id", id.String()},
		{"source", fmt.Sprintf("%s/%d/%d", safetext.Text(r.Topic, 256), r.Partition, r.Offset)},
		{"reason", safetext.Text(r.Reason, 64)},
		{"detail", safetext.Text(r.Detail, 1024)},
		{"event_id", safetext.Bytes(r.EventID, 256)},
		{"key", safetext.Bytes(r.Key, 256)},
		{"checkpoint", safetext.Text(r.Checkpoint, 128)},
		{"created_at", r.CreatedAt.UTC().Format(time.RFC3339Nano)},
		{"reinjected_at", reinj},
		{"payload", payloadSummary(r)},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout, renderPayload(r.Payload, maxBytes))
	if doc := renderDecoded(ctx, cfg, r.Payload); doc != "" {
		fmt.Fprintln(stdout, doc)
	}
	if out != "" {
		f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("--payload-out: %w", err)
		}
		if _, err := f.Write(r.Payload); err != nil {
			_ = f.Close()
			return fmt.Errorf("--payload-out: %w", err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("--payload-out: %w", err)
		}
		fmt.Fprintf(stdout, "payload written to %s\n", out)
	}
	return nil
}

func payloadSummary(r *deadletters.Row) string {
	s := fmt.Sprintf("%d bytes", r.PayloadSize)
	if int64(len(r.Payload)) < r.PayloadSize {
		s += fmt.Sprintf(", only the first %d stored", len(r.Payload))
	}
	if len(r.PayloadSHA) > 0 {
		s += ", sha256 " + hex.EncodeToString(r.PayloadSHA)
	}
	return s
}

// renderDecoded shows a payload of a registry format decoded ("" when the
// format is not one, or the payload not in its wire format): the schema id,
// then the record as JSON, or why it does not decode.
func renderDecoded(ctx context.Context, cfg config.Config, payload []byte) string {
	dec, err := service.EventDecoder(cfg)
	if err != nil || dec == nil {
		return ""
	}
	d, ok := dec.(*format.Decoder)
	if !ok {
		return ""
	}
	id, doc, ok, err := d.Render(ctx, payload)
	switch {
	case !ok:
		return ""
	case err != nil:
		return fmt.Sprintf("--- decoded (%s, schema id %d): does not decode: %s ---", safetext.Text(cfg.EventFormat, 32), id, safetext.Text(err.Error(), 1024))
	}
	text := string(doc)
	if !safetext.Printable(doc, true) {
		text = strconv.Quote(text)
	}
	return fmt.Sprintf("--- decoded (%s, schema id %d) ---\n%s\n--- end ---", safetext.Text(cfg.EventFormat, 32), id, text)
}

// renderPayload shows a payload without letting it drive the terminal:
// printed as is when it is valid UTF-8 made of printable characters, tabs
// and newlines; otherwise Go-quoted (every control byte escaped).
func renderPayload(b []byte, limit int) string {
	cut := ""
	if len(b) > limit {
		b, cut = b[:limit], fmt.Sprintf("\n… (%d more bytes not shown; see --max-bytes, --payload-out)", len(b)-limit)
	}
	if safetext.Printable(b, true) {
		return "--- payload (verbatim) ---\n" + string(b) + cut + "\n--- end ---"
	}
	return "--- payload (Go-quoted: it holds non-printable bytes) ---\n" + strconv.Quote(string(b)) + cut + "\n--- end ---"
}

func dlReinject(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing deadletters reinject", "ID [ID...] [--payload-file FILE] [--by NAME] [--force] [--timeout D]",
		"Produces the dead letter's payload (or FILE's, corrected) again to KAFKA_TOPIC, with\nthe original key, on the original partition, and records who did it, whether it was\nforced, where the record landed and the SHA-256 of the value produced.\n\nRefused: a payload that does not decode; an event id or account different from the\ndead letter's, or a dead letter that names none (a re-injection must not mint a new\nevent); a row already reinjected; an event id already counted (unexpired in\ndedup_keys). --force overrides all but the first, each with a warning.\n\nSeveral IDs are re-injected one after the other, each checked on its own (a refusal\ndoes not stop the others; --payload-file takes one ID); on a terminal, the progress\nshows on stderr. Exit status 0 when every one was re-injected, 1 when one was refused\nor failed, 2 usage or configuration error.\n")
	payloadFile := fs.String("payload-file", "", "produce this file's content instead of the stored payload (one ID only)")
	by := fs.String("by", defaultOperator(), "who re-injects: recorded in the row (reinjected_by) and the log")
	force := fs.Bool("force", false, "override the identity, already-reinjected and already-counted checks (each is warned about and recorded)")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on producing each record")
	pos, code, done := fs.parse(args, -1, stdout, stderr)
	if done {
		return code
	}
	if len(pos) == 0 {
		return fs.fail(stderr, errors.New("want at least 1 argument (a dead letter ID)"))
	}
	var ids []reinject.ID
	for _, a := range pos {
		id, err := reinject.ParseID(a)
		if err != nil {
			return fs.fail(stderr, err)
		}
		ids = append(ids, id)
	}
	switch {
	case *timeout <= 0:
		return fs.fail(stderr, errors.New("--timeout must be positive"))
	case strings.TrimSpace(*by) == "" || !utf8.ValidString(*by) || utf8.RuneCountInString(*by) > 255:
		return fs.fail(stderr, errors.New("--by must be 1 to 255 characters of UTF-8"))
	case *payloadFile != "" && len(ids) > 1:
		return fs.fail(stderr, errors.New("--payload-file takes one dead letter ID"))
	}
	req := reinject.Request{PayloadFile: *payloadFile, By: *by, Force: *force, Timeout: *timeout}
	return dlRun(fs, dlReinjectScope(), stdout, stderr, func(ctx context.Context, cfg config.Config, log *slog.Logger) error {
		return reinjectAll(ctx, cfg, log, ids, req, stdout, stderr)
	})
}

// reinjectAll re-injects each dead letter of ids in turn (package
// reinject), each checked on its own, on one producer and one set of
// pools; a refusal or failure is reported and the next one goes on. The
// error counts those that were not re-injected (exit status 1).
func reinjectAll(ctx context.Context, cfg config.Config, log *slog.Logger, ids []reinject.ID, req reinject.Request, stdout, stderr io.Writer) error {
	kopts, err := cfg.KafkaConn().Opts()
	if err != nil {
		return err
	}
	dbs, _, err := openServers(cfg, log)
	if err != nil {
		return err
	}
	defer closeAll(dbs)
	cl, err := kgo.NewClient(append(slices.Clip(kopts),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RecordDeliveryTimeout(req.Timeout),
		kgo.WithLogger(kgo.BasicLogger(io.Discard, kgo.LogLevelNone, nil)),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	dec, err := service.EventDecoder(cfg)
	if err != nil {
		return err
	}
	versions := pipeline.Config{DedupTTL: cfg.DedupTTL, VersionHorizon: cfg.VersionHorizon}
	keyTTL, horizon := versions.Versions()
	r := &reinject.Reinjector{Servers: pools(dbs), Producer: cl, Topic: cfg.KafkaTopic, MaxPayloadBytes: cfg.MaxPayloadBytes, Log: log,
		KeyTTL: keyTTL, VersionHorizon: horizon,
		Warn: func(msg string) { fmt.Fprintf(stderr, "WARNING: %s\n", msg) }}
	if dec != nil {
		r.Decoder = dec
	}
	one := func(id reinject.ID) error {
		req := req
		req.ID = id
		res, err := r.Reinject(ctx, req)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "reinjected dead letter %s (event_id %s) to %s partition %d at offset %d\n", id, safetext.Text(res.EventID, 256), cfg.KafkaTopic, res.Partition, res.Offset)
		return nil
	}
	if len(ids) == 1 {
		return one(ids[0])
	}
	bar := newTermProgress(stderr, isTerminal(stderr), "re-injecting", "dead letters", int64(len(ids)))
	failed := 0
	for i, id := range ids {
		err := ctx.Err()
		if err == nil {
			err = one(id)
		}
		if err != nil {
			failed++
			fmt.Fprintf(stderr, "billing deadletters: %s: %v\n", id, err)
		}
		bar.set(int64(i + 1))
	}
	bar.done()
	fmt.Fprintf(stdout, "reinjected %d of %d dead letters\n", len(ids)-failed, len(ids))
	if failed > 0 {
		return fmt.Errorf("%w: %d of %d not re-injected (each said why above)", reinject.ErrRefused, failed, len(ids))
	}
	return nil
}

// defaultOperator names who runs the command: $USER (or the account) at
// the host name, "unknown" for what cannot be found.
func defaultOperator() string {
	name := os.Getenv("USER")
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
	}
	host, _ := os.Hostname()
	if name == "" {
		name = "unknown"
	}
	if host == "" {
		return name
	}
	return name + "@" + host
}
