package reinject

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billing/ledger/internal/deadletters"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// lettersContract holds an implementation of Letters to what the protocol
// relies on: Get reads what is stored (ErrNotFound for no row); Mark is a
// compare-and-set on the re-injection columns (it fails on a row marked
// since it was read); Restore and Landed change only the row that still
// holds their mark. insert stores a dead letter and returns its id.
func lettersContract(t *testing.T, l Letters, insert func(deadletters.Row) int64) {
	ctx := t.Context()
	if _, err := l.Get(ctx, 1<<40); !errors.Is(err, deadletters.ErrNotFound) {
		t.Fatalf("Get of no row: %v", err)
	}
	id := insert(deadletters.Row{Topic: "t", Partition: 1, Offset: 7, Reason: "invalid_json", Detail: "d", EventID: []byte("e1"),
		Key: []byte("k"), Payload: []byte("{}"), PayloadSize: 2, PayloadSHA: make([]byte, 32), Checkpoint: "c", CreatedAt: time.Now().UTC().Truncate(time.Second)})
	r, err := l.Get(ctx, id)
	if err != nil || r.ID != id || r.Offset != 7 || string(r.EventID) != "e1" || r.ReinjectedAt.Valid {
		t.Fatalf("Get: %+v %v", r, err)
	}
	first := time.Date(2026, 11, 29, 13, 0, 0, 123456000, time.UTC)
	if ok, err := l.Mark(ctx, r, deadletters.Audit{At: first, By: "a", SHA256: []byte{1}}); err != nil || !ok {
		t.Fatalf("first mark: %v %v", ok, err)
	}
	// A second re-injection that read the row before the first mark.
	if ok, err := l.Mark(ctx, r, deadletters.Audit{At: first.Add(time.Second), By: "b", SHA256: []byte{2}}); err != nil || ok {
		t.Fatalf("a mark over a row marked since it was read: %v %v", ok, err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(l.Landed(ctx, id, first.Add(time.Hour), 3, 99)) // another mark's: nothing
	must(l.Landed(ctx, id, first, 2, 42))
	marked, err := l.Get(ctx, id)
	must(err)
	if !marked.ReinjectedAt.Time.Equal(first) || marked.ReinjectedBy.String != "a" || marked.ReinjectedPartition.Int32 != 2 || marked.ReinjectedOffset.Int64 != 42 {
		t.Fatalf("after mark and landed: %+v", marked)
	}
	// A re-injection of a marked row (forced) marks over the last one,
	// then its produce fails: the row goes back to the first mark.
	second := first.Add(time.Minute)
	if ok, err := l.Mark(ctx, marked, deadletters.Audit{At: second, By: "c", Forced: true, SHA256: []byte{3}}); err != nil || !ok {
		t.Fatalf("mark over the row as read: %v %v", ok, err)
	}
	must(l.Restore(ctx, marked, first)) // not its mark: nothing
	if now, _ := l.Get(ctx, id); now.ReinjectedBy.String != "c" || now.ReinjectedOffset.Valid {
		t.Fatalf("a restore under another mark changed the row: %+v", now)
	}
	must(l.Restore(ctx, marked, second))
	back, err := l.Get(ctx, id)
	must(err)
	if !back.ReinjectedAt.Time.Equal(first) || back.ReinjectedBy.String != "a" || back.ReinjectedForced.Bool || back.ReinjectedOffset.Int64 != 42 {
		t.Fatalf("after restore: %+v", back)
	}
	// A row never marked is restored to never marked.
	fresh := insert(deadletters.Row{Topic: "t", Partition: 1, Offset: 8, Reason: "invalid_json", Payload: []byte{}, PayloadSHA: make([]byte, 32), CreatedAt: time.Now().UTC().Truncate(time.Second)})
	fr, err := l.Get(ctx, fresh)
	must(err)
	if ok, err := l.Mark(ctx, fr, deadletters.Audit{At: second, By: "d", SHA256: []byte{4}}); err != nil || !ok {
		t.Fatalf("mark: %v %v", ok, err)
	}
	must(l.Restore(ctx, fr, second))
	if again, _ := l.Get(ctx, fresh); again.ReinjectedAt.Valid || again.ReinjectedBy.Valid {
		t.Fatalf("restored to a mark: %+v", again)
	}
}

// The in-memory driver's table, which the protocol's tests run on, keeps
// the contract.
func TestMemLettersContract(t *testing.T) {
	c := memdriver.New(memdriver.Options{})
	lettersContract(t, c.As("billing").Letters(), func(r deadletters.Row) int64 {
		d := driver.DeadLetter{Partition: r.Partition, Offset: r.Offset, Reason: r.Reason, Detail: r.Detail, EventID: string(r.EventID),
			Key: r.Key, Payload: r.Payload, Size: int(r.PayloadSize)}
		copy(d.SHA256[:], r.PayloadSHA)
		return c.SeedDeadLetter(r.Topic, r.Checkpoint, d, r.CreatedAt)
	})
}

// So does the MySQL one (Pool), against the test server.
func TestPoolLettersContract(t *testing.T) {
	dsn, _ := testenv.LedgerDB(t)
	db, err := mysqldriver.OpenDB(dsn, 5*time.Second, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	lettersContract(t, Pool(db).Letters, func(r deadletters.Row) int64 {
		res, err := db.ExecContext(context.Background(), `INSERT INTO dead_letters (kafka_topic, kafka_partition, kafka_offset, reason, detail, event_id,
			record_key, payload, payload_size, payload_sha256, checkpoint_id, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)`,
			r.Topic, r.Partition, r.Offset, r.Reason, r.Detail, r.EventID, r.Key, r.Payload, r.PayloadSize, r.PayloadSHA, r.Checkpoint, r.CreatedAt)
		if err != nil {
			t.Fatal(err)
		}
		id, err := res.LastInsertId()
		if err != nil {
			t.Fatal(err)
		}
		return id
	})
}
