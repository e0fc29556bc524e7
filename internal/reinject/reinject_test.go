package reinject

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/deadletters"
	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

func sameMark(a, b sql.NullTime) bool {
	return a.Valid == b.Valid && (!a.Valid || a.Time.Equal(b.Time))
}

// memKeys are a server's dedup keys.
type memKeys map[string]dedup.Stored

func (k memKeys) Lookup(_ context.Context, ids []string) (map[string]dedup.Stored, error) {
	out := map[string]dedup.Stored{}
	for _, id := range ids {
		if s, ok := k[id]; ok {
			out[id] = s
		}
	}
	return out, nil
}

// failing produces nothing.
type failing struct{}

func (failing) ProduceSync(_ context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	var out kgo.ProduceResults
	for _, r := range rs {
		out = append(out, kgo.ProduceResult{Record: r, Err: errors.New("broker unreachable")})
	}
	return out
}

const topic = "billing-events"

// keyTTL is the world's dedup key lifetime; its version horizon is half.
const keyTTL = 24 * time.Hour

// world is a ledger of two servers (dead letters on the in-memory
// driver, dedup keys in a map) and a topic of three partitions on kfake.
type world struct {
	servers []*memdriver.Cluster
	letters []memdriver.Letters
	keys    []memKeys
	cluster *kfake.Cluster
	warned  []string
	r       *Reinjector
	now     time.Time
}

func newWorld(t *testing.T) *world {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	w := &world{cluster: cluster, now: time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)}
	w.r = &Reinjector{Producer: cl, Topic: topic, MaxPayloadBytes: 65536, KeyTTL: keyTTL, VersionHorizon: keyTTL / 2,
		Warn: func(msg string) { w.warned = append(w.warned, msg) }, Now: func() time.Time { return w.now }}
	for range 2 {
		c, k := memdriver.New(memdriver.Options{}), memKeys{}
		l := c.As("billing").Letters()
		w.servers, w.letters, w.keys = append(w.servers, c), append(w.letters, l), append(w.keys, k)
		w.r.Servers = append(w.r.Servers, Server{Letters: l, Keys: k})
	}
	return w
}

func payload(id, account string) []byte {
	return fmt.Appendf(nil, `{"event_id":%q,"account_id":%q,"amount_minor":1250,"currency":"EUR","occurred_at":"2026-11-29T13:05:00Z"}`, id, account)
}

// letter stores a dead letter of a record at partition/offset on server
// i and returns its id.
func (w *world) letter(i int, partition int32, offset int64, eventID string, key, value []byte, reason string) ID {
	return w.letterOf(i, topic, partition, offset, eventID, key, value, len(value), reason)
}

// letterOf stores a dead letter of topic tp keeping value of a record of
// size bytes.
func (w *world) letterOf(i int, tp string, partition int32, offset int64, eventID string, key, value []byte, size int, reason string) ID {
	d := driver.DeadLetter{Partition: partition, Offset: offset, Reason: reason, EventID: eventID, Key: key, Payload: value, Size: size,
		SHA256: sha256.Sum256(value)}
	return ID{Server: i, N: w.servers[i].SeedDeadLetter(tp, "c", d, w.now.Add(-time.Hour))}
}

// row reads dead letter id of server i.
func (w *world) row(t *testing.T, id ID) deadletters.Row {
	t.Helper()
	r, err := w.letters[id.Server].Get(t.Context(), id.N)
	if err != nil {
		t.Fatal(err)
	}
	return *r
}

// consumed reads every record of the topic: as many as its end offsets
// say it holds.
func (w *world) consumed(t *testing.T) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(w.cluster.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	var out []*kgo.Record
	for int64(len(out)) < total && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	if int64(len(out)) < total {
		t.Fatalf("read %d of the %d records of the topic", len(out), total)
	}
	return out
}

