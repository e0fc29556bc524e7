package pipeline

import (
	"testing"
	"time"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
)

func ts(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

func TestTopicWatermark(t *testing.T) {
	tests := []struct {
		name  string
		parts map[int32]partTime
		want  string
	}{
		{"none", map[int32]partTime{0: {}, 1: {caughtUp: true}}, ""},
		{"the earliest active partition holds it back", map[int32]partTime{
			0: {wm: ts("2026-03-01T10:00:00Z")}, 1: {wm: ts("2026-03-01T08:00:00Z")}, 2: {wm: ts("2026-03-01T12:00:00Z")}}, "2026-03-01T08:00:00Z"},
		{"a caught-up partition does not", map[int32]partTime{
			0: {wm: ts("2026-03-01T10:00:00Z")}, 1: {wm: ts("2026-03-01T08:00:00Z"), caughtUp: true}}, "2026-03-01T10:00:00Z"},
		{"nor one that never had an event", map[int32]partTime{
			0: {wm: ts("2026-03-01T10:00:00Z")}, 1: {}}, "2026-03-01T10:00:00Z"},
		{"every partition caught up: the latest", map[int32]partTime{
			0: {wm: ts("2026-03-01T10:00:00Z"), caughtUp: true}, 1: {wm: ts("2026-03-01T08:00:00Z"), caughtUp: true}}, "2026-03-01T10:00:00Z"},
	}
	for _, tt := range tests {
		got := topicWatermark(tt.parts)
		if (tt.want == "" && !got.IsZero()) || (tt.want != "" && !got.Equal(ts(tt.want))) {
			t.Errorf("%s: %v, want %s", tt.name, got, tt.want)
		}
	}
}

func evAt(partition int32, offset int64, at string) record {
	return record{ev: event.Event{EventID: at, AccountID: "a", Currency: "EUR", AmountMinor: 1, OccurredAt: ts(at)}, partition: partition, offset: offset}
}

// Each record is judged against the frontier raised by the records before
// it and itself in its partition, whatever else the snapshot holds, so
// that on one partition the outcome does not depend on where checkpoints
// cut it.
func TestPlanEventTimeOnePartition(t *testing.T) {
	day, err := event.Calendar("day", "Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	// Berlin: 28 March is [27T23:00Z, 28T23:00Z), 29 March (23 hours)
	// [28T23:00Z, 29T22:00Z). Windows close 2 hours after their end.
	recs := []record{
		evAt(0, 0, "2026-03-28T10:00:00Z"), // 28 March
		evAt(0, 1, "2026-03-28T23:30:00Z"), // 29 March 00:30 CET: 28 March closes at 29T01:00Z, not yet
		evAt(0, 2, "2026-03-28T11:00:00Z"), // 28 March, still open
		evAt(0, 3, "2026-03-29T01:00:00Z"), // exactly 28 March's end + 2h: closed
		evAt(0, 4, "2026-03-28T12:00:00Z"), // late
		evAt(0, 5, "2026-03-29T20:00:00Z"), // 29 March, open until 30T00:00Z
	}
	want := []bool{false, false, false, false, true, false}
	for cut := 0; cut <= len(recs); cut++ {
		// The same records in two checkpoints, cut anywhere, judge alike.
		var late []bool
		et := txsink.EventTime{Partitions: map[int32]txsink.Position{0: {}}}
		for _, part := range [][]record{append([]record(nil), recs[:cut]...), append([]record(nil), recs[cut:]...)} {
			if len(part) == 0 {
				continue
			}
			wm := time.Time{}
			for _, r := range part {
				wm = laterOf(wm, r.ev.OccurredAt)
			}
			plan := planEventTime(day, 2*time.Hour, et, part, []txsink.PartitionCut{{Partition: 0, Watermark: wm}})
			for _, r := range part {
				late = append(late, r.late)
			}
			// What the decision commits.
			et.Frontier.Closed = plan.raise
			et.Partitions[0] = txsink.Position{Watermark: laterOf(et.Partitions[0].Watermark, wm)}
		}
		for i := range want {
			if late[i] != want[i] {
				t.Errorf("cut after %d records: record %d late = %v, want %v", cut, i, late[i], want[i])
			}
		}
		// The latest watermark, 29T20:00Z - 2h, is in 29 March: the
		// frontier is its start.
		if want := ts("2026-03-28T23:00:00Z"); !et.Frontier.Closed.Equal(want) {
			t.Errorf("cut after %d: frontier %s, want %s", cut, et.Frontier.Closed, want)
		}
	}
}

// Other partitions hold the watermark back unless they are caught up or
// never had an event; the snapshot's own partitions count at their cut.
func TestPlanEventTimePartitions(t *testing.T) {
	hour, _ := event.Fixed(time.Hour)
	et := txsink.EventTime{
		Frontier: driver.Frontier{Closed: ts("2026-03-01T05:00:00Z"), Sealed: ts("2026-03-01T04:00:00Z")},
		Partitions: map[int32]txsink.Position{
			0: {Watermark: ts("2026-03-01T06:00:00Z")},
			1: {Watermark: ts("2026-03-01T07:30:00Z")},                 // active, behind
			2: {Watermark: ts("2026-03-01T03:00:00Z"), CaughtUp: true}, // idle
			3: {},                                                      // never had an event
		},
	}
	recs := []record{evAt(0, 10, "2026-03-01T09:10:00Z"), evAt(0, 11, "2026-03-01T06:30:00Z"), evAt(0, 12, "2026-03-01T04:30:00Z")}
	plan := planEventTime(hour, 0, et, recs, []txsink.PartitionCut{{Partition: 0, Watermark: ts("2026-03-01T09:10:00Z"), CaughtUp: true}})
	// Partition 1 holds it at 07:30: windows before 07:00 are closed.
	if want := ts("2026-03-01T07:00:00Z"); !plan.raise.Equal(want) {
		t.Errorf("raise %s, want %s", plan.raise, want)
	}
	if recs[0].late || !recs[1].late || !recs[2].late {
		t.Errorf("late: %v %v %v, want false true true", recs[0].late, recs[1].late, recs[2].late)
	}
	if !plan.sealFrom.Equal(et.Frontier.Sealed) || !plan.sealTo.Equal(et.Frontier.Closed) {
		t.Errorf("seal [%s, %s), want the committed frontier's gap", plan.sealFrom, plan.sealTo)
	}
	// Once partition 1 is caught up, the snapshot's partition 0, caught up
	// at its cut, makes the watermark the latest: 09:10.
	et.Partitions[1] = txsink.Position{Watermark: ts("2026-03-01T07:30:00Z"), CaughtUp: true}
	plan = planEventTime(hour, 0, et, recs, []txsink.PartitionCut{{Partition: 0, Watermark: ts("2026-03-01T09:10:00Z"), CaughtUp: true}})
	if want := ts("2026-03-01T09:00:00Z"); !plan.raise.Equal(want) {
		t.Errorf("all caught up: raise %s, want %s", plan.raise, want)
	}
	// The frontier never goes back, even when the watermark does.
	et.Frontier.Closed = ts("2026-03-01T10:00:00Z")
	plan = planEventTime(hour, 0, et, nil, nil)
	if !plan.raise.Equal(et.Frontier.Closed) || plan.noWork() {
		t.Errorf("raise %s (no work %v), want the stored frontier and the seal to do", plan.raise, plan.noWork())
	}
	et.Frontier.Sealed = et.Frontier.Closed
	if plan = planEventTime(hour, 0, et, nil, nil); !plan.noWork() {
		t.Errorf("nothing to close or seal, but not idle: %+v", plan)
	}
}
