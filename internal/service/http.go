package service

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/billing/ledger/internal/health"
	"github.com/billing/ledger/internal/waits"
)

// Limits of the metrics and health server: a client that trickles its
// headers or body, or never reads the answer, cannot hold a connection
// (and its goroutine) for long. The write timeout exceeds the bound the
// metrics handler puts on a scrape (10s).
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second
	httpWriteTimeout      = 30 * time.Second
	httpIdleTimeout       = 60 * time.Second
)

// newHTTPServer is the server of /metrics, /healthz and /readyz, with its
// limits.
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      httpWriteTimeout,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    16 << 10,
	}
}

// handler serves
//
//	/healthz  liveness (health.Monitor.Live): 200 from the start of the
//	          process; 503 when the pipeline is wedged;
//	/readyz   readiness (health.Monitor.Ready): 200 when the instance can
//	          do its job, 503 with the reason otherwise (startup phases
//	          included), and 503 once a shutdown started;
//	/metrics  Prometheus metrics;
//	/waits    the instance's waits in progress (package waits), as JSON:
//	          what each waits for, since when (`billing status` shows
//	          them);
//	/records  the totals of the records the pipeline took since it
//	          started, skipped ones included (health.Records), as JSON
//	          (`billing status` shows them).
func handler(ctx context.Context, mon *health.Monitor, metrics http.Handler, ws *waits.Set) http.Handler {
	mux := http.NewServeMux()
	answer := func(w http.ResponseWriter, ok bool, why string) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, why)
	}
	mux.HandleFunc("GET "+health.PathHealthz, func(w http.ResponseWriter, _ *http.Request) {
		ok, why := mon.Live()
		answer(w, ok, why)
	})
	mux.HandleFunc("GET "+health.PathReadyz, func(w http.ResponseWriter, _ *http.Request) {
		if ctx.Err() != nil {
			answer(w, false, "shutting down")
			return
		}
		ok, why := mon.Ready()
		if ok {
			why = "ready: " + why
		}
		answer(w, ok, why)
	})
	mux.Handle("GET "+health.PathMetrics, metrics)
	mux.Handle("GET "+health.PathWaits, ws.Handler())
	mux.HandleFunc("GET "+health.PathRecords, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(mon.Records())
	})
	return mux
}
