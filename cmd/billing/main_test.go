package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing/ledger/internal/buildinfo"
)

// clearEnv unsets every variable the service reads, so the host
// environment (KAFKA_BROKERS and MYSQL_DSN of `make test`) cannot leak in.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		for _, p := range []string{"KAFKA_", "MYSQL_", "CHECKPOINT_", "DEDUP_", "HTTP_", "LOG_", "READY_", "LIVENESS_", "HEALTH_", "SHUTDOWN_", "METRICS_", "BILLING_"} {
			if strings.HasPrefix(name, p) {
				t.Setenv(name, "") // restored after the test
				os.Unsetenv(name)
			}
		}
	}
}

func TestHelpPrintsAlignedTable(t *testing.T) {
	clearEnv(t)
	var out, errOut bytes.Buffer
	if code := run([]string{"--help"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut.String())
	}
	s := out.String()
	for _, want := range []string{"Usage:", "billing deadletters", "VARIABLE", "DEFAULT", "MEANING", "KAFKA_SASL_PASSWORD_FILE", "MYSQL_TLS_CA_FILE", "READY_MAX_CHECKPOINT_AGE"} {
		if !strings.Contains(s, want) {
			t.Errorf("help lacks %q", want)
		}
	}
	if strings.Contains(s, "\t") {
		t.Error("help table still has tabs: not aligned")
	}
	// Every row's MEANING starts in the header's MEANING column.
	lines := strings.Split(s, "\n")
	var head int
	for i, l := range lines {
		if strings.HasPrefix(l, "VARIABLE") {
			head = i
		}
	}
	col := strings.Index(lines[head], "MEANING")
	for _, l := range lines[head+1:] {
		if l == "" {
			continue
		}
		if len(l) <= col || l[col-1] != ' ' || l[col] == ' ' {
			t.Errorf("row not aligned at column %d: %q", col, l)
		}
	}
}

