package mysqldriver

import (
	"context"
	"crypto/sha256"
	"time"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The SQL the checkpoints write to dead_letters (the operator's tools read
// and update the table through package deadletters).

const (
	letterHead = `INSERT INTO dead_letters (kafka_topic, kafka_partition, kafka_offset, reason, detail, event_id, record_key, payload, payload_size, payload_sha256, checkpoint_id, created_at) VALUES `
	// A replay that meets a dead letter already stored (a group allowed to
	// start over a ledger's topic, a checkpoint whose outcome was
	// ambiguous) keeps the stored row: its offset names the same record.
	letterTail  = ` ON DUPLICATE KEY UPDATE id = id`
	letterTuple = "(?,?,?,?,?,?,?,?,?,?,?,?)"
)

// letterBase bounds the text of one row besides its payload: the tuple and
// its separator, and every other argument at the bound of its column
// (driver.DeadLetter.Columns). With the payload's TextBytes it is the one
// size computation of a row: writeDeadLetters sizes the statements with it
// and cuts the payload prefix to what it leaves (letterPrefix), so a row's
// estimate never exceeds the budget it was cut for.
func letterBase(topic, checkpoint string) int {
	return len(letterTuple) + 1 +
		stmt.ArgBytes(topic) + stmt.ArgBytes(checkpoint) +
		3*stmt.ArgBytes(int64(0)) + // partition, offset, payload size
		stmt.TextBytes(driver.DeadLetterReasonBytes) + stmt.TextBytes(driver.DeadLetterDetailBytes) +
		stmt.TextBytes(driver.DeadLetterEventIDBytes) + stmt.TextBytes(driver.DeadLetterKeyBytes) +
		stmt.TextBytes(sha256.Size) + stmt.ArgBytes(time.Time{})
}

// letterPrefix is the longest payload prefix a row can carry alone in a
// statement of budget bytes.
func letterPrefix(budget int, topic, checkpoint string) int {
	return stmt.FitText(stmt.Room(budget, letterHead, letterTail) - letterBase(topic, checkpoint))
}

// writeDeadLetters inserts the letters of one checkpoint, as few
// statements as ex's budget allows; a server with a small
// max_allowed_packet keeps a shorter payload prefix (at least a quarter of
// the server's max_allowed_packet less 4 KiB, stmt.Budget being half of
// it).
func writeDeadLetters(ctx context.Context, ex stmt.Execer, topic, checkpoint string, ls []driver.DeadLetter, now time.Time) error {
	prefix := letterPrefix(ex.MaxStatementBytes(), topic, checkpoint)
	base := letterBase(topic, checkpoint)
	return stmt.Insert(ctx, ex, len(ls), letterHead, letterTuple, letterTail,
		func(i int) int { return base + stmt.TextBytes(min(len(ls[i].Payload), prefix)) },
		func(i int) []any {
			d := ls[i].Columns(prefix)
			var id, key any
			if d.EventID != "" {
				id = d.EventID
			}
			if d.Key != nil {
				key = d.Key
			}
			return []any{topic, d.Partition, d.Offset, d.Reason, d.Detail, id, key, d.Payload, d.Size, d.SHA256[:], checkpoint, now}
		})
}
