package service

import (
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/pipeline"
)

// NewLogger is the logger LOG_FORMAT and LOG_LEVEL describe, writing to w
// (auto: text on a terminal, JSON otherwise).
func NewLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(strings.ToUpper(cfg.LogLevel)))
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: readableDurations}
	format := cfg.LogFormat
	if format == "auto" {
		format = "json"
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			format = "text"
		}
	}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// readableDurations writes durations as text ("1.5s", "250ms"), not as
// the nanoseconds slog's JSON handler gives them, which read as a count.
func readableDurations(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// summary is the "stopped" line: the totals of this run and its rate.
func summary(st *pipeline.Stats, ran time.Duration) []any {
	counted := st.Counted.Load()
	return []any{"counted", counted, "checkpoints", st.Checkpoints.Load(), "consumed", st.Consumed.Load(), "skipped", st.Skipped.Load(),
		"duplicates", st.Duplicates.Load(), "dead_letters", st.DeadLetters.Load(), "aborted_checkpoints", st.Aborts.Load(),
		"in_doubt_resolved", st.RecoveredCommit.Load() + st.RecoveredAbort.Load(),
		"read_ahead_ids", st.ReadAhead.Load(), "read_ahead_dropped", st.ReadAheadDropped.Load(), "read_ahead_failures", st.ReadAheadFailed.Load(),
		"ran_for", ran.Round(time.Millisecond), "average_events_per_second", int64(float64(counted)/max(ran.Seconds(), 1e-3) + 0.5)}
}
