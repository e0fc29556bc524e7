package ledgerstatus

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// letters are dead letters waiting per server, as the pools would count
// them.
type letters map[int][]Waiting

func (l letters) Waiting(_ context.Context, i int, _ string, _ []int32) ([]Waiting, error) {
	return l[i], nil
}

// ledger is a ledger on two in-memory servers with an identity.
type ledger struct {
	servers []*memdriver.Server
	id      txsink.Identity
}

func newLedger(t *testing.T, now func() time.Time) *ledger {
	l := &ledger{}
	for range 2 {
		l.servers = append(l.servers, memdriver.New(memdriver.Options{AttachPrepared: true, Now: now}).As("billing"))
	}
	id, secret, err := l.servers[0].Identity(t.Context(), func() (string, []byte) { return "00112233445566ff", []byte("the ledger's secret") })
	if err != nil {
		t.Fatal(err)
	}
	l.id = txsink.Identity{ID: id, Secret: secret}
	return l
}

// prepare leaves a branch of xid x prepared on server i.
func (l *ledger) prepare(t *testing.T, i int, x driver.Xid) {
	t.Helper()
	ctx := t.Context()
	c, err := l.servers[i].Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []driver.Verb{driver.Start, driver.End, driver.Prepare} {
		if err := c.XA(ctx, v, x); err != nil {
			t.Fatalf("XA %s %v: %v", v, x, err)
		}
	}
}

