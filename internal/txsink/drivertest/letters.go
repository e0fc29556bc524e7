package drivertest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// Letters is dead_letters as the operator's tools read and update it
// (driver/letters.go): the union of what its consumers declare.
type Letters interface {
	List(ctx context.Context, f driver.LetterFilter) ([]driver.DeadLetterRecord, error)
	Get(ctx context.Context, id int64) (*driver.DeadLetterRecord, error)
	Mark(ctx context.Context, r *driver.DeadLetterRecord, a driver.LetterAudit) (bool, error)
	Restore(ctx context.Context, r *driver.DeadLetterRecord, at time.Time) error
	Landed(ctx context.Context, id int64, at time.Time, partition int32, offset int64) error
	Waiting(ctx context.Context, topic string, partitions []int32) ([]driver.LettersWaiting, error)
}

var lettersTests = []struct {
	name string
	fn   func(t *testing.T, ctx context.Context, f Fixture)
}{
	{"Letters/ListAndGetReadWhatTheCheckpointsWrote", testLettersList},
	{"Letters/ReinjectionIsACompareAndSet", testLettersReinjection},
	{"Letters/WaitingCountsByReason", testLettersWaiting},
}

// writeLetters commits letters of topic, one checkpoint each created at
// its instant in at, and returns their ids by offset.
func writeLetters(t *testing.T, ctx context.Context, f Fixture, topic string, letters []driver.DeadLetter, at []time.Time) map[int64]int64 {
	t.Helper()
	for i, d := range letters {
		commit(t, ctx, f, func(tx driver.StoreTx) error {
			return tx.WriteDeadLetters(ctx, topic, fmt.Sprint("c-", i), []driver.DeadLetter{d}, at[i])
		})
	}
	rows, err := f.Letters.List(ctx, driver.LetterFilter{Limit: 1000})
	must(t, err)
	ids := map[int64]int64{}
	for _, r := range rows {
		if r.Topic == topic {
			ids[r.Offset] = r.ID
		}
	}
	return ids
}

// Property: List returns the letters newest first (created_at, then id),
// filtered by reason and by not re-injected, at most Limit, without the
// key and the payload; Get returns one letter whole (a letter without an
// event id or a key reads nil there), and ErrNoDeadLetter for no row.
func testLettersList(t *testing.T, ctx context.Context, f Fixture) {
	t0 := clock()
	var letters []driver.DeadLetter
	var at []time.Time
	for i := range 6 {
		reason := []string{"invalid_json", "missing_field"}[i%2]
		d := driver.DeadLetter{Partition: int32(i % 3), Offset: int64(i), Reason: reason, Detail: fmt.Sprint("detail ", i),
			EventID: fmt.Sprint("e", i), Key: []byte{byte(i), 0}, Payload: []byte(fmt.Sprint("{payload ", i)), Size: 100 + i,
			SHA256: sha256.Sum256([]byte{byte(i)})}
		if i == 5 {
			d.EventID, d.Key = "", nil
		}
		letters = append(letters, d)
		at = append(at, t0.Add(time.Duration(i/2)*time.Minute)) // two letters per instant: the id decides
	}
	ids := writeLetters(t, ctx, f, "list", letters, at)
	if len(ids) != len(letters) {
		t.Fatalf("List found %d of the %d letters written", len(ids), len(letters))
	}
	all, err := f.Letters.List(ctx, driver.LetterFilter{Limit: 100})
	must(t, err)
	var offsets []int64
	for _, r := range all {
		offsets = append(offsets, r.Offset)
		if r.Payload != nil || r.Key != nil {
			t.Errorf("List returned letter %d with its payload %q or key %q", r.Offset, r.Payload, r.Key)
		}
	}
	if want := []int64{5, 4, 3, 2, 1, 0}; !slices.Equal(offsets, want) {
		t.Errorf("List's order %v, want %v (newest first, then the larger id)", offsets, want)
	}
	some, err := f.Letters.List(ctx, driver.LetterFilter{Reason: "missing_field", Limit: 2})
	must(t, err)
	if len(some) != 2 || some[0].Offset != 5 || some[1].Offset != 3 {
		t.Errorf("List of missing_field, limit 2: %+v, want offsets 5 and 3", some)
	}
	r, err := f.Letters.Get(ctx, ids[1])
	must(t, err)
	want := letters[1]
	if r.ID != ids[1] || r.Topic != "list" || r.Partition != want.Partition || r.Offset != 1 || r.Reason != want.Reason || r.Detail != want.Detail ||
		string(r.EventID) != want.EventID || string(r.Key) != string(want.Key) || string(r.Payload) != string(want.Payload) ||
		r.PayloadSize != int64(want.Size) || string(r.PayloadSHA) != string(want.SHA256[:]) || r.Checkpoint != "c-1" || !r.CreatedAt.Equal(at[1]) ||
		r.ReinjectedAt.Valid || r.ReinjectedBy.Valid || r.ReinjectedForced.Valid || r.ReinjectedPartition.Valid || r.ReinjectedOffset.Valid || r.ReinjectedSHA256 != nil {
		t.Errorf("Get = %+v, want letter %+v as written, never re-injected", r, want)
	}
	if r, err := f.Letters.Get(ctx, ids[5]); err != nil || r.EventID != nil || r.Key != nil || string(r.Payload) != string(letters[5].Payload) {
		t.Errorf("Get of a letter without event id and key = %+v, %v", r, err)
	}
	if _, err := f.Letters.Get(ctx, 1<<40); !errors.Is(err, driver.ErrNoDeadLetter) {
		t.Errorf("Get of no row: %v, want ErrNoDeadLetter", err)
	}
	// Pending leaves the re-injected out.
	if ok, err := f.Letters.Mark(ctx, r, driver.LetterAudit{At: t0, By: "op", SHA256: sum(0)}); err != nil || !ok {
		t.Fatalf("mark: %v %v", ok, err)
	}
	pending, err := f.Letters.List(ctx, driver.LetterFilter{Pending: true, Limit: 100})
	must(t, err)
	if len(pending) != 5 || slices.ContainsFunc(pending, func(p driver.DeadLetterRecord) bool { return p.ID == ids[1] }) {
		t.Errorf("List of the pending: %d letters, want the 5 not re-injected", len(pending))
	}
}

