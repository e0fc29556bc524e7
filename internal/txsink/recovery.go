package txsink

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/billing/ledger/internal/stmt"
)

// InDoubt is a prepared branch of this service found by XA RECOVER.
type InDoubt struct {
	Server int
	Xid    Xid
	ID     GlobalID
}

// RecoveryResult counts what a recovery pass did.
type RecoveryResult struct {
	Committed  int // branches rolled forward under a commit decision
	RolledBack int // branches rolled back under an abort decision
	Skipped    int // undecided branches too young to abort
	// Remaining lists the gtrids still in doubt after the pass.
	Remaining map[string]bool
}

// Recover resolves this service's prepared branches on every server by the
// decision record:
//
//   - decided commit: XA COMMIT (roll forward);
//   - decided abort: XA ROLLBACK;
//   - undecided and older than minAge: an abort decision is inserted by
//     compare-and-set; if it wins the branch is rolled back, if it loses
//     (the coordinator decided commit meanwhile) the branch is committed;
//   - undecided and younger than minAge: skipped, since its coordinator may
//     still be deciding it. This is for liveness only: a coordinator that
//     comes late finds the abort decision and aborts.
//
// The absence of a branch from XA RECOVER is never taken as proof of
// anything; only the decision record is. Recover returns the errors of the
// branches it could not resolve, after trying all of them.
func (s *Sink) Recover(ctx context.Context, minAge time.Duration) (RecoveryResult, error) {
	res := RecoveryResult{Remaining: map[string]bool{}}
	var errs []error
	for _, sv := range s.servers {
		branches, err := s.listInDoubt(ctx, sv)
		if err != nil {
			errs = append(errs, err)
			res.Remaining["?server"+fmt.Sprint(sv.index)] = true // unknown: keep decisions
			continue
		}
		decisions := map[string]outcome{}
		for _, b := range branches {
			o, ok := decisions[b.Xid.Gtrid]
			if !ok {
				var found bool
				o, found, err = s.lookupDecision(ctx, b.Xid.Gtrid)
				if err != nil {
					errs = append(errs, err)
					res.Remaining[b.Xid.Gtrid] = true
					continue
				}
				if !found {
					if time.Since(b.ID.Created) < minAge {
						res.Skipped++
						res.Remaining[b.Xid.Gtrid] = true
						continue
					}
					o, err = s.decide(ctx, b.Xid.Gtrid, outcomeAbort)
					if err != nil {
						errs = append(errs, err)
						res.Remaining[b.Xid.Gtrid] = true
						continue
					}
				}
				decisions[b.Xid.Gtrid] = o
			}
			verb := "ROLLBACK"
			if o == outcomeCommit {
				verb = "COMMIT"
			}
			err := s.xaOnce(ctx, sv, b.Xid, verb)
			if errors.Is(err, errUnknownXid) {
				// Listed, yet unknown to XA COMMIT/ROLLBACK: on MariaDB the
				// branch is still attached to the connection that prepared
				// it. Past minAge its coordinator is dead, frozen or cut
				// off; ending that connection detaches the branch, and the
				// next pass resolves it by the same decision.
				res.Remaining[b.Xid.Gtrid] = true
				if time.Since(b.ID.Created) >= minAge {
					s.killHolder(ctx, sv, b)
				}
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("XA %s %s/%s on server %d: %w", verb, b.Xid.Gtrid, b.Xid.Bqual, sv.index, err))
				res.Remaining[b.Xid.Gtrid] = true
				continue
			}
			if o == outcomeCommit {
				res.Committed++
			} else {
				res.RolledBack++
			}
			s.log.Info("resolved in-doubt branch", "gtrid", b.Xid.Gtrid, "bqual", b.Xid.Bqual, "server", sv.index, "outcome", string(o), "age", time.Since(b.ID.Created).Round(time.Millisecond))
		}
	}
	return res, errors.Join(errs...)
}

