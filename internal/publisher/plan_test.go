package publisher

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/billing/ledger/internal/txsink/driver"
)

// Where a publisher resumes: from Kafka's progress when there is one of
// this enabling, from the enabling otherwise (with the snapshot first on a
// ledger that held rows); never behind MySQL's hint (the rows below it are
// deleted: a gap), never on another ledger's topic.
func TestResume(t *testing.T) {
	st := driver.ChangelogState{On: true, Prefix: "cl", From: 5, Published: 4}
	snap := st
	snap.Snapshot = true
	for _, c := range []struct {
		name  string
		kafka *Progress
		st    driver.ChangelogState
		want  Progress
		err   error
	}{
		{"nothing published yet: just before the enabling", nil, st, Progress{Seq: 4, From: 5, Ledger: "L", Prefix: "cl"}, nil},
		{"Kafka ahead of the hint (a crash before the bookkeeping): Kafka", &Progress{Seq: 9, Parts: 2, From: 5, Ledger: "L", Prefix: "cl"}, st,
			Progress{Seq: 9, Parts: 2, From: 5, Ledger: "L", Prefix: "cl"}, nil},
		{"the hint ahead of Kafka: the progress was lost", &Progress{Seq: 3, From: 5, Ledger: "L", Prefix: "cl"}, st, Progress{}, ErrProgressLost},
		{"no progress record but a hint beyond the enabling", nil, driver.ChangelogState{On: true, Prefix: "cl", From: 5, Published: 7}, Progress{}, ErrProgressLost},
		{"rows before the enabling: the snapshot first", nil, snap,
			Progress{Seq: 4, From: 5, Ledger: "L", Prefix: "cl", Snapshot: &SnapshotPos{Table: "account_balances"}}, nil},
		{"a snapshot under way: where Kafka says", &Progress{Seq: 4, From: 5, Ledger: "L", Prefix: "cl",
			Snapshot: &SnapshotPos{Server: 1, Table: "billing_windows", After: &RowKey{Account: "a", Currency: "EUR"}}}, snap,
			Progress{Seq: 4, From: 5, Ledger: "L", Prefix: "cl", Snapshot: &SnapshotPos{Server: 1, Table: "billing_windows",
				After: &RowKey{Account: "a", Currency: "EUR"}}}, nil},
		{"the snapshot published: the changes", &Progress{Seq: 4, From: 5, Ledger: "L", Prefix: "cl"}, snap,
			Progress{Seq: 4, From: 5, Ledger: "L", Prefix: "cl"}, nil},
		{"a record of an earlier enabling: from this one", &Progress{Seq: 2, From: 1, Ledger: "L", Prefix: "cl"}, snap,
			Progress{Seq: 4, From: 5, Ledger: "L", Prefix: "cl", Snapshot: &SnapshotPos{Table: "account_balances"}}, nil},
	} {
		got, err := resume(c.kafka, c.st, "L")
		if c.err != nil && !errors.Is(err, c.err) || c.err == nil && (err != nil || !reflect.DeepEqual(got, c.want)) {
			t.Errorf("%s: %+v, %v; want %+v, %v", c.name, got, err, c.want, c.err)
		}
	}
	if _, err := resume(&Progress{Seq: 9, Ledger: "other", Prefix: "cl"}, st, "L"); err == nil {
		t.Error("another ledger's progress was followed")
	}
	if _, err := resume(&Progress{Seq: 9, From: 7, Ledger: "L", Prefix: "cl"}, st, "L"); err == nil {
		t.Error("a progress record of a later enabling than the ledger's was followed")
	}
}

func checkpoints(events ...[]int) []pending {
	out := make([]pending, len(events))
	for i, ev := range events {
		out[i] = pending{Seq: int64(i + 1), Gtrid: fmt.Sprintf("g%d", i+1)}
		for j, n := range ev {
			out[i].Chunks = append(out[i].Chunks, chunkRef{OutboxChunk: driver.OutboxChunk{Checkpoint: out[i].Gtrid, Chunk: j, Events: n}})
		}
	}
	return out
}

// What the next transaction publishes: whole checkpoints in commit order
// up to the bound; a checkpoint larger than the bound alone in parts, at
// least one row each, resumed at the part Kafka holds; only whole
// checkpoints deletable.
func TestPlanTxn(t *testing.T) {
	type span struct {
		seq      int64
		from, to int
	}
	for _, c := range []struct {
		name    string
		pos     Progress
		cps     []pending
		max     int
		want    []span
		next    Progress
		deletes []string
		nEvents int
	}{
		{"whole checkpoints up to the bound", Progress{}, checkpoints([]int{3}, []int{4, 2}, []int{5}), 10,
			[]span{{1, 0, 1}, {2, 0, 2}}, Progress{Seq: 2, Checkpoint: "g2"}, []string{"g1", "g2"}, 9},
		{"checkpoints without changes go along", Progress{}, checkpoints(nil, []int{10}, nil), 10,
			[]span{{1, 0, 0}, {2, 0, 1}, {3, 0, 0}}, Progress{Seq: 3, Checkpoint: "g3"}, []string{"g1", "g2", "g3"}, 10},
		{"a checkpoint too large alone is split", Progress{}, checkpoints([]int{4, 4, 4}), 9,
			[]span{{1, 0, 2}}, Progress{Seq: 0, Parts: 2, Checkpoint: "g1"}, nil, 8},
		{"its last part completes it", Progress{Seq: 0, Parts: 2}, checkpoints([]int{4, 4, 4}, []int{1}), 9,
			[]span{{1, 2, 3}, {2, 0, 1}}, Progress{Seq: 2, Checkpoint: "g2"}, []string{"g1", "g2"}, 5},
		{"one row above the bound still goes, alone", Progress{}, checkpoints([]int{50}, []int{1}), 9,
			[]span{{1, 0, 1}}, Progress{Seq: 1, Checkpoint: "g1"}, []string{"g1"}, 50},
		{"a large one waits for its own transaction", Progress{}, checkpoints([]int{2}, []int{4, 4, 4}), 9,
			[]span{{1, 0, 1}}, Progress{Seq: 1, Checkpoint: "g1"}, []string{"g1"}, 2},
		{"nothing pending", Progress{Seq: 3}, nil, 9, nil, Progress{Seq: 3}, nil, 0},
	} {
		tp := planTxn(c.pos, c.cps, c.max)
		var got []span
		for _, p := range tp.Parts {
			got = append(got, span{p.Checkpoint.Seq, p.From, p.To})
		}
		if !slices.Equal(got, c.want) || tp.Next != c.next || !slices.Equal(deletable(tp), c.deletes) || tp.Events != c.nEvents {
			t.Errorf("%s: parts %v next %+v deletes %v events %d; want %v %+v %v %d", c.name, got, tp.Next, deletable(tp), tp.Events,
				c.want, c.next, c.deletes, c.nEvents)
		}
	}
}

func TestProgressRecord(t *testing.T) {
	p := Progress{Seq: 1 << 40, Parts: 3, Ledger: "L", Prefix: "cl", Checkpoint: "g"}
	got, err := decodeProgress(encodeProgress(p))
	if err != nil || got != p {
		t.Errorf("%+v, %v", got, err)
	}
	if _, err := decodeProgress([]byte("{")); err == nil {
		t.Error("a damaged progress record decoded")
	}
}

func TestHoldReason(t *testing.T) {
	if holdReason(9, 10) != "" || holdReason(10, 10) == "" {
		t.Error("the hold starts elsewhere than at the bound")
	}
}
