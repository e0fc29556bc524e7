package pipeline

import (
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink"
)

// Event time bounded by processing time (issue 18, item 2): the rule of
// admit, over the class of skews and offsets, generated: a record is in
// the future exactly when its occurred_at is later than now plus the skew
// (to the nanosecond, both sides of the boundary); the future ones become
// event_time_in_future dead letters carrying the record; the others stay,
// in order; no cut's watermark ends past now plus the skew, and each is
// the latest admitted occurred_at of its partition (or the stored floor);
// the snapshot given is left as it was, for another attempt.
func TestAdmitBoundsEventTimeByProcessingTime(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 2))
	skews := []time.Duration{time.Nanosecond, time.Microsecond, time.Second, time.Minute, time.Hour, 36 * time.Hour, 400 * 24 * time.Hour}
	nudges := []time.Duration{-time.Hour, -time.Second, -time.Microsecond, -time.Nanosecond, 0, time.Nanosecond, time.Microsecond, time.Second, time.Hour, 36 * 365 * 24 * time.Hour}
	for round := range 200 {
		skew := skews[round%len(skews)]
		if round >= len(skews) {
			skew = time.Duration(1 + rng.Int64N(int64(48*time.Hour)))
		}
		now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC).Add(time.Duration(rng.Int64N(int64(365 * 24 * time.Hour))))
		parts := 1 + rng.IntN(4)
		s := &snapshot{}
		floors := map[int32]time.Time{}
		for p := range int32(parts) {
			floor := time.Time{}
			if rng.IntN(2) == 0 {
				floor = now.Add(-time.Duration(rng.Int64N(int64(24 * time.Hour))))
			}
			floors[p] = floor
			s.cuts = append(s.cuts, txsink.PartitionCut{Partition: p, Epoch: 1, NextOffset: 100, Watermark: floor})
		}
		n := rng.IntN(40)
		for i := range n {
			d := skew + nudges[rng.IntN(len(nudges))]
			if rng.IntN(3) == 0 {
				d = time.Duration(rng.Int64N(int64(2*skew+2))) - skew // anywhere around
			}
			p := int32(rng.IntN(parts))
			id := fmt.Sprintf("r%d-%d", round, i)
			s.records = append(s.records, record{ev: event.Event{EventID: id, AccountID: "a", Currency: "EUR", AmountMinor: 1, OccurredAt: now.Add(d)},
				partition: p, offset: int64(i), key: []byte("a"), value: []byte(id)})
		}
		before := slices.Clone(s.records)
		beforeCuts := slices.Clone(s.cuts)
		got := admit(s, now, skew, 64)

		bound := now.Add(skew)
		var wantKept []string
		wantWM := map[int32]time.Time{}
		future := map[string]bool{}
		for _, r := range before {
			if r.ev.OccurredAt.After(bound) {
				future[r.ev.EventID] = true
				continue
			}
			wantKept = append(wantKept, r.ev.EventID)
			wantWM[r.partition] = laterOf(wantWM[r.partition], r.ev.OccurredAt)
		}
		var kept []string
		for _, r := range got.records {
			kept = append(kept, r.ev.EventID)
		}
		if !slices.Equal(kept, wantKept) {
			t.Fatalf("round %d (skew %v): kept %v, want %v", round, skew, kept, wantKept)
		}
		if len(got.dead) != len(future) {
			t.Fatalf("round %d (skew %v): %d dead letters, want %d", round, skew, len(got.dead), len(future))
		}
		for _, d := range got.dead {
			if d.Reason != string(event.ReasonEventTimeInFuture) || !future[d.EventID] || string(d.Payload) != d.EventID || d.Detail == "" {
				t.Fatalf("round %d: dead letter %+v", round, d)
			}
		}
		for _, c := range got.cuts {
			if c.Watermark.After(bound) {
				t.Fatalf("round %d: partition %d's watermark %v is past now + skew %v", round, c.Partition, c.Watermark, bound)
			}
			if want := laterOf(floors[c.Partition], wantWM[c.Partition]); !c.Watermark.Equal(want) {
				t.Fatalf("round %d: partition %d's watermark %v, want %v", round, c.Partition, c.Watermark, want)
			}
		}
		if !slices.EqualFunc(s.records, before, func(a, b record) bool { return a.ev.EventID == b.ev.EventID }) || !slices.Equal(s.cuts, beforeCuts) || len(s.dead) != 0 {
			t.Fatalf("round %d: admit changed the snapshot it was given", round)
		}
	}
}

