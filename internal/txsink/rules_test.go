package txsink

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

func TestFence(t *testing.T) {
	stored := []driver.Stored{{Partition: 0, Epoch: 3, Owner: "me"}, {Partition: 1, Epoch: 1, Owner: "me"}}
	tests := []struct {
		name    string
		cuts    []PartitionCut
		fenced  bool
		stored  int64
		byOwner string
	}{
		{"held at the stored epochs", []PartitionCut{{Partition: 0, Epoch: 3}, {Partition: 1, Epoch: 1}}, false, 0, ""},
		{"no cut", nil, false, 0, ""},
		{"claimed since", []PartitionCut{{Partition: 0, Epoch: 2}}, true, 3, "me"},
		{"never stored", []PartitionCut{{Partition: 5, Epoch: 1}}, true, 0, ""},
	}
	for _, tt := range tests {
		err := fence("me", tt.cuts, stored)
		var fe *FencedError
		if got := errors.As(err, &fe); got != tt.fenced || (got && (fe.StoredEpoch != tt.stored || fe.StoredOwner != tt.byOwner || !errors.Is(err, ErrFenced))) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	if err := fence("other", []PartitionCut{{Partition: 0, Epoch: 3}}, stored); err == nil {
		t.Error("another owner at the same epoch passed the fence")
	}
}

func TestRecoveryStep(t *testing.T) {
	const minAge = 30 * time.Second
	tests := []struct {
		decided bool
		outcome driver.Outcome
		age     time.Duration
		want    step
	}{
		{true, driver.Committed, 0, stepCommit},
		{true, driver.Committed, time.Hour, stepCommit},
		{true, driver.Aborted, 0, stepRollback},
		{false, "", minAge - time.Millisecond, stepWait},
		{false, "", minAge, stepAbort},
		{false, "", -time.Hour, stepWait}, // created "in the future" by a fast clock: left alone
	}
	for _, tt := range tests {
		if got := recoveryStep(tt.decided, tt.outcome, tt.age, minAge); got != tt.want {
			t.Errorf("recoveryStep(%v, %q, %s) = %s, want %s", tt.decided, tt.outcome, tt.age, got, tt.want)
		}
	}
}

// Each condition of killVerdict alone keeps the connection alive.
func TestKillVerdict(t *testing.T) {
	const minAge = 30 * time.Second
	holder := driver.Session{Exists: true, OwnUser: true, TxKnown: true, InTx: true, TxAge: time.Hour}
	if why := killVerdict(holder, 2*time.Hour, time.Hour, minAge); why != "" {
		t.Fatalf("the holder of an hour-old branch is kept: %s", why)
	}
	unknown := holder
	unknown.TxKnown, unknown.InTx, unknown.TxAge = false, false, 0
	if why := killVerdict(unknown, 2*time.Hour, time.Hour, minAge); why != "" {
		t.Fatalf("without PROCESS the other checks decide alone: %s", why)
	}
	tests := []struct {
		name   string
		edit   func(*driver.Session)
		uptime time.Duration
		age    time.Duration
	}{
		{"young branch", nil, 2 * time.Hour, minAge - time.Second},
		{"no such connection", func(s *driver.Session) { s.Exists = false }, 2 * time.Hour, time.Hour},
		{"another account's", func(s *driver.Session) { s.OwnUser = false }, 2 * time.Hour, time.Hour},
		{"server restarted since", nil, time.Hour - time.Second, time.Hour},
		{"idle connection", func(s *driver.Session) { s.InTx = false }, 2 * time.Hour, time.Hour},
		{"young transaction", func(s *driver.Session) { s.TxAge = minAge - time.Second }, 2 * time.Hour, time.Hour},
	}
	for _, tt := range tests {
		s := holder
		if tt.edit != nil {
			tt.edit(&s)
		}
		if why := killVerdict(s, tt.uptime, tt.age, minAge); why == "" {
			t.Errorf("%s: the connection would be ended", tt.name)
		}
	}
}

func TestIdentityXid(t *testing.T) {
	id := Identity{ID: "0123456789abcdef", Secret: []byte("0123456789abcdef0123456789abcdef")}
	g := GlobalID{Instance: "0a1b2c3d4e5f", Checkpoint: 1<<64 - 1, Created: time.UnixMilli(1<<43 - 1)}
	q := Qualifier{Participant: 63, Conn: 1<<64 - 1, Ledger: id.ID}
	x := id.Xid(g.String(), q)
	if len(x.Gtrid) > 64 || len(x.Bqual) > 64 || x.Format != FormatID {
		t.Fatalf("xid %+v: over 64 bytes or wrong format", x)
	}
	gb, qb, ok := id.Parse(x)
	if !ok || gb.Instance != g.Instance || gb.Checkpoint != g.Checkpoint || !gb.Created.Equal(g.Created) || qb != q {
		t.Fatalf("round trip: %+v %+v %v", gb, qb, ok)
	}
	other := Identity{ID: id.ID, Secret: []byte("another secret of thirty-two b.")}
	tamper := x
	tamper.Bqual = "p1" + x.Bqual[3:] // another participant, same MAC
	for name, y := range map[string]struct {
		id Identity
		x  driver.Xid
	}{
		"another secret":    {other, x},
		"tampered":          {id, tamper},
		"another format":    {id, driver.Xid{Format: 1, Gtrid: x.Gtrid, Bqual: x.Bqual}},
		"another ledger id": {Identity{ID: "fedcba9876543210", Secret: id.Secret}, x},
	} {
		if _, _, ok := y.id.Parse(y.x); ok {
			t.Errorf("%s: parsed as the ledger's own", name)
		}
	}
	for _, bad := range []string{"", "blg1-", "blg2-a-1-1", "blg1-a-x-1", "blg1-a-1", "other"} {
		if _, ok := ParseGlobalID(bad); ok {
			t.Errorf("parsed gtrid %q", bad)
		}
	}
}

// A commit decision is marked applied only after a pass that listed every
// server and found none of its branches in doubt.
func TestAppliedAfter(t *testing.T) {
	unapplied := []string{"g1", "g2", "g3"}
	tests := []struct {
		name      string
		remaining map[string]bool
		want      []string
	}{
		{"nothing in doubt", map[string]bool{}, []string{"g1", "g2", "g3"}},
		{"one still in doubt", map[string]bool{"g2": true}, []string{"g1", "g3"}},
		{"others in doubt only", map[string]bool{"undecided": true}, []string{"g1", "g2", "g3"}},
		{"a server not listed", map[string]bool{"?server1": true}, nil},
		{"a server not listed, one in doubt", map[string]bool{"?server0": true, "g1": true}, nil},
	}
	for _, tt := range tests {
		if got := appliedAfter(unapplied, tt.remaining); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	if got := appliedAfter(nil, map[string]bool{}); len(got) != 0 {
		t.Errorf("nothing unapplied: %v", got)
	}
}

// Only a prefix of applied records below the visible position and older
// than the retention is pruned.
func TestCommitLogPruneBound(t *testing.T) {
	const keep = time.Hour
	old := func(seq int64) driver.CommitRecord {
		return driver.CommitRecord{Seq: seq, Applied: true, Age: 2 * keep}
	}
	edit := func(r driver.CommitRecord, fn func(*driver.CommitRecord)) driver.CommitRecord { fn(&r); return r }
	tests := []struct {
		name    string
		recs    []driver.CommitRecord
		visible int64
		want    int64
		needed  int64
	}{
		{"all old, applied, below visible", []driver.CommitRecord{old(3), old(4), old(5)}, 9, 5, 0},
		{"the record at the visible position stays", []driver.CommitRecord{old(3), old(4), old(5)}, 5, 4, 0},
		{"nothing visible", []driver.CommitRecord{old(1)}, 0, 0, 0},
		{"a young record stops it", []driver.CommitRecord{old(3), edit(old(4), func(r *driver.CommitRecord) { r.Age = keep - time.Second }), old(5)}, 9, 3, 0},
		{"an unapplied record stops it", []driver.CommitRecord{old(3), edit(old(4), func(r *driver.CommitRecord) { r.Applied = false }), old(5)}, 9, 3, 0},
		{"a gap stops it", []driver.CommitRecord{old(3), old(5)}, 9, 3, 0},
		{"the first is young", []driver.CommitRecord{edit(old(3), func(r *driver.CommitRecord) { r.Age = 0 }), old(4)}, 9, 0, 0},
		{"empty log", nil, 9, 0, 0},
		{"the changelog's publisher needs 5 on", []driver.CommitRecord{old(3), old(4), old(5), old(6)}, 9, 4, 5},
		{"the changelog's publisher needs everything", []driver.CommitRecord{old(3), old(4)}, 9, 0, 3},
	}
	for _, tt := range tests {
		if got := commitLogPruneBound(tt.recs, tt.visible, tt.needed, keep); got != tt.want {
			t.Errorf("%s: through %d, want %d", tt.name, got, tt.want)
		}
	}
}
