package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Set is a CA and the certificates it signed, as PEM files in Dir.
type Set struct {
	Dir                           string
	CAFile                        string
	ServerCertFile, ServerKeyFile string
	ClientCertFile, ClientKeyFile string
	// Server is the server certificate, ready for a tls.Config.
	Server tls.Certificate
	// CAPool trusts the CA.
	CAPool *x509.CertPool
}

// New writes a fresh set into a new temporary directory (removed with the
// test). The files are readable by the current user only, except the CA
// and the certificates, which a server process may need to read.
func New(t testing.TB, name string) *Set {
	t.Helper()
	dir := t.TempDir()
	s := &Set{Dir: dir}
	caKey := key(t)
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name + " test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	s.CAFile = write(t, dir, "ca.pem", "CERTIFICATE", caDER, 0o644)
	s.CAPool = x509.NewCertPool()
	s.CAPool.AddCert(ca)

	leaf := func(cn string, usage x509.ExtKeyUsage, server bool) (certFile, keyFile string, pair tls.Certificate) {
		k := key(t)
		tmpl := &x509.Certificate{
			SerialNumber: serial(t),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if server {
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		certFile = write(t, dir, cn+".pem", "CERTIFICATE", der, 0o644)
		keyFile = write(t, dir, cn+"-key.pem", "PRIVATE KEY", kder, 0o600)
		pair, err = tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		return certFile, keyFile, pair
	}
	s.ServerCertFile, s.ServerKeyFile, s.Server = leaf("server", x509.ExtKeyUsageServerAuth, true)
	s.ClientCertFile, s.ClientKeyFile, _ = leaf("client", x509.ExtKeyUsageClientAuth, false)
	return s
}

func key(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func write(t testing.TB, dir, name, typ string, der []byte, mode os.FileMode) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		t.Fatal(err)
	}
	return p
}