// The repro, planned: Berlin months that close 48 hours after
// their end, November's events and one dated 36 years later on the same
// partition. Admitted, the stray event would raise the frontier past
// November (closing it, and every month until 2062); refused, November
// stays open and its events count in it.
func TestFutureEventDoesNotCloseThePlan(t *testing.T) {
	month, err := event.Calendar("month", "Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	now := ts("2026-12-01T09:00:00Z")
	s := &snapshot{cuts: []txsink.PartitionCut{{Partition: 0, Epoch: 1, NextOffset: 102, CaughtUp: true}}}
	for i := range 100 {
		s.records = append(s.records, evAt(0, int64(i), "2026-11-29T12:00:00Z"))
	}
	s.records = append(s.records, evAt(0, 100, "2062-11-29T12:00:00Z"), evAt(0, 101, "2026-11-29T13:00:00Z"))
	plan := func(s *snapshot) eventTimePlan {
		return planEventTime(month, 48*time.Hour, txsink.EventTime{}, s.records, s.cuts)
	}
	if p := plan(s); !p.raise.After(ts("2062-01-01T00:00:00Z")) {
		t.Fatalf("without the bound the stray event raises the frontier to %v only: the repro does not reproduce", p.raise)
	}
	got := admit(s, now, time.Hour, 64)
	p := plan(got)
	if november := ts("2026-10-31T23:00:00Z"); p.raise.After(november) {
		t.Fatalf("the frontier rises to %v: November (from %v) is closed", p.raise, november)
	}
	for _, r := range got.records {
		if r.late {
			t.Fatalf("event at %v counted as late", r.ev.OccurredAt)
		}
	}
	if len(got.records) != 101 || len(got.dead) != 1 || got.dead[0].Offset != 100 {
		t.Fatalf("%d records and dead letters %+v, want 101 and the one at offset 100", len(got.records), got.dead)
	}
}

// frontier reads window_frontier.closed_before (zero: none).
func frontier(t *testing.T, db *sqlx.DB) time.Time {
	t.Helper()
	var f []sql.NullTime
	if err := db.Select(&f, `SELECT closed_before FROM window_frontier`); err != nil {
		t.Fatal(err)
	}
	if len(f) == 0 {
		return time.Time{}
	}
	return f[0].Time
}

// storedWatermark is the latest watermark stored for the topic.
func storedWatermark(t *testing.T, e *env) time.Time {
	t.Helper()
	var wm sql.NullTime
	if err := e.db.Get(&wm, `SELECT MAX(watermark) FROM partition_offsets WHERE kafka_topic = ?`, e.topic); err != nil {
		t.Fatal(err)
	}
	return wm.Time
}

// The repro against the service: Berlin months that close 48
// hours after their end, 100 events of 29 November 2026 and one mistyped
// as 2062. The stray event is an event_time_in_future dead letter; it moves
// neither the watermark nor the frontier, so November is not sealed and
// its later events count in it, not in adjustments; corrected and sent
// again, it counts, once (a dead letter is not remembered as seen).
func TestMistypedYearDoesNotSealTheMonth(t *testing.T) {
	e := newEnv(t, 1)
	month, err := event.Calendar("month", "Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	start(t, e, func(c *Config, _ *sinkConfig) {
		c.Window, c.WindowCloseAfter, c.LedgerEntries = month, 48*time.Hour, true
	})
	var recs []*kgo.Record
	for i := range 100 {
		recs = append(recs, ev{fmt.Sprintf("nov-%d", i), fmt.Sprintf("acct-%d", i%7), 10, "EUR", "2026-11-29T12:00:00+01:00"}.record(""))
	}
	recs = append(recs, ev{"typo", "acct-0", 10, "EUR", "2062-11-29T12:00:00+01:00"}.record(""))
	produce(t, e, recs...)
	waitCounted(t, e.db, 100, 1)
	var dl []struct {
		ID     string `db:"event_id"`
		Reason string `db:"reason"`
	}
	if err := e.db.Select(&dl, `SELECT event_id, reason FROM dead_letters`); err != nil || len(dl) != 1 || dl[0].ID != "typo" || dl[0].Reason != "event_time_in_future" {
		t.Fatalf("dead letters %+v (%v), want the 2062 event as event_time_in_future", dl, err)
	}
	november := ts("2026-10-31T23:00:00Z")
	if wm := storedWatermark(t, e); !wm.Equal(ts("2026-11-29T11:00:00Z")) {
		t.Fatalf("stored watermark %v, want 29 November's", wm)
	}
	if f := frontier(t, e.db); f.After(november) {
		t.Fatalf("closed_before %v: November (from %v) closed", f, november)
	}
	produce(t, e,
		ev{"nov-late", "acct-1", 5, "EUR", "2026-11-30T23:30:00+01:00"}.record(""),
		ev{"typo", "acct-0", 10, "EUR", "2026-11-29T12:00:00+01:00"}.record(""), // corrected
	)
	waitCounted(t, e.db, 102, 1)
	time.Sleep(300 * time.Millisecond) // ticks: nothing closes
	if n := sealedCount(t, e.db); n != 0 {
		t.Fatalf("%d rows sealed", n)
	}
	if a := windowRows(t, e.db, "window_adjustments"); len(a) != 0 {
		t.Fatalf("adjustments %v: November's events went late", a)
	}
	win := windowRows(t, e.db, "billing_windows")
	if w := win["acct-0/EUR@2026-10-31T23:00:00Z"]; w.Count != 16 || w.Amount != 160 {
		t.Fatalf("acct-0's November: %+v, want its 15 events and the corrected one", w)
	}
	checkSplit(t, e.db, true)
}

