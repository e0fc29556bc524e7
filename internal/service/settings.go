package service

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// The settings of the parts the service is assembled from, as the
// configuration describes them: the one place a setting reaches the
// package that acts on it, for the service, the benchmark and the tests
// alike (what is measured and tested is what runs).

// SinkConfig is the configuration of the checkpoint sink.
func SinkConfig(cfg config.Config, log *slog.Logger) txsink.Config {
	return txsink.Config{
		Branches: cfg.MySQLBranches, Group: cfg.KafkaGroup, Topic: cfg.KafkaTopic,
		StepTimeout: cfg.CheckpointTimeout, Logger: log, Changelog: cfg.ChangelogTopicPrefix != "",
	}
}

// MySQLOptions are the options of the ledger's servers.
func MySQLOptions(cfg config.Config) mysqldriver.Options {
	return mysqldriver.Options{LockWaitTimeout: cfg.MySQLLockWaitTimeout, Images: cfg.ChangelogTopicPrefix != "",
		ReadAheadConns: cfg.DedupReadAheadConns}
}

// PipelineConfig is the pipeline's configuration. kopts are the Kafka
// client's connection options (brokers, TLS, SASL); the group's timeouts
// are added here. The caller sets what comes from the servers (the
// ledger's clock and period schedule, the settings check) and the hooks.
func PipelineConfig(cfg config.Config, kopts []kgo.Opt, log *slog.Logger, onCheckpoint func(pipeline.CheckpointInfo)) pipeline.Config {
	// Validate refuses settings no decoder can be built from, and the
	// service builds it again with the error (newPipeline).
	dec, _ := EventDecoder(cfg)
	return pipeline.Config{
		Decoder: dec,
		Topic:   cfg.KafkaTopic, Group: cfg.KafkaGroup,
		CheckpointInterval: cfg.CheckpointInterval, CheckpointTimeout: cfg.CheckpointTimeout,
		CheckpointMaxRecords: cfg.CheckpointMaxRecords, CheckpointMaxBytes: cfg.CheckpointMaxBytes, MaxPollRecords: cfg.KafkaMaxPollRecords,
		DedupTTL: cfg.DedupTTL, VersionHorizon: cfg.VersionHorizon, DedupCacheKeys: cfg.DedupCacheKeys, DedupReadAheadConns: cfg.DedupReadAheadConns,
		DedupCleanupInterval: cfg.DedupCleanupInterval, DedupCleanupBatch: cfg.DedupCleanupBatch,
		Window: cfg.Period(), WindowCloseAfter: time.Duration(cfg.WindowCloseAfter), MaxEventTimeSkew: cfg.MaxEventTimeSkew,
		LedgerEntries: cfg.LedgerEntries, LedgerEntriesRetention: time.Duration(cfg.LedgerEntriesRetention),
		MaxPayloadBytes: cfg.MaxPayloadBytes, DeadLetterPayloadBytes: cfg.DeadLetterPayloadBytes,
		RecoveryInterval: cfg.RecoveryInterval, DecisionRetention: cfg.DecisionRetention, CommitLogRetention: cfg.CommitLogRetention,
		ShutdownTimeout: cfg.ShutdownTimeout, AllowGroupChange: cfg.AllowGroupChange,
		KafkaOpts: append(slices.Clip(kopts),
			kgo.SessionTimeout(cfg.KafkaSessionTimeout), kgo.RebalanceTimeout(cfg.KafkaRebalanceTimeout)),
		Logger:           log,
		OnCheckpoint:     onCheckpoint,
		ProgressInterval: cfg.LogProgress,
		Changelog:        cfg.ChangelogTopicPrefix != "",
	}
}

// EventDecoder is the record decoder the EVENT_* settings describe; nil
// when they describe the JSON contract, which the pipeline reads with its
// own decoder (event.Decoder).
func EventDecoder(cfg config.Config) (pipeline.RecordDecoder, error) {
	o, err := cfg.EventDecoderOptions()
	if err != nil {
		return nil, err
	}
	d, err := format.New(o)
	if err != nil || d.Fast() {
		return nil, err
	}
	return d, nil
}

// resultSettings are the settings that change what the ledger holds
// (config.ResultSettings), by variable name, for the "configured" line.
func resultSettings(cfg config.Config) slog.Value {
	var attrs []slog.Attr
	for _, name := range config.ResultSettings() {
		v, _ := cfg.Setting(name)
		attrs = append(attrs, slog.String(name, v))
	}
	return slog.GroupValue(attrs...)
}

// closingText says in words whether and when windows close.
func closingText(cfg config.Config) string {
	if cfg.WindowCloseAfter == 0 {
		return "windows never close (WINDOW_CLOSE_AFTER empty)"
	}
	return fmt.Sprintf("a window closes once the watermark is %s past its end", time.Duration(cfg.WindowCloseAfter))
}