// TestCollectReadsTheLedgerThroughTheView: a report of a ledger on the
// in-memory driver, every part read through driver.View: positions
// against the log, the groups the ledger holds, the last checkpoint, the
// commit log, the period settings, the dead letters of both servers, and
// the branches in doubt, where a branch is this ledger's by its MAC alone:
// one that names the ledger's id with a forged MAC is another's (issue 19:
// status decided it by the id's presence in the bqual).
func TestCollectReadsTheLedgerThroughTheView(t *testing.T) {
	ctx := t.Context()
	now := time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	l := newLedger(t, clock)
	control := l.servers[0]
	scope := driver.Scope{Group: "billing-ledger", Topic: "events"}
	claimed := now.Add(-time.Hour)
	if _, err := control.Claim(ctx, scope, "inst-a", []int32{0, 1}, claimed); err != nil {
		t.Fatal(err)
	}
	if _, err := control.Claim(ctx, driver.Scope{Group: "billing-blue", Topic: "events"}, "inst-b", []int32{0}, claimed); err != nil {
		t.Fatal(err)
	}
	decided := driver.Decision{Gtrid: "blg1-insta-5-19000000000", Outcome: driver.Committed, By: "inst-a", At: now.Add(-10 * time.Second)}
	if _, err := control.Commit(ctx, decided, scope, []driver.Cut{{Partition: 0, NextOffset: 60}}, func([]driver.Stored) error { return nil }, nil, nil, nil, true); err != nil {
		t.Fatal(err)
	}

	// In doubt: this ledger's branch on the shard, aborted; a forged one
	// naming this ledger's id; another ledger's sharing the shard.
	gtrid := txsink.GlobalID{Instance: "insta", Checkpoint: 7, Created: now.Add(-90 * time.Second)}.String()
	mine := l.id.Xid(gtrid, txsink.Qualifier{Participant: 1, Conn: 5, Ledger: l.id.ID})
	l.prepare(t, 1, mine)
	if _, err := control.Decide(ctx, driver.Decision{Gtrid: gtrid, Outcome: driver.Aborted, By: "recovery", At: now}); err != nil {
		t.Fatal(err)
	}
	forgedGtrid := txsink.GlobalID{Instance: "mallory", Checkpoint: 1, Created: now}.String()
	l.prepare(t, 0, driver.Xid{Format: txsink.FormatID, Gtrid: forgedGtrid, Bqual: "p0-c1-l" + l.id.ID + "-m000000000000"})
	other := txsink.Identity{ID: "ffeeddccbbaa9988", Secret: []byte("another ledger")}
	otherGtrid := txsink.GlobalID{Instance: "elsewhere", Checkpoint: 3, Created: now}.String()
	l.prepare(t, 1, other.Xid(otherGtrid, txsink.Qualifier{Participant: 0, Conn: 9, Ledger: other.ID}))
	l.prepare(t, 1, driver.Xid{Format: 7, Gtrid: "not-ours", Bqual: "b"}) // not this service's: not listed

	control.Cluster().StorePeriods(driver.PeriodRow{Seq: 1, Window: "day", Timezone: "Europe/Berlin", Close: true, RecordedAt: claimed, RecordedBy: "inst-a"})
	k := fakeKafka{ends: listed("events", map[int32]int64{0: 100, 1: 50}), starts: listed("events", map[int32]int64{0: 0, 1: 0}),
		groups: kadm.DescribedGroups{"billing-ledger": {Group: "billing-ledger", State: "Empty"}}}
	// Dead letters on both servers, on the in-memory driver: two waiting
	// on the control server (one re-injected, one of another topic, not
	// counted), one on the shard.
	seed := func(i int, tp string, offset int64, at time.Time) int64 {
		return l.servers[i].Cluster().SeedDeadLetter(tp, "ck", driver.DeadLetter{Partition: 0, Offset: offset, Reason: "invalid_json", Payload: []byte{}}, at)
	}
	seed(0, "events", 1, claimed)
	seed(0, "events", 2, now)
	seed(0, "other", 3, claimed.Add(-time.Hour))
	reinjected := seed(0, "events", 4, claimed.Add(-time.Hour))
	seed(1, "events", 5, now)
	if ok, err := l.servers[0].Letters().Mark(ctx, &driver.DeadLetterRecord{ID: reinjected}, driver.LetterAudit{At: now, By: "ops"}); err != nil || !ok {
		t.Fatalf("mark: %v %v", ok, err)
	}
	dead := ServerLetters{l.servers[0].Letters(), l.servers[1].Letters()}
	r := Collect(ctx, Sources{View: memdriver.NewView(l.servers...), Letters: dead, Kafka: k, Topic: "events", Group: "billing-ledger", Now: clock,
		Environment: Periods{Windows: "environment's, must not show", WindowsClose: false}})

	if !r.Complete() || r.Absent() != "" {
		t.Fatalf("problems %q, absent %q", r.Problems, r.Absent())
	}
	if len(r.Partitions) != 2 || r.TotalLag == nil || *r.TotalLag != 90 {
		t.Fatalf("partitions %+v, total lag %v; want lags 40 and 50", r.Partitions, r.TotalLag)
	}
	p0, p1 := r.Partitions[0], r.Partitions[1]
	if p0.Stored != StoredAt || *p0.StoredOffset != 60 || p0.Owner != "inst-a" || p0.Epoch != 1 || !p0.UpdatedAt.Equal(decided.At) || *p0.Lag != 40 {
		t.Errorf("partition 0: %+v", p0)
	}
	if p1.Stored != StoredStart || *p1.Lag != 50 || !p1.UpdatedAt.Equal(claimed) {
		t.Errorf("partition 1: %+v", p1)
	}
	if !r.GroupStored || len(r.StoredGroups) != 2 || r.StoredGroups[0].Group != "billing-blue" {
		t.Errorf("stored groups %+v (stored %v)", r.StoredGroups, r.GroupStored)
	}
	if c := r.LastCheckpoint; c == nil || c.Gtrid != decided.Gtrid || c.DecidedBy != "inst-a" || c.AgeSeconds != 10 {
		t.Errorf("last checkpoint %+v", c)
	}
	if c := r.CommitLog; c == nil || c.VisibleSeq != 1 || c.DecidedSeq != 1 || c.RetainedFrom != 1 || c.Unapplied != 0 {
		t.Errorf("commit log %+v", c)
	}
	if c := r.Changelog; c == nil || c.On {
		t.Errorf("changelog %+v, want off", c)
	}
	// The changelog turned on for this ledger, which holds rows: its
	// snapshot pending, nothing published, one publisher leased.
	if _, err := control.EnableChangelog(ctx, "cl", now); err != nil {
		t.Fatal(err)
	}
	if _, err := control.LeaseChangelog(ctx, "inst-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := control.Commit(ctx, driver.Decision{Gtrid: "blg1-insta-6-19000000000", Outcome: driver.Committed, By: "inst-a", At: now, Changelog: true},
		scope, []driver.Cut{{Partition: 0, NextOffset: 61}}, func([]driver.Stored) error { return nil }, nil, nil, nil,
		true); err != nil {
		t.Fatal(err)
	}
	r = Collect(ctx, Sources{View: memdriver.NewView(l.servers...), Letters: dead, Kafka: k, Topic: "events", Group: "billing-ledger", Now: clock})
	if c := r.Changelog; c == nil || !c.On || c.Prefix != "cl" || c.From != 2 || !c.SnapshotPending || c.PublishedSeq != 1 ||
		c.Behind == nil || *c.Behind != 1 || c.Publisher != "inst-a" || c.LeaseLeftSeconds <= 0 {
		t.Errorf("changelog on: %+v", c)
	}
	if len(r.InDoubt) != 1 || r.OtherLedgersInDoubt == nil || *r.OtherLedgersInDoubt != 2 {
		t.Fatalf("in doubt %+v, of other ledgers %v; want this ledger's one, and the forged and the other ledger's as others'", r.InDoubt, r.OtherLedgersInDoubt)
	}
	if b := r.InDoubt[0]; b.Server != 1 || b.Gtrid != gtrid || b.Bqual != mine.Bqual || b.Ledger != "this" || b.Instance != "insta" ||
		b.Checkpoint != 7 || b.Decision != "abort" || math.Abs(b.AgeSeconds-90) > 1e-3 {
		t.Errorf("in doubt: %+v", b)
	}
	if len(r.DeadLetters) != 1 || r.DeadLetters[0].Count != 3 || !r.DeadLetters[0].Oldest.Equal(claimed) {
		t.Errorf("dead letters %+v", r.DeadLetters)
	}
	if p := r.Periods; p == nil || p.Source != "ledger" || p.Windows != "day in Europe/Berlin" || !p.WindowsClose {
		t.Errorf("periods %+v", p)
	}

	// A ledger with no period settings stored shows the environment's, and
	// says so.
	fresh := newLedger(t, clock)
	r = Collect(ctx, Sources{View: memdriver.NewView(fresh.servers...), Letters: letters{}, Kafka: k, Topic: "events", Group: "billing-ledger",
		Environment: Periods{Windows: "1h0m0s", WindowsClose: true}})
	if p := r.Periods; p == nil || p.Source != "environment" || p.Windows != "1h0m0s" || !p.WindowsClose || !r.Complete() {
		t.Errorf("no settings stored: periods %+v, problems %q", p, r.Problems)
	}
	if r.LastCheckpoint != nil || len(r.InDoubt) != 0 || *r.OtherLedgersInDoubt != 0 || r.CommitLog == nil || r.CommitLog.VisibleSeq != 0 {
		t.Errorf("fresh ledger: %+v", r)
	}
}

