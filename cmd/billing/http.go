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
// is younger than READY_MAX_CHECKPOINT_AGE, or it is idle: nothing consumed
// waits for a checkpoint (Stats.Pending) and no attempt failed since the
// last commit.
type readiness struct {
	stats   *pipeline.Stats
	maxAge  time.Duration
	started time.Time
	now     func() time.Time

	mu          sync.Mutex
	failedSince bool
}

func newReadiness(maxAge time.Duration) *readiness {
	return &readiness{maxAge: maxAge, started: time.Now(), now: time.Now}
}

// OnCheckpoint follows checkpoint outcomes (chained into
// pipeline.Config.OnCheckpoint).
func (r *readiness) OnCheckpoint(info pipeline.CheckpointInfo) {
	if info.Retrying {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failedSince = !info.Decided
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
	case r.stats.Pending.Load() != 0:
		return false, fmt.Sprintf("no checkpoint committed for %s while %d records wait", age.Round(time.Second), r.stats.Pending.Load())
	default:
		return true, "idle"
	}
}
