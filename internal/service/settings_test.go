package service_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/service"
	"github.com/billing/ledger/internal/service/servicetest"
)

// TestPipelineConfigCarriesTheSettings: every setting of the pipeline and
// the sink reaches them from the configuration, calendar periods and the
// empty optional durations included.
func TestPipelineConfigCarriesTheSettings(t *testing.T) {
	c := config.Defaults()
	c.KafkaBrokers, c.MySQLDSN = []string{"127.0.0.1:1"}, "u:p@tcp(127.0.0.1:2)/billing"
	c.BillingWindow, c.BillingTimezone, c.WindowCloseAfter = "month", "Europe/Berlin", config.OptionalDuration(36*time.Hour)
	c.LedgerEntries, c.LedgerEntriesRetention = true, config.OptionalDuration(90*24*time.Hour)
	c.KafkaSessionTimeout, c.KafkaRebalanceTimeout = 7*time.Second, 70*time.Second
	c.MySQLBranches, c.DeadLetterPayloadBytes, c.VersionHorizon = 5, 1234, 3*time.Hour
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	pc := service.PipelineConfig(c, []kgo.Opt{kgo.SeedBrokers(c.KafkaBrokers...)}, nil, nil)
	if pc.Window.String() != "month in Europe/Berlin" || pc.WindowCloseAfter != 36*time.Hour || !pc.LedgerEntries || pc.LedgerEntriesRetention != 90*24*time.Hour {
		t.Errorf("period settings: window %v, close after %v, entries %v, retention %v", pc.Window, pc.WindowCloseAfter, pc.LedgerEntries, pc.LedgerEntriesRetention)
	}
	if pc.CheckpointInterval != c.CheckpointInterval || pc.CheckpointMaxBytes != c.CheckpointMaxBytes || pc.MaxPollRecords != c.KafkaMaxPollRecords ||
		pc.DedupTTL != c.DedupTTL || pc.VersionHorizon != c.VersionHorizon || pc.DedupReadAheadConns != c.DedupReadAheadConns || pc.DeadLetterPayloadBytes != 1234 || pc.CommitLogRetention != c.CommitLogRetention || pc.ProgressInterval != c.LogProgress {
		t.Errorf("pipeline config %+v does not carry the configuration %+v", pc, c)
	}
	cl, err := kgo.NewClient(pc.KafkaOpts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if got := cl.OptValue(kgo.SessionTimeout); got != 7*time.Second {
		t.Errorf("session timeout %v", got)
	}
	if got := cl.OptValue(kgo.RebalanceTimeout); got != 70*time.Second {
		t.Errorf("rebalance timeout %v", got)
	}
	if sc := service.SinkConfig(c, nil); sc.Branches != 5 || sc.StepTimeout != c.CheckpointTimeout || sc.Group != c.KafkaGroup || sc.Topic != c.KafkaTopic {
		t.Errorf("sink config %+v", sc)
	}
	if mo := service.MySQLOptions(c); mo.LockWaitTimeout != c.MySQLLockWaitTimeout || mo.ReadAheadConns != c.DedupReadAheadConns || mo.MaxConns != 0 {
		t.Errorf("MySQL options %+v", mo)
	}

	c.WindowCloseAfter, c.LedgerEntriesRetention = 0, 0
	if pc := service.PipelineConfig(c, nil, nil, nil); pc.WindowCloseAfter != 0 || pc.LedgerEntriesRetention != 0 {
		t.Errorf("empty values: close after %v, retention %v", pc.WindowCloseAfter, pc.LedgerEntriesRetention)
	}
}

// TestServicetestConfig: the tests' configuration is the defaults with the
// test's servers and timings, valid as the service checks an environment,
// and it reaches the pipeline as the service's does.
func TestServicetestConfig(t *testing.T) {
	c := servicetest.Config([]string{"127.0.0.1:9092"}, "u:p@tcp(127.0.0.1:3306)/billing", "events")
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	d := config.Defaults()
	if c.BillingWindow != d.BillingWindow || c.MaxEventTimeSkew != d.MaxEventTimeSkew || c.CheckpointMaxBytes != d.CheckpointMaxBytes || c.MySQLBranches != d.MySQLBranches {
		t.Errorf("settings the tests do not choose differ from the defaults: %+v", c)
	}
	pc := servicetest.Pipeline(c, nil)
	if pc.Topic != "events" || pc.Group != "g-events" || pc.CheckpointInterval != 100*time.Millisecond || pc.Window.(event.Period).Size() != time.Hour {
		t.Errorf("pipeline config %+v", pc)
	}
}
