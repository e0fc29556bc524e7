package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

const deadLettersUsage = `Usage:
  billing deadletters list [--reason R] [--limit N] [--pending]
  billing deadletters show ID [--max-bytes N] [--payload-out FILE]
  billing deadletters reinject ID [--payload-file FILE] [--force] [--timeout D]

ID is the one printed by list: N for a row of the control server (MYSQL_DSN),
S:N for a row of shard server S (MYSQL_SHARD_DSNS[S-1]).

reinject produces the stored payload (or FILE's, corrected) again to
KAFKA_TOPIC, with the original key, on the original partition. It refuses a
payload that does not decode, a row already reinjected, and an event id that
is already counted (present and unexpired in dedup_keys); --force overrides
the last two, with a warning.
`

// errRefused marks a refusal (exit status 1, no stack of wrapping).
var errRefused = errors.New("refused")

// deadLetters runs `billing deadletters ...`. It returns the exit status.
func deadLetters(ctx context.Context, cfg config.Config, log *slog.Logger, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, deadLettersUsage)
		return 2
	}
	var err error
	switch args[0] {
	case "list":
		err = dlList(ctx, cfg, log, args[1:], stdout)
	case "show":
		err = dlShow(ctx, cfg, log, args[1:], stdout)
	case "reinject":
		err = dlReinject(ctx, cfg, log, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, deadLettersUsage)
		return 0
	default:
		err = usageError{fmt.Errorf("unknown deadletters command %q", args[0])}
	}
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "billing deadletters: %v\n\n%s", err, deadLettersUsage)
		return 2
	default:
		fmt.Fprintf(stderr, "billing deadletters: %v\n", err)
		return 1
	}
}

type usageError struct{ error }

// parseArgs parses flags placed before or after the positional arguments,
// and checks the number of positional arguments.
func parseArgs(fs *flag.FlagSet, args []string, positional int) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, usageError{err}
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) != positional {
		return nil, usageError{fmt.Errorf("want %d argument(s), got %d", positional, len(pos))}
	}
	return pos, nil
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

// openServers resolves the connection settings and opens a small pool on
// every server (DSNs with the password file and TLS applied).
func openServers(cfg config.Config, log *slog.Logger) ([]*sqlx.DB, *conns, error) {
	c, err := resolveConns(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	var dbs []*sqlx.DB
	for i, dsn := range c.dsns {
		db, err := mysqldriver.OpenDB(dsn, cfg.MySQLLockWaitTimeout, 2)
		if err != nil {
			closeAll(dbs)
			return nil, nil, fmt.Errorf("server %d: %w", i, err)
		}
		dbs = append(dbs, db)
	}
	return dbs, c, nil
}

func closeAll(dbs []*sqlx.DB) {
	for _, db := range dbs {
		_ = db.Close()
	}
}

type dlRow struct {
	ID           int64        `db:"id"`
	Topic        string       `db:"kafka_topic"`
	Partition    int32        `db:"kafka_partition"`
	Offset       int64        `db:"kafka_offset"`
	Reason       string       `db:"reason"`
	Detail       string       `db:"detail"`
	EventID      []byte       `db:"event_id"`
	Key          []byte       `db:"record_key"`
	Payload      []byte       `db:"payload"`
	PayloadSize  int64        `db:"payload_size"`
	Checkpoint   string       `db:"checkpoint_id"`
	CreatedAt    time.Time    `db:"created_at"`
	ReinjectedAt sql.NullTime `db:"reinjected_at"`
	server       int
}

func dlList(ctx context.Context, cfg config.Config, log *slog.Logger, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	reason := fs.String("reason", "", "only this reason")
	limit := fs.Int("limit", 50, "at most this many rows, newest first")
	pending := fs.Bool("pending", false, "only rows not yet reinjected")
	if _, err := parseArgs(fs, args, 0); err != nil {
		return err
	}
	if *limit < 1 || *limit > 100000 {
		return usageError{errors.New("--limit must be between 1 and 100000")}
	}
	dbs, _, err := openServers(cfg, log)
	if err != nil {
		return err
	}
	defer closeAll(dbs)
	q := `SELECT id, kafka_topic, kafka_partition, kafka_offset, reason, event_id, payload_size, created_at, reinjected_at FROM dead_letters WHERE 1=1`
	var qargs []any
	if *reason != "" {
		q += ` AND reason = ?`
		qargs = append(qargs, *reason)
	}
	if *pending {
		q += ` AND reinjected_at IS NULL`
	}
	q += ` ORDER BY created_at DESC, id DESC LIMIT ?`
	qargs = append(qargs, *limit)
	var all []dlRow
	for i, db := range dbs {
		var rows []dlRow
		if err := db.SelectContext(ctx, &rows, q, qargs...); err != nil {
			return fmt.Errorf("server %d: list dead letters: %w", i, err)
		}
		for j := range rows {
			rows[j].server = i
		}
		all = append(all, rows...)
	}
	slices.SortStableFunc(all, func(a, b dlRow) int { return b.CreatedAt.Compare(a.CreatedAt) })
	all = all[:min(len(all), *limit)]

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
	if len(all) == *limit {
		fmt.Fprintf(stdout, "(first %d; raise --limit for more)\n", *limit)
	}
	return nil
}

func loadDL(ctx context.Context, dbs []*sqlx.DB, id dlID) (*dlRow, error) {
	if id.server >= len(dbs) {
		return nil, fmt.Errorf("%w: no server %d (MYSQL_DSN is 0, MYSQL_SHARD_DSNS are 1..%d)", errRefused, id.server, len(dbs)-1)
	}
	var r dlRow
	err := dbs[id.server].GetContext(ctx, &r, `SELECT id, kafka_topic, kafka_partition, kafka_offset, reason, detail, event_id, record_key,
		payload, payload_size, checkpoint_id, created_at, reinjected_at FROM dead_letters WHERE id = ?`, id.id)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: no dead letter %s", errRefused, id)
	}
	if err != nil {
		return nil, fmt.Errorf("read dead letter %s: %w", id, err)
	}
	r.server = id.server
	return &r, nil
}