// countingListener accepts and counts connections: pointed at by
// KAFKA_BROKERS, MYSQL_DSN and HTTP_ADDR, it shows whether a command
// connected to anything.
func countingListener(t *testing.T) (addr string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = &atomic.Int64{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().String(), accepted
}

// TestHelpNeverActs: -h/--help at every level prints help on stdout and
// exits 0, and a bad flag, argument or command exits 2, all without
// connecting to Kafka, MySQL or the HTTP endpoint, although the
// configuration points at a live listener.
func TestHelpNeverActs(t *testing.T) {
	clearEnv(t)
	addr, accepted := countingListener(t)
	t.Setenv("KAFKA_BROKERS", addr)
	t.Setenv("MYSQL_DSN", "u:p@tcp("+addr+")/billing?timeout=1s")
	t.Setenv("HTTP_ADDR", addr)
	tests := []struct {
		args []string
		code int
		want string // in stdout (exit 0) or stderr (exit 2)
	}{
		{[]string{"--help"}, 0, "billing status"},
		{[]string{"-h"}, 0, "KAFKA_BROKERS"},
		{[]string{"help"}, 0, "Usage:"},
		{[]string{"help", "status"}, 0, "billing status [--json]"},
		{[]string{"run", "--help"}, 0, "billing run"},
		{[]string{"migrate", "--help"}, 0, "billing migrate"},
		{[]string{"migrate", "-h"}, 0, "billing migrate"},
		{[]string{"status", "--help"}, 0, "--json"},
		{[]string{"version", "--help"}, 0, "--json"},
		{[]string{"compare", "--help"}, 0, "--other-dsn"},
		{[]string{"help", "compare"}, 0, "EXACT"},
		{[]string{"healthcheck", "--help"}, 0, "--path"},
		{[]string{"deadletters", "--help"}, 0, "reinject ID"},
		{[]string{"deadletters", "help"}, 0, "reinject ID"},
		{[]string{"deadletters", "list", "--help"}, 0, "--pending"},
		{[]string{"deadletters", "show", "--help"}, 0, "--payload-out"},
		{[]string{"deadletters", "show", "7", "-h"}, 0, "--payload-out"},
		{[]string{"deadletters", "reinject", "1", "--payload-file", "x", "--help"}, 0, "--by"},
		{[]string{"periods", "--help"}, 0, "billing periods change"},
		{[]string{"periods", "show", "--help"}, 0, "--json"},
		{[]string{"periods", "change", "--window", "day", "--help"}, 0, "--dry-run"},
		{[]string{"help", "periods"}, 0, "every instance stopped"},
		{[]string{"shards", "--help"}, 0, "billing shards status"},
		{[]string{"shards", "status", "--help"}, 0, "--json"},
		{[]string{"shards", "add", "--help"}, 0, "resumed by"},
		{[]string{"help", "shards"}, 0, "billing shards add --dsn DSN"},
		{[]string{"changelog", "--help"}, 0, "recover-progress"},
		{[]string{"changelog", "recover-progress", "--help"}, 0, "--dry-run"},
		{[]string{"status", "--help"}, 0, "--instance"},

		{[]string{"--bogus"}, 2, "unknown flag"},
		{[]string{"frobnicate"}, 2, "unknown command"},
		{[]string{"run", "--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"run", "now"}, 2, "want 0 argument(s)"},
		{[]string{"migrate", "--bogus"}, 2, "billing migrate: flag provided but not defined"},
		{[]string{"migrate", "extra"}, 2, "want 0 argument(s)"},
		{[]string{"status", "--bogus"}, 2, "not defined"},
		{[]string{"status", "--timeout", "0s"}, 2, "--timeout must be positive"},
		{[]string{"version", "--bogus"}, 2, "not defined"},
		{[]string{"compare"}, 2, "--other-dsn is required"},
		{[]string{"compare", "--other-dsn", "x", "extra"}, 2, "want 0 argument(s)"},
		{[]string{"healthcheck", "--bogus"}, 2, "not defined"},
		{[]string{"healthcheck", "/readyz"}, 2, "want 0 argument(s)"},
		{[]string{"deadletters"}, 2, "Usage:"},
		{[]string{"deadletters", "bogus"}, 2, "unknown command"},
		{[]string{"deadletters", "list", "--bogus"}, 2, "not defined"},
		{[]string{"deadletters", "list", "--limit", "0"}, 2, "--limit must be between"},
		{[]string{"deadletters", "show"}, 2, "want 1 argument(s)"},
		{[]string{"deadletters", "show", "abc"}, 2, "bad dead letter id"},
		{[]string{"deadletters", "reinject", "1", "--force=maybe"}, 2, "invalid boolean"},
		{[]string{"deadletters", "reinject", "1", "--by", ""}, 2, "--by must be"},
		{[]string{"deadletters", "reinject"}, 2, "want at least 1 argument"},
		{[]string{"deadletters", "reinject", "1", "x"}, 2, "bad dead letter id"},
		{[]string{"deadletters", "reinject", "1", "2", "--payload-file", "f"}, 2, "--payload-file takes one dead letter ID"},
		{[]string{"periods"}, 2, "Usage:"},
		{[]string{"changelog"}, 2, "Usage:"},
		{[]string{"changelog", "bogus"}, 2, "unknown command"},
		{[]string{"changelog", "recover-progress", "extra"}, 2, "want 0 argument(s)"},
		{[]string{"changelog", "recover-progress", "--timeout", "0s"}, 2, "--timeout must be positive"},
		{[]string{"periods", "bogus"}, 2, "unknown command"},
		{[]string{"periods", "change"}, 2, "give --window, --timezone or --close"},
		{[]string{"periods", "change", "--close=maybe"}, 2, "invalid boolean"},
		{[]string{"periods", "show", "extra"}, 2, "want 0 argument(s)"},
		{[]string{"shards"}, 2, "Usage:"},
		{[]string{"shards", "bogus"}, 2, "unknown command"},
		{[]string{"shards", "status", "extra"}, 2, "want 0 argument(s)"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(tt.args, &out, &errOut)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, out.String(), errOut.String())
			}
			where := out.String()
			if tt.code != 0 {
				where = errOut.String()
			}
			if !strings.Contains(where, tt.want) {
				t.Fatalf("output lacks %q\nstdout: %s\nstderr: %s", tt.want, out.String(), errOut.String())
			}
			if tt.code == 0 && errOut.Len() != 0 {
				t.Errorf("help wrote to stderr: %s", errOut.String())
			}
		})
	}
	time.Sleep(50 * time.Millisecond) // let a stray connection be accepted
	if n := accepted.Load(); n != 0 {
		t.Fatalf("%d connection(s) made by help or usage errors", n)
	}
}

