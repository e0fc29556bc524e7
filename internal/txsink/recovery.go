package txsink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/billing/ledger/internal/txsink/driver"
)

// InDoubt is a prepared branch of this ledger found by XA RECOVER.
type InDoubt struct {
	Server int
	Xid    driver.Xid
	ID     GlobalID
	Qual   Qualifier
}

// RecoveryResult counts what a recovery pass did.
type RecoveryResult struct {
	Committed  int // branches rolled forward under a commit decision
	RolledBack int // branches rolled back under an abort decision
	Skipped    int // undecided branches too young to abort
	Ended      int // connections ended that held an old branch attached
	Applied    int // commit decisions marked applied (see appliedAfter)
	// Remaining lists the gtrids still in doubt after the pass. A key
	// starting with '?' stands for a server that could not be listed.
	Remaining map[string]bool
}

// maxApplyPerPass bounds the unapplied commit decisions one recovery pass
// reads (the oldest first: they hold the visible position back).
const maxApplyPerPass = 1000

// Recover resolves the ledger's prepared branches on every server by the
// decision record, following recoveryStep; a branch the server refuses to
// resolve from elsewhere may have its holding connection ended, following
// killVerdict, and is resolved by a later pass. Branches of other ledgers,
// other applications, or forged with this service's format but without the
// ledger's MAC are never touched.
//
// It then marks applied, in the commit log, the commit decisions that
// were not applied before the pass listed any server and none of whose
// branches is left in doubt on any server (appliedAfter): those its
// coordinator could not mark (it died, or its last XA COMMIT failed), this
// pass's roll-forwards among them. Recover returns the errors of the
// branches it could not resolve, after trying all of them.
func (s *Sink) Recover(ctx context.Context, minAge time.Duration) (RecoveryResult, error) {
	res := RecoveryResult{Remaining: map[string]bool{}}
	var errs []error
	// Read before any XA RECOVER: appliedAfter's argument needs every
	// branch of these checkpoints prepared before the listing.
	unapplied, uerr := s.control.Commits(ctx, 0, true, maxApplyPerPass)
	if uerr != nil {
		errs = append(errs, fmt.Errorf("read the unapplied commit decisions: %w", uerr))
	}
	decisions := map[string]driver.Outcome{}
	seen := map[driver.Xid]bool{}
	for i, sv := range s.servers {
		branches, err := s.listInDoubt(ctx, i)
		if err != nil {
			errs = append(errs, err)
			res.Remaining[fmt.Sprintf("?server%d", i)] = true // unknown: keep decisions
			continue
		}
		for _, b := range branches {
			if seen[b.Xid] {
				// Two DSNs name the same server (a shard database beside
				// the control database): listed once already.
				continue
			}
			seen[b.Xid] = true
			age := s.now().Sub(b.ID.Created)
			o, decided := decisions[b.Xid.Gtrid]
			if !decided {
				if o, decided, err = s.control.Lookup(ctx, b.Xid.Gtrid); err != nil {
					errs = append(errs, fmt.Errorf("look up decision %s: %w", b.Xid.Gtrid, err))
					res.Remaining[b.Xid.Gtrid] = true
					continue
				}
			}
			switch recoveryStep(decided, o, age, minAge) {
			case stepWait:
				res.Skipped++
				res.Remaining[b.Xid.Gtrid] = true
				continue
			case stepAbort:
				if o, err = s.decide(ctx, b.Xid.Gtrid, driver.Aborted); err != nil {
					errs = append(errs, err)
					res.Remaining[b.Xid.Gtrid] = true
					continue
				}
			}
			decisions[b.Xid.Gtrid] = o
			commit := o == driver.Committed
			err := sv.Resolve(ctx, b.Xid, commit)
			switch {
			case sv.Code(err) == driver.UnknownXid:
				// Listed, yet unknown to XA COMMIT/ROLLBACK from here:
				// attached to a live connection (MariaDB). The next pass
				// resolves it once that connection has ended.
				res.Remaining[b.Xid.Gtrid] = true
				if s.endHolder(ctx, b, age, minAge) {
					res.Ended++
				}
			case err != nil:
				errs = append(errs, fmt.Errorf("XA %s %s/%s on server %d: %w", verbOf(commit), b.Xid.Gtrid, b.Xid.Bqual, i, err))
				res.Remaining[b.Xid.Gtrid] = true
			default:
				if commit {
					res.Committed++
				} else {
					res.RolledBack++
				}
				s.forget(b.Xid)
				s.log.Info("resolved in-doubt branch", "gtrid", b.Xid.Gtrid, "bqual", b.Xid.Bqual, "server", i,
					"outcome", string(o), "age", age.Round(time.Millisecond))
			}
		}
	}
	if uerr == nil {
		gtrids := make([]string, len(unapplied))
		for i, r := range unapplied {
			gtrids[i] = r.Gtrid
		}
		if mark := appliedAfter(gtrids, res.Remaining); len(mark) > 0 {
			n, err := s.control.MarkApplied(ctx, mark)
			res.Applied = int(n)
			if err != nil {
				errs = append(errs, fmt.Errorf("mark commit decisions applied: %w", err))
			}
		}
	}
	return res, errors.Join(errs...)
}