// TestInDoubtIsThisLedgersByTheMACAlone: every way a branch can fail to be
// this ledger's (another ledger's identity, a forged or cut MAC, another
// gtrid signed, this service's format without a qualifier) is another's;
// with the identity unknown every branch of the service may be this
// ledger's.
func TestInDoubtIsThisLedgersByTheMACAlone(t *testing.T) {
	now := time.Now()
	l := newLedger(t, time.Now)
	gtrid := func(n uint64) string { return txsink.GlobalID{Instance: "i", Checkpoint: n, Created: now}.String() }
	good := l.id.Xid(gtrid(1), txsink.Qualifier{Participant: 0, Conn: 1, Ledger: l.id.ID})
	resigned := l.id.Xid(gtrid(2), txsink.Qualifier{Participant: 0, Conn: 1, Ledger: l.id.ID})
	resigned.Gtrid = gtrid(3) // the MAC covers the gtrid
	cut := good
	cut.Gtrid, cut.Bqual = gtrid(4), good.Bqual[:len(good.Bqual)-1]
	bad := []driver.Xid{
		resigned, cut,
		{Format: txsink.FormatID, Gtrid: gtrid(5), Bqual: "p0-c1-l" + l.id.ID + "-m" + "0123456789ab"},
		{Format: txsink.FormatID, Gtrid: gtrid(6), Bqual: l.id.ID},
		(&txsink.Identity{ID: l.id.ID, Secret: []byte("guessed")}).Xid(gtrid(7), txsink.Qualifier{Participant: 0, Conn: 1, Ledger: l.id.ID}),
	}
	l.prepare(t, 0, good)
	for _, x := range bad {
		l.prepare(t, 0, x)
	}
	v := memdriver.NewView(l.servers...)
	branches, err := InDoubt(t.Context(), v, 0, &l.id)
	if err != nil {
		t.Fatal(err)
	}
	if len(branches) != 1+len(bad) {
		t.Fatalf("%d branches, want %d", len(branches), 1+len(bad))
	}
	for _, b := range branches {
		want := "other"
		if b.Gtrid == good.Gtrid {
			want = "this"
		}
		if b.Ledger != want || b.Mine() != (want == "this") {
			t.Errorf("%s / %s: ledger %q, want %q", b.Gtrid, b.Bqual, b.Ledger, want)
		}
	}
	unknown, err := InDoubt(t.Context(), v, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range unknown {
		if b.Ledger != "" || !b.Mine() {
			t.Errorf("identity unknown: %+v", b)
		}
	}
	if _, err := InDoubt(t.Context(), v, 2, &l.id); err == nil {
		t.Error("a server the ledger does not have: no error")
	}
}
