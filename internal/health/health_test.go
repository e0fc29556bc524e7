package health

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/pipeline"
)

// TestProbes: liveness and readiness for each state an instance can be
// in. Times are offsets from the pipeline's start.
func TestProbes(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	type state struct {
		phase      string        // startup phase; "" = running
		mysqlErr   error         // the last MySQL check
		kafkaErr   error         // the last Kafka check
		member     bool          // the coordinator lists the client
		assigned   int           // partitions the group assigned
		claimed    int64         // partitions claimed (Stats.AssignedParts)
		lastCkpt   time.Duration // 0 = none
		waitFrom   time.Duration // when records started waiting (seen by a check); -1 = none wait
		now        time.Duration
		pending    int64
		events     []pipeline.CheckpointInfo
		ready      bool
		readyWhy   string
		live       bool
		liveWhy    string
		noCheckYet bool
		hold       string // why checkpoints are held (the changelog's backlog)
	}
	member := func(s state) state { s.member = true; return s }
	tests := []struct {
		name string
		s    state
	}{
		{"migrating", state{phase: "migrating the schema", now: time.Second, live: true, liveWhy: "starting: migrating", readyWhy: "starting: migrating"}},
		{"before the first check", state{noCheckYet: true, now: time.Second, live: true, readyWhy: "first check"}},
		{"mysql down", state{mysqlErr: errors.New("connection refused"), member: true, now: time.Second, live: true, readyWhy: "MySQL: connection refused"}},
		{"kafka unreachable", state{kafkaErr: context.DeadlineExceeded, now: time.Second, live: true, readyWhy: "Kafka: no answer"}},
		{"joining", state{now: time.Second, live: true, readyWhy: "not a member"}},
		{"standby", member(state{now: time.Hour, live: true, ready: true, readyWhy: "standby"})},
		{"claiming", member(state{assigned: 3, now: time.Second, live: true, readyWhy: "claiming the 3 partitions"})},
		{"fresh start with a backlog", member(state{assigned: 3, claimed: 3, waitFrom: 0, now: 10 * time.Second, pending: 500, live: true, ready: true, readyWhy: "checkpointing"})},
		{"recent checkpoint", member(state{assigned: 3, claimed: 3, lastCkpt: 5 * time.Minute, waitFrom: 0, now: 5*time.Minute + 30*time.Second, pending: 9, live: true, ready: true, readyWhy: "checkpointing"})},
		{"idle for hours", member(state{assigned: 3, claimed: 3, lastCkpt: time.Minute, waitFrom: -1, now: time.Hour,
			events: []pipeline.CheckpointInfo{{Decided: true}}, live: true, ready: true, readyWhy: "idle"})},
		{"records arrive after hours idle", member(state{assigned: 3, claimed: 3, lastCkpt: time.Minute, waitFrom: time.Hour - time.Second, now: time.Hour, pending: 50,
			events: []pipeline.CheckpointInfo{{Decided: true}}, live: true, ready: true, readyWhy: "checkpointing"})},
		{"records wait, no checkpoint", member(state{assigned: 3, claimed: 3, lastCkpt: time.Minute, waitFrom: time.Minute, now: 3 * time.Minute, pending: 50,
			events: []pipeline.CheckpointInfo{{Decided: true}}, live: true, readyWhy: "while 50 records wait"})},
		{"failing checkpoints", member(state{assigned: 3, claimed: 3, lastCkpt: time.Minute, waitFrom: time.Minute, now: 3 * time.Minute, pending: 50,
			events: []pipeline.CheckpointInfo{{Decided: true}, {Err: context.DeadlineExceeded}}, live: true, readyWhy: "last attempt failed"})},
		{"careful retry is not a failure", member(state{assigned: 3, claimed: 3, lastCkpt: time.Minute, waitFrom: -1, now: time.Hour,
			events: []pipeline.CheckpointInfo{{Decided: true}, {Err: context.DeadlineExceeded, Retrying: true}}, live: true, ready: true, readyWhy: "idle"})},
		{"wedged", member(state{assigned: 3, claimed: 3, lastCkpt: time.Minute, waitFrom: 2 * time.Minute, now: 8 * time.Minute, pending: 7,
			readyWhy: "no checkpoint committed for 6m0s", liveWhy: "wedged: 7 records have waited 6m0s"})},
		{"wedged before any checkpoint", member(state{assigned: 3, claimed: 3, waitFrom: 0, now: 6 * time.Minute, pending: 7, liveWhy: "wedged"})},
		{"held by the changelog's backlog: not ready, saying why, but alive", member(state{assigned: 3, claimed: 3, lastCkpt: time.Minute, waitFrom: 2 * time.Minute,
			now: 8 * time.Minute, pending: 7, hold: "the changelog's backlog is full", readyWhy: "the changelog's backlog is full", live: true, liveWhy: "holding checkpoints"})},
		{"wedged while starting is not judged", state{phase: "checking grants", now: time.Hour, pending: 7, live: true, liveWhy: "alive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.s
			now := start
			m := New(Options{ReadyMaxAge: time.Minute, MaxStall: 5 * time.Minute, CheckInterval: time.Second, Now: func() time.Time { return now }})
			st := &pipeline.Stats{}
			if s.phase == "" {
				m.Start(Checks{Stats: st,
					MySQL:      func(context.Context) error { return s.mysqlErr },
					Membership: func(context.Context) (bool, int, error) { return s.member, s.assigned, s.kafkaErr },
					Hold:       func() string { return s.hold }})
			} else {
				m.SetPhase(s.phase)
			}
			st.AssignedParts.Store(s.claimed)
			for _, ev := range s.events {
				m.OnCheckpoint(ev)
			}
			if s.lastCkpt != 0 {
				st.LastCheckpoint.Store(start.Add(s.lastCkpt).UnixNano())
			}
			if s.waitFrom >= 0 && s.pending > 0 {
				now = start.Add(s.waitFrom)
				st.Pending.Store(s.pending)
				if !s.noCheckYet {
					m.Check(context.Background()) // sees the records waiting
				}
			}
			now = start.Add(s.now)
			st.Pending.Store(s.pending)
			if !s.noCheckYet {
				m.Check(context.Background())
			}
			ok, why := m.Ready()
			if ok != s.ready || !strings.Contains(why, s.readyWhy) {
				t.Errorf("Ready() = %v, %q; want %v, %q", ok, why, s.ready, s.readyWhy)
			}
			ok, why = m.Live()
			if ok != s.live || !strings.Contains(why, s.liveWhy) {
				t.Errorf("Live() = %v, %q; want %v, %q", ok, why, s.live, s.liveWhy)
			}
		})
	}
}