// listInDoubt runs XA RECOVER on one server and keeps this service's
// branches. XA RECOVER lists every prepared branch on the server, other
// applications' too; its data column is the gtrid followed by the bqual.
func (s *Sink) listInDoubt(ctx context.Context, sv *server) ([]InDoubt, error) {
	rows, err := sv.db.QueryContext(ctx, "XA RECOVER")
	if err != nil {
		return nil, fmt.Errorf("XA RECOVER on server %d: %w", sv.index, err)
	}
	defer rows.Close()
	var out []InDoubt
	for rows.Next() {
		var format, glen, blen int64
		var data []byte
		if err := rows.Scan(&format, &glen, &blen, &data); err != nil {
			return nil, fmt.Errorf("XA RECOVER on server %d: %w", sv.index, err)
		}
		if format != FormatID || glen < 0 || blen < 0 || int(glen+blen) > len(data) {
			continue
		}
		x := Xid{Gtrid: string(data[:glen]), Bqual: string(data[glen : glen+blen])}
		id, ok := ParseGlobalID(x.Gtrid)
		if _, _, scope, okb := parseBqual(x.Bqual); !ok || !okb || scope != s.scope {
			continue // not this service's, or another deployment's
		}
		out = append(out, InDoubt{Server: sv.index, Xid: x, ID: id})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("XA RECOVER on server %d: %w", sv.index, err)
	}
	return out, nil
}

// killHolder ends the connection that holds a prepared branch, named in
// its bqual. It needs no privilege when the service's user owns that
// connection (CONNECTION ADMIN otherwise). Killing a connection that no
// longer holds the branch is harmless: at worst a live checkpoint on it
// fails and replays.
func (s *Sink) killHolder(ctx context.Context, sv *server, b InDoubt) {
	_, conn, _, ok := parseBqual(b.Xid.Bqual)
	if !ok {
		return
	}
	_, err := sv.db.ExecContext(ctx, "KILL CONNECTION "+strconv.FormatUint(conn, 10))
	s.log.Warn("ended the connection holding an old in-doubt branch", "gtrid", b.Xid.Gtrid, "bqual", b.Xid.Bqual,
		"server", sv.index, "connection", conn, "age", time.Since(b.ID.Created).Round(time.Millisecond), "err", err)
}

// InDoubtBranches lists this service's prepared branches on every server.
func (s *Sink) InDoubtBranches(ctx context.Context) ([]InDoubt, error) {
	var all []InDoubt
	for _, sv := range s.servers {
		b, err := s.listInDoubt(ctx, sv)
		if err != nil {
			return nil, err
		}
		all = append(all, b...)
	}
	return all, nil
}

// PruneDecisions deletes up to limit decision rows older than olderThan whose
// checkpoint has no branch left in doubt. It needs a complete view of the
// branches in doubt: pass the Remaining set of a recovery pass that reached
// every server (it refuses when the set says a server was unreachable).
func (s *Sink) PruneDecisions(ctx context.Context, olderThan time.Duration, remaining map[string]bool, limit int) (int64, error) {
	for g := range remaining {
		if len(g) > 0 && g[0] == '?' {
			return 0, errors.New("prune decisions: a server was not reached by recovery")
		}
	}
	var candidates []string
	err := s.Control().SelectContext(ctx, &candidates,
		`SELECT gtrid FROM checkpoint_decisions WHERE decided_at < ? ORDER BY decided_at LIMIT ?`,
		time.Now().UTC().Add(-olderThan), limit)
	if err != nil {
		return 0, fmt.Errorf("prune decisions: %w", err)
	}
	var del []any
	for _, g := range candidates {
		if !remaining[g] {
			del = append(del, g)
		}
	}
	if len(del) == 0 {
		return 0, nil
	}
	var n int64
	err = s.controlChunks(len(del), 64, func(i int) int { return stmt.ArgBytes(del[i]) }, func(start, end int) error {
		r, err := s.Control().ExecContext(ctx, `DELETE FROM checkpoint_decisions WHERE gtrid IN (`+placeholders(end-start)+`)`, del[start:end]...)
		if err != nil {
			return err
		}
		k, _ := r.RowsAffected()
		n += k
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("prune decisions: %w", err)
	}
	return n, nil
}