func verbOf(commit bool) driver.Verb {
	if commit {
		return driver.Commit
	}
	return driver.Rollback
}

// listInDoubt runs XA RECOVER on server i and keeps this ledger's
// branches (see Identity.Parse).
func (s *Sink) listInDoubt(ctx context.Context, i int) ([]InDoubt, error) {
	xids, err := s.servers[i].Recover(ctx)
	if err != nil {
		return nil, fmt.Errorf("XA RECOVER on server %d: %w", i, err)
	}
	var out []InDoubt
	for _, x := range xids {
		if g, q, ok := s.ledger.Parse(x); ok {
			out = append(out, InDoubt{Server: i, Xid: x, ID: g, Qual: q})
		}
	}
	return out, nil
}

// endHolder ends the connection named in the qualifier of a branch the
// server will not resolve from elsewhere, when killVerdict allows it. It
// re-lists the branch first: resolved meanwhile, there is nothing to end.
// A refusal is logged once per branch, not at every pass.
func (s *Sink) endHolder(ctx context.Context, b InDoubt, age, minAge time.Duration) bool {
	if age < minAge {
		return false // its coordinator may be alive and about to resolve it
	}
	sv := s.servers[b.Server]
	if why := s.holderVerdict(ctx, sv, b, age, minAge); why != "" {
		if s.firstReport(b.Xid) {
			s.log.Warn("in-doubt branch attached to a connection that is not ended", "gtrid", b.Xid.Gtrid, "bqual", b.Xid.Bqual,
				"server", b.Server, "connection", b.Qual.Conn, "age", age.Round(time.Millisecond), "reason", why)
		}
		return false
	}
	err := sv.Kill(ctx, b.Qual.Conn)
	s.log.Warn("ended the connection holding an old in-doubt branch", "gtrid", b.Xid.Gtrid, "bqual", b.Xid.Bqual,
		"server", b.Server, "connection", b.Qual.Conn, "age", age.Round(time.Millisecond), "err", err)
	return err == nil
}

// holderVerdict gathers killVerdict's inputs from the server.
func (s *Sink) holderVerdict(ctx context.Context, sv driver.Server, b InDoubt, age, minAge time.Duration) string {
	xids, err := sv.Recover(ctx)
	if err != nil {
		return "cannot re-list the branch: " + err.Error()
	}
	listed := false
	for _, x := range xids {
		listed = listed || x == b.Xid
	}
	if !listed {
		return "no longer in doubt"
	}
	session, err := sv.Session(ctx, b.Qual.Conn)
	if err != nil {
		return "cannot look the connection up: " + err.Error()
	}
	uptime, err := sv.Uptime(ctx)
	if err != nil {
		return "cannot read the server's uptime: " + err.Error()
	}
	return killVerdict(session, uptime, age, minAge)
}

