package integration_test

import (
	"fmt"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/testenv"
)

// CloudEvents of a type EVENT_CLOUDEVENT_TYPES does not select are
// skipped, in no table of the ledger: billing status shows how many the
// running instance skipped, from its /records endpoint.
func TestStatusShowsSkippedCloudEvents(t *testing.T) {
	e := newOpsEnv(t, 2)
	addr := opsFreeAddr(t)
	ce := map[string]string{"EVENT_CLOUDEVENTS": "true", "EVENT_CLOUDEVENT_TYPES": "com.example.charge"}
	svc := testenv.Start(t, "billing", e.bin, e.env(stMerge(ce, map[string]string{"HTTP_ADDR": addr})))
	defer svc.Signal(syscall.SIGTERM)
	var recs []*kgo.Record
	for i := range 60 {
		typ := "com.example.charge"
		if i%4 == 0 {
			typ = "com.example.refund" // 15 of them
		}
		v := fmt.Sprintf(`{"specversion":"1.0","id":"s-%d","source":"/shop","type":%q,"data":{"account_id":"acct-%d","amount_minor":100,"currency":"EUR","occurred_at":"2026-11-29T10:00:00Z"}}`, i, typ, i%5)
		recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprint(i)), Value: []byte(v),
			Headers: []kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json")}}})
	}
	testenv.Produce(t, e.brokers, e.topic, recs...)
	testenv.Eventually(t, 90*time.Second, "45 events counted", func() (bool, string) {
		_, n := ledger(t, e.db)
		return n == 45, fmt.Sprintf("%d counted", n)
	})
	// The skipped records are counted when their poll is decoded, before
	// the checkpoint that counts the others commits.
	out, code := e.cli(t, ce, "status", "--instance", "http://"+addr)
	// (A replay after an aborted checkpoint would count its records
	// again, skipped ones included: at least 15 of at least 60.)
	want := regexp.MustCompile(`records skipped by http://` + regexp.QuoteMeta(addr) + ` since \S+: (\d+) of (\d+) consumed`)
	m := want.FindStringSubmatch(out)
	if code != 0 || m == nil || atoi(m[1]) < 15 || atoi(m[2]) < 60 {
		t.Errorf("billing status (exit %d) lacks %q with 15 of 60:\n%s", code, want, out)
	}
	var dead int
	if err := e.db.Get(&dead, `SELECT COUNT(*) FROM dead_letters`); err != nil || dead != 0 {
		t.Errorf("%d dead letters (%v): a skipped record is none", dead, err)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