// TestVersion: `billing version`, `billing --version` and `billing version
// --json` print what internal/buildinfo reports, without any configuration.
func TestVersion(t *testing.T) {
	clearEnv(t)
	want := buildinfo.Get()
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 0 {
			t.Fatalf("%v: exit %d, %s", args, code, errOut.String())
		}
		for _, part := range []string{want.Version, want.Commit, want.GoVersion} {
			if !strings.Contains(out.String(), part) {
				t.Errorf("%v: %q lacks %q", args, out.String(), part)
			}
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"version", "--json"}, &out, &errOut); code != 0 {
		t.Fatalf("--json: exit %d", code)
	}
	var got buildinfo.Info
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || got != want {
		t.Fatalf("--json = %s (%v), want %+v", out.String(), err, want)
	}
}

// TestConfigErrorsExit2: every problem in one message, exit status 2, and
// no secret in it.
func TestConfigErrorsExit2(t *testing.T) {
	clearEnv(t)
	const secret = "do-not-print-me"
	t.Setenv("KAFKA_BROKERS", "nohostport")
	t.Setenv("MYSQL_DSN", "billing:"+secret+"@tcp(127.0.0.1:3306)/billing")
	t.Setenv("KAFKA_SASL_MECHANISM", "PLAIN")
	t.Setenv("KAFKA_SASL_USERNAME", "svc")
	t.Setenv("KAFKA_SASL_PASSWORD", secret)
	t.Setenv("LOG_FORMAT", "xml")
	t.Setenv("MYSQL_TLS", "sometimes")
	// The four of issue 22: a value that does not parse hid the others.
	t.Setenv("CHECKPOINT_INTERVAL", "fast")
	t.Setenv("DEDUP_TTL", "-1h")
	t.Setenv("LOG_LEVEL", "loud")
	t.Setenv("BILLING_WINDOW", "week")
	var out, errOut bytes.Buffer
	if code := run(nil, &out, &errOut); code != 2 {
		t.Fatalf("exit %d, want 2; stderr %s", code, errOut.String())
	}
	msg := errOut.String()
	for _, want := range []string{"KAFKA_BROKERS", "LOG_FORMAT", "MYSQL_TLS", "PLAIN sends the password in clear",
		`CHECKPOINT_INTERVAL="fast": not a duration`, "DEDUP_TTL must be positive", `LOG_LEVEL must be debug, info, warn or error, got "loud"`, `window "week"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, secret) {
		t.Fatalf("configuration error leaks a secret:\n%s", msg)
	}
}

// closedAddr returns a 127.0.0.1 address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestStartupLogHasNoSecret runs the service with a DSN holding a password,
// a MySQL password file and a SASL password, at debug level, until it fails
// to reach MySQL: the log names the (redacted) DSN and the SASL user, and
// contains none of the secrets.
func TestStartupLogHasNoSecret(t *testing.T) {
	clearEnv(t)
	const dsnSecret, fileSecret, saslSecret = "dsn-Secret-1", "file-Secret-2", "sasl-Secret-3"
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte(fileSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mysqlAddr := closedAddr(t)
	t.Setenv("KAFKA_BROKERS", closedAddr(t))
	t.Setenv("MYSQL_DSN", "billing:"+dsnSecret+"@tcp("+mysqlAddr+")/billing?timeout=2s")
	t.Setenv("MYSQL_SHARD_DSNS", "billing:"+dsnSecret+"@tcp("+mysqlAddr+")/billing_shard1")
	t.Setenv("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
	t.Setenv("KAFKA_SASL_USERNAME", "svc-user")
	t.Setenv("KAFKA_SASL_PASSWORD", saslSecret)
	t.Setenv("LOG_FORMAT", "json")
	t.Setenv("LOG_LEVEL", "debug")
	t.Setenv("HTTP_ADDR", "127.0.0.1:0")

	for _, withFile := range []bool{false, true} {
		if withFile {
			t.Setenv("MYSQL_PASSWORD_FILE", pw)
		}
		var out, errOut bytes.Buffer
		if code := run(nil, &out, &errOut); code != 1 {
			t.Fatalf("exit %d, want 1 (MySQL unreachable); output:\n%s", code, errOut.String())
		}
		log := errOut.String() + out.String()
		for _, want := range []string{`"msg":"configured"`, `billing:xxxxx@tcp(` + mysqlAddr + `)/billing`, `"sasl_user":"svc-user"`, `"level":"ERROR"`,
			// Every setting that changes results, to confirm them (issue 22).
			`"settings":{"KAFKA_TOPIC":"billing-events","KAFKA_GROUP":"billing-ledger"`, `"MYSQL_SHARD_DSNS":"1 server(s)"`, `"DEDUP_TTL":"24h0m0s"`,
			`"BILLING_WINDOW":"1h","BILLING_TIMEZONE":"UTC","WINDOW_CLOSE_AFTER":""`, `"LEDGER_ENTRIES":"false"`, `"MAX_PAYLOAD_BYTES":"65536"`,
			`"window":"1h0m0s"`, `"closing":"windows never close`} {
			if !strings.Contains(log, want) {
				t.Errorf("log lacks %s:\n%s", want, log)
			}
		}
		for _, s := range []string{dsnSecret, fileSecret, saslSecret} {
			if strings.Contains(log, s) {
				t.Fatalf("log contains a secret (%s):\n%s", s, log)
			}
		}
	}
}

