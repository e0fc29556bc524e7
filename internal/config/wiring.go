package config

import (
	"log/slog"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// Sink is the configuration of the checkpoint sink these settings
// describe, and MySQL the options of the servers it runs on. The service
// and the benchmark both build their sink from them (see
// mysqldriver.OpenSink), so that what is measured is what runs.
func (c Config) Sink(log *slog.Logger) txsink.Config {
	return txsink.Config{
		Branches: c.MySQLBranches, Group: c.KafkaGroup, Topic: c.KafkaTopic,
		StepTimeout: c.CheckpointTimeout, Logger: log,
	}
}

// MySQL are the options of the ledger's servers.
func (c Config) MySQL() mysqldriver.Options {
	return mysqldriver.Options{LockWaitTimeout: c.MySQLLockWaitTimeout}
}

// Pipeline is the pipeline configuration these settings describe. kopts
// are the Kafka client's connection options (brokers, TLS, SASL); the
// group's timeouts are added here.
func (c Config) Pipeline(kopts []kgo.Opt, log *slog.Logger, onCheckpoint func(pipeline.CheckpointInfo)) pipeline.Config {
	return pipeline.Config{
		Topic: c.KafkaTopic, Group: c.KafkaGroup,
		CheckpointInterval: c.CheckpointInterval, CheckpointTimeout: c.CheckpointTimeout,
		CheckpointMaxRecords: c.CheckpointMaxRecords, CheckpointMaxBytes: c.CheckpointMaxBytes, MaxPollRecords: c.KafkaMaxPollRecords,
		DedupTTL: c.DedupTTL, DedupCacheKeys: c.DedupCacheKeys,
		DedupCleanupInterval: c.DedupCleanupInterval, DedupCleanupBatch: c.DedupCleanupBatch,
		Window: c.Period(), WindowCloseAfter: time.Duration(c.WindowCloseAfter), MaxEventTimeSkew: c.MaxEventTimeSkew,
		LedgerEntries: c.LedgerEntries, LedgerEntriesRetention: time.Duration(c.LedgerEntriesRetention),
		MaxPayloadBytes: c.MaxPayloadBytes, DeadLetterPayloadBytes: c.DeadLetterPayloadBytes,
		RecoveryInterval: c.RecoveryInterval, DecisionRetention: c.DecisionRetention, CommitLogRetention: c.CommitLogRetention,
		ShutdownTimeout: c.ShutdownTimeout, AllowGroupChange: c.AllowGroupChange,
		KafkaOpts: append(slices.Clip(kopts),
			kgo.SessionTimeout(c.KafkaSessionTimeout), kgo.RebalanceTimeout(c.KafkaRebalanceTimeout)),
		Logger:           log,
		OnCheckpoint:     onCheckpoint,
		ProgressInterval: c.LogProgress,
	}
}
