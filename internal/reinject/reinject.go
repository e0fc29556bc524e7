package reinject

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/deadletters"
	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/safetext"
)

// ErrRefused marks a refusal: a check that failed (exit status 1 of the
// command), not a failure to reach a server.
var ErrRefused = errors.New("refused")

// Letters is one server's dead_letters table as re-injection reads and
// updates it (mysqldriver.Letters, memdriver's Server.Letters).
type Letters interface {
	// Get reads a dead letter by its id on the server
	// (deadletters.ErrNotFound when there is none).
	Get(ctx context.Context, id int64) (*deadletters.Row, error)
	// Mark records the re-injection about to happen if the row's
	// re-injection columns are still as r holds them, and reports
	// whether it did.
	Mark(ctx context.Context, r *deadletters.Row, a deadletters.Audit) (bool, error)
	// Restore puts the columns back as r holds them if the row still
	// holds the mark made at at.
	Restore(ctx context.Context, r *deadletters.Row, at time.Time) error
	// Landed records where the record was produced, if the row still
	// holds the mark made at at.
	Landed(ctx context.Context, id int64, at time.Time, partition int32, offset int64) error
}

// Keys looks event ids up in one server's dedup key tables: those found,
// with their fingerprint, expiry and the version the ledger counts.
type Keys interface {
	Lookup(ctx context.Context, ids []string) (map[string]dedup.Stored, error)
}

// Server is one of the ledger's servers: its dead letters and its dedup
// keys.
type Server struct {
	Letters Letters
	Keys    Keys
}

// Producer produces records and waits for their acknowledgement
// (*kgo.Client, with the manual partitioner: records keep the partition
// they are given).
type Producer interface {
	ProduceSync(ctx context.Context, rs ...*kgo.Record) kgo.ProduceResults
}

// ID names a dead letter: its server (index in the DSN list, 0 the
// control server) and its id there (ids are per server). It reads "N" on
// the control server, "S:N" on shard server S.
type ID struct {
	Server int
	N      int64
}

func (d ID) String() string {
	if d.Server == 0 {
		return strconv.FormatInt(d.N, 10)
	}
	return fmt.Sprintf("%d:%d", d.Server, d.N)
}

// ErrBadID: an id that is neither N nor S:N.
var ErrBadID = errors.New("bad dead letter id")

// ParseID reads N or S:N.
func ParseID(s string) (ID, error) {
	var d ID
	idPart := s
	if srv, rest, ok := strings.Cut(s, ":"); ok {
		n, err := strconv.Atoi(srv)
		if err != nil || n < 0 {
			return d, fmt.Errorf("%w %q: want N or S:N", ErrBadID, s)
		}
		d.Server, idPart = n, rest
	}
	n, err := strconv.ParseInt(idPart, 10, 64)
	if err != nil || n < 1 {
		return d, fmt.Errorf("%w %q: want N or S:N", ErrBadID, s)
	}
	d.N = n
	return d, nil
}

// Reinjector re-injects the dead letters of a ledger's servers to its
// topic.
type Reinjector struct {
	// Servers are the ledger's servers, the control server first.
	Servers []Server
	// Producer produces to Topic, the topic the dead letters must have
	// come from (KAFKA_TOPIC).
	Producer Producer
	Topic    string
	// MaxPayloadBytes is the pipeline's MAX_PAYLOAD_BYTES: a payload is
	// checked by the decoder the pipeline runs.
	MaxPayloadBytes int
	// KeyTTL and VersionHorizon are how long the pipeline keeps a dedup
	// key and applies a later version of its event
	// (pipeline.Config.Versions): a counted event's dead letter is judged
	// as the pipeline would judge it (an amendment goes through). Zero
	// KeyTTL: any counted event is refused.
	KeyTTL, VersionHorizon time.Duration
	// Decoder is the pipeline's decoder of EVENT_FORMAT (format.Decoder;
	// nil: the JSON contract's). A dead letter's headers are not kept, so
	// a CloudEvent in binary mode does not decode here: it is refused.
	Decoder interface {
		Decode(ctx context.Context, value []byte, headers []kgo.RecordHeader) (event.Event, error)
	}
	// Log receives one line per re-injection (the audit); Warn each
	// warning for the operator (a check overridden by Force, an audit
	// that could not be completed). Both may be nil.
	Log  *slog.Logger
	Warn func(msg string)
	// Now is the clock dedup expiries are judged by; time.Now when nil.
	Now func() time.Time
}

