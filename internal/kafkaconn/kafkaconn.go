package kafkaconn

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Config is how to reach and authenticate to the cluster.
type Config struct {
	Brokers []string
	TLS     TLS
	SASL    SASL
}

// Opts returns the client options for c: seed brokers, the TLS dialer when
// enabled, and the SASL mechanism when one is set. Callers append their own
// options (consumer group, producer settings) after these.
func (c Config) Opts() ([]kgo.Opt, error) {
	if len(c.Brokers) == 0 {
		return nil, fmt.Errorf("kafkaconn: no broker")
	}
	opts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...)}
	if c.TLS.Enabled {
		tc, err := c.TLS.Build()
		if err != nil {
			return nil, fmt.Errorf("kafkaconn: TLS: %w", err)
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if c.SASL.Mechanism != "" {
		m, err := c.SASL.Build()
		if err != nil {
			return nil, fmt.Errorf("kafkaconn: SASL: %w", err)
		}
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// Cleartext reports whether the configured SASL mechanism would send its
// password unencrypted (PLAIN without TLS).
func (c Config) Cleartext() bool {
	return !c.TLS.Enabled && strings.EqualFold(c.SASL.Mechanism, MechanismPlain)
}

// LogValue describes the connection for logs: brokers, whether TLS is on,
// the SASL mechanism and user. It never includes the password or file
// contents.
func (c Config) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.Any("brokers", c.Brokers),
		slog.Bool("tls", c.TLS.Enabled),
	}
	if c.SASL.Mechanism != "" {
		attrs = append(attrs, slog.String("sasl", strings.ToUpper(c.SASL.Mechanism)), slog.String("sasl_user", c.SASL.Username))
	}
	return slog.GroupValue(attrs...)
}