// TestRenderPayloadIsSafe: a payload can never send control sequences to
// the operator's terminal.
func TestRenderPayloadIsSafe(t *testing.T) {
	tests := []struct {
		name     string
		payload  string
		verbatim bool
	}{
		{"json", `{"event_id":"e1","currency":"eur"}`, true},
		{"multi-line json", "{\n\t\"a\": 1\n}", true},
		{"unicode", `{"account_id":"Zoë ☃"}`, true},
		{"escape sequence", "{\"a\":\"\x1b[2J\x1b]0;pwned\x07\"}", false},
		{"carriage return", "ok\rHIDDEN", false},
		{"invalid utf8", "\xff\xfe{}", false},
		{"nul", "a\x00b", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := renderPayload([]byte(tt.payload), 1<<10)
			if tt.verbatim != strings.Contains(out, "(verbatim)") {
				t.Fatalf("verbatim=%v, got %q", tt.verbatim, out)
			}
			for _, r := range out {
				if r < 0x20 && r != '\n' && r != '\t' || r == 0x7f {
					t.Fatalf("control character %U in output %q", r, out)
				}
			}
			if !tt.verbatim {
				if u, err := strconv.Unquote(strings.Split(out, "\n")[1]); err != nil || u != tt.payload {
					t.Fatalf("quoted form does not round-trip: %v", err)
				}
			}
		})
	}
	if out := renderPayload(bytes.Repeat([]byte("x"), 100), 10); !strings.Contains(out, "90 more bytes") {
		t.Errorf("truncation not reported: %q", out)
	}
}

func TestParseInterspersed(t *testing.T) {
	var out, errOut bytes.Buffer
	fs := newFlags("billing test", "ID", "")
	force := fs.Bool("force", false, "")
	file := fs.String("payload-file", "", "")
	pos, code, done := fs.parse([]string{"12", "--payload-file", "f.json", "--force"}, 1, &out, &errOut)
	if done || len(pos) != 1 || pos[0] != "12" || !*force || *file != "f.json" {
		t.Fatalf("got %v %d %v force=%v file=%q", pos, code, done, *force, *file)
	}
	if _, code, done := newFlags("billing test", "", "").parse([]string{"1", "2"}, 1, &out, &errOut); !done || code != 2 {
		t.Fatal("two positional arguments accepted")
	}
	if _, code, done := newFlags("billing test", "", "").parse([]string{"--nope"}, 0, &out, &errOut); !done || code != 2 {
		t.Fatal("unknown flag accepted")
	}
}

func TestHealthURL(t *testing.T) {
	tests := []struct{ addr, path, want string }{
		{":8080", "/readyz", "http://127.0.0.1:8080/readyz"},
		{"0.0.0.0:9000", "healthz", "http://127.0.0.1:9000/healthz"},
		{"[::]:9000", "/readyz", "http://127.0.0.1:9000/readyz"},
		{"10.1.2.3:80", "/readyz", "http://10.1.2.3:80/readyz"},
		{"[::1]:80", "/readyz", "http://[::1]:80/readyz"},
	}
	for _, tt := range tests {
		if got, err := healthURL(tt.addr, tt.path); err != nil || got != tt.want {
			t.Errorf("healthURL(%q, %q) = %q, %v; want %q", tt.addr, tt.path, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "nohostport"} {
		if _, err := healthURL(bad, "/readyz"); err == nil {
			t.Errorf("healthURL(%q) accepted", bad)
		}
	}
}

// TestHealthcheckCommand: exit 0 when the endpoint answers 200, 1 on 503 or
// when nothing listens.
func TestHealthcheckCommand(t *testing.T) {
	clearEnv(t)
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		fmt.Fprintln(w, "ready: idle")
	}))
	defer srv.Close()
	t.Setenv("HTTP_ADDR", strings.TrimPrefix(srv.URL, "http://"))
	var out, errOut bytes.Buffer
	if code := run([]string{"healthcheck"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "ready: idle") {
		t.Fatalf("healthy: exit %d, %q %q", code, out.String(), errOut.String())
	}
	status = http.StatusServiceUnavailable
	if code := run([]string{"healthcheck"}, &out, &errOut); code != 1 {
		t.Fatalf("503: exit %d, want 1", code)
	}
	if code := run([]string{"healthcheck", "--path", "/healthz"}, &out, &errOut); code != 1 {
		t.Fatalf("404: exit %d, want 1", code)
	}
	t.Setenv("HTTP_ADDR", closedAddr(t))
	if code := run([]string{"healthcheck"}, &out, &errOut); code != 1 {
		t.Fatalf("nothing listening: exit %d, want 1", code)
	}
}