// Request is one re-injection.
type Request struct {
	ID ID
	// PayloadFile, if set, holds the (corrected) payload to produce
	// instead of the stored one.
	PayloadFile string
	// By names who re-injects (recorded in the row and the log).
	By string
	// Force overrides the identity, already-reinjected and
	// already-counted checks, each with a warning.
	Force bool
	// Timeout bounds the produce.
	Timeout time.Duration
}

// Result is where a re-injected record landed.
type Result struct {
	EventID   string
	Partition int32
	Offset    int64
	// Overridden are the checks Force overrode.
	Overridden []string
}

func (r *Reinjector) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reinjector) warn(msg string) {
	if r.Warn != nil {
		r.Warn(msg)
	}
}

// Load reads the dead letter id names from the ledger's servers (the
// control server first); an id of no dead letter, or of no server, is
// refused.
func Load(ctx context.Context, servers []Server, id ID) (*deadletters.Row, error) {
	if id.Server < 0 || id.Server >= len(servers) {
		return nil, fmt.Errorf("%w: no server %d (MYSQL_DSN is 0, MYSQL_SHARD_DSNS are 1..%d)", ErrRefused, id.Server, len(servers)-1)
	}
	row, err := servers[id.Server].Letters.Get(ctx, id.N)
	if errors.Is(err, deadletters.ErrNotFound) {
		return nil, fmt.Errorf("%w: no dead letter %s", ErrRefused, id)
	}
	if err != nil {
		return nil, fmt.Errorf("read dead letter %s: %w", id, err)
	}
	return row, nil
}

// checks are the refusals Force may override, as the protocol meets
// them.
type checks struct {
	r          *Reinjector
	force      bool
	overridden []string
}

// refuseOrWarn refuses with msg, or, forced, warns and records check as
// overridden.
func (c *checks) refuseOrWarn(check, msg string) error {
	if !c.force {
		return fmt.Errorf("%w: %s (--force to reinject anyway)", ErrRefused, msg)
	}
	c.r.warn(msg)
	if !slices.Contains(c.overridden, check) {
		c.overridden = append(c.overridden, check)
	}
	return nil
}

// Reinject runs the protocol for one dead letter (see the package
// documentation). A refusal wraps ErrRefused.
func (r *Reinjector) Reinject(ctx context.Context, req Request) (Result, error) {
	row, err := Load(ctx, r.Servers, req.ID)
	if err != nil {
		return Result{}, err
	}
	c := &checks{r: r, force: req.Force, overridden: []string{}}
	if row.ReinjectedAt.Valid {
		if err := c.refuseOrWarn("already_reinjected", fmt.Sprintf("dead letter %s was already reinjected at %s by %s; the pipeline drops an identical copy of a counted event within DEDUP_TTL",
			req.ID, row.ReinjectedAt.Time.UTC().Format(time.RFC3339Nano), safetext.Text(row.ReinjectedBy.String, 255))); err != nil {
			return Result{}, err
		}
	}
	payload, ev, err := r.payload(req, row)
	if err != nil {
		return Result{}, err
	}
	// 2. The same event? A correction fixes a field; it must not turn the
	// dead letter into another event (another id counts anew, another
	// account moves money to someone else).
	for _, p := range identityProblems(row, ev) {
		if err := c.refuseOrWarn("identity", p); err != nil {
			return Result{}, err
		}
	}
	if err := r.notCounted(ctx, c, ev); err != nil {
		return Result{}, err
	}
	part, off, err := r.markAndProduce(ctx, req, row, payload, c.overridden)
	if err != nil {
		return Result{}, err
	}
	return Result{EventID: ev.EventID, Partition: part, Offset: off, Overridden: c.overridden}, nil
}

