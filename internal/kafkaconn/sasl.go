package kafkaconn

import (
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/billing/ledger/internal/connfiles"
)

// SASL mechanisms, as spelled in KAFKA_SASL_MECHANISM (case-insensitive).
const (
	MechanismPlain       = "PLAIN"
	MechanismScramSHA256 = "SCRAM-SHA-256"
	MechanismScramSHA512 = "SCRAM-SHA-512"
)

// Mechanisms lists the supported SASL mechanisms.
func Mechanisms() []string {
	return []string{MechanismPlain, MechanismScramSHA256, MechanismScramSHA512}
}

// SASL configures authentication. The password comes from Password or,
// when PasswordFile is set, from that file (trailing newlines trimmed): a
// mounted secret then never passes through the environment.
type SASL struct {
	Mechanism    string // empty: no SASL
	Username     string
	Password     string
	PasswordFile string
}

// Build returns the franz-go mechanism. The password file is read now.
func (s SASL) Build() (sasl.Mechanism, error) {
	if s.Username == "" {
		return nil, errors.New("a username is required")
	}
	if s.Password != "" && s.PasswordFile != "" {
		return nil, errors.New("set the password or the password file, not both")
	}
	pass := s.Password
	if s.PasswordFile != "" {
		var err error
		if pass, err = connfiles.ReadSecret(s.PasswordFile); err != nil {
			return nil, err
		}
	}
	if pass == "" {
		return nil, errors.New("a password is required")
	}
	switch strings.ToUpper(s.Mechanism) {
	case MechanismPlain:
		return plain.Auth{User: s.Username, Pass: pass}.AsMechanism(), nil
	case MechanismScramSHA256:
		return scram.Auth{User: s.Username, Pass: pass}.AsSha256Mechanism(), nil
	case MechanismScramSHA512:
		return scram.Auth{User: s.Username, Pass: pass}.AsSha512Mechanism(), nil
	default:
		return nil, fmt.Errorf("unknown mechanism %q (want one of %s)", s.Mechanism, strings.Join(Mechanisms(), ", "))
	}
}
