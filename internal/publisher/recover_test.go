package publisher

import (
	"testing"

	"github.com/billing/ledger/internal/txsink/driver"
)

// How far the last checkpoint Kafka holds events of is published: in
// whole when its outbox rows are gone or Kafka holds all their events;
// else the fewest first rows whose events are the events Kafka holds (a
// row of no event is published again, publishing nothing); refused when
// no first rows add up to them.
func TestRebuiltProgress(t *testing.T) {
	from := Progress{Seq: 4, From: 1, Ledger: "L", Prefix: "cl"}
	last := lastEvent{Seq: 7, Gtrid: "g7"}
	rows := func(events ...int) []driver.OutboxChunk {
		var out []driver.OutboxChunk
		for i, e := range events {
			out = append(out, driver.OutboxChunk{Checkpoint: "g7", Chunk: i, Events: e})
		}
		return out
	}
	whole := Progress{Seq: 7, From: 1, Ledger: "L", Prefix: "cl", Checkpoint: "g7"}
	part := func(n int) Progress { p := whole; p.Seq, p.Parts = 6, n; return p }
	for _, c := range []struct {
		name   string
		rows   []driver.OutboxChunk
		events int64
		want   Progress
		fails  bool
	}{
		{"rows deleted: published in whole", nil, 3, whole, false},
		{"every event of every row", rows(3, 2, 4), 9, whole, false},
		{"the first row", rows(3, 2, 4), 3, part(1), false},
		{"the first two rows", rows(3, 2, 4), 5, part(2), false},
		{"a row of no event after the published ones is published again", rows(3, 0, 4), 3, part(1), false},
		{"events of no first rows", rows(3, 2, 4), 4, from, true},
		{"more events than the rows", rows(3, 2, 4), 10, from, true},
	} {
		got, err := rebuilt(from, last, c.rows, c.events)
		if (err != nil) != c.fails || got != c.want {
			t.Errorf("%s: %+v %v, want %+v (fails %v)", c.name, got, err, c.want, c.fails)
		}
	}
}