// payload is step 1: what to produce (the stored payload, whole, or the
// request's file), and the event it decodes to, from the dead letter's
// topic only.
func (r *Reinjector) payload(req Request, row *deadletters.Row) ([]byte, event.Event, error) {
	if row.Topic != r.Topic {
		return nil, event.Event{}, fmt.Errorf("%w: dead letter %s came from topic %s, but KAFKA_TOPIC is %s", ErrRefused, req.ID, safetext.Text(row.Topic, 256), r.Topic)
	}
	payload := row.Payload
	if req.PayloadFile != "" {
		var err error
		if payload, err = os.ReadFile(req.PayloadFile); err != nil {
			return nil, event.Event{}, fmt.Errorf("--payload-file: %w", err)
		}
	} else if int64(len(row.Payload)) < row.PayloadSize {
		return nil, event.Event{}, fmt.Errorf("%w: only the first %d of %d bytes of the payload were stored; supply the whole (corrected) payload with --payload-file", ErrRefused, len(row.Payload), row.PayloadSize)
	}
	var ev event.Event
	var err error
	if r.Decoder != nil {
		ev, err = r.Decoder.Decode(context.Background(), payload, nil)
	} else {
		ev, err = event.NewDecoder(r.MaxPayloadBytes).Decode(payload)
	}
	if format.IsUnavailable(err) {
		return nil, event.Event{}, fmt.Errorf("cannot check the payload: %w", err)
	}
	if err != nil {
		reason := "invalid"
		var de *event.DecodeError
		if errors.As(err, &de) {
			reason = string(de.Reason)
		}
		return nil, event.Event{}, fmt.Errorf("%w: the payload does not decode (%s: %v): it would only be dead-lettered again; correct it and pass --payload-file", ErrRefused, reason, err)
	}
	return payload, ev, nil
}

// notCounted is step 3: is the event counted already, so that the
// pipeline would not count this version? The pipeline's dedup is the
// arbiter (dedup.ClassifyVersions, as it classifies: a higher revision
// within the horizon amends, a repeat is dropped, another content of the
// same revision is a conflict, a lower revision is stale); this is the
// operator's early warning, so that a re-injection that changes nothing,
// or only dead-letters again, is refused unless forced.
func (r *Reinjector) notCounted(ctx context.Context, c *checks, ev event.Event) error {
	now := r.now().UTC()
	arrival := dedup.Arrival{ID: ev.EventID, Fingerprint: ev.Fingerprint(), Version: dedup.VersionOf(&ev)}
	for i, sv := range r.Servers {
		seen, err := sv.Keys.Lookup(ctx, []string{ev.EventID})
		if err != nil {
			return fmt.Errorf("server %d: %w", i, err)
		}
		s, ok := seen[ev.EventID]
		if !ok || !s.ExpiresAt.After(now) {
			continue
		}
		why := r.countedWhy(now, arrival, s)
		if why == "" {
			continue
		}
		e := s.ExpiresAt.Format(time.RFC3339)
		if err := c.refuseOrWarn("already_counted", fmt.Sprintf("event_id %s is already counted (dedup key on server %d until %s); %s; consumed after %s, it would count as a new event",
			safetext.Text(ev.EventID, 256), i, e, why, e)); err != nil {
			return err
		}
	}
	return nil
}

// unchanged is why a counted event's re-injection is refused when its
// version cannot be judged.
const unchanged = "reinjecting cannot change the ledger while the key lives"

// countedWhy says what the pipeline would do with arrival against the
// live key s, when that is not to count it ("" when it amends the counted
// version).
func (r *Reinjector) countedWhy(now time.Time, a dedup.Arrival, s dedup.Stored) string {
	if r.KeyTTL <= 0 {
		return unchanged
	}
	verdicts, _, _ := dedup.ClassifyVersions(now, r.KeyTTL, r.VersionHorizon, []dedup.Arrival{a}, map[string]dedup.Stored{a.ID: s}, nil)
	counted := fmt.Sprintf("revision %d", s.Version.Revision)
	if s.Version.Cancelled {
		counted += " (cancelled)"
	}
	switch verdicts[0] {
	case dedup.Amend:
		return ""
	case dedup.Duplicate:
		return fmt.Sprintf("counted at %s with this content: the pipeline drops this copy as a repeat", counted)
	case dedup.Conflict:
		return fmt.Sprintf("counted at %s with other content: the pipeline dead-letters this one as conflicting_duplicate (send a higher revision to amend it)", counted)
	case dedup.Stale:
		return fmt.Sprintf("counted at %s: the pipeline drops revision %d as stale", counted, a.Version.Revision)
	case dedup.PastHorizon:
		return fmt.Sprintf("revision %d arrives past the version horizon (%s after the event's first version), or the key keeps no version to retract: the pipeline dead-letters it as version_past_horizon", a.Version.Revision, r.VersionHorizon)
	}
	return unchanged
}

