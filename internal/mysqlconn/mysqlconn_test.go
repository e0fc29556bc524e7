package mysqlconn

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/billing/ledger/internal/testcert"
)

const secret = "Sup3r-secret"

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestApply(t *testing.T) {
	certs := testcert.New(t, "mysqlconn")
	pwFile := writeFile(t, secret+"\r\n")
	dsns := []string{
		"billing:old@tcp(db0:3306)/billing?parseTime=true",
		"billing@tcp(db1:3306)/billing_shard1?tls=skip-verify",
	}
	tests := []struct {
		name     string
		opts     Options
		wantPass string // for every DSN; "" = unchanged
		wantTLS  []string
		custom   bool
	}{
		{"nothing", Options{}, "", []string{"", "skip-verify"}, false},
		{"password file for every DSN", Options{PasswordFile: pwFile}, secret, []string{"", "skip-verify"}, false},
		{"tls true overrides", Options{TLS: TLSVerify}, "", []string{"true", "true"}, false},
		{"tls false overrides", Options{TLS: TLSOff}, "", []string{"false", "false"}, false},
		{"preferred", Options{TLS: TLSPreferred}, "", []string{"preferred", "preferred"}, false},
		{"custom CA", Options{TLS: TLSVerify, CAFile: certs.CAFile}, "", nil, true},
		{"custom CA and client cert", Options{TLS: TLSVerify, CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile, PasswordFile: pwFile}, secret, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := tt.opts.Apply(dsns)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != len(dsns) {
				t.Fatalf("got %d DSNs", len(out))
			}
			var names []string
			for i, d := range out {
				cfg, err := mysql.ParseDSN(d) // also resolves a registered TLS name
				if err != nil {
					t.Fatalf("DSN %d does not parse: %v", i, err)
				}
				orig, _ := mysql.ParseDSN(dsns[i])
				want := orig.Passwd
				if tt.wantPass != "" {
					want = tt.wantPass
				}
				if cfg.Passwd != want {
					t.Errorf("DSN %d: password %q, want %q", i, cfg.Passwd, want)
				}
				if cfg.Addr != orig.Addr || cfg.DBName != orig.DBName {
					t.Errorf("DSN %d: address or database changed: %s", i, Redact(d))
				}
				if tt.custom {
					if !strings.HasPrefix(cfg.TLSConfig, "billing-") || cfg.TLS == nil || cfg.TLS.RootCAs == nil || cfg.TLS.InsecureSkipVerify {
						t.Errorf("DSN %d: custom TLS not applied: name %q", i, cfg.TLSConfig)
					}
					if want := strings.Split(orig.Addr, ":")[0]; cfg.TLS != nil && cfg.TLS.ServerName != want {
						t.Errorf("DSN %d: server name %q, want the host %q", i, cfg.TLS.ServerName, want)
					}
					if (tt.opts.CertFile != "") != (cfg.TLS != nil && len(cfg.TLS.Certificates) == 1) {
						t.Errorf("DSN %d: client certificate presence wrong", i)
					}
					names = append(names, cfg.TLSConfig)
				} else if cfg.TLSConfig != tt.wantTLS[i] {
					t.Errorf("DSN %d: tls=%q, want %q", i, cfg.TLSConfig, tt.wantTLS[i])
				}
			}
			if tt.custom {
				// Same settings, same registered name: Apply is idempotent.
				again, err := tt.opts.Apply(dsns[:1])
				if err != nil {
					t.Fatal(err)
				}
				cfg, _ := mysql.ParseDSN(again[0])
				if cfg.TLSConfig != names[0] || names[0] != names[1] {
					t.Errorf("registered names differ: %q, %v", cfg.TLSConfig, names)
				}
			}
		})
	}
}

// Different certificates never share a registered name.
func TestRegisteredNamesDiffer(t *testing.T) {
	a, b := testcert.New(t, "a"), testcert.New(t, "b")
	da, err := Options{TLS: TLSVerify, CAFile: a.CAFile}.Apply([]string{"u@tcp(h:3306)/d"})
	if err != nil {
		t.Fatal(err)
	}
	db, err := Options{TLS: TLSVerify, CAFile: b.CAFile}.Apply([]string{"u@tcp(h:3306)/d"})
	if err != nil {
		t.Fatal(err)
	}
	if da[0] == db[0] {
		t.Fatalf("two CAs, one name: %s", da[0])
	}
}

func TestApplyErrors(t *testing.T) {
	certs := testcert.New(t, "mysqlconn")
	tests := []struct {
		name string
		opts Options
		dsn  string
		want string
	}{
		{"unknown mode", Options{TLS: "required"}, "u@tcp(h)/d", "not one of"},
		{"CA without verify", Options{TLS: TLSSkipVerify, CAFile: certs.CAFile}, "u@tcp(h)/d", "needs TLS mode true"},
		{"cert without key", Options{TLS: TLSVerify, CertFile: certs.ClientCertFile}, "u@tcp(h)/d", "both a certificate file and a key file"},
		{"missing CA", Options{TLS: TLSVerify, CAFile: "/nonexistent/ca.pem"}, "u@tcp(h)/d", "/nonexistent/ca.pem"},
		{"missing password file", Options{PasswordFile: "/nonexistent/pw"}, "u@tcp(h)/d", "/nonexistent/pw"},
		{"bad DSN with password", Options{}, "u:" + secret + "@tcp(h/d", "DSN 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.opts.Apply([]string{tt.dsn})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("want error containing %q, got %v", tt.want, err)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	tests := []struct{ dsn, want string }{
		{"billing:" + secret + "@tcp(127.0.0.1:3306)/billing", "billing:xxxxx@tcp(127.0.0.1:3306)/billing"},
		{"billing@tcp(127.0.0.1:3306)/billing", "billing@tcp(127.0.0.1:3306)/billing"},
		{"billing:" + secret + "@tcp(127.0.0.1:3306/billing", "<unparseable DSN>"},
		{"root:" + secret + "@/", "root:xxxxx@tcp(127.0.0.1:3306)/"},
	}
	for _, tt := range tests {
		got := Redact(tt.dsn)
		if got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", strings.ReplaceAll(tt.dsn, secret, "…"), got, tt.want)
		}
		if strings.Contains(got, secret) {
			t.Errorf("Redact leaks the password: %q", got)
		}
	}
	if got := RedactAll([]string{"a:" + secret + "@tcp(h:1)/d", "b:" + secret + "@tcp(h:2)/d"}); strings.Contains(strings.Join(got, " "), secret) {
		t.Errorf("RedactAll leaks: %v", got)
	}
}

// CheckDSN never echoes a password, even when the driver's message would
// quote a fragment of a misparsed DSN.
func TestCheckDSN(t *testing.T) {
	for _, dsn := range []string{
		"u:" + secret + "@tcp(h/d",
		"u:" + secret + "@tcp(h)/d?tls=" + secret,
		"u:" + secret + "@tcp(h)/d?parseTime=" + secret,
		"u:pa/ss" + secret + "@tcp(h)/db?x=%zz",
	} {
		err := CheckDSN(dsn)
		if err == nil {
			t.Errorf("CheckDSN accepted a bad DSN")
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("CheckDSN error leaks the password: %v", err)
		}
	}
	if err := CheckDSN("u:p@tcp(h:3306)/d?parseTime=true"); err != nil {
		t.Errorf("CheckDSN rejected a good DSN: %v", err)
	}
}
