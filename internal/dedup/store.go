package dedup

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// chunk bounds the rows of one statement: large enough to amortise the
// round trip, small enough for max_allowed_packet and short lock lists.
const chunk = 1000

// Querier runs a read-only query (a server's pool, or a branch).
type Querier interface {
	Select(ctx context.Context, dest any, query string, args ...any) error
}

// Execer runs a statement inside a checkpoint's branch (txsink.Branch).
type Execer interface {
	Exec(ctx context.Context, query string, args ...any) (sql.Result, error)
}

type row struct {
	ID          []byte    `db:"event_id"`
	Fingerprint []byte    `db:"fingerprint"`
	ExpiresAt   time.Time `db:"expires_at"`
}

// Lookup reads the stored rows of ids, expired ones included, with a
// consistent (non-locking) read of the committed rows. Run after Claim, on
// the claim's suspects: the claim's row locks keep every stored row it met
// as it was until the checkpoint ends, and the ids it inserted itself are
// not visible to the read (and so count as new).
func Lookup(ctx context.Context, q Querier, ids []string, into map[string]Seen) error {
	for start := 0; start < len(ids); start += chunk {
		part := ids[start:min(start+chunk, len(ids))]
		args := make([]any, len(part))
		for i, id := range part {
			args[i] = id
		}
		var rows []row
		if err := q.Select(ctx, &rows, `SELECT event_id, fingerprint, expires_at FROM dedup_keys WHERE event_id IN (`+placeholders(len(part))+`)`, args...); err != nil {
			return fmt.Errorf("dedup lookup: %w", err)
		}
		for _, r := range rows {
			var s Seen
			copy(s.Fingerprint[:], r.Fingerprint)
			s.ExpiresAt = r.ExpiresAt
			into[string(r.ID)] = s
		}
	}
	return nil
}

// Claim inserts the keys of one checkpoint's candidate ids (not in the
// cache, first arrival's fingerprint) and leaves every row that already
// exists untouched, one statement per chunk. The server reports how many
// rows each statement inserted; a chunk that inserted fewer than it holds
// contains ids stored before, and Claim returns the ids of every such chunk
// (the only ids worth looking up). Every other id is new and its key is
// written: no lookup is needed for the usual case, where nearly every id
// is new. Keys are written in id order, as Store does.
//
// A row that another instance is inserting concurrently makes the
// statement wait for that instance's branch; once it commits, the row
// counts as existing, and if it rolls back, the key is claimed here.
func Claim(ctx context.Context, ex Execer, keys []Insert) ([]string, error) {
	slices.SortFunc(keys, func(a, b Insert) int { return strings.Compare(a.ID, b.ID) })
	var suspects []string
	var b strings.Builder
	for start := 0; start < len(keys); start += chunk {
		part := keys[start:min(start+chunk, len(keys))]
		b.Reset()
		b.WriteString(`INSERT INTO dedup_keys (event_id, fingerprint, expires_at) VALUES `)
		args := make([]any, 0, 3*len(part))
		for i, in := range part {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString("(?,?,?)")
			args = append(args, in.ID, in.Fingerprint[:], in.ExpiresAt)
		}
		// An existing row is "updated" to itself: 0 affected rows (no
		// CLIENT_FOUND_ROWS), unlike INSERT IGNORE no error is downgraded.
		b.WriteString(` ON DUPLICATE KEY UPDATE event_id = event_id`)
		r, err := ex.Exec(ctx, b.String(), args...)
		if err != nil {
			return nil, fmt.Errorf("dedup claim: %w", err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return nil, fmt.Errorf("dedup claim: %w", err)
		}
		if n != int64(len(part)) {
			for _, in := range part {
				suspects = append(suspects, in.ID)
			}
		}
	}
	return suspects, nil
}

// Unclaim deletes keys that this checkpoint claimed but does not keep (the
// event became a dead letter).
func Unclaim(ctx context.Context, ex Execer, ids []string) error {
	slices.Sort(ids)
	for start := 0; start < len(ids); start += chunk {
		part := ids[start:min(start+chunk, len(ids))]
		args := make([]any, len(part))
		for i, id := range part {
			args[i] = id
		}
		if _, err := ex.Exec(ctx, `DELETE d FROM dedup_keys AS d FORCE INDEX (PRIMARY) WHERE d.event_id IN (`+placeholders(len(part))+`)`, args...); err != nil {
			return fmt.Errorf("dedup unclaim: %w", err)
		}
	}
	return nil
}

// Store writes keys that replace expired rows (Claim writes the new ones),
// deleting the expired rows first.
// Deletes name the primary key (multi-table form: single-table DELETE takes
// no index hint): a scan would wait on rows other branches hold. Keys
// are written in id order so that concurrent checkpoints lock in one order.
func Store(ctx context.Context, ex Execer, inserts []Insert, now time.Time) error {
	slices.SortFunc(inserts, func(a, b Insert) int { return strings.Compare(a.ID, b.ID) })
	var replace []any
	for _, in := range inserts {
		if in.Replace {
			replace = append(replace, in.ID)
		}
	}
	for start := 0; start < len(replace); start += chunk {
		part := replace[start:min(start+chunk, len(replace))]
		args := append(part[:len(part):len(part)], now)
		if _, err := ex.Exec(ctx, `DELETE d FROM dedup_keys AS d FORCE INDEX (PRIMARY) WHERE d.event_id IN (`+placeholders(len(part))+`) AND d.expires_at <= ?`, args...); err != nil {
			return fmt.Errorf("dedup replace expired: %w", err)
		}
	}
	var b strings.Builder
	for start := 0; start < len(inserts); start += chunk {
		part := inserts[start:min(start+chunk, len(inserts))]
		b.Reset()
		b.WriteString(`INSERT INTO dedup_keys (event_id, fingerprint, expires_at) VALUES `)
		args := make([]any, 0, 3*len(part))
		for i, in := range part {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString("(?,?,?)")
			args = append(args, in.ID, in.Fingerprint[:], in.ExpiresAt)
		}
		if _, err := ex.Exec(ctx, b.String(), args...); err != nil {
			return fmt.Errorf("dedup insert: %w", err)
		}
	}
	return nil
}

// Cleanup deletes keys expired at now from one server, batch keys per
// statement, until none is left, max keys were deleted, or ctx ends. Each
// batch is selected without locks and deleted by primary key in its own
// short transaction; a key re-inserted meanwhile (with a later expiry) is
// not touched.
func Cleanup(ctx context.Context, db *sqlx.DB, now time.Time, batch, max int) (int64, error) {
	var total int64
	for total < int64(max) {
		var ids [][]byte
		if err := db.SelectContext(ctx, &ids, `SELECT event_id FROM dedup_keys WHERE expires_at <= ? ORDER BY expires_at LIMIT ?`, now, batch); err != nil {
			return total, fmt.Errorf("dedup cleanup: %w", err)
		}
		if len(ids) == 0 {
			return total, nil
		}
		args := make([]any, 0, len(ids)+1)
		for _, id := range ids {
			args = append(args, id)
		}
		args = append(args, now)
		r, err := db.ExecContext(ctx, `DELETE d FROM dedup_keys AS d FORCE INDEX (PRIMARY) WHERE d.event_id IN (`+placeholders(len(ids))+`) AND d.expires_at <= ?`, args...)
		if err != nil {
			return total, fmt.Errorf("dedup cleanup: %w", err)
		}
		n, _ := r.RowsAffected()
		total += n
		if len(ids) < batch {
			return total, nil
		}
	}
	return total, nil
}

func placeholders(n int) string {
	return strings.Repeat("?,", n-1) + "?"
}