// markAndProduce is steps 4 and 5: mark the row first, atomically (of two
// concurrent re-injections only one proceeds), with who and what, so that
// the audit outlives a crash between here and the produce; produce; on
// failure put the row back as it was (only if it still holds this mark),
// else record where the record landed.
func (r *Reinjector) markAndProduce(ctx context.Context, req Request, row *deadletters.Row, payload []byte, overridden []string) (int32, int64, error) {
	letters := r.Servers[req.ID.Server].Letters
	sum := sha256.Sum256(payload)
	mark := r.now().UTC().Truncate(time.Microsecond)
	marked, err := letters.Mark(ctx, row, deadletters.Audit{At: mark, By: req.By, Forced: req.Force, SHA256: sum[:]})
	if err != nil {
		return 0, 0, fmt.Errorf("mark dead letter %s: %w", req.ID, err)
	}
	if !marked {
		return 0, 0, fmt.Errorf("%w: dead letter %s was reinjected concurrently", ErrRefused, req.ID)
	}
	part, off, err := r.produce(ctx, row, payload, req.ID, req.Timeout)
	if err != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if uerr := letters.Restore(uctx, row, mark); uerr != nil {
			r.warn(fmt.Sprintf("could not restore the re-injection columns of %s after the failure: %v", req.ID, uerr))
		}
		return 0, 0, fmt.Errorf("produce: %w (if the failure was a timeout the record may still have been written; running reinject again is safe: the pipeline drops an identical copy of a counted event)", err)
	}
	if r.Log != nil {
		r.Log.Info("dead letter re-injected", "dead_letter", req.ID.String(), "source", fmt.Sprintf("%s/%d/%d", row.Topic, row.Partition, row.Offset),
			"reason", row.Reason, "by", req.By, "forced", req.Force, "overridden", overridden, "corrected", req.PayloadFile != "",
			"partition", part, "offset", off, "sha256", hex.EncodeToString(sum[:]))
	}
	if err := letters.Landed(ctx, req.ID.N, mark, part, off); err != nil {
		r.warn(fmt.Sprintf("the record was produced to partition %d at offset %d, but recording that in dead letter %s failed: %v", part, off, req.ID, err))
	}
	return part, off, nil
}

// produce writes the record to the dead letter's original partition with
// its original key, and returns where it landed.
func (r *Reinjector) produce(ctx context.Context, row *deadletters.Row, payload []byte, id ID, timeout time.Duration) (int32, int64, error) {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rec := &kgo.Record{
		Topic: r.Topic, Partition: row.Partition, Key: row.Key, Value: bytes.Clone(payload),
		Headers: []kgo.RecordHeader{
			{Key: "billing-reinjected-from", Value: fmt.Appendf(nil, "%s/%d/%d", row.Topic, row.Partition, row.Offset)},
			{Key: "billing-dead-letter-id", Value: []byte(id.String())},
		},
	}
	res := r.Producer.ProduceSync(pctx, rec)
	if err := res.FirstErr(); err != nil {
		return 0, 0, err
	}
	return rec.Partition, rec.Offset, nil
}

// identityOf returns the event id and the account a dead letter stands
// for: its event_id column, and the account_id of its stored payload when
// that payload is a JSON object naming one as a string (it may be invalid
// for another reason), or else its record key (producers key by account).
// known is false for a part the dead letter does not name.
func identityOf(r *deadletters.Row) (eventID, account string, idKnown, accountKnown bool) {
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
// instead of the one that was refused. A tombstone names no account and
// moves no money to one (it retracts whatever version is counted): only
// its event id is checked.
func identityProblems(r *deadletters.Row, ev event.Event) []string {
	wantID, wantAccount, idKnown, accountKnown := identityOf(r)
	var p []string
	switch {
	case !idKnown:
		p = append(p, fmt.Sprintf("the dead letter (%s) names no event id, so the payload's event_id %s cannot be checked against it", safetext.Text(r.Reason, 64), safetext.Text(ev.EventID, 256)))
	case wantID != ev.EventID:
		p = append(p, fmt.Sprintf("the payload's event_id %s differs from the dead letter's %s", safetext.Text(ev.EventID, 256), safetext.Text(wantID, 256)))
	}
	switch {
	case ev.Cancelled:
	case !accountKnown:
		p = append(p, fmt.Sprintf("the dead letter names no account (no account_id in its payload, no record key), so the payload's account_id %s cannot be checked against it", safetext.Text(ev.AccountID, 128)))
	case wantAccount != ev.AccountID:
		p = append(p, fmt.Sprintf("the payload's account_id %s differs from the dead letter's %s", safetext.Text(ev.AccountID, 128), safetext.Text(wantAccount, 128)))
	}
	return p
}
