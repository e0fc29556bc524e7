package metrics

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/txsink"
)

// TestCheckpointAbortsByCause: every aborted attempt counts once under
// the cause of its error, however deeply the error is wrapped (the
// protocol's typed errors before the MySQL kind, a context's end after
// it); an attempt retried at once counts too (pipeline.Stats.Aborts counts
// it), a committed or decided one does not; every cause is exported at 0
// before anything happens.
func TestCheckpointAbortsByCause(t *testing.T) {
	m, _, _ := newTest(t)
	if n := len(series(t, m, "billing_checkpoint_aborts_total")); n != len(AbortCauses()) {
		t.Errorf("abort series = %d, want one per cause (%d)", n, len(AbortCauses()))
	}
	for _, c := range AbortCauses() {
		if v := value(t, m, "billing_checkpoint_aborts_total", map[string]string{"cause": c}); v != 0 {
			t.Errorf("cause %s starts at %v", c, v)
		}
	}
	wrap := func(err error) error {
		return fmt.Errorf("checkpoint: %w", &txsink.PhaseError{Phase: "prepare", Err: &txsink.StatementError{Participant: 1, Err: fmt.Errorf("dedup claim: %w", err)}})
	}
	cases := []struct {
		err  error
		want string
	}{
		{wrap(&mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded; try restarting transaction"}), "lock_wait_timeout"},
		{wrap(&mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock"}), "deadlock"},
		{wrap(&txsink.FencedError{Partition: 3, HeldEpoch: 1, StoredEpoch: 2}), CauseFenced},
		{wrap(txsink.ErrAborted), CauseAbortedRecovery},
		{wrap(&txsink.FrontierMovedError{}), CauseFrontierMoved},
		{wrap(txsink.ErrOutcomeUnknown), CauseOutcomeUnknown},
		{wrap(pipeline.ErrCreatedUncounted), CauseCreatedUncounted},
		{wrap(context.Canceled), CauseCanceled},
		{wrap(context.DeadlineExceeded), CauseCanceled},
		{wrap(mysql.ErrInvalidConn), "connection"},
		// A protocol error that carries a MySQL error is named by the protocol.
		{fmt.Errorf("%w: %w", txsink.ErrFenced, &mysql.MySQLError{Number: 1213}), CauseFenced},
		{wrap(errors.New("something else")), CauseOther},
	}
	want := map[string]float64{}
	for _, c := range cases {
		info := pipeline.CheckpointInfo{Err: c.err, FailedPhase: "prepare"}
		if got := AbortCause(info); got != c.want {
			t.Errorf("AbortCause(%v) = %q, want %q", c.err, got, c.want)
		}
		if !slices.Contains(AbortCauses(), c.want) {
			t.Errorf("cause %q of %v is not among AbortCauses", c.want, c.err)
		}
		m.OnCheckpoint(info)
		want[c.want]++
	}
	// Retried at once (the frontier moved): aborted all the same.
	m.OnCheckpoint(pipeline.CheckpointInfo{Err: wrap(&txsink.FrontierMovedError{}), FailedPhase: "decide", Retrying: true})
	want[CauseFrontierMoved]++
	// Committed, or decided with a late XA COMMIT failure: not aborted.
	for _, info := range []pipeline.CheckpointInfo{
		{Decided: true},
		{Decided: true, Err: wrap(mysql.ErrInvalidConn), FailedPhase: "commit"},
	} {
		if got := AbortCause(info); got != "" {
			t.Errorf("AbortCause(%+v) = %q, want none", info, got)
		}
		m.OnCheckpoint(info)
	}
	var total float64
	for _, c := range AbortCauses() {
		got := value(t, m, "billing_checkpoint_aborts_total", map[string]string{"cause": c})
		if got != want[c] {
			t.Errorf("aborts{cause=%q} = %v, want %v", c, got, want[c])
		}
		total += got
	}
	if total != float64(len(cases)+1) {
		t.Errorf("aborts in all = %v, want %d", total, len(cases)+1)
	}
}