// TestReinjectProducesOnceAndAudits: a corrected payload of a dead letter
// on a shard server is produced to the original partition with the
// original key and the headers naming its origin; the row records who,
// what (the SHA-256 of the value produced) and where it landed; a second
// attempt is refused (already reinjected), and produces nothing.
func TestReinjectProducesOnceAndAudits(t *testing.T) {
	w := newWorld(t)
	bad := []byte(`{"event_id":"e-7f3a","account_id":"acct-42","amount_minor":12.5,"currency":"EUR","occurred_at":"2026-11-29T13:05:00Z"}`)
	id := w.letter(1, 2, 17, "e-7f3a", []byte("acct-42"), bad, "amount_not_integer")
	fixed := filepath.Join(t.TempDir(), "fixed.json")
	if err := os.WriteFile(fixed, payload("e-7f3a", "acct-42"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	res, err := w.r.Reinject(ctx, Request{ID: id, PayloadFile: fixed, By: "ops@host", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.EventID != "e-7f3a" || res.Partition != 2 || len(res.Overridden) != 0 || len(w.warned) != 0 {
		t.Fatalf("result %+v, warnings %q", res, w.warned)
	}
	recs := w.consumed(t)
	if len(recs) != 1 {
		t.Fatalf("%d records produced, want 1", len(recs))
	}
	rec := recs[0]
	if rec.Partition != 2 || rec.Offset != res.Offset || string(rec.Key) != "acct-42" || !bytes.Equal(rec.Value, payload("e-7f3a", "acct-42")) {
		t.Errorf("record %d/%d key %q value %s", rec.Partition, rec.Offset, rec.Key, rec.Value)
	}
	headers := map[string]string{}
	for _, h := range rec.Headers {
		headers[h.Key] = string(h.Value)
	}
	if headers["billing-reinjected-from"] != topic+"/2/17" || headers["billing-dead-letter-id"] != "1:1" {
		t.Errorf("headers %v", headers)
	}
	row, _ := w.letters[1].Get(ctx, id.N)
	sum := sha256.Sum256(payload("e-7f3a", "acct-42"))
	if !row.ReinjectedAt.Valid || !row.ReinjectedAt.Time.Equal(w.now) || row.ReinjectedBy.String != "ops@host" || row.ReinjectedForced.Bool ||
		!bytes.Equal(row.ReinjectedSHA256, sum[:]) || row.ReinjectedPartition.Int32 != 2 || row.ReinjectedOffset.Int64 != res.Offset {
		t.Errorf("audit %+v", row)
	}

	w.now = w.now.Add(time.Minute)
	_, err = w.r.Reinject(ctx, Request{ID: id, PayloadFile: fixed, By: "someone else", Timeout: 10 * time.Second})
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "already reinjected") {
		t.Fatalf("second re-injection: %v", err)
	}
	if n := len(w.consumed(t)); n != 1 {
		t.Errorf("%d records after a refused second attempt, want 1", n)
	}
	if again, _ := w.letters[1].Get(ctx, id.N); again.ReinjectedBy.String != "ops@host" {
		t.Errorf("a refusal changed the audit: %+v", again)
	}
}

// TestReinjectRefusals: every check refuses without producing or marking
// anything; --force overrides the identity, already-counted and
// already-reinjected checks, each warned about and recorded, and nothing
// overrides a payload that does not decode, a truncated payload, another
// topic or an unknown dead letter.
func TestReinjectRefusals(t *testing.T) {
	file := func(t *testing.T, b []byte) string {
		p := filepath.Join(t.TempDir(), "p.json")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name      string
		setup     func(t *testing.T, w *world) (ID, string)
		want      string // in the refusal
		forceable string // the check Force overrides; "" none
	}{
		{"does not decode", func(t *testing.T, w *world) (ID, string) {
			return w.letter(0, 0, 1, "", []byte("acct-1"), []byte("{not json"), "invalid_json"), ""
		}, "does not decode (invalid_json", ""},
		{"payload cut", func(t *testing.T, w *world) (ID, string) {
			return w.letterOf(0, topic, 0, 1, "e1", []byte("acct-1"), payload("e1", "acct-1")[:20], 100000, "payload_too_large"), ""
		}, "only the first 20 of 100000 bytes", ""},
		{"another topic", func(t *testing.T, w *world) (ID, string) {
			v := payload("e1", "acct-1")
			return w.letterOf(0, "other-topic", 0, 1, "e1", []byte("acct-1"), v, len(v), "invalid_json"), ""
		}, "came from topic other-topic", ""},
		{"unknown", func(t *testing.T, w *world) (ID, string) { return ID{Server: 0, N: 99}, "" }, "no dead letter 99", ""},
		{"no such server", func(t *testing.T, w *world) (ID, string) { return ID{Server: 5, N: 1}, "" }, "no server 5", ""},
		{"another event id", func(t *testing.T, w *world) (ID, string) {
			return w.letter(0, 1, 1, "e1", []byte("acct-1"), []byte(`{"event_id":"e1","account_id":"acct-1","amount_minor":"x"}`), "amount_not_integer"),
				file(t, payload("e2", "acct-1"))
		}, "the payload's event_id e2 differs from the dead letter's e1", "identity"},
		{"another account", func(t *testing.T, w *world) (ID, string) {
			return w.letter(0, 1, 1, "e1", nil, []byte(`{"event_id":"e1","account_id":"acct-1","amount_minor":"x"}`), "amount_not_integer"),
				file(t, payload("e1", "acct-2"))
		}, "account_id acct-2 differs from the dead letter's acct-1", "identity"},
		{"names no event id", func(t *testing.T, w *world) (ID, string) {
			return w.letter(0, 1, 1, "", []byte("acct-1"), []byte("junk"), "invalid_json"), file(t, payload("e9", "acct-1"))
		}, "names no event id", "identity"},
		{"already counted", func(t *testing.T, w *world) (ID, string) {
			w.keys[1]["e1"] = dedup.Stored{ExpiresAt: w.now.Add(time.Hour)}
			return w.letter(0, 1, 1, "e1", []byte("acct-1"), payload("e1", "acct-1"), "rejected_by_database"), ""
		}, "event_id e1 is already counted (dedup key on server 1", "already_counted"},
		{"already reinjected", func(t *testing.T, w *world) (ID, string) {
			id := w.letter(0, 1, 1, "e1", []byte("acct-1"), payload("e1", "acct-1"), "rejected_by_database")
			row := w.row(t, id)
			if ok, err := w.letters[0].Mark(t.Context(), &row, deadletters.Audit{At: w.now.Add(-time.Hour), By: "earlier"}); err != nil || !ok {
				t.Fatalf("mark: %v %v", ok, err)
			}
			return id, ""
		}, "was already reinjected at", "already_reinjected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, force := range []bool{false, true} {
				w := newWorld(t)
				id, f := tc.setup(t, w)
				var before deadletters.Row
				if id.Server == 0 {
					if r, err := w.letters[0].Get(t.Context(), id.N); err == nil {
						before = *r
					}
				}
				res, err := w.r.Reinject(t.Context(), Request{ID: id, PayloadFile: f, By: "ops", Force: force, Timeout: 5 * time.Second})
				if !force || tc.forceable == "" {
					if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) {
						t.Fatalf("force=%v: err %v, want a refusal naming %q", force, err, tc.want)
					}
					if n := len(w.consumed(t)); n != 0 {
						t.Fatalf("force=%v: a refusal produced %d records", force, n)
					}
					after, _ := w.letters[0].Get(t.Context(), id.N)
					if after != nil && !sameMark(after.ReinjectedAt, before.ReinjectedAt) {
						t.Fatalf("force=%v: a refusal marked the row", force)
					}
					continue
				}
				if err != nil {
					t.Fatalf("forced: %v", err)
				}
				if !slices.Contains(res.Overridden, tc.forceable) || len(w.warned) == 0 || !strings.Contains(strings.Join(w.warned, "\n"), tc.want) {
					t.Fatalf("forced: overridden %v, warnings %q; want %s overridden and %q warned", res.Overridden, w.warned, tc.forceable, tc.want)
				}
				if row := w.row(t, id); !row.ReinjectedForced.Bool || !row.ReinjectedOffset.Valid {
					t.Fatalf("forced: audit %+v", row)
				}
				if n := len(w.consumed(t)); n != 1 {
					t.Fatalf("forced: %d records produced, want 1", n)
				}
			}
		})
	}
}