// firstReport reports whether x was not reported yet, and remembers it.
// The memory is bounded: past 1,024 branches it starts over (a branch is
// then reported once more).
func (s *Sink) firstReport(x driver.Xid) bool {
	key := x.Gtrid + "/" + x.Bqual
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.reported[key]; ok {
		return false
	}
	if len(s.reported) >= 1024 {
		clear(s.reported)
	}
	s.reported[key] = 1
	return true
}

func (s *Sink) forget(x driver.Xid) {
	s.mu.Lock()
	delete(s.reported, x.Gtrid+"/"+x.Bqual)
	s.mu.Unlock()
}

// InDoubtBranches lists this ledger's prepared branches on every server,
// each once (two DSNs may name the same server).
func (s *Sink) InDoubtBranches(ctx context.Context) ([]InDoubt, error) {
	var all []InDoubt
	seen := map[driver.Xid]bool{}
	for i := range s.servers {
		bs, err := s.listInDoubt(ctx, i)
		if err != nil {
			return nil, err
		}
		for _, b := range bs {
			if !seen[b.Xid] {
				seen[b.Xid] = true
				all = append(all, b)
			}
		}
	}
	return all, nil
}

// PruneDecisions deletes up to limit decision rows older than olderThan
// whose checkpoint has no branch left in doubt (see prunable). It needs a
// complete view of the branches in doubt: pass the Remaining set of a
// recovery pass that reached every server (it refuses when the set says a
// server was unreachable).
func (s *Sink) PruneDecisions(ctx context.Context, olderThan time.Duration, remaining map[string]bool, limit int) (int64, error) {
	if !complete(remaining) {
		return 0, errors.New("prune decisions: a server was not reached by recovery")
	}
	candidates, err := s.control.Decided(ctx, s.now().UTC().Add(-olderThan), limit)
	if err != nil {
		return 0, fmt.Errorf("prune decisions: %w", err)
	}
	var del []string
	for _, g := range candidates {
		if prunable(g, remaining) {
			del = append(del, g)
		}
	}
	if len(del) == 0 {
		return 0, nil
	}
	n, err := s.control.Forget(ctx, del)
	if err != nil {
		return n, fmt.Errorf("prune decisions: %w", err)
	}
	return n, nil
}

// CommitPosition is where the commit log stands (see driver.CommitPosition).
type CommitPosition = driver.CommitPosition

// CommitPosition reads the commit log's position in one snapshot: readers
// of the result tables follow Visible (see the package documentation).
func (s *Sink) CommitPosition(ctx context.Context) (CommitPosition, error) {
	p, err := s.control.CommitPosition(ctx)
	if err != nil {
		return CommitPosition{}, fmt.Errorf("commit position: %w", err)
	}
	return p, nil
}

// PruneCommitLog deletes, from the lowest sequence number up, at most
// limit records of the commit log that are older than retention (by the
// control server's clock), below the visible position, and, while the
// ledger's changelog is on, at or below what its publisher recorded Kafka
// holds (see commitLogPruneBound), and returns how many it deleted.
func (s *Sink) PruneCommitLog(ctx context.Context, retention time.Duration, limit int) (int64, error) {
	// The changelog's hint is read first: it only grows, so a bound read
	// before the position is never above what it is when records go.
	cl, err := s.control.Changelog(ctx)
	if err != nil {
		return 0, fmt.Errorf("prune the commit log: %w", err)
	}
	var needed int64
	if cl.On {
		needed = cl.Published + 1
	}
	pos, err := s.control.CommitPosition(ctx)
	if err != nil {
		return 0, fmt.Errorf("prune the commit log: %w", err)
	}
	recs, err := s.control.Commits(ctx, pos.RetainedFrom, false, limit)
	if err != nil {
		return 0, fmt.Errorf("prune the commit log: %w", err)
	}
	through := commitLogPruneBound(recs, pos.Visible, needed, retention)
	if through == 0 {
		return 0, nil
	}
	n, err := s.control.ForgetCommits(ctx, through)
	if err != nil {
		return n, fmt.Errorf("prune the commit log: %w", err)
	}
	return n, nil
}
