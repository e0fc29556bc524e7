package check

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

type grafanaPanel struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

type grafanaDashboard struct {
	Title      string         `json:"title"`
	UID        string         `json:"uid"`
	Panels     []grafanaPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func loadDashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

func allPanels(ps []grafanaPanel) []grafanaPanel {
	var out []grafanaPanel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// grafanaVars are the dashboard's variables and Grafana's built-in
// intervals, replaced by values a query would see, so that the queries
// parse as PromQL.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "${job}", ".*", "$job", ".*", "${instance}", ".*", "$instance", ".*")

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)

// dashboardExprs returns every PromQL query of the dashboard, panels and
// variables, with the variables replaced.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	d := loadDashboard(t)
	var exprs []string
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			exprs = append(exprs, grafanaVars.Replace(tg.Expr))
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		s, _ := q["query"].(string)
		m := labelValues.FindStringSubmatch(s)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, s)
			continue
		}
		exprs = append(exprs, grafanaVars.Replace(m[1]))
	}
	return exprs
}

// TestDashboard: the dashboard has the panels a team running billing
// needs, every query is valid PromQL, and every panel reads from the
// dashboard's data source variable (it imports into any Grafana).
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("title %q, uid %q", d.Title, d.UID)
	}
	titles := map[string]bool{}
	for _, p := range allPanels(d.Panels) {
		titles[p.Title] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not use the ${datasource} variable", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if _, err := promql.ParseExpr(grafanaVars.Replace(tg.Expr)); err != nil {
				t.Errorf("panel %q: %q: %v", p.Title, tg.Expr, err)
			}
		}
	}
	for _, want := range []string{"Throughput", "Consumer lag", "Checkpoint duration", "Checkpoint failures", "End-to-end latency", "Dedup hits", "Dead letters", "Memory (RSS)"} {
		if !titles[want] {
			t.Errorf("no panel %q", want)
		}
	}
	for _, e := range dashboardExprs(t) {
		if _, err := promql.ParseExpr(e); err != nil {
			t.Errorf("%q: %v", e, err)
		}
	}
}
