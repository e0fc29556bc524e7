package config

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/billing/ledger/internal/kafkaconn"
	"github.com/billing/ledger/internal/mysqlconn"
)

// KafkaConn is the Kafka connection configuration (brokers, TLS, SASL).
func (c *Config) KafkaConn() kafkaconn.Config {
	return kafkaconn.Config{
		Brokers: c.KafkaBrokers,
		TLS: kafkaconn.TLS{
			Enabled: c.KafkaTLSEnabled, CAFile: c.KafkaTLSCAFile, CertFile: c.KafkaTLSCertFile,
			KeyFile: c.KafkaTLSKeyFile, ServerName: c.KafkaTLSServerName,
		},
		SASL: kafkaconn.SASL{
			Mechanism: c.KafkaSASLMechanism, Username: c.KafkaSASLUsername,
			Password: c.KafkaSASLPassword, PasswordFile: c.KafkaSASLPasswordFile,
		},
	}
}

// MySQLConn is what applies to every MySQL DSN (password file, TLS).
func (c *Config) MySQLConn() mysqlconn.Options {
	return mysqlconn.Options{
		TLS: c.MySQLTLS, CAFile: c.MySQLTLSCAFile, CertFile: c.MySQLTLSCertFile,
		KeyFile: c.MySQLTLSKeyFile, PasswordFile: c.MySQLPasswordFile,
	}
}

// securityProblems checks the TLS, SASL and secret-file settings. Messages
// name variables and files, never a secret.
func (c *Config) securityProblems() []string {
	var p []string
	bad := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }

	files := []struct{ name, path string }{
		{"KAFKA_TLS_CA_FILE", c.KafkaTLSCAFile},
		{"KAFKA_TLS_CERT_FILE", c.KafkaTLSCertFile},
		{"KAFKA_TLS_KEY_FILE", c.KafkaTLSKeyFile},
		{"KAFKA_SASL_PASSWORD_FILE", c.KafkaSASLPasswordFile},
		{"MYSQL_PASSWORD_FILE", c.MySQLPasswordFile},
		{"MYSQL_TLS_CA_FILE", c.MySQLTLSCAFile},
		{"MYSQL_TLS_CERT_FILE", c.MySQLTLSCertFile},
		{"MYSQL_TLS_KEY_FILE", c.MySQLTLSKeyFile},
		{"SCHEMA_REGISTRY_PASSWORD_FILE", c.SchemaRegistryPasswordFile},
		{"SCHEMA_REGISTRY_TLS_CA_FILE", c.SchemaRegistryTLSCAFile},
		{"SCHEMA_REGISTRY_TLS_CERT_FILE", c.SchemaRegistryTLSCertFile},
		{"SCHEMA_REGISTRY_TLS_KEY_FILE", c.SchemaRegistryTLSKeyFile},
	}
	for _, f := range files {
		if f.path == "" {
			continue
		}
		if fi, err := os.Stat(f.path); err != nil {
			bad("%s: %v", f.name, err)
		} else if fi.IsDir() {
			bad("%s: %s is a directory", f.name, f.path)
		}
	}

	// Kafka TLS.
	if !c.KafkaTLSEnabled {
		for _, f := range []struct{ name, v string }{
			{"KAFKA_TLS_CA_FILE", c.KafkaTLSCAFile}, {"KAFKA_TLS_CERT_FILE", c.KafkaTLSCertFile},
			{"KAFKA_TLS_KEY_FILE", c.KafkaTLSKeyFile}, {"KAFKA_TLS_SERVER_NAME", c.KafkaTLSServerName},
		} {
			if f.v != "" {
				bad("%s is set but KAFKA_TLS_ENABLED is false", f.name)
			}
		}
	}
	if (c.KafkaTLSCertFile == "") != (c.KafkaTLSKeyFile == "") {
		bad("KAFKA_TLS_CERT_FILE and KAFKA_TLS_KEY_FILE go together")
	}

	// Kafka SASL.
	mech := strings.ToUpper(c.KafkaSASLMechanism)
	switch {
	case mech == "":
		if c.KafkaSASLUsername != "" || c.KafkaSASLPassword != "" || c.KafkaSASLPasswordFile != "" {
			bad("KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD or KAFKA_SASL_PASSWORD_FILE is set but KAFKA_SASL_MECHANISM is empty")
		}
	case !slices.Contains(kafkaconn.Mechanisms(), mech):
		bad("KAFKA_SASL_MECHANISM must be empty, %s; got %q", strings.Join(kafkaconn.Mechanisms(), ", "), c.KafkaSASLMechanism)
	default:
		if c.KafkaSASLUsername == "" {
			bad("KAFKA_SASL_MECHANISM=%s needs KAFKA_SASL_USERNAME", mech)
		}
		switch {
		case c.KafkaSASLPassword != "" && c.KafkaSASLPasswordFile != "":
			bad("set KAFKA_SASL_PASSWORD or KAFKA_SASL_PASSWORD_FILE, not both")
		case c.KafkaSASLPassword == "" && c.KafkaSASLPasswordFile == "":
			bad("KAFKA_SASL_MECHANISM=%s needs KAFKA_SASL_PASSWORD or KAFKA_SASL_PASSWORD_FILE", mech)
		}
		if mech == kafkaconn.MechanismPlain && !c.KafkaTLSEnabled {
			bad("KAFKA_SASL_MECHANISM=PLAIN sends the password in clear: enable KAFKA_TLS_ENABLED or use SCRAM")
		}
	}

	// MySQL TLS.
	if !slices.Contains(mysqlconn.Modes(), c.MySQLTLS) {
		bad("MYSQL_TLS must be empty, false, true, skip-verify or preferred; got %q", c.MySQLTLS)
	} else if err := c.MySQLConn().Validate(); err != nil {
		bad("MYSQL_TLS_CA_FILE / MYSQL_TLS_CERT_FILE / MYSQL_TLS_KEY_FILE: %v", err)
	}
	return p
}
