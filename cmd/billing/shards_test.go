package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/billing/ledger/internal/shards"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// The service refuses, with exit status 4 and the difference named, to
// start on a list of servers that is not its ledger's layout, before it
// connects to Kafka; billing shards status shows the layout and the
// configured servers, and exits 4 on a list that differs.
func TestShardsStatusAndTheRefusal(t *testing.T) {
	adminA, adminB := testenv.MySQL(t), testenv.MySQL2(t)
	a, _ := testenv.LedgerDBOn(t, adminA, testenv.RandomName("t_"))
	b, _ := testenv.LedgerDBOn(t, adminB, testenv.RandomName("t_"))
	d, err := mysqldriver.Open(t.Context(), []string{a, b}, mysqldriver.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	ledger, layout, err := shards.Ensure(t.Context(), d, []string{shards.Host(a), shards.Host(b)}, txsink.NewIdentity, "the test", testenv.Logger())
	d.Close()
	if err != nil {
		t.Fatal(err)
	}
	configure := func(first, shard string) {
		clearEnv(t)
		t.Setenv("KAFKA_BROKERS", "127.0.0.1:1") // never reached: the refusal comes first
		t.Setenv("KAFKA_TOPIC", "billing-events")
		t.Setenv("MYSQL_DSN", first)
		t.Setenv("MYSQL_SHARD_DSNS", shard)
		t.Setenv("LOG_LEVEL", "warn")
	}

	configure(a, b)
	var out, errOut bytes.Buffer
	if code := run([]string{"shards", "status", "--json"}, &out, &errOut); code != 0 {
		t.Fatalf("billing shards status: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	var r shards.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if r.Version != 1 || len(r.Layout) != 2 || r.Layout[0] != layout.Servers[0] || len(r.Servers) != 2 || r.Servers[1].Ordinal != 1 ||
		r.Servers[1].Ledger != ledger || r.Servers[1].Host != shards.Host(b) || len(r.Differences) != 0 || r.Moving != "nothing moving" ||
		len(r.Servers[0].Tables) == 0 || strings.Contains(out.String(), "root:root") {
		t.Fatalf("billing shards status --json:\n%s", out.String())
	}

	configure(b, a)
	out.Reset()
	errOut.Reset()
	if code := run([]string{"shards", "status"}, &out, &errOut); code != exitSettings || !strings.Contains(out.String(), "differ from the ledger's layout") {
		t.Fatalf("billing shards status on the list reordered: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	out.Reset()
	errOut.Reset()
	code := run([]string{"run"}, &out, &errOut)
	if code != exitSettings || !strings.Contains(errOut.String(), "is a shard server of ledger "+ledger) || !strings.Contains(errOut.String(), "the control server must come first") {
		t.Fatalf("billing run on the list reordered: exit %d\n%s", code, errOut.String())
	}
	if strings.Contains(errOut.String(), "root:root") {
		t.Fatalf("the refusal shows a password:\n%s", errOut.String())
	}

	configure(a, "")
	errOut.Reset()
	code = run([]string{"run"}, &out, &errOut)
	if code != exitSettings || !strings.Contains(errOut.String(), "is missing from the list") {
		t.Fatalf("billing run with a server dropped: exit %d\n%s", code, errOut.String())
	}
}