// A dead letter of a counted event is judged as the pipeline would judge
// the version it holds (dedup.ClassifyVersions): a higher revision within
// the horizon amends the counted one and goes through, unforced; a copy,
// another content of the counted revision, a lower revision, and one past
// the horizon or against a key that keeps no version are refused, each
// saying what the pipeline would do instead.
func TestReinjectJudgesVersionsAsThePipeline(t *testing.T) {
	rev := func(r int64, cancelled bool) []byte {
		if cancelled {
			return fmt.Appendf(nil, `{"event_id":"e1","revision":%d,"cancelled":true}`, r)
		}
		return fmt.Appendf(nil, `{"event_id":"e1","revision":%d,"account_id":"acct-1","amount_minor":1250,"currency":"EUR","occurred_at":"2026-11-29T13:05:00Z"}`, r)
	}
	counted := func(w *world, firstAgo time.Duration, content []byte) dedup.Stored {
		ev, err := event.NewDecoder(65536).Decode(content)
		if err != nil {
			t.Fatal(err)
		}
		return dedup.Stored{Fingerprint: ev.Fingerprint(), ExpiresAt: w.now.Add(keyTTL - firstAgo), Version: dedup.VersionOf(&ev)}
	}
	for _, tc := range []struct {
		name   string
		stored func(w *world) dedup.Stored
		letter []byte
		want   string // in the refusal; "": produced
	}{
		{"a higher revision amends", func(w *world) dedup.Stored { return counted(w, time.Hour, rev(0, false)) }, rev(1, false), ""},
		{"a tombstone cancels", func(w *world) dedup.Stored { return counted(w, time.Hour, rev(0, false)) }, rev(3, true), ""},
		{"the same content is a repeat", func(w *world) dedup.Stored { return counted(w, time.Hour, rev(1, false)) }, rev(1, false), "drops this copy as a repeat"},
		{"other content of the counted revision", func(w *world) dedup.Stored {
			return counted(w, time.Hour, bytes.Replace(rev(1, false), []byte("1250"), []byte("999"), 1))
		}, rev(1, false), "conflicting_duplicate"},
		{"a lower revision is stale", func(w *world) dedup.Stored { return counted(w, time.Hour, rev(2, false)) }, rev(1, false), "drops revision 1 as stale"},
		{"past the horizon", func(w *world) dedup.Stored { return counted(w, keyTTL/2+time.Hour, rev(0, false)) }, rev(1, false), "version_past_horizon"},
		{"a key that keeps no version", func(w *world) dedup.Stored {
			s := counted(w, time.Hour, rev(0, false))
			s.Version, s.Unknown = dedup.Version{}, true
			return s
		}, rev(1, false), "version_past_horizon"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			w.keys[1]["e1"] = tc.stored(w)
			id := w.letter(0, 1, 1, "e1", []byte("acct-1"), tc.letter, "rejected_by_database")
			res, err := w.r.Reinject(t.Context(), Request{ID: id, By: "ops", Timeout: 5 * time.Second})
			if tc.want != "" {
				if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "already counted (dedup key on server 1") {
					t.Fatalf("err %v, want a refusal saying %q", err, tc.want)
				}
				if n := len(w.consumed(t)); n != 0 {
					t.Fatalf("a refusal produced %d records", n)
				}
				return
			}
			if err != nil || len(res.Overridden) != 0 || len(w.warned) != 0 {
				t.Fatalf("reinject: %v, overridden %v, warned %q; want it produced unforced", err, res.Overridden, w.warned)
			}
			if n := len(w.consumed(t)); n != 1 {
				t.Fatalf("%d records produced, want 1", n)
			}
		})
	}
}

