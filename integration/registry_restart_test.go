package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/testenv"
)

// The service reading Avro while its schema registry, a real one of the
// test's own, is stopped (its process ended) and started again: records
// naming a schema the service has not compiled wait for it, none becomes a
// dead letter, the instance lists the wait, and once the registry answers
// again holding the same schemas under the same ids (re-registered in the
// same order, as a registry with persistent storage would still hold
// them) the ledger is exact, repeats re-encoded under the newer schema id
// included.
//
// The registry keeps its schemas in memory: started again, it answers
// before the test has registered them again, and a record the service
// decoded in that moment would be an unknown_schema dead letter (what a
// registry that lost its schemas does, docs/formats.md). So the service
// reaches the registry through a gate that, while the registry restarts
// and its schemas are registered again, answers 503 (a registry that is
// not up yet, as one with persistent storage is until it has loaded
// them); the rest of the time it passes everything through, the
// registry's own absence included (502).
func TestAvroAcrossARegistryRestart(t *testing.T) {
	reg := testenv.StartOwnRegistry(t)
	g := newRegistryGate(t, reg.URL)
	e := newTestEnv(t, 2)
	subject := e.topic + "-value"
	v1, _, err := format.ContractSchema(format.Avro)
	if err != nil {
		t.Fatal(err)
	}
	v2 := withAvroField(t, v1, `{"name":"channel","type":"string","default":"web"}`)
	register := func() [2]int {
		t.Helper()
		cl, err := sr.NewClient(sr.URLs(reg.URL))
		if err != nil {
			t.Fatal(err)
		}
		var ids [2]int
		for i, text := range []string{v1, v2} {
			ss, err := cl.CreateSchema(context.Background(), subject, sr.Schema{Schema: text, Type: sr.TypeAvro})
			if err != nil {
				t.Fatalf("registering schema %d: %v", i+1, err)
			}
			ids[i] = ss.ID
		}
		return ids
	}
	ids := register()
	schemas := [2]avro.Schema{avro.MustParse(v1), avro.MustParse(v2)}

	w := &workload{want: map[string]total{}}
	base := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	encode := func(version int, i int) *kgo.Record {
		account := fmt.Sprintf("acct-%d", i%25)
		v := map[string]any{"event_id": fmt.Sprintf("rr-%d", i), "account_id": account, "amount_minor": int64(i%13*100 - 200),
			"currency": "EUR", "occurred_at": base.Add(time.Duration(i) * time.Second), "revision": int64(0), "cancelled": false}
		if version == 1 {
			v["channel"] = "app"
		}
		body, err := avro.Marshal(schemas[version], v)
		if err != nil {
			t.Fatal(err)
		}
		var h sr.ConfluentHeader
		b, _ := h.AppendEncode(nil, ids[version], nil)
		return &kgo.Record{Key: []byte(account), Value: append(b, body...)}
	}
	add := func(i int) {
		k := fmt.Sprintf("acct-%d/EUR", i%25)
		tt := w.want[k]
		tt.amount += int64(i%13*100 - 200)
		tt.count++
		w.want[k] = tt
		w.events++
	}

	addr := opsFreeAddr(t)
	svc := e.start(t, "billing", map[string]string{"EVENT_FORMAT": format.Avro, "SCHEMA_REGISTRY_URL": g.url,
		"SCHEMA_REGISTRY_TIMEOUT": "1s", "HTTP_ADDR": addr})
	defer svc.Signal(syscall.SIGTERM)
	var first []*kgo.Record
	for i := range 200 {
		first = append(first, encode(0, i))
		add(i)
	}
	testenv.Produce(t, e.brokers, e.topic, first...)
	testenv.Eventually(t, 90*time.Second, "the first 200 events counted", func() (bool, string) {
		_, n := ledger(t, e.db)
		return n == 200, fmt.Sprintf("%d counted", n)
	})

	// The registry's process ends; the producer moves to the second
	// schema, which the service has not fetched yet, and sends repeats of
	// earlier events under it.
	reg.Stop()
	var second []*kgo.Record
	for i := 200; i < 400; i++ {
		second = append(second, encode(1, i))
		add(i)
	}
	for i := range 20 {
		second = append(second, encode(1, i))
	}
	testenv.Produce(t, e.brokers, e.topic, second...)
	testenv.Eventually(t, 60*time.Second, "the instance lists records held for the registry", func() (bool, string) {
		code, body := opsGet("http://" + addr + "/waits")
		return code == 200 && strings.Contains(body, "schema registry"), body
	})
	time.Sleep(2 * time.Second) // retries go on: still nothing dead-lettered, nothing counted
	var dead int
	if err := e.db.Get(&dead, `SELECT COUNT(*) FROM dead_letters`); err != nil || dead != 0 {
		t.Fatalf("%d dead letters while the registry was down (%v)", dead, err)
	}
	if _, n := ledger(t, e.db); n != 200 {
		t.Fatalf("%d events counted while the registry was down, want the first 200", n)
	}
	_, metrics := opsGet("http://" + addr + "/metrics")
	if down, _ := opsMetric(metrics, "billing_schema_registry_unavailable", ""); down != 1 {
		t.Errorf("billing_schema_registry_unavailable = %v during the outage", down)
	}

	// Started again, in memory: empty. The same schemas registered in the
	// same order get the same ids, as a registry that kept them would
	// serve them; then the held records decode.
	g.closed.Store(true)
	reg.Start()
	if again := register(); again != ids {
		t.Fatalf("the restarted registry gave the schemas ids %v, before %v: the test needs them kept", again, ids)
	}
	g.closed.Store(false)
	waitExact(t, e.db, w, 120*time.Second)
	testenv.Eventually(t, 30*time.Second, "the wait over", func() (bool, string) {
		_, body := opsGet("http://" + addr + "/waits")
		return !strings.Contains(body, "schema registry"), body
	})
	_, metrics = opsGet("http://" + addr + "/metrics")
	if retries, _ := opsMetric(metrics, "billing_schema_registry_retries_total", ""); retries < 1 {
		t.Errorf("billing_schema_registry_retries_total = %v after the outage", retries)
	}
	if dups, _ := opsMetric(metrics, "billing_duplicates_dropped_total", ""); dups != 20 {
		t.Errorf("billing_duplicates_dropped_total = %v, want the 20 repeats re-encoded under the second schema", dups)
	}
}

// withAvroField returns the Avro record schema text with field (JSON)
// appended to its fields.
func withAvroField(t *testing.T, schema, field string) string {
	t.Helper()
	var s map[string]any
	if err := json.Unmarshal([]byte(schema), &s); err != nil {
		t.Fatal(err)
	}
	var f any
	if err := json.Unmarshal([]byte(field), &f); err != nil {
		t.Fatal(err)
	}
	s["fields"] = append(s["fields"].([]any), f)
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// registryGate passes requests through to a registry, or, while closed,
// answers them 503 itself.
type registryGate struct {
	url    string // the registry's base URL through the gate
	closed atomic.Bool
}

func newRegistryGate(t *testing.T, registryURL string) *registryGate {
	t.Helper()
	target, err := url.Parse(registryURL)
	if err != nil {
		t.Fatal(err)
	}
	g := &registryGate{}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: target.Scheme, Host: target.Host})
	proxy.ErrorLog = log.New(io.Discard, "", 0) // the registry's absence is the point
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.closed.Load() {
			http.Error(w, "the registry is starting", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	g.url = srv.URL + target.Path
	return g
}
