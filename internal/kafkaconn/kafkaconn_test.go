package kafkaconn

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/testcert"
)

const secret = "s3cret-Pa55word"

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOptsValidation: every misconfiguration is an error at build time
// (never a silent fallback), and no error text contains the password.
func TestOptsValidation(t *testing.T) {
	certs := testcert.New(t, "kafkaconn")
	notPEM := writeFile(t, "not.pem", "hello")
	empty := writeFile(t, "empty", "\n")
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // empty: success
		wantN   int    // number of options on success
	}{
		{"brokers only", Config{Brokers: []string{"b:9092"}}, "", 1},
		{"no broker", Config{}, "no broker", 0},
		{"tls system roots", Config{Brokers: []string{"b:9092"}, TLS: TLS{Enabled: true}}, "", 2},
		{"tls custom CA and client cert", Config{Brokers: []string{"b:9092"}, TLS: TLS{Enabled: true, CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile}}, "", 2},
		{"tls missing CA file", Config{Brokers: []string{"b:9092"}, TLS: TLS{Enabled: true, CAFile: "/nonexistent/ca.pem"}}, "/nonexistent/ca.pem", 0},
		{"tls CA not PEM", Config{Brokers: []string{"b:9092"}, TLS: TLS{Enabled: true, CAFile: notPEM}}, "no PEM certificate", 0},
		{"tls cert without key", Config{Brokers: []string{"b:9092"}, TLS: TLS{Enabled: true, CertFile: certs.ClientCertFile}}, "both a certificate file and a key file", 0},
		{"sasl scram-256", Config{Brokers: []string{"b:9092"}, SASL: SASL{Mechanism: "scram-sha-256", Username: "u", Password: secret}}, "", 2},
		{"sasl scram-512 from file", Config{Brokers: []string{"b:9092"}, SASL: SASL{Mechanism: "SCRAM-SHA-512", Username: "u", PasswordFile: writeFile(t, "pw", secret+"\n")}}, "", 2},
		{"sasl plain with tls", Config{Brokers: []string{"b:9092"}, TLS: TLS{Enabled: true}, SASL: SASL{Mechanism: "PLAIN", Username: "u", Password: secret}}, "", 3},
		{"sasl unknown mechanism", Config{Brokers: []string{"b:9092"}, SASL: SASL{Mechanism: "GSSAPI", Username: "u", Password: secret}}, "unknown mechanism", 0},
		{"sasl no user", Config{Brokers: []string{"b:9092"}, SASL: SASL{Mechanism: "PLAIN", Password: secret}}, "username is required", 0},
		{"sasl no password", Config{Brokers: []string{"b:9092"}, SASL: SASL{Mechanism: "PLAIN", Username: "u"}}, "password is required", 0},
		{"sasl both passwords", Config{Brokers: []string{"b:9092"}, SASL: SASL{Mechanism: "PLAIN", Username: "u", Password: secret, PasswordFile: empty}}, "not both", 0},
		{"sasl empty password file", Config{Brokers: []string{"b:9092"}, SASL: SASL{Mechanism: "PLAIN", Username: "u", PasswordFile: empty}}, "is empty", 0},
		{"sasl missing password file", Config{Brokers: []string{"b:9092"}, SASL: SASL{Mechanism: "PLAIN", Username: "u", PasswordFile: "/nonexistent/pw"}}, "/nonexistent/pw", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts, err := tt.cfg.Opts()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Opts: %v", err)
				}
				if len(opts) != tt.wantN {
					t.Fatalf("got %d options, want %d", len(opts), tt.wantN)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("want error containing %q, got %v", tt.wantErr, err)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
}

func TestTLSBuild(t *testing.T) {
	certs := testcert.New(t, "kafkaconn")
	c, err := TLS{Enabled: true, CAFile: certs.CAFile, ServerName: "kafka.internal"}.Build()
	if err != nil {
		t.Fatal(err)
	}
	if c.MinVersion != tls.VersionTLS12 || c.RootCAs == nil || c.ServerName != "kafka.internal" || c.InsecureSkipVerify {
		t.Fatalf("unexpected TLS config: min %x roots %v name %q skip %v", c.MinVersion, c.RootCAs != nil, c.ServerName, c.InsecureSkipVerify)
	}
	if _, err := (TLS{}).Build(); err == nil {
		t.Fatal("Build of a disabled TLS config must fail")
	}
}

// TestLogValueHasNoSecret: the connection description logged at start names
// the mechanism and the user but never the password.
func TestLogValueHasNoSecret(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	c := Config{Brokers: []string{"b:9092"}, TLS: TLS{Enabled: true}, SASL: SASL{Mechanism: "scram-sha-512", Username: "svc", Password: secret}}
	log.Info("configured", "kafka", c)
	out := buf.String()
	if strings.Contains(out, secret) {
		t.Fatalf("log leaks the password: %s", out)
	}
	for _, want := range []string{`"sasl":"SCRAM-SHA-512"`, `"sasl_user":"svc"`, `"tls":true`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s: %s", want, out)
		}
	}
	if (Config{SASL: SASL{Mechanism: "plain"}}).Cleartext() != true || (Config{TLS: TLS{Enabled: true}, SASL: SASL{Mechanism: "PLAIN"}}).Cleartext() {
		t.Error("Cleartext: PLAIN without TLS is cleartext, with TLS it is not")
	}
}

