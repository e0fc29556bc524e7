package metrics

import (
	"context"
	"errors"

	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Causes of an aborted checkpoint attempt that are not a MySQL error kind,
// label values of billing_checkpoint_aborts_total beside
// mysqldriver.ErrorKinds.
const (
	CauseFenced           = "fenced"              // a partition moved to another instance (a rebalance)
	CauseAbortedRecovery  = "aborted_by_recovery" // the decision is abort: a recoverer's, or the coordinator gave up
	CauseFrontierMoved    = "frontier_moved"      // another checkpoint closed a window this one wrote to as open
	CauseLayoutMoved      = "layout_moved"        // a live move of rows to a new server passed a key this one placed (billing shards add): retried at once
	CauseOutcomeUnknown   = "outcome_unknown"     // the decision was neither made durable nor proven either way
	CauseCanceled         = "canceled"            // the attempt's context ended: CHECKPOINT_TIMEOUT or the instance stopping
	CauseCreatedUncounted = "created_uncounted"   // beside other instances the seed created a row no counted event writes (every event on it refused): retried at once without creating it
	CauseOther            = "other"
)

// AbortCauses lists every label value of billing_checkpoint_aborts_total,
// in a stable order.
func AbortCauses() []string {
	out := []string{CauseFenced, CauseAbortedRecovery, CauseFrontierMoved, CauseLayoutMoved, CauseOutcomeUnknown, CauseCreatedUncounted}
	for _, k := range mysqldriver.ErrorKinds() {
		if k != mysqldriver.KindOther {
			out = append(out, k)
		}
	}
	return append(out, CauseCanceled, CauseOther)
}

// AbortCause names why a checkpoint attempt aborted, "" when it did not
// (pipeline.CheckpointInfo.Aborted, the attempts pipeline.Stats.Aborts
// counts, retried at once or not): the protocol's typed errors first
// (however deeply wrapped), then the MySQL error kind of
// billing_mysql_errors_total, then the end of the attempt's context, else
// "other". It is the one home of this classification:
// billing_checkpoint_aborts_total is labelled by it, and so are the
// aborted attempts cmd/billing-bench reports.
func AbortCause(info pipeline.CheckpointInfo) string {
	if !info.Aborted() {
		return ""
	}
	err := info.Err
	switch {
	case errors.Is(err, txsink.ErrFenced):
		return CauseFenced
	case errors.Is(err, txsink.ErrAborted):
		return CauseAbortedRecovery
	case errors.Is(err, txsink.ErrFrontierMoved):
		return CauseFrontierMoved
	case errors.Is(err, txsink.ErrLayoutMoved):
		return CauseLayoutMoved
	case errors.Is(err, txsink.ErrOutcomeUnknown):
		return CauseOutcomeUnknown
	case errors.Is(err, pipeline.ErrCreatedUncounted):
		return CauseCreatedUncounted
	}
	if kind, ok := mysqldriver.ErrorKind(err); ok {
		return kind
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return CauseCanceled
	}
	return CauseOther
}
