package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func setenv(t *testing.T, kv map[string]string) {
	t.Helper()
	for k, v := range kv {
		t.Setenv(k, v)
	}
}

func TestLoadDefaults(t *testing.T) {
	setenv(t, map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092,127.0.0.1:9093", "MYSQL_DSN": "u:p@tcp(127.0.0.1:3306)/billing"})
	c, err := Load()
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if len(c.KafkaBrokers) != 2 || c.CheckpointInterval != time.Second || c.DedupTTL != 24*time.Hour || c.BillingWindow != time.Hour {
		t.Fatalf("unexpected defaults: %+v", c)
	}
	if got := c.DSNs(); len(got) != 1 || got[0] != c.MySQLDSN {
		t.Fatalf("DSNs() = %v", got)
	}
}

// Every problem is reported at once: a parse error, a missing required
// variable and a semantic error in one message.
func TestLoadListsEveryProblem(t *testing.T) {
	setenv(t, map[string]string{
		"KAFKA_BROKERS":       "127.0.0.1:9092",
		"CHECKPOINT_INTERVAL": "soon",
		"DEDUP_TTL":           "-1h",
		"MYSQL_BRANCHES":      "0",
		"LOG_FORMAT":          "xml",
	})
	_, err := Load()
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("want *Error, got %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"CHECKPOINT_INTERVAL=\"soon\"", "MYSQL_DSN is required"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	if len(ce.Problems) != 2 {
		t.Errorf("want 2 parse problems (semantic checks run once parsing succeeds), got %d: %v", len(ce.Problems), ce.Problems)
	}
}

func TestValidate(t *testing.T) {
	base := func() map[string]string {
		return map[string]string{"KAFKA_BROKERS": "127.0.0.1:9092", "MYSQL_DSN": "x"}
	}
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"negative ttl", map[string]string{"DEDUP_TTL": "-1h"}, "DEDUP_TTL must be positive"},
		{"broker without port", map[string]string{"KAFKA_BROKERS": "localhost"}, "is not host:port"},
		{"rebalance shorter than checkpoint", map[string]string{"KAFKA_REBALANCE_TIMEOUT": "10s"}, "must exceed CHECKPOINT_TIMEOUT"},
		{"fractional window", map[string]string{"BILLING_WINDOW": "1500ms"}, "BILLING_WINDOW must be a whole number of seconds"},
		{"branches", map[string]string{"MYSQL_BRANCHES": "0"}, "MYSQL_BRANCHES must be between 1 and 64"},
		{"log format", map[string]string{"LOG_FORMAT": "xml"}, "LOG_FORMAT must be"},
		{"interval beyond timeout", map[string]string{"CHECKPOINT_INTERVAL": "1m"}, "CHECKPOINT_TIMEOUT (30s) must exceed CHECKPOINT_INTERVAL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := base()
			for k, v := range tt.env {
				env[k] = v
			}
			setenv(t, env)
			_, err := Load()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("want error containing %q, got %v", tt.want, err)
			}
		})
	}
}

func TestUsageListsEveryVariable(t *testing.T) {
	var b strings.Builder
	if err := Usage(&b); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"KAFKA_BROKERS", "MYSQL_DSN", "CHECKPOINT_INTERVAL", "DEDUP_TTL", "BILLING_WINDOW", "MYSQL_SHARD_DSNS"} {
		if !strings.Contains(b.String(), v) {
			t.Errorf("usage lacks %s", v)
		}
	}
}
