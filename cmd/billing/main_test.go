package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/metrics"
	"github.com/billing/ledger/internal/pipeline"
)

// clearEnv unsets every variable the service reads, so the host
// environment (KAFKA_BROKERS and MYSQL_DSN of `make test`) cannot leak in.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		for _, p := range []string{"KAFKA_", "MYSQL_", "CHECKPOINT_", "DEDUP_", "HTTP_", "LOG_", "READY_", "SHUTDOWN_", "METRICS_", "BILLING_"} {
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

func TestUnknownCommandExit2(t *testing.T) {
	clearEnv(t)
	var out, errOut bytes.Buffer
	if code := run([]string{"frobnicate"}, &out, &errOut); code != 2 {
		t.Fatalf("exit %d, want 2", code)
	}
	if code := run([]string{"deadletters"}, &out, &errOut); code != 2 {
		t.Fatalf("deadletters without subcommand: exit %d, want 2", code)
	}
	out.Reset()
	if code := run([]string{"deadletters", "help"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "reinject ID") {
		t.Fatalf("deadletters help: exit %d, %q", code, out.String())
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
	var out, errOut bytes.Buffer
	if code := run(nil, &out, &errOut); code != 2 {
		t.Fatalf("exit %d, want 2; stderr %s", code, errOut.String())
	}
	msg := errOut.String()
	for _, want := range []string{"KAFKA_BROKERS", "LOG_FORMAT", "MYSQL_TLS", "PLAIN sends the password in clear"} {
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
		for _, want := range []string{`"msg":"configured"`, `billing:xxxxx@tcp(` + mysqlAddr + `)/billing`, `"sasl_user":"svc-user"`, `"level":"ERROR"`} {
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

func TestReadiness(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	const maxAge = time.Minute
	tests := []struct {
		name     string
		assigned int64
		lastCkpt time.Duration // after start; 0 = none
		now      time.Duration // after start
		pending  int64         // records no decided checkpoint covers
		events   []pipeline.CheckpointInfo
		ready    bool
		why      string
	}{
		{name: "no partitions", assigned: 0, now: time.Second, why: "no partitions assigned"},
		{name: "fresh start", assigned: 3, now: 10 * time.Second, pending: 500, ready: true, why: "checkpointing"},
		{name: "recent checkpoint", assigned: 3, lastCkpt: 5 * time.Minute, now: 5*time.Minute + 30*time.Second, pending: 9, ready: true, why: "checkpointing"},
		{name: "idle after a checkpoint", assigned: 3, lastCkpt: time.Minute, now: time.Hour,
			events: []pipeline.CheckpointInfo{{Decided: true}}, ready: true, why: "idle"},
		{name: "idle from the start", assigned: 3, now: time.Hour, ready: true, why: "idle"},
		{name: "records wait, no checkpoint", assigned: 3, lastCkpt: time.Minute, now: time.Hour, pending: 50,
			events: []pipeline.CheckpointInfo{{Decided: true}}, why: "while 50 records wait"},
		{name: "backlog never checkpointed", assigned: 3, now: 2 * time.Minute, pending: 10, why: "while 10 records wait"},
		{name: "failing checkpoints", assigned: 3, lastCkpt: time.Minute, now: time.Hour,
			events: []pipeline.CheckpointInfo{{Decided: true}, {Err: context.DeadlineExceeded}}, why: "last attempt failed"},
		{name: "careful retry is not a failure", assigned: 3, lastCkpt: time.Minute, now: time.Hour,
			events: []pipeline.CheckpointInfo{{Decided: true}, {Err: context.DeadlineExceeded, Retrying: true}}, ready: true, why: "idle"},
		{name: "recovered after a failure", assigned: 3, lastCkpt: time.Minute, now: time.Hour,
			events: []pipeline.CheckpointInfo{{Err: context.DeadlineExceeded}, {Decided: true}}, ready: true, why: "idle"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := &pipeline.Stats{}
			r := &readiness{stats: st, maxAge: maxAge, started: start, now: func() time.Time { return start.Add(tt.now) }}
			st.AssignedParts.Store(tt.assigned)
			for _, ev := range tt.events {
				r.OnCheckpoint(ev)
			}
			if tt.lastCkpt != 0 {
				st.LastCheckpoint.Store(start.Add(tt.lastCkpt).UnixNano())
			}
			st.Pending.Store(tt.pending)
			ok, why := r.Ready()
			if ok != tt.ready || !strings.Contains(why, tt.why) {
				t.Fatalf("Ready() = %v, %q; want %v, %q", ok, why, tt.ready, tt.why)
			}
		})
	}
}

func TestHandler(t *testing.T) {
	st := &pipeline.Stats{}
	st.AssignedParts.Store(1)
	m := metrics.New(metrics.Options{Stats: st})
	r := &readiness{stats: st, maxAge: time.Minute, started: time.Now(), now: time.Now}
	ctx, cancel := context.WithCancel(context.Background())
	h := handler(ctx, m, r)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, body := get("/readyz"); code != 200 || !strings.HasPrefix(body, "ready") {
		t.Errorf("/readyz = %d %q", code, body)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "billing_partitions_assigned 1") {
		t.Errorf("/metrics = %d, body lacks billing_partitions_assigned 1", code)
	}
	if code, _ := get("/nope"); code != 404 {
		t.Errorf("/nope = %d", code)
	}
	st.AssignedParts.Store(0)
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "no partitions") {
		t.Errorf("/readyz without partitions = %d %q", code, body)
	}
	st.AssignedParts.Store(1)
	cancel()
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "shutting down") {
		t.Errorf("/readyz while shutting down = %d %q", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz while shutting down = %d", code)
	}
}

func TestParseDLID(t *testing.T) {
	tests := []struct {
		in   string
		want dlID
		ok   bool
	}{
		{"42", dlID{0, 42}, true},
		{"1:7", dlID{1, 7}, true},
		{"0:7", dlID{0, 7}, true},
		{"0", dlID{}, false},
		{"-1", dlID{}, false},
		{"a:1", dlID{}, false},
		{"1:", dlID{}, false},
		{"1:2:3", dlID{}, false},
		{"", dlID{}, false},
	}
	for _, tt := range tests {
		got, err := parseDLID(tt.in)
		if (err == nil) != tt.ok || tt.ok && got != tt.want {
			t.Errorf("parseDLID(%q) = %v, %v; want %v ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
		if tt.ok && got.String() != strings.TrimPrefix(tt.in, "0:") {
			t.Errorf("%v.String() = %q", got, got.String())
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
	if got := safeText("a\x1bb", 100); strings.ContainsRune(got, 0x1b) {
		t.Errorf("safeText kept ESC: %q", got)
	}
	if got := safeBytes(nil, 10); got != "-" {
		t.Errorf("safeBytes(nil) = %q", got)
	}
	if got := safeText(strings.Repeat("é", 50), 10); len([]rune(got)) != 10 || !strings.HasSuffix(got, "…") {
		t.Errorf("safeText cut = %q", got)
	}
}

func TestParseArgsInterspersed(t *testing.T) {
	fs := newFlagSet()
	force := fs.Bool("force", false, "")
	file := fs.String("payload-file", "", "")
	pos, err := parseArgs(fs, []string{"12", "--payload-file", "f.json", "--force"}, 1)
	if err != nil || len(pos) != 1 || pos[0] != "12" || !*force || *file != "f.json" {
		t.Fatalf("got %v %v force=%v file=%q", pos, err, *force, *file)
	}
	if _, err := parseArgs(newFlagSet(), []string{"1", "2"}, 1); err == nil {
		t.Fatal("two positional arguments accepted")
	}
	if _, err := parseArgs(newFlagSet(), []string{"--nope"}, 0); err == nil {
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
