package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/billing/ledger/internal/metrics"
	"github.com/billing/ledger/internal/pipeline"
)

// handler serves
//
//	/healthz  200 while the process runs (liveness);
//	/readyz   200 when partitions are assigned and checkpoints keep up
//	          (see readiness), 503 with the reason otherwise, and 503 once
//	          a shutdown started;
//	/metrics  Prometheus metrics.
func handler(ctx context.Context, m *metrics.Metrics, r *readiness) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ctx.Err() != nil {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		ok, why := r.Ready()
		if !ok {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready:", why)
	})
	mux.Handle("GET /metrics", m.Handler())
	return mux
}

// readiness decides /readyz. An instance is ready when it owns partitions
// and either its last committed checkpoint (or its start, before the first)
// is younger than READY_MAX_CHECKPOINT_AGE, or it is idle.
//
// Idle is approximated from outside the pipeline: no record was consumed
// since the last committed checkpoint finished, and no attempt failed
// since. Blind spot: records consumed while that checkpoint ran and never
// checkpointed afterwards (the pipeline hung right then) look idle. The
// exact signal needs a pipeline stat (records buffered and not yet
// decided); see the report.
type readiness struct {
	stats   *pipeline.Stats
	maxAge  time.Duration
	started time.Time
	now     func() time.Time

	mu               sync.Mutex
	consumedAtCommit int64
	failedSince      bool
}

func newReadiness(maxAge time.Duration) *readiness {
	return &readiness{maxAge: maxAge, started: time.Now(), now: time.Now}
}

// OnCheckpoint follows checkpoint outcomes (chained into
// pipeline.Config.OnCheckpoint).
func (r *readiness) OnCheckpoint(info pipeline.CheckpointInfo) {
	consumed := r.stats.Consumed.Load()
	r.mu.Lock()
	defer r.mu.Unlock()
	if info.Decided {
		r.consumedAtCommit, r.failedSince = consumed, false
	} else {
		r.failedSince = true
	}
}

// Ready reports readiness and a short reason.
func (r *readiness) Ready() (bool, string) {
	if r.stats == nil || r.stats.AssignedParts.Load() == 0 {
		return false, "no partitions assigned"
	}
	last := r.started
	if n := r.stats.LastCheckpoint.Load(); n != 0 {
		last = time.Unix(0, n)
	}
	age := r.now().Sub(last)
	if age <= r.maxAge {
		return true, "checkpointing"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.failedSince:
		return false, fmt.Sprintf("no checkpoint committed for %s and the last attempt failed", age.Round(time.Second))
	case r.stats.Consumed.Load() != r.consumedAtCommit:
		return false, fmt.Sprintf("no checkpoint committed for %s while records wait", age.Round(time.Second))
	default:
		return true, "idle"
	}
}
