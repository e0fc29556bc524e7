package memdriver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// The control tables. Every method runs under the cluster's lock: one
// local transaction each, serialisable.

// Identity returns the ledger identity, creating it once.
func (s *Server) Identity(ctx context.Context, new func() (string, []byte)) (string, []byte, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.identity == nil {
		id, secret := new()
		c.identity = &identity{id: id, secret: slices.Clone(secret)}
	}
	return c.identity.id, slices.Clone(c.identity.secret), nil
}

// Decide inserts d unless a decision exists and returns the one that holds.
func (s *Server) Decide(ctx context.Context, d driver.Decision) (driver.Outcome, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if code, ok := c.faultLocked("decide"); ok {
		return "", coded(code, "injected decide failure")
	}
	if old, ok := c.decisions[d.Gtrid]; ok {
		return old.Outcome, nil
	}
	c.decisions[d.Gtrid] = d
	return d.Outcome, nil
}

// Lookup returns the decision for gtrid.
func (s *Server) Lookup(ctx context.Context, gtrid string) (driver.Outcome, bool, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	d, ok := s.c.decisions[gtrid]
	return d.Outcome, ok, nil
}

// Commit is the commit point (driver.Control.Commit). An injected
// Transient fault on "commit" applies it and then reports the outcome
// ambiguous, as a connection lost during COMMIT may; any other code fails
// it before anything is written.
func (s *Server) Commit(ctx context.Context, d driver.Decision, scope driver.Scope, cuts []driver.Cut, fence func([]driver.Stored) error, f *driver.FrontierChange, keys *driver.Generation, layout func(driver.MoveCursor) error, applied bool) (int64, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	code, faulty := c.faultLocked("commit")
	if faulty && code != driver.Transient {
		return 0, coded(code, "injected commit failure")
	}
	rows := c.partitions[scope]
	var stored []driver.Stored
	for _, cut := range cuts {
		if r, ok := rows[cut.Partition]; ok {
			stored = append(stored, r)
		}
	}
	if err := fence(stored); err != nil {
		return 0, err
	}
	if f != nil && f.Check != nil {
		if err := f.Check(c.frontier); err != nil {
			return 0, err
		}
	}
	if keys != nil && *keys != c.gens.Current {
		return 0, fmt.Errorf("%w (claimed under %d, now %d)", driver.ErrKeysMoved, *keys, c.gens.Current)
	}
	if layout != nil {
		if err := layout(c.cursor); err != nil {
			return 0, err
		}
	}
	if _, ok := c.decisions[d.Gtrid]; ok {
		return 0, driver.ErrDecided
	}
	if c.changelog.on && !d.Changelog {
		return 0, driver.ErrChangelogOn
	}
	for _, cut := range cuts {
		r := rows[cut.Partition]
		r.NextOffset = cut.NextOffset
		if cut.Watermark.After(r.Watermark) {
			r.Watermark = cut.Watermark
		}
		r.CaughtUp = cut.CaughtUp
		rows[cut.Partition] = r
		c.touchLocked(scope, cut.Partition, d.At)
	}
	if f != nil {
		if f.Raise.Closed.After(c.frontier.Closed) {
			c.frontier.Closed = f.Raise.Closed
		}
		if f.Raise.Sealed.After(c.frontier.Sealed) {
			c.frontier.Sealed = f.Raise.Sealed
		}
	}
	c.decisions[d.Gtrid] = d
	c.lastSeq++
	rec := commitRecord{seq: c.lastSeq, gtrid: d.Gtrid, at: c.opts.Now().UTC(), applied: applied}
	if f != nil {
		rec.sealed = c.frontier.Sealed
	}
	c.commits = append(c.commits, rec)
	if faulty {
		return 0, errors.Join(driver.ErrAmbiguous, coded(code, "injected loss of the COMMIT's answer"))
	}
	return rec.seq, nil
}

// MarkApplied marks the commit log records of gtrids applied.
func (s *Server) MarkApplied(ctx context.Context, gtrids []string) (int64, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if code, ok := c.faultLocked("applied"); ok {
		return 0, coded(code, "injected failure to mark applied")
	}
	want := map[string]bool{}
	for _, g := range gtrids {
		want[g] = true
	}
	var n int64
	for i := range c.commits {
		if r := &c.commits[i]; want[r.gtrid] && !r.applied {
			r.applied = true
			n++
		}
	}
	return n, nil
}

// Commits lists commit log records from sequence number from on.
func (s *Server) Commits(ctx context.Context, from int64, unapplied bool, limit int) ([]driver.CommitRecord, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Now().UTC()
	var out []driver.CommitRecord
	for _, r := range c.commits {
		if len(out) >= limit {
			break
		}
		if r.seq < from || unapplied && r.applied {
			continue
		}
		out = append(out, driver.CommitRecord{Seq: r.seq, Gtrid: r.gtrid, CommittedAt: r.at, Age: now.Sub(r.at), Applied: r.applied, SealedBefore: r.sealed})
	}
	return out, nil
}

