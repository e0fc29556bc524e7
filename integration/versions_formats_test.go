package integration_test

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/testenv"
)

// Versions (amendments, cancellations, out of order, sent twice, on any
// partition) in the registry formats and CloudEvents, written with the
// contract's schema files through the real registry: billing-verify finds
// the ledger EXACT (each event's highest revision), beside repeats and
// malformed records, on two instances, one killed.
func TestVersionsInRegistryFormatsVerified(t *testing.T) {
	regURL := testenv.SchemaRegistry(t)
	genBin := testenv.Binary(t, "github.com/billing/ledger/cmd/billing-gen")
	verifyBin := testenv.Binary(t, "github.com/billing/ledger/cmd/billing-verify")
	for _, c := range []struct{ format, cloudevents string }{
		{"avro", ""}, {"protobuf", ""}, {"protobuf", "binary"},
	} {
		t.Run(c.format+"/"+c.cloudevents, func(t *testing.T) {
			e := newTestEnv(t, 3)
			settings := map[string]string{"EVENT_FORMAT": c.format, "SCHEMA_REGISTRY_URL": regURL}
			if c.cloudevents != "" {
				settings["EVENT_CLOUDEVENTS"] = "true"
			}
			procs := []*testenv.Process{e.start(t, "billing-1", settings), e.start(t, "billing-2", settings)}
			expected := filepath.Join(t.TempDir(), "expected.json")
			args := []string{"-brokers", strings.Join(e.brokers, ","), "-topic", e.topic, "-events", "1500", "-rate", "1500",
				"-format", c.format, "-schema-registry", regURL, "-version-ratio", "0.3",
				"-dup-ratio", "0.05", "-malformed-ratio", "0.01", "-seed", "35", "-expected", expected, "-progress", "none"}
			if c.cloudevents != "" {
				args = append(args, "-cloudevents", c.cloudevents)
			}
			gen := testenv.Start(t, "billing-gen", genBin, nil, args...)
			// Killed once it counts (not during its migrations, which a kill
			// leaves half applied).
			testenv.Eventually(t, 2*time.Minute, "the first events counted", func() (bool, string) {
				_, n := ledger(t, e.db)
				return n > 0, ""
			})
			procs[0].Signal(syscall.SIGKILL)
			procs = append(procs, e.start(t, "billing-3", settings))
			if err := gen.Wait(t, 3*time.Minute); err != nil {
				t.Fatalf("billing-gen: %v\n%s", err, gen.Output())
			}
			exp, err := ledgercheck.ReadFile(expected)
			if err != nil {
				t.Fatal(err)
			}
			if exp.Produced.Versions == 0 {
				t.Fatal("the generator wrote no versions")
			}
			verify := testenv.Start(t, "billing-verify", verifyBin, nil,
				"-dsn", e.dsn, "-expected", expected, "-topic", e.topic, "-wait", "2m", "-interval", "500ms")
			if err := verify.Wait(t, 3*time.Minute); err != nil || !strings.Contains(verify.Output(), "\nEXACT: ") {
				t.Fatalf("billing-verify: %v\n%s", err, verify.Output())
			}
			t.Logf("%s %s: %d versions; %s", c.format, c.cloudevents, exp.Produced.Versions, strings.TrimSpace(verify.Output()))
			for _, p := range procs {
				p.Signal(syscall.SIGTERM)
			}
		})
	}
}
