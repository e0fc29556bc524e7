package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/billing/ledger/internal/config"
)

// healthcheck runs `billing healthcheck [--path P] [--timeout D]`, the
// container health check of images without a shell or curl: it GETs
// http://127.0.0.1:<port of HTTP_ADDR><P> (P is /readyz by default) and
// exits 0 on 200, 1 otherwise. It uses only HTTP_ADDR (its default is the
// service's) and checks no other setting, so it works in any container of
// the service.
func healthcheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("billing healthcheck", "[--path /readyz] [--timeout 4s]",
		"GETs http://127.0.0.1:<port of HTTP_ADDR><path> and exits 0 on 200, 1 otherwise:\nthe health check of containers without a shell or curl. Reads only HTTP_ADDR.\n")
	path := fs.String("path", "/readyz", "endpoint to check: /readyz (readiness) or /healthz (liveness)")
	timeout := fs.Duration("timeout", 4*time.Second, "bound on the request")
	if _, code, done := fs.parse(args, 0, stdout, stderr); done {
		return code
	}
	url, err := healthURL(config.Unchecked().HTTPAddr, *path)
	if err != nil {
		fmt.Fprintln(stderr, "billing healthcheck:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintln(stderr, "billing healthcheck:", err)
		return 1
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintln(stderr, "billing healthcheck:", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	msg := strings.TrimSpace(string(body))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "billing healthcheck: %s: %d %s\n", *path, resp.StatusCode, msg)
		return 1
	}
	fmt.Fprintf(stdout, "%s: %s\n", *path, msg)
	return 0
}

// healthURL turns HTTP_ADDR into the URL to probe from inside the
// container: a wildcard or empty host becomes 127.0.0.1.
func healthURL(addr, path string) (string, error) {
	if addr == "" {
		return "", fmt.Errorf("HTTP_ADDR is empty: the HTTP endpoints are disabled")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("HTTP_ADDR %q: %w", addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}
