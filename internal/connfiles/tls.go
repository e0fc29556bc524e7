package connfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Files names the PEM files of a TLS client. Every field is optional; an
// empty CAFile means the system roots.
type Files struct {
	CAFile   string // PEM bundle of CA certificates to trust instead of the system roots
	CertFile string // PEM client certificate (mutual TLS); requires KeyFile
	KeyFile  string // PEM private key of CertFile
}

// Client returns a TLS 1.2+ client configuration. ServerName is left empty
// unless serverName is set: both franz-go and go-sql-driver/mysql then fill
// it in from the address they dial, so one configuration serves several
// hosts. Errors name the file, never its content.
func (f Files) Client(serverName string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificate found", f.CAFile)
		}
		c.RootCAs = pool
	}
	switch {
	case f.CertFile != "" && f.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			// The error of LoadX509KeyPair names no key material.
			return nil, fmt.Errorf("client certificate %s / key %s: %w", f.CertFile, f.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	case f.CertFile != "" || f.KeyFile != "":
		return nil, errors.New("a client certificate needs both a certificate file and a key file")
	}
	return c, nil
}
