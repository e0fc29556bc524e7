package service

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/health"
	"github.com/billing/ledger/internal/metrics"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/waits"
)

// TestHandler: the endpoints answer from the monitor's state, startup
// included, and /readyz turns 503 once a shutdown starts while /healthz
// stays 200.
func TestHandler(t *testing.T) {
	st := &pipeline.Stats{}
	m := metrics.New(metrics.Options{})
	mon := health.New(health.Options{ReadyMaxAge: time.Minute, MaxStall: 5 * time.Minute, CheckInterval: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	ws := waits.New(nil)
	h := handler(ctx, mon, m.Handler(), ws)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	mon.SetPhase("migrating the schema")
	if code, body := get("/healthz"); code != 200 || !strings.Contains(body, "starting: migrating the schema") {
		t.Errorf("/healthz during startup = %d %q", code, body)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "starting: migrating the schema") {
		t.Errorf("/readyz during startup = %d %q", code, body)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "billing_build_info{") {
		t.Errorf("/metrics during startup = %d, lacks billing_build_info", code)
	}
	mon.Start(health.Checks{Stats: st,
		MySQL:      func(context.Context) error { return nil },
		Membership: func(context.Context) (bool, int, error) { return true, 0, nil }})
	mon.Check(ctx)
	if code, body := get("/readyz"); code != 200 || !strings.Contains(body, "ready: standby") {
		t.Errorf("/readyz = %d %q", code, body)
	}
	if code, body := get("/waits"); code != 200 || body != "{\"waits\":[]}\n" {
		t.Errorf("/waits with none = %d %q", code, body)
	}
	w := ws.Begin("something")
	if code, body := get("/waits"); code != 200 || !strings.Contains(body, `"what":"something"`) {
		t.Errorf("/waits = %d %q", code, body)
	}
	w.End()
	// /records: the pipeline's totals, the records skipped among them.
	st.Consumed.Store(40)
	st.Skipped.Store(3)
	if code, body := get("/records"); code != 200 || !strings.Contains(body, `"consumed":40,"skipped":3}`) {
		t.Errorf("/records = %d %q", code, body)
	}
	if code, _ := get("/nope"); code != 404 {
		t.Errorf("/nope = %d", code)
	}
	cancel()
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "shutting down") {
		t.Errorf("/readyz while shutting down = %d %q", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz while shutting down = %d", code)
	}
}

// TestHTTPServerLimits: the server has read-header, read, write and idle
// timeouts, and a client that opens a connection and trickles a request
// without finishing its headers is disconnected (here with the read-header
// timeout shortened; the wait for the disconnection is bounded generously,
// nothing is timed).
func TestHTTPServerLimits(t *testing.T) {
	srv := newHTTPServer(http.NotFoundHandler())
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.WriteTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Fatalf("a limit is missing: %+v", srv)
	}
	if srv.WriteTimeout <= 10*time.Second {
		t.Errorf("write timeout %s does not exceed the scrape bound of 10s", srv.WriteTimeout)
	}
	srv.ReadHeaderTimeout = 200 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")); err != nil { // never finished
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	b, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("the server did not close the connection of a client that never finished its headers: %v", err)
	}
	if strings.Contains(string(b), "404") {
		t.Fatalf("an unfinished request was answered: %q", b)
	}
}

// TestJSONLogDurations: durations in JSON logs are text with their unit
// ("1.5s"), not nanoseconds (issue 22: migration durations read as
// 48213967).
func TestJSONLogDurations(t *testing.T) {
	var b bytes.Buffer
	log := NewLogger(config.Config{LogFormat: "json", LogLevel: "info"}, &b)
	log.Info("migration applied", "duration", 48213967*time.Nanosecond, "next_attempt_in", 5*time.Second, "count", 3)
	for _, want := range []string{`"duration":"48.213967ms"`, `"next_attempt_in":"5s"`, `"count":3`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("log lacks %s: %s", want, b.String())
		}
	}
}

// TestStoppedSummary: the "stopped" line sums up the run.
func TestStoppedSummary(t *testing.T) {
	st := &pipeline.Stats{}
	st.Counted.Store(1000)
	st.Consumed.Store(1100)
	st.DeadLetters.Store(40)
	st.Duplicates.Store(60)
	st.ReadAhead.Store(900)
	st.ReadAheadDropped.Store(7)
	var b bytes.Buffer
	NewLogger(config.Config{LogFormat: "json", LogLevel: "info"}, &b).Info("stopped", summary(st, 4*time.Second)...)
	for _, want := range []string{`"counted":1000`, `"consumed":1100`, `"duplicates":60`, `"dead_letters":40`, `"aborted_checkpoints":0`, `"read_ahead_ids":900`, `"read_ahead_dropped":7`, `"read_ahead_failures":0`, `"ran_for":"4s"`, `"average_events_per_second":250`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary lacks %s: %s", want, b.String())
		}
	}
}
