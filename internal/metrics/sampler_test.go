package metrics

import (
	"database/sql"
	"testing"
	"time"

	"github.com/billing/ledger/internal/testenv"
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
	s := &Sampler{Servers: []*sql.DB{db.DB}, Topic: "billing-events", Group: "billing-ledger", Interval: time.Second, Timeout: 10 * time.Second}
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
