package memdriver

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"slices"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The operator's statements on dead_letters (driver/letters.go), each a
// statement of its own on the committed rows. The checkpoints never change
// a stored letter (a replay keeps it as it is), so the re-injection
// columns are the operator's alone: they are kept beside the rows, by id.

// reinjection is a dead letter's re-injection columns.
type reinjection struct {
	at        sql.NullTime
	by        sql.NullString
	forced    sql.NullBool
	partition sql.NullInt32
	offset    sql.NullInt64
	sha256    []byte
}

// Letters is the server's dead_letters as the operator's tools read and
// update it: mysqldriver.Letters' methods.
func (s *Server) Letters() Letters { return Letters{s.c} }

// Letters is dead_letters on a server of the cluster.
type Letters struct{ c *Cluster }

// recordLocked is the stored row r with its re-injection columns, whole or
// (summary) without its key and payload.
func (c *Cluster) recordLocked(r driver.DeadLetterRow, summary bool) driver.DeadLetterRecord {
	d := driver.DeadLetterRecord{ID: r.ID, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Reason: r.Reason, Detail: r.Detail,
		PayloadSize: int64(r.Size), PayloadSHA: bytes.Clone(r.SHA256[:]), Checkpoint: r.Checkpoint, CreatedAt: r.CreatedAt}
	if r.EventID != "" {
		d.EventID = []byte(r.EventID)
	}
	if !summary {
		d.Key, d.Payload = bytes.Clone(r.Key), bytes.Clone(r.Payload)
		if d.Payload == nil {
			d.Payload = []byte{}
		}
	}
	x := c.reinjected[r.ID]
	d.ReinjectedAt, d.ReinjectedBy, d.ReinjectedForced = x.at, x.by, x.forced
	d.ReinjectedPartition, d.ReinjectedOffset, d.ReinjectedSHA256 = x.partition, x.offset, bytes.Clone(x.sha256)
	return d
}

// letterLocked finds the committed dead letter of id.
func (c *Cluster) letterLocked(id int64) (driver.DeadLetterRow, bool) {
	for _, r := range c.rows[tDeadLetters] {
		if l := r.(driver.DeadLetterRow); l.ID == id {
			return l, true
		}
	}
	return driver.DeadLetterRow{}, false
}

// List returns the dead letters, newest first (by created_at, then id),
// without their payloads and keys.
func (l Letters) List(ctx context.Context, f driver.LetterFilter) ([]driver.DeadLetterRecord, error) {
	c := l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []driver.DeadLetterRecord
	for _, r := range c.rows[tDeadLetters] {
		d := c.recordLocked(r.(driver.DeadLetterRow), true)
		if (f.Reason == "" || d.Reason == f.Reason) && (!f.Pending || !d.ReinjectedAt.Valid) {
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b driver.DeadLetterRecord) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), cmp.Compare(b.ID, a.ID))
	})
	return out[:min(len(out), max(f.Limit, 0))], nil
}

// Get reads one dead letter by its id (driver.ErrNoDeadLetter when there
// is none).
func (l Letters) Get(ctx context.Context, id int64) (*driver.DeadLetterRecord, error) {
	c := l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.letterLocked(id)
	if !ok {
		return nil, driver.ErrNoDeadLetter
	}
	d := c.recordLocked(r, false)
	return &d, nil
}

// Mark records the re-injection about to happen if the row's re-injection
// columns are still as r holds them (reinjected_at alone decides, as
// mysqldriver's WHERE), and reports whether it did.
func (l Letters) Mark(ctx context.Context, r *driver.DeadLetterRecord, a driver.LetterAudit) (bool, error) {
	c := l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.letterLocked(r.ID); !ok || !sameMark(c.reinjected[r.ID].at, r.ReinjectedAt) {
		return false, nil
	}
	c.reinjected[r.ID] = reinjection{at: sql.NullTime{Time: datetime(a.At), Valid: true}, by: sql.NullString{String: a.By, Valid: true},
		forced: sql.NullBool{Bool: a.Forced, Valid: true}, sha256: binary32(a.SHA256)}
	return true, nil
}