// TestBusyHTTPAddrFailsStart: an HTTP_ADDR already in use stops the
// service at start (before it connects anywhere), instead of running
// without its health endpoints.
func TestBusyHTTPAddrFailsStart(t *testing.T) {
	clearEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Setenv("KAFKA_BROKERS", closedAddr(t))
	t.Setenv("MYSQL_DSN", "u:p@tcp("+closedAddr(t)+")/billing")
	t.Setenv("HTTP_ADDR", ln.Addr().String())
	var out, errOut bytes.Buffer
	if code := run(nil, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "HTTP_ADDR") || !strings.Contains(errOut.String(), "address already in use") {
		t.Fatalf("exit %d, want 1 naming HTTP_ADDR:\n%s", code, errOut.String())
	}
}

// TestToolExitCodes: compare and status document their exit codes; compare
// needs no Kafka setting, and a ledger it cannot read exits 3 ("could not
// compare"), not 1 like a mismatch (issue 22).
func TestToolExitCodes(t *testing.T) {
	clearEnv(t)
	for cmd, want := range map[string][]string{
		"compare": {"Exit status:", "0  EXACT", "1  MISMATCH", "2  usage or configuration error", "3  could not compare", "no Kafka setting is needed"},
		"status":  {"Exit status:", "0  the whole report was read", "1  the topic does not exist", "3  part of the report could not be read", "unknown"},
	} {
		var out, errOut bytes.Buffer
		if code := run([]string{cmd, "--help"}, &out, &errOut); code != 0 {
			t.Fatalf("%s --help: exit %d", cmd, code)
		}
		for _, w := range want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s --help lacks %q:\n%s", cmd, w, out.String())
			}
		}
	}
	t.Setenv("MYSQL_DSN", "u:p@tcp("+closedAddr(t)+")/billing?timeout=1s")
	var out, errOut bytes.Buffer
	code := run([]string{"compare", "--other-dsn", "u:p@tcp(" + closedAddr(t) + ")/other?timeout=1s"}, &out, &errOut)
	if code != exitUnreadable || !strings.Contains(errOut.String(), "could not compare") || strings.Contains(out.String(), "EXACT") {
		t.Fatalf("compare of an unreachable ledger without KAFKA_BROKERS: exit %d, want 3\nstdout: %s\nstderr: %s", code, out.String(), errOut.String())
	}
	t.Setenv("MYSQL_BRANCHES", "none")
	out.Reset()
	errOut.Reset()
	if code := run([]string{"compare", "--other-dsn", "x"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "MYSQL_BRANCHES") {
		t.Fatalf("compare with a bad MySQL setting: exit %d, want 2\n%s", code, errOut.String())
	}
}

// TestProgressOnlyOnATerminal: the progress display writes nothing unless
// shown (a terminal), so a script reading the output gets only the output.
func TestProgressOnlyOnATerminal(t *testing.T) {
	var b bytes.Buffer
	p := newTermProgress(&b, false, "reading", "rows", -1)
	p.set(10)
	p.describe("x")
	p.done()
	if p != nil || b.Len() != 0 {
		t.Fatalf("progress written while not on a terminal: %q", b.String())
	}
	p = newTermProgress(&b, true, "reading this ledger", "rows", -1)
	p.set(4096)
	p.done()
	if !strings.Contains(b.String(), "reading this ledger") || !strings.Contains(b.String(), "4096") {
		t.Errorf("progress on a terminal: %q", b.String())
	}
	var f bytes.Buffer
	if isTerminal(&f) {
		t.Error("a buffer is not a terminal")
	}
}
