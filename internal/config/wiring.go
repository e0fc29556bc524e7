package config

import (
	"log/slog"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/txsink"
)

// Sink is the configuration of the checkpoint sink these settings describe,
// over dsns (the control server first). The service and the benchmark both
// build their sink from it, so that what is measured is what runs.
func (c Config) Sink(dsns []string, log *slog.Logger) txsink.Config {
	return txsink.Config{
		DSNs: dsns, Branches: c.MySQLBranches, Group: c.KafkaGroup, Topic: c.KafkaTopic,
		LockWaitTimeout: c.MySQLLockWaitTimeout, StepTimeout: c.CheckpointTimeout,
		Logger: log,
	}
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
		BillingWindow: c.BillingWindow, MaxPayloadBytes: c.MaxPayloadBytes, DeadLetterPayloadBytes: c.DeadLetterPayloadBytes,
		RecoveryInterval: c.RecoveryInterval, DecisionRetention: c.DecisionRetention,
		ShutdownTimeout: c.ShutdownTimeout, AllowGroupChange: c.AllowGroupChange,
		KafkaOpts: append(slices.Clip(kopts),
			kgo.SessionTimeout(c.KafkaSessionTimeout), kgo.RebalanceTimeout(c.KafkaRebalanceTimeout)),
		Logger:       log,
		OnCheckpoint: onCheckpoint,
	}
}