// A producer whose clock runs an hour fast, with hourly windows that close
// a second after their end: its events would take the watermark an hour
// ahead and close the current hour under the honest producers' events.
// With MAX_EVENT_TIME_SKEW below its error they are dead letters, and the
// honest events count in their open window.
func TestFastProducerClockCannotCloseTheHour(t *testing.T) {
	e := newEnv(t, 2)
	start(t, e, func(c *Config, _ *sinkConfig) { c.WindowCloseAfter, c.MaxEventTimeSkew = time.Second, 30*time.Minute })
	honest := func(prefix string) []*kgo.Record {
		var recs []*kgo.Record
		for i := range 10 {
			recs = append(recs, ev{fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("acct-%d", i), 1, "EUR", time.Now().UTC().Format(time.RFC3339Nano)}.record(""))
		}
		return recs
	}
	produce(t, e, honest("h1")...)
	waitCounted(t, e.db, 10, 0)
	var fast []*kgo.Record
	for i := range 10 {
		fast = append(fast, ev{fmt.Sprintf("fast-%d", i), fmt.Sprintf("acct-%d", i), 1, "EUR", time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)}.record(""))
	}
	produce(t, e, fast...)
	produce(t, e, honest("h2")...)
	waitCounted(t, e.db, 20, 10)
	time.Sleep(300 * time.Millisecond)
	if reasons := deadReasons(t, e.db); reasons["event_time_in_future"] != 10 {
		t.Fatalf("dead letters %v, want the fast producer's 10 as event_time_in_future", reasons)
	}
	if a := windowRows(t, e.db, "window_adjustments"); len(a) != 0 {
		t.Fatalf("adjustments %v: the honest events went late", a)
	}
	if f := frontier(t, e.db); f.After(event.Window(time.Now(), time.Hour)) {
		t.Fatalf("closed_before %v is past the current hour", f)
	}
	if wm := storedWatermark(t, e); wm.After(time.Now().Add(time.Minute)) {
		t.Fatalf("stored watermark %v is ahead of now", wm)
	}
	checkSplit(t, e.db, false)
}

// The boundary, against the service: events just inside the bound count
// and set the watermark, events just outside are dead letters, for
// offsets generated on both sides (the exact boundary is
// TestAdmitBoundsEventTimeByProcessingTime's: here processing lags the
// produce by a moment, so the offsets keep 30 s from the limit).
func TestEventTimeAroundTheBound(t *testing.T) {
	const skew = 10 * time.Minute
	e := newEnv(t, 3)
	start(t, e, func(c *Config, _ *sinkConfig) { c.MaxEventTimeSkew = skew })
	rng := rand.New(rand.NewPCG(18, 5))
	var recs []*kgo.Record
	inside, outside := 0, 0
	var latest time.Time
	now := time.Now()
	for i := range 40 {
		margin := 30*time.Second + time.Duration(rng.Int64N(int64(4*time.Minute)))
		at := now.Add(skew + margin)
		if rng.IntN(2) == 0 {
			at = now.Add(skew - margin)
			inside++
			latest = laterOf(latest, at)
		} else {
			outside++
		}
		recs = append(recs, ev{fmt.Sprintf("b-%d", i), fmt.Sprintf("acct-%d", i%5), 1, "EUR", at.UTC().Format(time.RFC3339Nano)}.record(""))
	}
	produce(t, e, recs...)
	waitCounted(t, e.db, int64(inside), outside)
	if r := deadReasons(t, e.db); r["event_time_in_future"] != outside {
		t.Fatalf("dead letters %v, want %d event_time_in_future", r, outside)
	}
	if wm := storedWatermark(t, e); !wm.Equal(latest.UTC().Truncate(time.Microsecond)) {
		t.Fatalf("stored watermark %v, want the latest admitted occurred_at %v", wm, latest)
	}
}
