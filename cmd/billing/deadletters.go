package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
	"unicode"
	"unicode/utf8"

	"github.com/billing/ledger/internal/deadletters"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/event"
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
an event id that is already counted (present and unexpired in dedup_keys);
--force overrides all but the first, with a warning each.

billing deadletters COMMAND --help describes one command.
`

// errRefused marks a refusal (exit status 1, no stack of wrapping).
var errRefused = errors.New("refused")

// deadLetters runs `billing deadletters ...`. It returns the exit status.
func deadLetters(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, deadLettersUsage)
		return 2
	}
	var cmd func(args []string, stdout, stderr io.Writer) int
	switch args[0] {
	case "list":
		cmd = dlList
	case "show":
		cmd = dlShow
	case "reinject":
		cmd = dlReinject
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, deadLettersUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "billing deadletters: unknown command %q\n\n%s", args[0], deadLettersUsage)
		return 2
	}
	return cmd(args[1:], stdout, stderr)
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

// dlID names a dead letter: its server (index in the DSN list) and its id
// there (ids are per server).
type dlID struct {
	server int
	id     int64
}

func (d dlID) String() string {
	if d.server == 0 {
		return strconv.FormatInt(d.id, 10)
	}
	return fmt.Sprintf("%d:%d", d.server, d.id)
}

func parseDLID(s string) (dlID, error) {
	var d dlID
	idPart := s
	if srv, rest, ok := strings.Cut(s, ":"); ok {
		n, err := strconv.Atoi(srv)
		if err != nil || n < 0 {
			return d, usageError{fmt.Errorf("bad dead letter id %q: want N or S:N", s)}
		}
		d.server, idPart = n, rest
	}
	id, err := strconv.ParseInt(idPart, 10, 64)
	if err != nil || id < 1 {
		return d, usageError{fmt.Errorf("bad dead letter id %q: want N or S:N", s)}
	}
	d.id = id
	return d, nil
}

// openServers resolves the MySQL connection settings and opens a small
// pool on every server (DSNs with the password file and TLS applied; the
// DSNs are returned in the same order, never to be logged unredacted).
func openServers(cfg config.Config, log *slog.Logger) ([]*sqlx.DB, []string, error) {
	dsns, err := resolveMySQL(cfg, log)
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
	return slices.Concat(dlScope(), config.KafkaSettings(), config.Scope{"KAFKA_TOPIC", "MAX_PAYLOAD_BYTES"})
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
	var all []dlRow
	for i, db := range dbs {
		rows, err := deadletters.List(ctx, db, deadletters.Filter{Reason: reason, Pending: pending, Limit: limit})
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%d/%d\t%s\t%d\t%s\n", dlID{r.server, r.ID}, r.CreatedAt.UTC().Format(time.RFC3339),
			safeText(r.Reason, 64), safeText(r.Topic, 64), r.Partition, r.Offset, safeBytes(r.EventID, 40), r.PayloadSize, reinj)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(all) == limit {
		fmt.Fprintf(stdout, "(first %d; raise --limit for more)\n", limit)
	}
	return nil
}

func loadDL(ctx context.Context, dbs []*sqlx.DB, id dlID) (*dlRow, error) {
	if id.server >= len(dbs) {
		return nil, fmt.Errorf("%w: no server %d (MYSQL_DSN is 0, MYSQL_SHARD_DSNS are 1..%d)", errRefused, id.server, len(dbs)-1)
	}
	r, err := deadletters.Get(ctx, dbs[id.server], id.id)
	if errors.Is(err, deadletters.ErrNotFound) {
		return nil, fmt.Errorf("%w: no dead letter %s", errRefused, id)
	}
	if err != nil {
		return nil, fmt.Errorf("read dead letter %s: %w", id, err)
	}
	return &dlRow{*r, id.server}, nil
}

func dlShow(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing deadletters show", "ID [--max-bytes N] [--payload-out FILE]",
		"Shows one dead letter: where it came from, why, the re-injection audit, and its\npayload (verbatim when printable, Go-quoted otherwise).\n")
	maxBytes := fs.Int("max-bytes", 64<<10, "print at most this many bytes of the payload")
	out := fs.String("payload-out", "", "write the stored payload, byte for byte, to this new file (for correction and reinject --payload-file)")
	pos, code, done := fs.parse(args, 1, stdout, stderr)
	if done {
		return code
	}
	id, err := parseDLID(pos[0])
	if err != nil {
		return fs.fail(stderr, err)
	}
	return dlRun(fs, dlScope(), stdout, stderr, func(ctx context.Context, cfg config.Config, log *slog.Logger) error {
		return showDeadLetter(ctx, cfg, log, id, *maxBytes, *out, stdout)
	})
}

func showDeadLetter(ctx context.Context, cfg config.Config, log *slog.Logger, id dlID, maxBytes int, out string, stdout io.Writer) error {
	dbs, _, err := openServers(cfg, log)
	if err != nil {
		return err
	}
	defer closeAll(dbs)
	r, err := loadDL(ctx, dbs, id)
	if err != nil {
		return err
	}
	reinj := "-"
	if r.ReinjectedAt.Valid {
		reinj = r.ReinjectedAt.Time.UTC().Format(time.RFC3339Nano) + " by " + safeText(r.ReinjectedBy.String, 255)
		if r.ReinjectedForced.Bool {
			reinj += " (forced)"
		}
		if r.ReinjectedPartition.Valid && r.ReinjectedOffset.Valid {
			reinj += fmt.Sprintf(" to %s/%d/%d", safeText(r.Topic, 256), r.ReinjectedPartition.Int32, r.ReinjectedOffset.Int64)
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
		{"source", fmt.Sprintf("%s/%d/%d", safeText(r.Topic, 256), r.Partition, r.Offset)},
		{"reason", safeText(r.Reason, 64)},
		{"detail", safeText(r.Detail, 1024)},
		{"event_id", safeBytes(r.EventID, 256)},
		{"key", safeBytes(r.Key, 256)},
		{"checkpoint", safeText(r.Checkpoint, 128)},
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

func payloadSummary(r *dlRow) string {
	s := fmt.Sprintf("%d bytes", r.PayloadSize)
	if int64(len(r.Payload)) < r.PayloadSize {
		s += fmt.Sprintf(", only the first %d stored", len(r.Payload))
	}
	if len(r.PayloadSHA) > 0 {
		s += ", sha256 " + hex.EncodeToString(r.PayloadSHA)
	}
	return s
}

// renderPayload shows a payload without letting it drive the terminal:
// printed as is when it is valid UTF-8 made of printable characters, tabs
// and newlines; otherwise Go-quoted (every control byte escaped).
func renderPayload(b []byte, limit int) string {
	cut := ""
	if len(b) > limit {
		b, cut = b[:limit], fmt.Sprintf("\n… (%d more bytes not shown; see --max-bytes, --payload-out)", len(b)-limit)
	}
	if printable(b, true) {
		return "--- payload (verbatim) ---\n" + string(b) + cut + "\n--- end ---"
	}
	return "--- payload (Go-quoted: it holds non-printable bytes) ---\n" + strconv.Quote(string(b)) + cut + "\n--- end ---"
}

func printable(b []byte, lines bool) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if !unicode.IsPrint(r) && !(lines && (r == '\n' || r == '\t')) {
			return false
		}
	}
	return true
}

// safeBytes renders an identifier for a table cell: "-" when absent, as
// is when printable, Go-quoted otherwise, cut to max runes.
func safeBytes(b []byte, max int) string {
	if b == nil {
		return "-"
	}
	return safeText(string(b), max)
}

func safeText(s string, max int) string {
	if !printable([]byte(s), false) {
		s = strconv.Quote(s)
	}
	if utf8.RuneCountInString(s) > max {
		s = string([]rune(s)[:max-1]) + "…"
	}
	return s
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
	var ids []dlID
	for _, a := range pos {
		id, err := parseDLID(a)
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
	o := reinjectOpts{payloadFile: *payloadFile, by: *by, force: *force, timeout: *timeout}
	return dlRun(fs, dlReinjectScope(), stdout, stderr, func(ctx context.Context, cfg config.Config, log *slog.Logger) error {
		return reinjectAll(ctx, cfg, log, ids, o, stdout, stderr)
	})
}

type reinjectOpts struct {
	payloadFile string
	by          string
	force       bool
	timeout     time.Duration
}

// reinjectAll re-injects each dead letter of ids in turn, each checked on
// its own, on one producer and one set of pools; a refusal or failure is
// reported and the next one goes on. The error counts those that were
// not re-injected (exit status 1).
func reinjectAll(ctx context.Context, cfg config.Config, log *slog.Logger, ids []dlID, o reinjectOpts, stdout, stderr io.Writer) error {
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
		kgo.RecordDeliveryTimeout(o.timeout),
		kgo.WithLogger(kgo.BasicLogger(io.Discard, kgo.LogLevelNone, nil)),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	if len(ids) == 1 {
		return reinject(ctx, cfg, log, dbs, cl, ids[0], o, stdout, stderr)
	}
	bar := newTermProgress(stderr, isTerminal(stderr), "re-injecting", "dead letters", int64(len(ids)))
	failed := 0
	for i, id := range ids {
		err := ctx.Err()
		if err == nil {
			err = reinject(ctx, cfg, log, dbs, cl, id, o, stdout, stderr)
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
		return fmt.Errorf("%w: %d of %d not re-injected (each said why above)", errRefused, failed, len(ids))
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

// identityOf returns the event id and the account a dead letter stands
// for: its event_id column, and the account_id of its stored payload when
// that payload is a JSON object naming one as a string (it may be invalid
// for another reason), or else its record key (producers key by account).
// known is false for a part the dead letter does not name.
func identityOf(r *dlRow) (eventID, account string, idKnown, accountKnown bool) {
	if r.EventID != nil {
		eventID, idKnown = string(r.EventID), true
	}
	var named struct {
		AccountID *string `json:"account_id"`
	}
	if json.Unmarshal(r.Payload, &named) == nil && named.AccountID != nil && *named.AccountID != "" {
		return eventID, *named.AccountID, idKnown, true
	}
	if len(r.Key) > 0 {
		return eventID, string(r.Key), idKnown, true
	}
	return eventID, "", idKnown, false
}

// identityProblems lists how the event to produce differs from the dead
// letter it replaces: another event id or account would count a new event
// instead of the one that was refused.
func identityProblems(r *dlRow, ev event.Event) []string {
	wantID, wantAccount, idKnown, accountKnown := identityOf(r)
	var p []string
	switch {
	case !idKnown:
		p = append(p, fmt.Sprintf("the dead letter (%s) names no event id, so the payload's event_id %s cannot be checked against it", safeText(r.Reason, 64), safeText(ev.EventID, 256)))
	case wantID != ev.EventID:
		p = append(p, fmt.Sprintf("the payload's event_id %s differs from the dead letter's %s", safeText(ev.EventID, 256), safeText(wantID, 256)))
	}
	switch {
	case !accountKnown:
		p = append(p, fmt.Sprintf("the dead letter names no account (no account_id in its payload, no record key), so the payload's account_id %s cannot be checked against it", safeText(ev.AccountID, 128)))
	case wantAccount != ev.AccountID:
		p = append(p, fmt.Sprintf("the payload's account_id %s differs from the dead letter's %s", safeText(ev.AccountID, 128), safeText(wantAccount, 128)))
	}
	return p
}

// reinject re-injects one dead letter, through cl (a producer with the
// manual partitioner).
func reinject(ctx context.Context, cfg config.Config, log *slog.Logger, dbs []*sqlx.DB, cl *kgo.Client, id dlID, o reinjectOpts, stdout, stderr io.Writer) error {
	r, err := loadDL(ctx, dbs, id)
	if err != nil {
		return err
	}
	overridden := []string{} // the checks --force overrode, for the log
	refuseOrWarn := func(check, msg string) error {
		if !o.force {
			return fmt.Errorf("%w: %s (--force to reinject anyway)", errRefused, msg)
		}
		fmt.Fprintf(stderr, "WARNING: %s\n", msg)
		if !slices.Contains(overridden, check) {
			overridden = append(overridden, check)
		}
		return nil
	}

	if r.ReinjectedAt.Valid {
		if err := refuseOrWarn("already_reinjected", fmt.Sprintf("dead letter %s was already reinjected at %s by %s; the pipeline drops an identical copy of a counted event within DEDUP_TTL",
			id, r.ReinjectedAt.Time.UTC().Format(time.RFC3339Nano), safeText(r.ReinjectedBy.String, 255))); err != nil {
			return err
		}
	}

	// 1. What to produce, and is it valid?
	if r.Topic != cfg.KafkaTopic {
		return fmt.Errorf("%w: dead letter %s came from topic %s, but KAFKA_TOPIC is %s", errRefused, id, safeText(r.Topic, 256), cfg.KafkaTopic)
	}
	payload := r.Payload
	if o.payloadFile != "" {
		if payload, err = os.ReadFile(o.payloadFile); err != nil {
			return fmt.Errorf("--payload-file: %w", err)
		}
	} else if int64(len(r.Payload)) < r.PayloadSize {
		return fmt.Errorf("%w: only the first %d of %d bytes of the payload were stored; supply the whole (corrected) payload with --payload-file", errRefused, len(r.Payload), r.PayloadSize)
	}
	ev, err := event.NewDecoder(cfg.MaxPayloadBytes).Decode(payload)
	if err != nil {
		reason := "invalid"
		var de *event.DecodeError
		if errors.As(err, &de) {
			reason = string(de.Reason)
		}
		return fmt.Errorf("%w: the payload does not decode (%s: %v): it would only be dead-lettered again; correct it and pass --payload-file", errRefused, reason, err)
	}

	// 2. The same event? A correction fixes a field; it must not turn the
	// dead letter into another event (another id counts anew, another
	// account moves money to someone else).
	for _, p := range identityProblems(r, ev) {
		if err := refuseOrWarn("identity", p); err != nil {
			return err
		}
	}

	// 3. Already counted? The pipeline's dedup is the arbiter, this is the
	// operator's early warning: within DEDUP_TTL an identical copy is
	// dropped and a different one is dead-lettered as a conflict.
	now := time.Now().UTC()
	for i, db := range dbs {
		seen, err := mysqldriver.LookupKeys(ctx, db, []string{ev.EventID})
		if err != nil {
			return fmt.Errorf("server %d: %w", i, err)
		}
		if len(seen) > 0 && seen[0].ExpiresAt.After(now) {
			e := seen[0].ExpiresAt
			if err := refuseOrWarn("already_counted", fmt.Sprintf("event_id %s is already counted (dedup key on server %d until %s); reinjecting cannot change the ledger while the key lives: an identical payload is dropped as a duplicate, a different one is dead-lettered as conflicting_duplicate; consumed after %s, it would count a second time",
				safeText(ev.EventID, 256), i, e.Format(time.RFC3339), e.Format(time.RFC3339))); err != nil {
				return err
			}
		}
	}

	// 4. Mark the row first, atomically (of two concurrent reinjects only
	// one proceeds), with who and what: the audit outlives a crash between
	// here and the produce.
	db := dbs[id.server]
	sum := sha256.Sum256(payload)
	mark := time.Now().UTC().Truncate(time.Microsecond)
	marked, err := deadletters.Mark(ctx, db, &r.Row, deadletters.Audit{At: mark, By: o.by, Forced: o.force, SHA256: sum[:]})
	if err != nil {
		return fmt.Errorf("mark dead letter %s: %w", id, err)
	}
	if !marked {
		return fmt.Errorf("%w: dead letter %s was reinjected concurrently", errRefused, id)
	}

	// 5. Produce; on failure, put the row back as it was (only if it still
	// holds our mark).
	part, off, err := produceOnce(ctx, cl, cfg.KafkaTopic, r, payload, id, o.timeout)
	if err != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if uerr := deadletters.Restore(uctx, db, &r.Row, mark); uerr != nil {
			fmt.Fprintf(stderr, "WARNING: could not restore the re-injection columns of %s after the failure: %v\n", id, uerr)
		}
		return fmt.Errorf("produce: %w (if the failure was a timeout the record may still have been written; running reinject again is safe: the pipeline drops an identical copy of a counted event)", err)
	}
	log.Info("dead letter re-injected", "dead_letter", id.String(), "source", fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset),
		"reason", r.Reason, "by", o.by, "forced", o.force, "overridden", overridden, "corrected", o.payloadFile != "",
		"partition", part, "offset", off, "sha256", hex.EncodeToString(sum[:]))
	if err := deadletters.Landed(ctx, db, id.id, mark, part, off); err != nil {
		fmt.Fprintf(stderr, "WARNING: the record was produced to partition %d at offset %d, but recording that in dead letter %s failed: %v\n", part, off, id, err)
	}
	fmt.Fprintf(stdout, "reinjected dead letter %s (event_id %s) to %s partition %d at offset %d\n", id, safeText(ev.EventID, 256), cfg.KafkaTopic, part, off)
	return nil
}

// produceOnce writes the record through cl, an idempotent producer with
// the manual partitioner, to the dead letter's original partition with its
// original key, and returns where it landed.
func produceOnce(ctx context.Context, cl *kgo.Client, topic string, r *dlRow, payload []byte, id dlID, timeout time.Duration) (int32, int64, error) {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rec := &kgo.Record{
		Topic: topic, Partition: r.Partition, Key: r.Key, Value: bytes.Clone(payload),
		Headers: []kgo.RecordHeader{
			{Key: "billing-reinjected-from", Value: fmt.Appendf(nil, "%s/%d/%d", r.Topic, r.Partition, r.Offset)},
			{Key: "billing-dead-letter-id", Value: []byte(id.String())},
		},
	}
	res := cl.ProduceSync(pctx, rec)
	if err := res.FirstErr(); err != nil {
		return 0, 0, err
	}
	return rec.Partition, rec.Offset, nil
}
