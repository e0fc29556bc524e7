package metrics

import (
	"context"
	"testing"
	"time"

	"github.com/billing/ledger/internal/ledgerstatus"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// TestSamplerReadsTheCommitLog: a commit decision left unapplied (its
// branches not all committed) shows in billing_commit_log_unapplied with
// its age by the control server's clock, which BillingCommitNotApplied
// pages on; once applied both are 0.
func TestSamplerReadsTheCommitLog(t *testing.T) {
	_, db := testenv.LedgerDB(t)
	ctx := t.Context()
	for _, q := range []string{
		`UPDATE commit_sequence SET last_seq = 2 WHERE singleton = 1`,
		`INSERT INTO checkpoint_commits (commit_seq, checkpoint_id, committed_at, applied_at) VALUES
			(1, 'blg1-a-1', UTC_TIMESTAMP(6) - INTERVAL 20 MINUTE, UTC_TIMESTAMP(6) - INTERVAL 20 MINUTE),
			(2, 'blg1-a-2', UTC_TIMESTAMP(6) - INTERVAL 10 MINUTE, NULL)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	m, _, _ := newTest(t)
	s := &Sampler{View: mysqldriver.NewView(db), Letters: ledgerstatus.ServerLetters{mysqldriver.NewLetters(db)}, Servers: []Stats{mysqldriver.NewStats(db)}, Topic: "billing-events", Group: "billing-ledger", Interval: time.Second, Timeout: 10 * time.Second}
	s.Sample(ctx, m)
	if v, ok := sum(t, m, "billing_commit_log_unapplied"); !ok || v != 1 {
		t.Errorf("billing_commit_log_unapplied = %v (present %v), want 1", v, ok)
	}
	if v, ok := sum(t, m, "billing_commit_log_oldest_unapplied_age_seconds"); !ok || v < 590 || v > 900 {
		t.Errorf("billing_commit_log_oldest_unapplied_age_seconds = %v (present %v), want about 600", v, ok)
	}
	if _, err := db.ExecContext(ctx, `UPDATE checkpoint_commits SET applied_at = UTC_TIMESTAMP(6)`); err != nil {
		t.Fatal(err)
	}
	s.Sample(ctx, m)
	if v, _ := sum(t, m, "billing_commit_log_unapplied"); v != 0 {
		t.Errorf("after applying: billing_commit_log_unapplied = %v, want 0", v)
	}
	if v, _ := sum(t, m, "billing_commit_log_oldest_unapplied_age_seconds"); v != 0 {
		t.Errorf("after applying: oldest age = %v, want 0", v)
	}
}

// waitingBy are the dead letters waiting per server, and the partitions
// each sample asked about.
type waitingBy struct {
	counts map[int][]ledgerstatus.Waiting
	asked  [][]int32
}

func (w *waitingBy) Waiting(_ context.Context, i int, _ string, partitions []int32) ([]ledgerstatus.Waiting, error) {
	w.asked = append(w.asked, partitions)
	return w.counts[i], nil
}

// TestSamplerOnTheView: the sampler reads through the read-only view, as
// billing status does, so it runs on the in-memory driver: this ledger's
// branches in doubt with the oldest's age, another ledger's and a forged
// one as foreign (the MAC decides), and the dead letters of the partitions
// this instance owns only.
func TestSamplerOnTheView(t *testing.T) {
	ctx := t.Context()
	m, _, now := newTest(t)
	clock := func() time.Time { return *now }
	var servers []*memdriver.Server
	for range 2 {
		servers = append(servers, memdriver.New(memdriver.Options{Now: clock}).As("billing"))
	}
	id, secret, err := servers[0].Identity(ctx, func() (string, []byte) { return "0123456789abcdef", []byte("s") })
	if err != nil {
		t.Fatal(err)
	}
	ledger := txsink.Identity{ID: id, Secret: secret}
	scope := driver.Scope{Group: "billing-ledger", Topic: "billing-events"}
	if _, err := servers[0].Claim(ctx, scope, "me", []int32{0, 2}, *now); err != nil {
		t.Fatal(err)
	}
	if _, err := servers[0].Claim(ctx, scope, "someone-else", []int32{1}, *now); err != nil {
		t.Fatal(err)
	}
	prepare := func(s *memdriver.Server, x driver.Xid) {
		c, err := s.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []driver.Verb{driver.Start, driver.End, driver.Prepare} {
			if err := c.XA(ctx, v, x); err != nil {
				t.Fatal(err)
			}
		}
	}
	gtrid := func(n uint64, age time.Duration) string {
		return txsink.GlobalID{Instance: "i", Checkpoint: n, Created: now.Add(-age)}.String()
	}
	q := txsink.Qualifier{Participant: 1, Conn: 3, Ledger: id}
	prepare(servers[1], ledger.Xid(gtrid(1, 45*time.Second), q))
	prepare(servers[1], ledger.Xid(gtrid(2, 5*time.Second), q))
	prepare(servers[1], driver.Xid{Format: txsink.FormatID, Gtrid: gtrid(3, time.Hour), Bqual: "p1-c3-l" + id + "-m000000000000"})
	other := txsink.Identity{ID: "fedcba9876543210", Secret: []byte("o")}
	prepare(servers[1], other.Xid(gtrid(4, time.Hour), txsink.Qualifier{Participant: 0, Conn: 1, Ledger: other.ID}))

	letters := &waitingBy{counts: map[int][]ledgerstatus.Waiting{0: {{Reason: "invalid_json", Count: 2}}, 1: {{Reason: "invalid_json", Count: 1}}}}
	servers[1].Cluster().SeedJournal(now.Add(time.Hour), []string{"k1", "k2", "k3"})
	s := &Sampler{View: memdriver.NewView(servers...), Letters: letters, Servers: []Stats{servers[0], servers[1]},
		Topic: "billing-events", Group: "billing-ledger", Owner: "me",
		Interval: time.Second, Timeout: 10 * time.Second, Now: clock}
	s.Sample(ctx, m)
	if v := value(t, m, "billing_xa_branches_in_doubt", map[string]string{"server": "1"}); v != 2 {
		t.Errorf("this ledger's branches in doubt on server 1 = %v, want 2", v)
	}
	if v := value(t, m, "billing_xa_oldest_in_doubt_age_seconds", map[string]string{"server": "1"}); v != 45 {
		t.Errorf("oldest in doubt = %vs, want 45 (the forged and the foreign are older, and not this ledger's)", v)
	}
	if v := value(t, m, "billing_xa_foreign_branches_in_doubt", map[string]string{"server": "1"}); v != 2 {
		t.Errorf("foreign branches in doubt = %v, want 2 (another ledger's and a forged one)", v)
	}
	if v := value(t, m, "billing_dedup_keys_estimate", map[string]string{"server": "1"}); v != 3 {
		t.Errorf("dedup keys on server 1 = %v, want the 3 stored", v)
	}
	if v := value(t, m, "billing_mysql_purge_history_length", map[string]string{"server": "0"}); v != 0 {
		t.Errorf("purge history on server 0 = %v, want 0 (the in-memory server keeps none)", v)
	}
	if v := value(t, m, "billing_dead_letters_waiting", map[string]string{"topic": "billing-events", "reason": "invalid_json"}); v != 3 {
		t.Errorf("dead letters waiting = %v, want 3", v)
	}
	if len(letters.asked) != 2 || len(letters.asked[0]) != 2 || letters.asked[0][0] != 0 || letters.asked[0][1] != 2 {
		t.Errorf("dead letters asked of the partitions %v, want [0 2] (those this instance owns) on each server", letters.asked)
	}
}