// Property: Mark is a compare-and-set on reinjected_at (it fails on a row
// marked since it was read); Landed and Restore change only a row that
// still holds their mark; a restore puts every re-injection column back as
// read, to none for a row never marked.
func testLettersReinjection(t *testing.T, ctx context.Context, f Fixture) {
	t0 := clock()
	l := f.Letters
	ids := writeLetters(t, ctx, f, "reinject", []driver.DeadLetter{
		{Partition: 1, Offset: 7, Reason: "invalid_json", Detail: "d", EventID: "e1", Key: []byte("k"), Payload: []byte("{}"), Size: 2},
		{Partition: 1, Offset: 8, Reason: "invalid_json", Payload: []byte{}},
	}, []time.Time{t0, t0})
	id, fresh := ids[7], ids[8]
	r, err := l.Get(ctx, id)
	must(t, err)
	first := time.Date(2026, 11, 29, 13, 0, 0, 123456000, time.UTC)
	if ok, err := l.Mark(ctx, r, driver.LetterAudit{At: first, By: "a", SHA256: sum(1)}); err != nil || !ok {
		t.Fatalf("first mark: %v %v", ok, err)
	}
	// A second re-injection that read the row before the first mark.
	if ok, err := l.Mark(ctx, r, driver.LetterAudit{At: first.Add(time.Second), By: "b", SHA256: sum(2)}); err != nil || ok {
		t.Fatalf("a mark over a row marked since it was read: %v %v", ok, err)
	}
	must(t, l.Landed(ctx, id, first.Add(time.Hour), 3, 99)) // another mark's: nothing
	must(t, l.Landed(ctx, id, first, 2, 42))
	marked, err := l.Get(ctx, id)
	must(t, err)
	if !marked.ReinjectedAt.Time.Equal(first) || marked.ReinjectedBy.String != "a" || marked.ReinjectedForced.Bool || !marked.ReinjectedForced.Valid ||
		marked.ReinjectedPartition.Int32 != 2 || marked.ReinjectedOffset.Int64 != 42 || string(marked.ReinjectedSHA256) != string(sum(1)) {
		t.Fatalf("after mark and landed: %+v", marked)
	}
	// A re-injection of a marked row (forced) marks over the last one,
	// then its produce fails: the row goes back to the first mark.
	second := first.Add(time.Minute)
	if ok, err := l.Mark(ctx, marked, driver.LetterAudit{At: second, By: "c", Forced: true, SHA256: sum(3)}); err != nil || !ok {
		t.Fatalf("mark over the row as read: %v %v", ok, err)
	}
	if now, _ := l.Get(ctx, id); now.ReinjectedBy.String != "c" || !now.ReinjectedForced.Bool || now.ReinjectedOffset.Valid || now.ReinjectedPartition.Valid {
		t.Fatalf("a mark keeps the last landing or the forced flag: %+v", now)
	}
	must(t, l.Restore(ctx, marked, first)) // not its mark: nothing
	if now, _ := l.Get(ctx, id); now.ReinjectedBy.String != "c" || now.ReinjectedOffset.Valid {
		t.Fatalf("a restore under another mark changed the row: %+v", now)
	}
	must(t, l.Restore(ctx, marked, second))
	back, err := l.Get(ctx, id)
	must(t, err)
	if !back.ReinjectedAt.Time.Equal(first) || back.ReinjectedBy.String != "a" || back.ReinjectedForced.Bool || back.ReinjectedOffset.Int64 != 42 ||
		string(back.ReinjectedSHA256) != string(sum(1)) {
		t.Fatalf("after restore: %+v", back)
	}
	// A row never marked is restored to never marked.
	fr, err := l.Get(ctx, fresh)
	must(t, err)
	if ok, err := l.Mark(ctx, fr, driver.LetterAudit{At: second, By: "d", SHA256: sum(4)}); err != nil || !ok {
		t.Fatalf("mark: %v %v", ok, err)
	}
	must(t, l.Restore(ctx, fr, second))
	if again, _ := l.Get(ctx, fresh); again.ReinjectedAt.Valid || again.ReinjectedBy.Valid || again.ReinjectedSHA256 != nil {
		t.Fatalf("restored to a mark: %+v", again)
	}
	// No row: nothing marked, nothing changed.
	if ok, err := l.Mark(ctx, &driver.DeadLetterRecord{ID: 1 << 40}, driver.LetterAudit{At: second, By: "e"}); err != nil || ok {
		t.Fatalf("mark of no row: %v %v", ok, err)
	}
}

