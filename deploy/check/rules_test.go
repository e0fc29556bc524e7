package check

import (
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"

	"github.com/billing/ledger/deploy/check/rulestest"
)

var update = flag.Bool("update", false, "rewrite deploy/prometheus/metrics-used.txt")

const (
	rulesFile     = "../prometheus/billing-rules.yml"
	ruleTestsFile = "../prometheus/billing-rules.test.yml"
	metricsUsed   = "../prometheus/metrics-used.txt"
	dashboardFile = "../grafana/billing-dashboard.json"
)

var promql = parser.NewParser(parser.Options{})

// TestRules: the rules parse and validate (promtool check rules), and
// their unit tests pass (promtool test rules), on the Prometheus engine.
func TestRules(t *testing.T) {
	if _, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, promql, slog.New(slog.NewTextHandler(io.Discard, nil))); len(errs) > 0 {
		t.Fatalf("%s: %v", rulesFile, errs)
	}
	var out strings.Builder
	code := rulestest.RulesUnitTestResult(&out, promqltest.LazyLoaderOpts{EnableAtModifier: true, EnableNegativeOffset: true},
		promql, nil, true, false, false, ruleTestsFile)
	if code != 0 {
		t.Fatalf("rule unit tests failed (exit %d); run `promtool test rules %s` for the details\n%s", code, ruleTestsFile, out.String())
	}
}

// ruleExprs returns the expressions of every rule, and the names the
// recording rules define.
func ruleExprs(t *testing.T) (exprs []string, recorded map[string]bool) {
	t.Helper()
	rgs, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, promql, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	recorded = map[string]bool{}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	return exprs, recorded
}

// metricNames returns the metric names an expression selects.
func metricNames(t *testing.T, expr string) []string {
	t.Helper()
	e, err := promql.ParseExpr(expr)
	if err != nil {
		t.Fatalf("%q: %v", expr, err)
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					name = m.Value
				}
			}
			if name == "" {
				t.Errorf("%q selects series without a metric name", expr)
			}
			names = append(names, name)
		}
		return nil
	})
	return names
}

// TestMetricsUsed: metrics-used.txt lists exactly the metrics that the
// rules and the dashboard read from the service: not `up` (Prometheus makes
// it) nor what the recording rules define. The service's integration test
// checks that each of them exists on a running instance.
func TestMetricsUsed(t *testing.T) {
	exprs, recorded := ruleExprs(t)
	exprs = append(exprs, dashboardExprs(t)...)
	set := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricNames(t, e) {
			if n != "up" && !recorded[n] {
				set[n] = true
			}
		}
	}
	var names []string
	for n := range set {
		names = append(names, n)
	}
	slices.Sort(names)
	want := "# Metrics read by deploy/prometheus/billing-rules.yml and deploy/grafana/billing-dashboard.json.\n" +
		"# Generated: cd deploy/check && go test -run TestMetricsUsed -update. Checked against a running\n" +
		"# service by integration.TestMetricsUsedByRulesExist.\n" + strings.Join(names, "\n") + "\n"
	if *update {
		if err := os.WriteFile(metricsUsed, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(metricsUsed)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is stale (run: cd deploy/check && go test -run TestMetricsUsed -update); want:\n%s", filepath.Base(metricsUsed), want)
	}
}