// TestStallResetsWhenCaughtUp: once nothing waits the stall is 0, and the
// next wait counts from when it was first seen, not from the old
// checkpoint.
func TestStallResetsWhenCaughtUp(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	now := start
	m := New(Options{ReadyMaxAge: time.Minute, MaxStall: 5 * time.Minute, CheckInterval: time.Second, Now: func() time.Time { return now }})
	st := &pipeline.Stats{}
	m.Start(Checks{Stats: st})
	st.Pending.Store(3)
	now = start.Add(10 * time.Minute)
	if d := m.Stall(); d != 0 {
		t.Fatalf("stall when first seen = %s, want 0", d)
	}
	now = now.Add(2 * time.Minute)
	if d := m.Stall(); d != 2*time.Minute {
		t.Fatalf("stall = %s, want 2m", d)
	}
	st.Pending.Store(0)
	if d := m.Stall(); d != 0 {
		t.Fatalf("stall when caught up = %s", d)
	}
	st.Pending.Store(1)
	now = now.Add(time.Hour)
	if d := m.Stall(); d != 0 {
		t.Fatalf("a new wait counts from when it is seen, got %s", d)
	}
}

// TestStallSurvivesAFailedCheckpointsRewind: checkpoints that all fail drop
// their records and read them again, so the pending count touches zero
// between attempts; a check landing on that moment must not restart the
// wait, or a wedged instance never looks wedged (integration's
// TestHealthDuringStartupAndWedge failed so once).
func TestStallSurvivesAFailedCheckpointsRewind(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	now := start
	m := New(Options{ReadyMaxAge: 2 * time.Second, MaxStall: 5 * time.Second, CheckInterval: 200 * time.Millisecond, Now: func() time.Time { return now }})
	st := &pipeline.Stats{}
	m.Start(Checks{Stats: st})
	for i := range 40 { // 8 s of attempts every 200 ms, each seen between drop and re-read
		st.Pending.Store(int64(20 * (i % 2)))
		m.Check(context.Background())
		now = now.Add(200 * time.Millisecond)
	}
	st.Pending.Store(20)
	if ok, why := m.Live(); ok || !strings.Contains(why, "wedged") {
		t.Fatalf("Live() = %v, %q after 8 s of failing checkpoints; want wedged", ok, why)
	}
}
