package publisher

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// Progress is how far the changelog is published: every checkpoint
// numbered up to Seq, and the first Parts outbox rows (in chunk order) of
// checkpoint Seq+1 (a checkpoint split across transactions); while
// Snapshot is set, the snapshot of an existing ledger up to there
// (snapshot.go), and nothing after Seq.
type Progress struct {
	Seq   int64 `json:"seq"`
	Parts int   `json:"parts"`
	// From is the enabling the record belongs to (ChangelogState.From): a
	// record of an earlier enabling is not followed.
	From     int64        `json:"from,omitempty"`
	Snapshot *SnapshotPos `json:"snapshot,omitempty"`
	// Ledger and Prefix name the changelog the record belongs to: a
	// progress topic shared by mistake is refused, not followed.
	Ledger string `json:"ledger"`
	Prefix string `json:"prefix"`
	// Checkpoint is the gtrid of the last checkpoint published (in whole
	// or in part), for people reading the topic.
	Checkpoint string `json:"checkpoint,omitempty"`
}

// ProgressKey is the key of every progress record (the topic is
// compacted: the last one is kept).
const ProgressKey = "progress"

// ErrProgressLost: MySQL's hint says more is published than Kafka's
// progress topic holds (the topic was deleted or truncated). The outbox
// rows below the hint are gone, so the publisher cannot republish them:
// it stops instead of publishing a changelog with a gap.
var ErrProgressLost = errors.New("publisher: the progress topic holds less than MySQL's published hint")

// ErrCommitLogPruned: the commit log no longer holds the records the
// publisher needs (it must not happen: pruning stops at the hint).
var ErrCommitLogPruned = errors.New("publisher: the commit log was pruned past the changelog's position")

// resume is where a publisher that found kafka (nil: no progress record)
// on the progress topic starts, given the ledger's changelog state: just
// before the enabling, with the snapshot first when the ledger held rows
// then.
func resume(kafka *Progress, st driver.ChangelogState, ledger string) (Progress, error) {
	if kafka != nil && (kafka.Ledger != ledger || kafka.Prefix != st.Prefix) {
		return Progress{}, fmt.Errorf("publisher: the progress topic belongs to ledger %q prefix %q, not %q %q", kafka.Ledger, kafka.Prefix, ledger, st.Prefix)
	}
	if kafka != nil && kafka.From > st.From {
		return Progress{}, fmt.Errorf("publisher: the progress topic is of an enabling at %d, after the ledger's at %d (its changelog state restored from an older backup?)", kafka.From, st.From)
	}
	if kafka != nil && kafka.From != 0 && kafka.From < st.From {
		kafka = nil // of an earlier enabling (the changelog was turned off and on)
	}
	if kafka == nil {
		p := Progress{Seq: st.From - 1, From: st.From, Ledger: ledger, Prefix: st.Prefix}
		if st.Published > p.Seq {
			return Progress{}, fmt.Errorf("%w: no progress record, hint %d", ErrProgressLost, st.Published)
		}
		if st.Snapshot {
			p.Snapshot = snapshotStart()
		}
		return p, nil
	}
	if st.Published > kafka.Seq {
		return Progress{}, fmt.Errorf("%w: progress %d, hint %d", ErrProgressLost, kafka.Seq, st.Published)
	}
	return *kafka, nil
}

func encodeProgress(p Progress) []byte {
	b, _ := json.Marshal(p) // strings and integers only
	return b
}

func decodeProgress(b []byte) (Progress, error) {
	var p Progress
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("publisher: progress record %q: %w", b, err)
	}
	return p, nil
}

// chunkRef is one outbox row, on its server.
type chunkRef struct {
	Server int
	driver.OutboxChunk
}

// pending is a committed checkpoint not yet published in whole, with its
// outbox rows in chunk order (server, participant, chunk).
type pending struct {
	Seq    int64
	Gtrid  string
	At     time.Time // its commit time: ts_ms of its events
	Chunks []chunkRef
}

// part is the rows [From, To) of one checkpoint that go into a
// transaction.
type part struct {
	Checkpoint *pending
	From, To   int
}

// txnPlan is one Kafka transaction: its parts, in commit order, and the
// progress once it commits.
type txnPlan struct {
	Parts  []part
	Events int
	Next   Progress
}

// planTxn plans the next transaction from pos over cps (the checkpoints
// after pos, in commit order, each with its rows): whole checkpoints, in
// order, while their events stay within maxEvents; a checkpoint larger
// than that alone is split at its rows (at least one row a transaction),
// so that any checkpoint publishes within the transaction's bounds. A plan
// without parts publishes nothing.
func planTxn(pos Progress, cps []pending, maxEvents int) txnPlan {
	t := txnPlan{Next: pos}
	for i := range cps {
		cp := &cps[i]
		from := 0
		if cp.Seq == pos.Seq+1 {
			from = min(pos.Parts, len(cp.Chunks)) // more: refused by the caller
		}
		n := 0
		for _, c := range cp.Chunks[from:] {
			n += c.Events
		}
		if t.Events+n <= maxEvents || len(t.Parts) == 0 && n == 0 {
			t.Parts = append(t.Parts, part{cp, from, len(cp.Chunks)})
			t.Events += n
			t.Next = Progress{Seq: cp.Seq, From: pos.From, Ledger: pos.Ledger, Prefix: pos.Prefix, Checkpoint: cp.Gtrid}
			continue
		}
		if len(t.Parts) > 0 {
			break
		}
		// Alone and too large: as many rows as fit, at least one.
		to := from
		for to < len(cp.Chunks) && (to == from || t.Events+cp.Chunks[to].Events <= maxEvents) {
			t.Events += cp.Chunks[to].Events
			to++
		}
		t.Parts = append(t.Parts, part{cp, from, to})
		if to == len(cp.Chunks) {
			t.Next = Progress{Seq: cp.Seq, From: pos.From, Ledger: pos.Ledger, Prefix: pos.Prefix, Checkpoint: cp.Gtrid}
		} else {
			t.Next = Progress{Seq: cp.Seq - 1, Parts: to, From: pos.From, Ledger: pos.Ledger, Prefix: pos.Prefix, Checkpoint: cp.Gtrid}
		}
		break
	}
	return t
}

// deletable are the checkpoints of the plan whose outbox rows may be
// deleted once its transaction committed: the ones published in whole.
func deletable(t txnPlan) []string {
	var out []string
	for _, p := range t.Parts {
		if p.Checkpoint.Seq <= t.Next.Seq {
			out = append(out, p.Checkpoint.Gtrid)
		}
	}
	return out
}
