package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// validConfig is a Config as cmd/billing-bench's defaults make it, small.
func validConfig(t *testing.T) Config {
	return Config{Brokers: []string{"127.0.0.1:1"}, Admin: "root:root@tcp(127.0.0.1:1)/", Events: 2000, Partitions: 6,
		LiveRate: 5000, Repeat: 1, Modes: []string{modeService}, Variants: []string{"default"}, Out: filepath.Join(t.TempDir(), "out")}
}

// TestPrepareRefusesBadConfigs: Run refuses what the flags used to refuse,
// in the flags' words, before anything is measured or written.
func TestPrepareRefusesBadConfigs(t *testing.T) {
	for _, c := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Repeat = 0 }, "-repeat must be 1..20"},
		{func(c *Config) { c.Modes = []string{"nope"} }, `-modes: unknown mode "nope"`},
		{func(c *Config) { c.Topic = "t" }, "-topic needs -expected and exactly one variant"},
		{func(c *Config) { c.Events = 0 }, "-events must be 1..1e8"},
		{func(c *Config) { c.LiveRate = 0 }, "-live-rate positive"},
		{func(c *Config) { c.LTMOldPct = 96 }, "-ltm-old-blocks-pct: 96 is outside"},
		{func(c *Config) { c.Decisions = []int{4, 257} }, `-decisions: "257" is not a count`},
		{func(c *Config) { c.Brokers = nil }, "-brokers: none"},
		{func(c *Config) { c.ServiceEnv = map[string]string{"CHECKPOINT_MAX_RECORDS": "abc"} }, "service configuration: "},
	} {
		cfg := validConfig(t)
		c.edit(&cfg)
		_, err := prepare(cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("prepare: %v, want %q", err, c.want)
		}
		if _, serr := os.Stat(cfg.Out); serr == nil {
			t.Errorf("%q: the output directory was created for a refused run", c.want)
		}
	}
}

// TestPrepareTakesTheServiceSizes: unset sizes of the naive job and of
// sink-only come from the service's configuration, set ones are kept,
// and the output directory exists.
func TestPrepareTakesTheServiceSizes(t *testing.T) {
	cfg := validConfig(t)
	cfg.ServiceEnv = map[string]string{"CHECKPOINT_MAX_RECORDS": "1234", "CHECKPOINT_INTERVAL": "250ms"}
	o, err := prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if o.NaiveBatch != 1234 || o.NaiveWait != 250*time.Millisecond || o.SinkChunk != 2468 {
		t.Errorf("naive batch %d, wait %s, sink chunk %d; want the service's 1234, 250ms, 2×1234", o.NaiveBatch, o.NaiveWait, o.SinkChunk)
	}
	if o.svc.CheckpointMaxRecords != 1234 {
		t.Errorf("service configuration: %d records per checkpoint", o.svc.CheckpointMaxRecords)
	}
	if st, err := os.Stat(cfg.Out); err != nil || !st.IsDir() {
		t.Errorf("output directory: %v", err)
	}
	cfg.NaiveBatch, cfg.SinkChunk, cfg.Out = 7, 9, filepath.Join(t.TempDir(), "b")
	if o, err = prepare(cfg); err != nil {
		t.Fatal(err)
	}
	if o.NaiveBatch != 7 || o.SinkChunk != 9 {
		t.Errorf("set sizes: %d, %d; want 7, 9", o.NaiveBatch, o.SinkChunk)
	}
}

// TestChildExitCode: a -child argument that is not a spec is a usage error
// (exit 2), as it was when main parsed it.
func TestChildExitCode(t *testing.T) {
	err := Child("{")
	if err == nil || ChildExitCode(err) != 2 {
		t.Errorf("Child(%q) = %v, exit %d; want a spec error, exit 2", "{", err, ChildExitCode(err))
	}
	if code := ChildExitCode(os.ErrClosed); code != 1 {
		t.Errorf("another error: exit %d, want 1", code)
	}
}