func dlShow(ctx context.Context, cfg config.Config, log *slog.Logger, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("show", flag.ContinueOnError)
	maxBytes := fs.Int("max-bytes", 64<<10, "print at most this many bytes of the payload")
	out := fs.String("payload-out", "", "write the stored payload, byte for byte, to this new file (for correction and reinject --payload-file)")
	pos, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	id, err := parseDLID(pos[0])
	if err != nil {
		return err
	}
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
		reinj = r.ReinjectedAt.Time.UTC().Format(time.RFC3339Nano)
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
	fmt.Fprintln(stdout, renderPayload(r.Payload, *maxBytes))
	if *out != "" {
		f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
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
		fmt.Fprintf(stdout, "payload written to %s\n", *out)
	}
	return nil
}

func payloadSummary(r *dlRow) string {
	s := fmt.Sprintf("%d bytes", r.PayloadSize)
	if int64(len(r.Payload)) < r.PayloadSize {
		s += fmt.Sprintf(", only the first %d stored", len(r.Payload))
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

func dlReinject(ctx context.Context, cfg config.Config, log *slog.Logger, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("reinject", flag.ContinueOnError)
	payloadFile := fs.String("payload-file", "", "produce this file's content instead of the stored payload")
	force := fs.Bool("force", false, "reinject even if the row was reinjected before or the event id is already counted")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on producing the record")
	pos, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	id, err := parseDLID(pos[0])
	if err != nil {
		return err
	}
	if *timeout <= 0 {
		return usageError{errors.New("--timeout must be positive")}
	}
	dbs, c, err := openServers(cfg, log)
	if err != nil {
		return err
	}
	defer closeAll(dbs)
	r, err := loadDL(ctx, dbs, id)
	if err != nil {
		return err
	}
	warn := func(format string, a ...any) { fmt.Fprintf(stderr, "WARNING: "+format+"\n", a...) }

	if r.ReinjectedAt.Valid {
		if !*force {
			return fmt.Errorf("%w: dead letter %s was already reinjected at %s (--force to reinject again; the pipeline drops an identical copy of a counted event within DEDUP_TTL)",
				errRefused, id, r.ReinjectedAt.Time.UTC().Format(time.RFC3339Nano))
		}
		warn("dead letter %s was already reinjected at %s", id, r.ReinjectedAt.Time.UTC().Format(time.RFC3339Nano))
	}

	// 1. What to produce, and is it valid?
	if r.Topic != cfg.KafkaTopic {
		return fmt.Errorf("%w: dead letter %s came from topic %s, but KAFKA_TOPIC is %s", errRefused, id, safeText(r.Topic, 256), cfg.KafkaTopic)
	}
	payload := r.Payload
	if *payloadFile != "" {
		if payload, err = os.ReadFile(*payloadFile); err != nil {
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
	if r.EventID != nil && string(r.EventID) != ev.EventID {
		warn("the payload's event_id %s differs from the dead letter's %s", safeText(ev.EventID, 256), safeBytes(r.EventID, 256))
	}

	// 2. Already counted? The pipeline's dedup is the arbiter, this is the
	// operator's early warning: within DEDUP_TTL an identical copy is
	// dropped and a different one is dead-lettered as a conflict.
	now := time.Now().UTC()
	for i, db := range dbs {
		var exp []time.Time
		if err := db.SelectContext(ctx, &exp, `SELECT expires_at FROM dedup_keys WHERE event_id = ?`, ev.EventID); err != nil {
			return fmt.Errorf("server %d: dedup lookup: %w", i, err)
		}
		for _, e := range exp {
			if !e.After(now) {
				continue
			}
			if !*force {
				return fmt.Errorf("%w: event_id %s is already counted (dedup key on server %d until %s); reinjecting cannot change the ledger: an identical payload is dropped as a duplicate, a different one is dead-lettered as conflicting_duplicate (--force to produce anyway)",
					errRefused, safeText(ev.EventID, 256), i, e.Format(time.RFC3339))
			}
			warn("event_id %s is already counted (dedup key on server %d until %s). Produced before that, the record is dropped or dead-lettered; consumed after it, it would count a second time.",
				safeText(ev.EventID, 256), i, e.Format(time.RFC3339))
		}
	}

	// 3. Mark the row first, atomically: of two concurrent reinjects only
	// one proceeds.
	db := dbs[id.server]
	mark := time.Now().UTC().Truncate(time.Microsecond)
	var res sql.Result
	if r.ReinjectedAt.Valid {
		res, err = db.ExecContext(ctx, `UPDATE dead_letters SET reinjected_at = ? WHERE id = ? AND reinjected_at = ?`, mark, id.id, r.ReinjectedAt.Time)
	} else {
		res, err = db.ExecContext(ctx, `UPDATE dead_letters SET reinjected_at = ? WHERE id = ? AND reinjected_at IS NULL`, mark, id.id)
	}
	if err != nil {
		return fmt.Errorf("mark dead letter %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("%w: dead letter %s was reinjected concurrently", errRefused, id)
	}

	// 4. Produce; on failure, unmark (only our own mark).
	off, err := produceOnce(ctx, c.kopts, cfg.KafkaTopic, r, payload, id, *timeout)
	if err != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, uerr := db.ExecContext(uctx, `UPDATE dead_letters SET reinjected_at = NULL WHERE id = ? AND reinjected_at = ?`, id.id, mark); uerr != nil {
			warn("could not clear reinjected_at of %s after the failure: %v", id, uerr)
		}
		return fmt.Errorf("produce: %w (if the failure was a timeout the record may still have been written; running reinject again is safe: the pipeline drops an identical copy of a counted event)", err)
	}
	fmt.Fprintf(stdout, "reinjected dead letter %s (event_id %s) to %s partition %d at offset %d\n", id, safeText(ev.EventID, 256), cfg.KafkaTopic, r.Partition, off)
	return nil
}

// produceOnce writes the record with an idempotent producer to the dead
// letter's original partition with its original key, and returns its offset.
func produceOnce(ctx context.Context, kopts []kgo.Opt, topic string, r *dlRow, payload []byte, id dlID, timeout time.Duration) (int64, error) {
	cl, err := kgo.NewClient(append(slices.Clip(kopts),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RecordDeliveryTimeout(timeout),
		kgo.WithLogger(kgo.BasicLogger(io.Discard, kgo.LogLevelNone, nil)),
	)...)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
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
		return 0, err
	}
	return rec.Offset, nil
}

func newFlagSet() *flag.FlagSet { return flag.NewFlagSet("billing deadletters", flag.ContinueOnError) }