// Property: Waiting counts the letters of the topic not re-injected, by
// reason in reason order with the oldest's instant; partitions non-nil
// counts those partitions only, and none for an empty list.
func testLettersWaiting(t *testing.T, ctx context.Context, f Fixture) {
	t0 := clock()
	var letters []driver.DeadLetter
	var at []time.Time
	for i := range 6 {
		letters = append(letters, driver.DeadLetter{Partition: int32(i % 3), Offset: int64(i), Reason: []string{"b_reason", "a_reason"}[i%2], Payload: []byte{}})
		at = append(at, t0.Add(-time.Duration(i)*time.Minute))
	}
	ids := writeLetters(t, ctx, f, "waiting", letters, at)
	writeLetters(t, ctx, f, "elsewhere", letters[:1], at[:1])
	r, err := f.Letters.Get(ctx, ids[5])
	must(t, err)
	if ok, err := f.Letters.Mark(ctx, r, driver.LetterAudit{At: t0, By: "op"}); err != nil || !ok {
		t.Fatalf("mark: %v %v", ok, err)
	}
	got, err := f.Letters.Waiting(ctx, "waiting", nil)
	must(t, err)
	want := []driver.LettersWaiting{{Reason: "a_reason", Count: 2, Oldest: at[3]}, {Reason: "b_reason", Count: 3, Oldest: at[4]}}
	if !sameWaiting(got, want) {
		t.Errorf("Waiting = %+v, want %+v (letter 5 re-injected)", got, want)
	}
	got, err = f.Letters.Waiting(ctx, "waiting", []int32{0, 2})
	must(t, err)
	want = []driver.LettersWaiting{{Reason: "a_reason", Count: 1, Oldest: at[3]}, {Reason: "b_reason", Count: 2, Oldest: at[2]}}
	if !sameWaiting(got, want) {
		t.Errorf("Waiting of partitions 0 and 2 = %+v, want %+v", got, want)
	}
	if got, err := f.Letters.Waiting(ctx, "waiting", []int32{}); err != nil || len(got) != 0 {
		t.Errorf("Waiting of no partition = %+v, %v, want none", got, err)
	}
	if got, err := f.Letters.Waiting(ctx, "nothing", nil); err != nil || len(got) != 0 {
		t.Errorf("Waiting of a topic without letters = %+v, %v", got, err)
	}
}

func sameWaiting(a, b []driver.LettersWaiting) bool {
	return slices.EqualFunc(a, b, func(x, y driver.LettersWaiting) bool {
		return x.Reason == y.Reason && x.Count == y.Count && x.Oldest.Equal(y.Oldest)
	})
}

// sum is a SHA-256 as the audit keeps one.
func sum(b byte) []byte {
	s := sha256.Sum256([]byte{b})
	return s[:]
}
