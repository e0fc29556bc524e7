package service

import (
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/kafkaconn"
	"github.com/billing/ledger/internal/mysqlconn"
)

// conns are the connection settings resolved from the configuration:
// secrets read from their files, TLS configurations built.
type conns struct {
	kafka kafkaconn.Config
	kopts []kgo.Opt // brokers, TLS, SASL
	dsns  []string  // with MYSQL_PASSWORD_FILE and MYSQL_TLS applied; never log them, see mysqlconn.Redact
}

func resolveConns(cfg config.Config, log *slog.Logger) (*conns, error) {
	c := &conns{kafka: cfg.KafkaConn()}
	var err error
	if c.kopts, err = c.kafka.Opts(); err != nil {
		return nil, err
	}
	if c.dsns, err = ResolveDSNs(cfg, log); err != nil {
		return nil, err
	}
	return c, nil
}

// ResolveDSNs returns the ledger's DSNs, the control server first, with
// MYSQL_PASSWORD_FILE and MYSQL_TLS applied (for the commands that use
// MySQL only, as for the service); it warns when TLS does not verify the
// server. Never log them unredacted (mysqlconn.Redact).
func ResolveDSNs(cfg config.Config, log *slog.Logger) ([]string, error) {
	dsns, err := cfg.MySQLConn().Apply(cfg.DSNs())
	if err != nil {
		return nil, err
	}
	if cfg.MySQLTLS == mysqlconn.TLSSkipVerify || cfg.MySQLTLS == mysqlconn.TLSPreferred {
		log.Warn("MySQL TLS does not verify the server's certificate", "mysql_tls", cfg.MySQLTLS)
	}
	return dsns, nil
}