// CommitPosition reads the commit log's position.
func (s *Server) CommitPosition(ctx context.Context) (driver.CommitPosition, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	p := driver.CommitPosition{Visible: c.lastSeq, Decided: c.lastSeq, RetainedFrom: c.lastSeq + 1}
	if len(c.commits) > 0 {
		p.RetainedFrom = c.commits[0].seq
	}
	for _, r := range c.commits {
		if !r.applied {
			p.Visible = r.seq - 1
			break
		}
	}
	for _, r := range c.commits {
		if r.seq == p.Visible {
			p.SealedBefore = r.sealed
		}
	}
	return p, nil
}

// ForgetCommits deletes the commit log records numbered through and below.
func (s *Server) ForgetCommits(ctx context.Context, through int64) (int64, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	i := 0
	for i < len(c.commits) && c.commits[i].seq <= through {
		i++
	}
	c.commits = slices.Delete(c.commits, 0, i)
	return int64(i), nil
}

// EventTime reads the frontier and the scope's partition rows.
func (s *Server) EventTime(ctx context.Context, scope driver.Scope) (driver.Frontier, []driver.Stored, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []driver.Stored
	for _, r := range c.partitions[scope] {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b driver.Stored) int { return cmp.Compare(a.Partition, b.Partition) })
	return c.frontier, out, nil
}

// Claim raises the partitions' epochs and records owner.
func (s *Server) Claim(ctx context.Context, scope driver.Scope, owner string, partitions []int32, at time.Time) (map[int32]driver.Stored, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	rows := c.partitions[scope]
	if rows == nil {
		rows = map[int32]driver.Stored{}
		c.partitions[scope] = rows
	}
	out := make(map[int32]driver.Stored, len(partitions))
	for _, p := range partitions {
		r, ok := rows[p]
		if !ok {
			r = driver.Stored{Partition: p, NextOffset: driver.StartOffset}
		}
		r.Epoch++
		r.Owner = owner
		rows[p] = r
		c.touchLocked(scope, p, at)
		out[p] = r
	}
	return out, nil
}

// Positions reads the partitions' rows.
func (s *Server) Positions(ctx context.Context, scope driver.Scope, partitions []int32) (map[int32]driver.Stored, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[int32]driver.Stored, len(partitions))
	for _, p := range partitions {
		if r, ok := c.partitions[scope][p]; ok {
			out[p] = r
		}
	}
	return out, nil
}

// Groups lists the groups with positions for topic.
func (s *Server) Groups(ctx context.Context, topic string) ([]string, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for sc, rows := range c.partitions {
		if sc.Topic == topic && len(rows) > 0 {
			out = append(out, sc.Group)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Decided lists up to limit gtrids decided before, oldest first.
func (s *Server) Decided(ctx context.Context, before time.Time, limit int) ([]string, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var ds []driver.Decision
	for _, d := range c.decisions {
		if d.At.Before(before) {
			ds = append(ds, d)
		}
	}
	slices.SortFunc(ds, func(a, b driver.Decision) int { return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.Gtrid, b.Gtrid)) })
	var out []string
	for _, d := range ds[:min(limit, len(ds))] {
		out = append(out, d.Gtrid)
	}
	return out, nil
}

// Forget deletes decisions.
func (s *Server) Forget(ctx context.Context, gtrids []string) (int64, error) {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, g := range gtrids {
		if _, ok := c.decisions[g]; ok {
			delete(c.decisions, g)
			n++
		}
	}
	return n, nil
}

func asCoded(err error, target **driver.CodedError) bool { return errors.As(err, target) }

// MoveCursor reads the live move's cursor (driver.Control.MoveCursor).
func (s *Server) MoveCursor(ctx context.Context) (driver.MoveCursor, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if code, faulty := s.c.faultLocked("cursor"); faulty {
		return driver.MoveCursor{}, coded(code, "injected cursor failure")
	}
	return s.c.cursor, nil
}

// AwaitStep records that instance waits for the step cur announces
// (driver.Control.AwaitStep); StepWaiters reads it.
func (s *Server) AwaitStep(ctx context.Context, instance string, cur driver.MoveCursor) error {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if code, faulty := s.c.faultLocked("cursor"); faulty {
		return coded(code, "injected cursor failure")
	}
	if s.c.waits == nil {
		s.c.waits = map[string]driver.MoveCursor{}
	}
	s.c.waits[instance] = cur
	return nil
}

// StepWaiters lists the instances that said they wait for the step cur
// announces (AwaitStep), those that stopped among them, sorted.
func (s *Server) StepWaiters(cur driver.MoveCursor) []string {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	var out []string
	for inst, c := range s.c.waits {
		if c.AnnouncedBelow == "" || c.Version == cur.Version && c.MovedBelow == cur.MovedBelow && c.AnnouncedBelow == cur.AnnouncedBelow {
			out = append(out, inst)
		}
	}
	slices.Sort(out)
	return out
}

// ChangeMoveCursor changes the live move's cursor from was to next, as the
// mover's steps do on a control server (mysqldriver.ChangeMoveCursor), and
// returns the commit log's last number; tests move a layout with it. Like
// a decision, it holds the cluster's lock: it waits for a decision that
// is checking the cursor.
func (s *Server) ChangeMoveCursor(_ context.Context, was, next driver.MoveCursor) (int64, error) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	if s.c.cursor != was {
		return 0, fmt.Errorf("%w: it is %+v", driver.ErrMoveCursorMoved, s.c.cursor)
	}
	s.c.cursor = next
	return s.c.lastSeq, nil
}
