package kafkaconn

import (
	"crypto/tls"
	"errors"

	"github.com/billing/ledger/internal/connfiles"
)

// TLS configures encryption to the brokers.
type TLS struct {
	Enabled bool
	// CAFile is a PEM bundle trusted instead of the system roots.
	CAFile string
	// CertFile and KeyFile are the client certificate for mutual TLS.
	CertFile, KeyFile string
	// ServerName overrides the name the brokers' certificates are checked
	// against (default: the host of each address dialled).
	ServerName string
}

// Build returns the client TLS configuration. Files are read now; their
// errors name the file, never its content.
func (t TLS) Build() (*tls.Config, error) {
	if !t.Enabled {
		return nil, errors.New("TLS is not enabled")
	}
	return connfiles.Files{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile}.Client(t.ServerName)
}
