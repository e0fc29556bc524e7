package pipeline

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/txsink"
)

// attrsOf turns a line's key-value list into a map.
func attrsOf(t *testing.T, kv []any) map[string]any {
	t.Helper()
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// TestProgressLine (issue 22: at info level nothing was logged between
// "partitions assigned" and "stopped"): while records are consumed or the
// positions are behind the log end, the line gives the counts, the rate,
// each partition's position against its log end, the records behind and
// when they would be caught up; an idle, caught-up instance logs nothing.
func TestProgressLine(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	prev := progressSnapshot{at: t0, consumed: 1000, counted: 900}
	cur := progressSnapshot{at: t0.Add(10 * time.Second), consumed: 51000, counted: 50000, parts: []partProgress{
		{0, 20000, 120000}, {1, 30000, 30000}, {2, txsink.StartOffset, 500}, {3, 10, -1},
	}}
	kv, work := progressLine(prev, cur)
	a := attrsOf(t, kv)
	if !work {
		t.Fatal("50000 records consumed, 100000 behind: no line")
	}
	want := map[string]any{"partitions": 4, "counted": int64(50000), "consumed": int64(51000), "records_per_second": int64(5000),
		"behind": int64(100000), "positions": "p0 20000/120000, p1 30000/30000, p2 start/500, p3 10/?", "positions_not_known_yet": 2,
		"catch_up_in": 20 * time.Second}
	for k, v := range want {
		if fmt.Sprint(a[k]) != fmt.Sprint(v) {
			t.Errorf("%s = %v, want %v", k, a[k], v)
		}
	}

	// A short wait is said in tenths of seconds, never "0s".
	kv, _ = progressLine(prev, progressSnapshot{at: cur.at, consumed: cur.consumed, parts: []partProgress{{0, 10, 710}}})
	if got := attrsOf(t, kv)["catch_up_in"]; got != 100*time.Millisecond {
		t.Errorf("700 records behind at 5000/s: catch_up_in %v, want 100ms", got)
	}

	// Behind, but nothing consumed since the last line: no rate, no
	// estimate, still a line (a stuck consumer is worth seeing).
	kv, work = progressLine(cur, progressSnapshot{at: cur.at.Add(10 * time.Second), consumed: cur.consumed, counted: cur.counted, parts: cur.parts})
	if a := attrsOf(t, kv); !work || !strings.HasPrefix(fmt.Sprint(a["catch_up_in"]), "unknown") || a["records_per_second"] != int64(0) {
		t.Errorf("stalled: work %v, %v", work, a)
	}

	// Caught up and idle: nothing to say.
	idle := progressSnapshot{at: cur.at, consumed: 7, counted: 7, parts: []partProgress{{0, 50, 50}, {1, 9, 9}}}
	if _, work := progressLine(idle, progressSnapshot{at: cur.at.Add(time.Minute), consumed: 7, counted: 7, parts: idle.parts}); work {
		t.Error("an idle, caught-up instance logs progress")
	}

	// Many partitions: the line names the first ones and counts the rest.
	var many []partProgress
	for i := range 100 {
		many = append(many, partProgress{int32(i), 1, 2})
	}
	kv, _ = progressLine(idle, progressSnapshot{at: cur.at.Add(time.Second), parts: many})
	if p := fmt.Sprint(attrsOf(t, kv)["positions"]); strings.Count(p, "/") != maxProgressPartitions || !strings.HasSuffix(p, "and 68 more") {
		t.Errorf("positions of 100 partitions: %q", p)
	}
}

// TestPositionsInHumanForm: assignments and revocations name each
// partition's position in words, not a Go struct.
func TestPositionsInHumanForm(t *testing.T) {
	wm := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	got := claimedText([]int32{0, 1}, map[int32]txsink.Position{
		0: {Epoch: 1, NextOffset: txsink.StartOffset},
		1: {Epoch: 4, NextOffset: 983, Watermark: wm},
	})
	if want := "p0 from the start (epoch 1), p1 at 983 (epoch 4, watermark 2026-11-29T10:00:00Z)"; got != want {
		t.Errorf("claimedText = %q, want %q", got, want)
	}
	p := &Pipeline{parts: map[int32]*partition{3: {committed: 1432}, 4: {committed: txsink.StartOffset}}}
	if got, want := p.committedTextLocked([]int32{3, 4, 5}), "p3 at 1432, p4 from the start, p5 unknown"; got != want {
		t.Errorf("committedTextLocked = %q, want %q", got, want)
	}
}
