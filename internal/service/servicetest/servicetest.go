package servicetest

import (
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/service"
	"github.com/billing/ledger/internal/txsink"
)

// Config is the service's configuration for a test of topic (its group is
// "g-"+topic) on brokers and the ledger at dsn: the defaults, with fast
// checkpoints (every 100 ms, 10,000 records at most, aborted after 10 s),
// a cache of 1,000 dedup keys and an hour of TTL, cleanup every second in
// batches of 100, recovery every second, decisions kept an hour, payloads
// up to 4 KiB, a group session of 6 s and rebalances of 20 s, and a
// shutdown bounded by 10 s.
func Config(brokers []string, dsn, topic string) config.Config {
	c := config.Defaults()
	c.KafkaBrokers, c.MySQLDSN = brokers, dsn
	c.KafkaTopic, c.KafkaGroup = topic, "g-"+topic
	c.KafkaSessionTimeout, c.KafkaRebalanceTimeout = 6*time.Second, 20*time.Second
	c.KafkaMaxPollRecords = 1000
	c.CheckpointInterval, c.CheckpointTimeout, c.CheckpointMaxRecords = 100*time.Millisecond, 10*time.Second, 10000
	c.DedupTTL, c.DedupCacheKeys = time.Hour, 1000
	c.DedupCleanupInterval, c.DedupCleanupBatch = time.Second, 100
	c.MaxPayloadBytes = 4096
	c.RecoveryInterval, c.DecisionRetention, c.ShutdownTimeout = time.Second, time.Hour, 10*time.Second
	c.MySQLLockWaitTimeout = 2 * time.Second
	return c
}

// Pipeline is the pipeline's configuration of c, on its brokers, logging
// to log.
func Pipeline(c config.Config, log *slog.Logger) pipeline.Config {
	return service.PipelineConfig(c, []kgo.Opt{kgo.SeedBrokers(c.KafkaBrokers...)}, log, nil)
}

// Sink is the sink's configuration of c, logging to log.
func Sink(c config.Config, log *slog.Logger) txsink.Config { return service.SinkConfig(c, log) }
