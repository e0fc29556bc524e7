package connfiles

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/billing/ledger/internal/testcert"
)

func TestReadSecret(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, content, want, err string
	}{
		{"plain", "s3cret", "s3cret", ""},
		{"trailing newline", "s3cret\n", "s3cret", ""},
		{"crlf", "s3cret\r\n\r\n", "s3cret", ""},
		{"inner spaces kept", " a b ", " a b ", ""},
		{"empty", "\n", "", "is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_"))
			if err := os.WriteFile(p, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := ReadSecret(p)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("want error %q, got %v", tt.err, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ReadSecret = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	if _, err := ReadSecret(filepath.Join(dir, "absent")); err == nil || !strings.Contains(err.Error(), "absent") {
		t.Fatalf("missing file: %v", err)
	}
}

func TestClient(t *testing.T) {
	certs := testcert.New(t, "connfiles")
	c, err := Files{CAFile: certs.CAFile, CertFile: certs.ClientCertFile, KeyFile: certs.ClientKeyFile}.Client("")
	if err != nil {
		t.Fatal(err)
	}
	if c.MinVersion != tls.VersionTLS12 || c.RootCAs == nil || len(c.Certificates) != 1 || c.InsecureSkipVerify || c.ServerName != "" {
		t.Fatalf("unexpected config")
	}
	// The key of another certificate does not match.
	other := testcert.New(t, "other")
	if _, err := (Files{CertFile: certs.ClientCertFile, KeyFile: other.ClientKeyFile}).Client(""); err == nil {
		t.Fatal("mismatched certificate and key accepted")
	}
	if _, err := (Files{KeyFile: certs.ClientKeyFile}).Client(""); err == nil {
		t.Fatal("key without certificate accepted")
	}
	c, err = Files{}.Client("kafka.internal")
	if err != nil || c.RootCAs != nil || c.ServerName != "kafka.internal" {
		t.Fatalf("system roots: %v", err)
	}
}
