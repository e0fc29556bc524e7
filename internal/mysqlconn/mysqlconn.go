package mysqlconn

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/billing/ledger/internal/connfiles"
)

// TLS modes of MYSQL_TLS. They are the driver's own values of the DSN's
// tls parameter; an empty mode keeps whatever each DSN says.
const (
	TLSFromDSN    = ""
	TLSOff        = "false"
	TLSVerify     = "true"        // encrypted, certificate and host name verified
	TLSSkipVerify = "skip-verify" // encrypted, certificate not verified
	TLSPreferred  = "preferred"   // encrypted if the server offers it, not verified
)

// Modes lists the accepted MYSQL_TLS values.
func Modes() []string {
	return []string{TLSFromDSN, TLSOff, TLSVerify, TLSSkipVerify, TLSPreferred}
}

// Options are the settings applied to every DSN.
type Options struct {
	// TLS is one of the modes above.
	TLS string
	// CAFile, CertFile and KeyFile customise TLSVerify: a CA bundle to
	// trust instead of the system roots, and a client certificate.
	CAFile, CertFile, KeyFile string
	// PasswordFile, if set, replaces the password of every DSN with the
	// file's content (trailing newlines trimmed).
	PasswordFile string
}

// Validate checks the options without reading any file.
func (o Options) Validate() error {
	var errs []error
	switch o.TLS {
	case TLSFromDSN, TLSOff, TLSVerify, TLSSkipVerify, TLSPreferred:
	default:
		errs = append(errs, fmt.Errorf("TLS mode %q is not one of false, true, skip-verify, preferred", o.TLS))
	}
	if o.custom() && o.TLS != TLSVerify {
		errs = append(errs, errors.New("a CA file or client certificate needs TLS mode true (verified)"))
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		errs = append(errs, errors.New("a client certificate needs both a certificate file and a key file"))
	}
	return errors.Join(errs...)
}

func (o Options) custom() bool { return o.CAFile != "" || o.CertFile != "" || o.KeyFile != "" }

// Apply returns dsns with the options applied, in the same order. Files are
// read once, now. Errors never contain a password.
func (o Options) Apply(dsns []string) ([]string, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("mysqlconn: %w", err)
	}
	var pass string
	if o.PasswordFile != "" {
		var err error
		if pass, err = connfiles.ReadSecret(o.PasswordFile); err != nil {
			return nil, fmt.Errorf("mysqlconn: password: %w", err)
		}
	}
	tlsName := o.TLS
	if o.custom() {
		var err error
		if tlsName, err = o.register(); err != nil {
			return nil, fmt.Errorf("mysqlconn: %w", err)
		}
	}
	out := make([]string, len(dsns))
	for i, dsn := range dsns {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, fmt.Errorf("mysqlconn: DSN %d (%s): %s", i, Redact(dsn), scrub(dsn, err))
		}
		if o.PasswordFile != "" {
			cfg.Passwd = pass
		}
		if tlsName != TLSFromDSN {
			cfg.TLSConfig = tlsName
			cfg.TLS = nil
		}
		out[i] = cfg.FormatDSN()
	}
	return out, nil
}

// register builds the custom TLS configuration and registers it with the
// driver under a content-derived name.
func (o Options) register() (string, error) {
	tc, err := connfiles.Files{CAFile: o.CAFile, CertFile: o.CertFile, KeyFile: o.KeyFile}.Client("")
	if err != nil {
		return "", fmt.Errorf("TLS: %w", err)
	}
	h := sha256.New()
	h.Write([]byte(o.TLS + "\x00" + o.KeyFile + "\x00"))
	for _, f := range []string{o.CAFile, o.CertFile} {
		if f == "" {
			h.Write([]byte{0})
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("TLS: %w", err)
		}
		h.Write(b)
		h.Write([]byte{0})
	}
	name := "billing-" + hex.EncodeToString(h.Sum(nil)[:8])
	if err := mysql.RegisterTLSConfig(name, tc); err != nil {
		return "", fmt.Errorf("TLS: register: %w", err)
	}
	return name, nil
}

// TLSConfig returns the tls.Config that Apply registers, for tests and
// diagnostics; nil when the options use no custom configuration.
func (o Options) TLSConfig() (*tls.Config, error) {
	if !o.custom() {
		return nil, nil
	}
	return connfiles.Files{CAFile: o.CAFile, CertFile: o.CertFile, KeyFile: o.KeyFile}.Client("")
}

// Redact returns dsn with its password replaced by "xxxxx", for logs and
// messages. A DSN that does not parse is returned as "<unparseable DSN>":
// it may still contain a password.
func Redact(dsn string) string {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "<unparseable DSN>"
	}
	if cfg.Passwd != "" {
		cfg.Passwd = "xxxxx"
	}
	return cfg.FormatDSN()
}

// CheckDSN reports whether dsn parses. The error never contains the
// password.
func CheckDSN(dsn string) error {
	if _, err := mysql.ParseDSN(dsn); err != nil {
		return errors.New(scrub(dsn, err))
	}
	return nil
}

// RedactAll redacts every DSN.
func RedactAll(dsns []string) []string {
	out := make([]string, len(dsns))
	for i, d := range dsns {
		out[i] = Redact(d)
	}
	return out
}

// scrub returns the parse error's text unless it could contain the
// password: the driver quotes parameter values in some messages, and an
// unescaped password can be mistaken for one.
func scrub(dsn string, err error) string {
	msg := err.Error()
	if at := strings.LastIndex(dsn, "@"); at > 0 {
		userinfo := dsn[:at]
		if c := strings.IndexByte(userinfo, ':'); c >= 0 && c+1 < len(userinfo) {
			pass := userinfo[c+1:]
			if strings.Contains(msg, pass) || len(pass) >= 3 && containsAnyPart(msg, pass) {
				return "invalid DSN (details withheld: they may contain the password)"
			}
		}
	}
	return msg
}

// containsAnyPart reports whether msg contains a substring of pass of at
// least 3 bytes split at DSN delimiters (where a misparse would cut it).
func containsAnyPart(msg, pass string) bool {
	for _, part := range strings.FieldsFunc(pass, func(r rune) bool { return strings.ContainsRune("@/?&=()", r) }) {
		if len(part) >= 3 && strings.Contains(msg, part) {
			return true
		}
	}
	return false
}