// roundTrip produces one record and consumes it back with a client built
// from c, against an in-process kfake cluster.
func roundTrip(ctx context.Context, c Config, topic string) error {
	opts, err := c.Opts()
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(append(opts,
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.RequestRetries(0),
		kgo.RetryTimeout(2*time.Second),
		kgo.DialTimeout(2*time.Second),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close()
	// A refused handshake or login closes the connection: with no request
	// retries, the ping fails at once rather than at the deadline.
	if err := cl.Ping(ctx); err != nil {
		return err
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("v")}).FirstErr(); err != nil {
		return err
	}
	for {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			return err
		}
		if fs.NumRecords() > 0 {
			return nil
		}
	}
}

// TestSASLAgainstKfake: a client with the right SASL credentials (PLAIN,
// SCRAM-SHA-256, SCRAM-SHA-512) produces and consumes; one with a wrong
// password or an unknown user fails.
func TestSASLAgainstKfake(t *testing.T) {
	const topic = "sasl-test"
	cluster, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(1, topic),
		kfake.EnableSASL(),
		kfake.Superuser("PLAIN", "plainuser", "plain-pass"),
		kfake.Superuser("SCRAM-SHA-256", "scram256", "s256-pass"),
		kfake.Superuser("SCRAM-SHA-512", "scram512", "s512-pass"),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()
	tests := []struct {
		name string
		sasl SASL
		ok   bool
	}{
		{"plain right", SASL{Mechanism: "PLAIN", Username: "plainuser", Password: "plain-pass"}, true},
		{"plain wrong password", SASL{Mechanism: "PLAIN", Username: "plainuser", Password: "nope"}, false},
		{"scram-256 right", SASL{Mechanism: "SCRAM-SHA-256", Username: "scram256", Password: "s256-pass"}, true},
		{"scram-256 right from file", SASL{Mechanism: "SCRAM-SHA-256", Username: "scram256", PasswordFile: writeFile(t, "pw", "s256-pass\n")}, true},
		{"scram-256 wrong password", SASL{Mechanism: "SCRAM-SHA-256", Username: "scram256", Password: "nope"}, false},
		{"scram-256 unknown user", SASL{Mechanism: "SCRAM-SHA-256", Username: "ghost", Password: "s256-pass"}, false},
		{"scram-512 right", SASL{Mechanism: "SCRAM-SHA-512", Username: "scram512", Password: "s512-pass"}, true},
		{"scram-512 with the 256 mechanism", SASL{Mechanism: "SCRAM-SHA-256", Username: "scram512", Password: "s512-pass"}, false},
		{"scram-512 wrong password", SASL{Mechanism: "SCRAM-SHA-512", Username: "scram512", Password: "nope"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := roundTrip(ctx, Config{Brokers: brokers, SASL: tt.sasl}, topic)
			if tt.ok && err != nil {
				t.Fatalf("right credentials failed: %v", err)
			}
			if !tt.ok {
				if err == nil {
					t.Fatal("wrong credentials were accepted")
				}
				if errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("wrong credentials should fail fast with an authentication error, got %v", err)
				}
				t.Logf("refused as expected: %v", err)
			}
		})
	}
}

// TestTLSAgainstKfake: with KAFKA_TLS_CA_FILE naming the cluster's CA the
// client connects (SCRAM over TLS); without it (system roots) the
// handshake fails: certificates are verified.
func TestTLSAgainstKfake(t *testing.T) {
	const topic = "tls-test"
	certs := testcert.New(t, "kfake")
	cluster, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(1, topic),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{certs.Server}, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-512", "svc", "pw"),
	)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	sasl := SASL{Mechanism: "SCRAM-SHA-512", Username: "svc", Password: "pw"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := roundTrip(ctx, Config{Brokers: cluster.ListenAddrs(), TLS: TLS{Enabled: true, CAFile: certs.CAFile}, SASL: sasl}, topic); err != nil {
		t.Fatalf("TLS with the right CA: %v", err)
	}
	err = roundTrip(ctx, Config{Brokers: cluster.ListenAddrs(), TLS: TLS{Enabled: true}, SASL: sasl}, topic)
	if err == nil {
		t.Fatal("TLS without the CA (system roots) connected: certificates are not verified")
	}
	t.Logf("refused as expected: %v", err)
}