// sameMark: a stored reinjected_at equals the one read (both NULL, or the
// same instant).
func sameMark(stored, read sql.NullTime) bool {
	if !read.Valid {
		return !stored.Valid
	}
	return stored.Valid && stored.Time.Equal(datetime(read.Time))
}

// Restore puts the columns back as r holds them if the row still holds the
// mark made at at.
func (l Letters) Restore(ctx context.Context, r *driver.DeadLetterRecord, at time.Time) error {
	c := l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.letterLocked(r.ID); !ok || !sameMark(c.reinjected[r.ID].at, sql.NullTime{Time: at, Valid: true}) {
		return nil
	}
	x := reinjection{at: r.ReinjectedAt, by: r.ReinjectedBy, forced: r.ReinjectedForced, partition: r.ReinjectedPartition,
		offset: r.ReinjectedOffset, sha256: binary32(r.ReinjectedSHA256)}
	if x.at.Valid {
		x.at.Time = datetime(x.at.Time)
	}
	c.reinjected[r.ID] = x
	return nil
}

// Landed records where the record was produced, if the row still holds
// the mark made at at.
func (l Letters) Landed(ctx context.Context, id int64, at time.Time, partition int32, offset int64) error {
	c := l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	x := c.reinjected[id]
	if _, ok := c.letterLocked(id); !ok || !sameMark(x.at, sql.NullTime{Time: at, Valid: true}) {
		return nil
	}
	x.partition, x.offset = sql.NullInt32{Int32: partition, Valid: true}, sql.NullInt64{Int64: offset, Valid: true}
	c.reinjected[id] = x
	return nil
}

// Waiting counts the dead letters of topic not re-injected, by reason in
// reason order; with partitions non-nil, of those partitions only.
func (l Letters) Waiting(ctx context.Context, topic string, partitions []int32) ([]driver.LettersWaiting, error) {
	c := l.c
	c.mu.Lock()
	defer c.mu.Unlock()
	by := map[string]*driver.LettersWaiting{}
	for _, r := range c.rows[tDeadLetters] {
		d := r.(driver.DeadLetterRow)
		if d.Topic != topic || c.reinjected[d.ID].at.Valid || (partitions != nil && !slices.Contains(partitions, d.Partition)) {
			continue
		}
		w := by[d.Reason]
		if w == nil {
			w = &driver.LettersWaiting{Reason: d.Reason, Oldest: d.CreatedAt}
			by[d.Reason] = w
		}
		w.Count++
		if d.CreatedAt.Before(w.Oldest) {
			w.Oldest = d.CreatedAt
		}
	}
	var out []driver.LettersWaiting
	for _, w := range by {
		out = append(out, *w)
	}
	slices.SortFunc(out, func(a, b driver.LettersWaiting) int { return cmp.Compare(a.Reason, b.Reason) })
	return out, nil
}

// binary32 is b as a BINARY(32) column keeps it: padded with zero bytes
// (NULL stays NULL).
func binary32(b []byte) []byte {
	if b == nil {
		return nil
	}
	out := make([]byte, max(len(b), 32))
	copy(out, b)
	return out
}

// SeedDeadLetter stores a committed dead letter of topic as it is (no
// column is cut), created at created by checkpoint, and returns its id:
// the tests of the operator's tools set up rows a checkpoint could not
// write (a payload cut shorter than its size says, another topic).
func (c *Cluster) SeedDeadLetter(topic, checkpoint string, d driver.DeadLetter, created time.Time) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.autoInc[tDeadLetters]++
	r := driver.DeadLetterRow{ID: c.autoInc[tDeadLetters], Topic: topic, DeadLetter: d, Checkpoint: checkpoint, CreatedAt: datetime(created)}
	c.rows[tDeadLetters][positionID(tDeadLetters, topic, d.Partition, d.Offset).key] = r
	return r.ID
}
