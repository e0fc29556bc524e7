// Package check validates what deploy/ ships, offline, in its own Go module
// so that the Prometheus and Kubernetes libraries stay out of the service's
// go.mod:
//
//   - the alerting rules (deploy/prometheus): promtool's rule unit tests,
//     run on the Prometheus rules engine (rulestest is promtool's own test
//     runner);
//   - the Grafana dashboard (deploy/grafana): valid JSON, every query
//     valid PromQL, every panel the issue asks for;
//   - deploy/prometheus/metrics-used.txt: exactly the metrics the rules and
//     the dashboard use (the service's integration test,
//     integration.TestMetricsUsedByRulesExist, scrapes a running service
//     and fails if any of them is missing);
//   - the Kubernetes manifests (deploy/kubernetes): strict decoding into
//     the k8s.io/api types, every environment variable a setting of
//     internal/config, every probe on an endpoint of internal/health.
//
// Run with `make test`, or `cd deploy/check && go test ./...`; `go test
// -run TestMetricsUsed -update` rewrites metrics-used.txt.
package check
