package pipeline

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/stmt"
)

// The result tables' SQL. Every statement is portable between MySQL 8.4 and
// MariaDB 10.11: upserts use VALUES() in ON DUPLICATE KEY UPDATE (MySQL 8.4
// warns 1287 and accepts it; its row alias does not exist on MariaDB).

// execer runs statements inside a branch (txsink.Branch), each within its
// server's statement budget (package stmt).
type execer = dedup.Execer

// preparer runs a statement through a server-side prepared statement kept
// with the branch's connection (txsink.Branch.ExecPrepared).
type preparer interface {
	ExecPrepared(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// upsertSQL returns the ON DUPLICATE KEY UPDATE clause that adds a delta to
// the given columns or, for absolute values read under a row lock, sets
// them.
func upsertSQL(absolute bool, cols ...string) string {
	var b strings.Builder
	b.WriteString(" ON DUPLICATE KEY UPDATE ")
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		if absolute {
			fmt.Fprintf(&b, "%s = VALUES(%s)", c, c)
		} else {
			fmt.Fprintf(&b, "%s = %s + VALUES(%s)", c, c, c)
		}
	}
	b.WriteString(", updated_at = VALUES(updated_at)")
	return b.String()
}

// batches runs multi-row INSERTs of n rows, as few as ex's statement
// budget allows (package stmt): rowBytes(i) bounds row i's text, args(i)
// gives its arguments.
func batches(ctx context.Context, ex execer, n int, head, tuple, tail string, rowBytes func(i int) int, args func(i int) []any) error {
	var b strings.Builder
	return stmt.Split(n, len(head)+len(tail), ex.MaxStatementBytes(), rowBytes, func(start, end int) error {
		b.Reset()
		b.WriteString(head)
		var all []any
		for i := start; i < end; i++ {
			if i > start {
				b.WriteByte(',')
			}
			b.WriteString(tuple)
			all = append(all, args(i)...)
		}
		b.WriteString(tail)
		exec := ex.Exec
		if p, ok := ex.(preparer); ok && end-start == stmt.MaxRows {
			exec = p.ExecPrepared // full statements: the same text every time
		}
		_, err := exec(ctx, b.String(), all...)
		return err
	})
}

// Worst-case bytes of a result row besides its account id: the currency,
// two BIGINTs, one or two DATETIMEs and the tuple's text.
const resultRowBytes = 6*32 + 16

// writeBalances writes delta rows with an adding upsert and absolute rows
// (seeded under a row lock) with a setting one.
func writeBalances(ctx context.Context, ex execer, rows []balanceRow, now time.Time) error {
	for _, abs := range []bool{false, true} {
		var part []balanceRow
		for _, r := range rows {
			if r.absolute == abs {
				part = append(part, r)
			}
		}
		err := batches(ctx, ex, len(part),
			`INSERT INTO account_balances (account_id, currency, balance_minor, event_count, updated_at) VALUES `,
			"(?,?,?,?,?)", upsertSQL(abs, "balance_minor", "event_count"),
			func(i int) int { return stmt.ArgBytes(part[i].account) + resultRowBytes },
			func(i int) []any {
				r := part[i]
				return []any{r.account, r.currency, r.amount, r.count, now}
			})
		if err != nil {
			return err
		}
	}
	return nil
}

// writeWindows is writeBalances for billing_windows.
func writeWindows(ctx context.Context, ex execer, rows []windowRow, now time.Time) error {
	for _, abs := range []bool{false, true} {
		var part []windowRow
		for _, r := range rows {
			if r.absolute == abs {
				part = append(part, r)
			}
		}
		err := batches(ctx, ex, len(part),
			`INSERT INTO billing_windows (account_id, currency, window_start, amount_minor, event_count, updated_at) VALUES `,
			"(?,?,?,?,?,?)", upsertSQL(abs, "amount_minor", "event_count"),
			func(i int) int { return stmt.ArgBytes(part[i].account) + resultRowBytes },
			func(i int) []any {
				r := part[i]
				return []any{r.account, r.currency, time.Unix(r.start, 0).UTC(), r.amount, r.count, now}
			})
		if err != nil {
			return err
		}
	}
	return nil
}

// deadLetter is a record that was not counted, with the reason. It keeps
// a bounded prefix of the record's value, its size and its SHA-256 (which
// finds the whole record again in Kafka), never the whole value: a flood
// of large junk costs the prefix per record, not the record.
type deadLetter struct {
	partition int32
	offset    int64
	reason    string
	detail    string
	eventID   string // empty when the payload named none
	key       []byte // at most maxStoredKey bytes
	payload   []byte // a prefix of the value, at most Config.DeadLetterPayloadBytes
	size      int    // of the whole value
	sha256    [32]byte
}

// newDeadLetter copies what a dead letter keeps of a record: its key and a
// prefix of its value, so that the record's buffers can be freed.
func newDeadLetter(partition int32, offset int64, key, value []byte, maxPayload int, reason, detail, eventID string) deadLetter {
	d := deadLetter{partition: partition, offset: offset, reason: reason, detail: detail, eventID: eventID,
		size: len(value), sha256: sha256.Sum256(value), payload: bytes.Clone(truncate(value, maxPayload))}
	if d.payload == nil {
		d.payload = []byte{}
	}
	if key != nil {
		d.key = bytes.Clone(truncate(key, maxStoredKey))
	}
	return d
}

// bytes is what a buffered dead letter holds in memory.
func (d *deadLetter) bytes() int {
	return len(d.payload) + len(d.key) + len(d.detail) + len(d.eventID) + deadLetterOverhead
}

// deadLetterOverhead approximates a dead letter's fixed memory.
const deadLetterOverhead = 160

const (
	maxStoredKey = 1024
	maxDetail    = 500
)

// deadLetterRowBytes bounds a dead letter row's text besides its payload:
// the topic, key, detail, event id, reason, checkpoint id, hash and the
// numbers, each escaped in the worst case.
func deadLetterRowBytes(topic, checkpoint string) int {
	return stmt.ArgBytes(topic) + stmt.ArgBytes(checkpoint) + 2*(maxStoredKey+maxDetail+128+64+32) + 12*32
}

const deadLetterHead = `INSERT INTO dead_letters (kafka_topic, kafka_partition, kafka_offset, reason, detail, event_id, record_key, payload, payload_size, payload_sha256, checkpoint_id, created_at) VALUES `

// A replay that meets a dead letter already stored (a group allowed to
// start over a ledger's topic, a checkpoint whose outcome was ambiguous)
// keeps the stored row: its offset names the same record.
const deadLetterTail = ` ON DUPLICATE KEY UPDATE id = id`

// maxPayloadPrefix is the longest payload prefix a dead letter row can
// carry within a statement budget: the rest of the row and the statement's
// text taken away, halved for escaping.
func maxPayloadPrefix(budget int, topic, checkpoint string) int {
	return max(0, (budget-len(deadLetterHead)-len(deadLetterTail)-deadLetterRowBytes(topic, checkpoint))/2)
}

func writeDeadLetters(ctx context.Context, ex execer, topic, checkpoint string, dls []deadLetter, now time.Time) error {
	prefix := maxPayloadPrefix(ex.MaxStatementBytes(), topic, checkpoint)
	fixed := deadLetterRowBytes(topic, checkpoint)
	return batches(ctx, ex, len(dls), deadLetterHead, "(?,?,?,?,?,?,?,?,?,?,?,?)", deadLetterTail,
		func(i int) int { return fixed + stmt.ArgBytes(truncate(dls[i].payload, prefix)) },
		func(i int) []any {
			d := dls[i]
			var id any
			if d.eventID != "" {
				id = d.eventID
			}
			var key any
			if d.key != nil {
				key = d.key
			}
			return []any{topic, d.partition, d.offset, d.reason, truncateText(d.detail, maxDetail), id, key,
				truncate(d.payload, prefix), d.size, d.sha256[:], checkpoint, now}
		})
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// truncateText cuts s to at most n bytes on a rune boundary and makes it
// valid UTF-8, so that it fits a VARCHAR column.
func truncateText(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// readBalances locks and reads the stored balances of keys (seeding).
//
// Every locking statement here names the primary key: when the list covers
// much of a small table the optimizer prefers a full scan, and a locking
// scan waits on every row another branch of the same checkpoint has locked,
// a wait InnoDB cannot see as a deadlock (the branches are separate
// transactions): the checkpoint then hangs until the lock wait times out.
func readBalances(ctx context.Context, q dedup.Querier, keys []balanceKey) (map[balanceKey]total, error) {
	out := make(map[balanceKey]total, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	err := stmt.Split(len(keys), 256, q.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(keys[i].account) + 32 }, func(start, end int) error {
		part := keys[start:end]
		args := make([]any, 0, 2*len(part))
		for _, k := range part {
			args = append(args, k.account, k.currency)
		}
		var rows []struct {
			Account  []byte `db:"account_id"`
			Currency string `db:"currency"`
			Amount   int64  `db:"balance_minor"`
			Count    int64  `db:"event_count"`
		}
		q2 := `SELECT account_id, currency, balance_minor, event_count FROM account_balances FORCE INDEX (PRIMARY) WHERE (account_id, currency) IN (` +
			strings.Repeat("(?,?),", len(part)-1) + `(?,?)) FOR UPDATE`
		if err := q.Select(ctx, &rows, q2, args...); err != nil {
			return err
		}
		for _, r := range rows {
			out[balanceKey{string(r.Account), r.Currency}] = total{amount: r.Amount, count: r.Count, exists: true}
		}
		return nil
	})
	return out, err
}

// readWindows locks and reads the stored window sums of keys (seeding).
func readWindows(ctx context.Context, q dedup.Querier, keys []windowKey) (map[windowKey]total, error) {
	out := make(map[windowKey]total, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	err := stmt.Split(len(keys), 256, q.MaxStatementBytes(), func(i int) int { return stmt.ArgBytes(keys[i].account) + 80 }, func(start, end int) error {
		part := keys[start:end]
		args := make([]any, 0, 3*len(part))
		for _, k := range part {
			args = append(args, k.account, k.currency, time.Unix(k.start, 0).UTC())
		}
		var rows []struct {
			Account  []byte    `db:"account_id"`
			Currency string    `db:"currency"`
			Start    time.Time `db:"window_start"`
			Amount   int64     `db:"amount_minor"`
			Count    int64     `db:"event_count"`
		}
		q2 := `SELECT account_id, currency, window_start, amount_minor, event_count FROM billing_windows FORCE INDEX (PRIMARY) WHERE (account_id, currency, window_start) IN (` +
			strings.Repeat("(?,?,?),", len(part)-1) + `(?,?,?)) FOR UPDATE`
		if err := q.Select(ctx, &rows, q2, args...); err != nil {
			return err
		}
		for _, r := range rows {
			out[windowKey{string(r.Account), r.Currency, r.Start.Unix()}] = total{amount: r.Amount, count: r.Count, exists: true}
		}
		return nil
	})
	return out, err
}