// TestExpiredKeyIsNotCounted: a dedup key past its expiry (the janitor
// has not deleted it yet) does not count as counted.
func TestExpiredKeyIsNotCounted(t *testing.T) {
	w := newWorld(t)
	w.keys[0]["e1"] = dedup.Stored{ExpiresAt: w.now.Add(-time.Second)}
	id := w.letter(0, 0, 3, "e1", []byte("acct-1"), payload("e1", "acct-1"), "rejected_by_database")
	if _, err := w.r.Reinject(t.Context(), Request{ID: id, By: "ops", Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
}

// TestFailedProducePutsTheRowBack: a produce that fails leaves the row as
// it was, so that the dead letter can be re-injected again.
func TestFailedProducePutsTheRowBack(t *testing.T) {
	w := newWorld(t)
	w.r.Producer = failing{}
	id := w.letter(0, 0, 3, "e1", []byte("acct-1"), payload("e1", "acct-1"), "rejected_by_database")
	_, err := w.r.Reinject(t.Context(), Request{ID: id, By: "ops", Timeout: 5 * time.Second})
	if err == nil || errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "broker unreachable") || !strings.Contains(err.Error(), "running reinject again is safe") {
		t.Fatalf("err %v", err)
	}
	if row := w.row(t, id); row.ReinjectedAt.Valid || row.ReinjectedBy.Valid {
		t.Fatalf("the row keeps the mark of a failed produce: %+v", row)
	}
}

// readAllFirst holds every Get until n of them have read the row: each
// of n re-injections then marks a row it read unmarked.
type readAllFirst struct {
	memdriver.Letters
	read sync.WaitGroup
}

func (r *readAllFirst) Get(ctx context.Context, id int64) (*deadletters.Row, error) {
	row, err := r.Letters.Get(ctx, id)
	r.read.Done()
	r.read.Wait()
	return row, err
}

// TestConcurrentReinjectionsProduceOnce: of re-injections of one dead
// letter racing, each having read the row before any marked it, exactly
// one produces; the others are refused as concurrent.
func TestConcurrentReinjectionsProduceOnce(t *testing.T) {
	w := newWorld(t)
	w.r.Warn = nil
	id := w.letter(0, 1, 3, "e1", []byte("acct-1"), payload("e1", "acct-1"), "rejected_by_database")
	const n = 8
	held := &readAllFirst{Letters: w.letters[0]}
	held.read.Add(n)
	w.r.Servers[0].Letters = held
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, errs[i] = w.r.Reinject(t.Context(), Request{ID: id, By: fmt.Sprint("op", i), Timeout: 5 * time.Second})
		})
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "reinjected concurrently"):
			t.Errorf("not refused as concurrent: %v", err)
		}
	}
	if ok != 1 || len(w.consumed(t)) != 1 {
		t.Fatalf("%d succeeded, %d records; want exactly one", ok, len(w.consumed(t)))
	}
}

func TestParseID(t *testing.T) {
	for in, want := range map[string]ID{"12": {0, 12}, "0:7": {0, 7}, "2:7": {2, 7}} {
		got, err := ParseID(in)
		if err != nil || got != want {
			t.Errorf("ParseID(%q) = %v, %v; want %v", in, got, err, want)
		}
		if in != "0:7" && got.String() != in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), in)
		}
	}
	for _, bad := range []string{"", "0", "-1", "x", "1:", ":1", "-1:2", "1:2:3", "1:0"} {
		if _, err := ParseID(bad); !errors.Is(err, ErrBadID) {
			t.Errorf("ParseID(%q) accepted: %v", bad, err)
		}
	}
}
