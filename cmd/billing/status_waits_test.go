package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/health"
	"github.com/billing/ledger/internal/ledgerstatus"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/waits"
)

// billing status lists what an instance waits for and since when, from
// its /waits endpoint; an instance asked by name that does not answer
// makes that part unknown (a problem of the report), the one of this host
// asked by default is only said not to answer.
func TestStatusShowsWaits(t *testing.T) {
	ws := waits.New(testenv.Logger())
	w := ws.Begin("the commit log's visible position to reach 6")
	w.Still("visible 4, decided 6: checkpoint 5 not applied yet")
	defer w.End()
	srv := httptest.NewServer(ws.Handler())
	defer srv.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	ctx := context.Background()
	client := &http.Client{Timeout: 5 * time.Second}

	r := &ledgerstatus.Report{Topic: "t", Group: "g", At: time.Now()}
	r.AddWaits(ctx, client, []string{srv.URL, dead.URL}, true)
	var out bytes.Buffer
	if err := printStatus(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"waits of " + srv.URL + ": 1", "WAITING FOR", "visible position to reach 6", "checkpoint 5 not applied yet",
		w2since(ws), "waits of " + dead.URL + ": unknown"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	if r.Complete() {
		t.Errorf("an instance asked by name did not answer, yet the report is complete")
	}

	r = &ledgerstatus.Report{Topic: "t", Group: "g", At: time.Now()}
	r.AddWaits(ctx, client, []string{dead.URL}, false)
	out.Reset()
	if err := printStatus(&out, r); err != nil {
		t.Fatal(err)
	}
	if !r.Complete() || !strings.Contains(out.String(), "waits: no instance answered at "+dead.URL) {
		t.Errorf("the default instance silent: complete %v, problems %q:\n%s", r.Complete(), r.Problems, out.String())
	}
}

// w2since is how status prints the start of the set's one wait.
func w2since(ws *waits.Set) string { return ws.Current()[0].Since.UTC().Format(time.RFC3339) }

// billing status shows the records each instance skipped since it started
// (its /records endpoint): CloudEvents of a type the filter does not
// select, which no table of the ledger holds. Without a filter and with
// none skipped, it says nothing of them.
func TestStatusShowsSkippedRecords(t *testing.T) {
	st := &pipeline.Stats{}
	st.Consumed.Store(120)
	st.Skipped.Store(7)
	mon := health.New(health.Options{})
	mon.Start(health.Checks{Stats: st})
	mux := http.NewServeMux()
	mux.Handle(health.PathWaits, waits.New(testenv.Logger()).Handler())
	mux.HandleFunc(health.PathRecords, func(w http.ResponseWriter, _ *http.Request) { _ = json.NewEncoder(w).Encode(mon.Records()) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx := context.Background()
	client := &http.Client{Timeout: 5 * time.Second}
	status := func(types []string) string {
		t.Helper()
		r := &ledgerstatus.Report{Topic: "t", Group: "g", At: time.Now(), CloudEventTypes: types}
		r.AddWaits(ctx, client, []string{srv.URL}, true)
		var out bytes.Buffer
		if err := printStatus(&out, r); err != nil {
			t.Fatal(err)
		}
		if !r.Complete() {
			t.Errorf("problems: %q", r.Problems)
		}
		return out.String()
	}
	since := mon.Records().Since.UTC().Format(time.RFC3339)
	want := "records skipped by " + srv.URL + " since " + since + ": 7 of 120 consumed"
	if out := status(nil); !strings.Contains(out, want) {
		t.Errorf("status lacks %q:\n%s", want, out)
	}
	st.Skipped.Store(0)
	if out := status(nil); strings.Contains(out, "records skipped") {
		t.Errorf("none skipped, no filter, yet:\n%s", out)
	}
	if out := status([]string{"com.example.charge"}); !strings.Contains(out, ": 0 of 120 consumed") {
		t.Errorf("with a filter, status lacks the count of 0:\n%s", out)
	}
}
