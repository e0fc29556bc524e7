// Package deadletters is the pipeline's dead letters and the operator's
// view of the dead_letters table: what a dead letter keeps of a record
// (New), and the rows the operator's tools, the status report and the
// metrics read and update. Every statement on the table is the driver's:
// the checkpoints write letters through the ledger store
// (driver.StoreTx.WriteDeadLetters), and the operator's statements (list,
// show, the re-injection audit, the count of the letters waiting) are
// mysqldriver.Letters and memdriver's Server.Letters, held to one contract
// by the conformance suite (driver/letters.go).
//
// A dead letter is a record that was not counted, with the reason, committed
// in the same checkpoint as the offsets that passed it. It keeps a bounded
// prefix of the record's value, the whole value's size and its SHA-256
// (which finds the record again in Kafka), never the whole value: a flood of
// large junk costs the prefix per record, not the record. Its unique key is
// the record's position (topic, partition, offset): a replay that meets a
// stored dead letter keeps the stored row.
package deadletters

import (
	"bytes"
	"crypto/sha256"

	"github.com/billing/ledger/internal/txsink/driver"
)

// Bounds of what a dead letter keeps of its record (the columns' sizes;
// the store cuts every field to its bound: driver.DeadLetter.Columns).
const (
	MaxKey    = driver.DeadLetterKeyBytes    // bytes of the record's key
	MaxDetail = driver.DeadLetterDetailBytes // bytes of the detail (the column holds 512 characters)
)

// Letter is a dead letter to write: the store's row.
type Letter = driver.DeadLetter

// New copies what a dead letter keeps of a record: its key and a prefix of
// its value of at most maxPayload bytes, so that the record's buffers can be
// freed.
func New(partition int32, offset int64, key, value []byte, maxPayload int, reason, detail, eventID string) Letter {
	d := Letter{Partition: partition, Offset: offset, Reason: reason, Detail: detail, EventID: eventID,
		Size: len(value), SHA256: sha256.Sum256(value), Payload: bytes.Clone(truncate(value, maxPayload))}
	if d.Payload == nil {
		d.Payload = []byte{}
	}
	if key != nil {
		d.Key = bytes.Clone(truncate(key, MaxKey))
	}
	return d
}

// overhead approximates a Letter's fixed memory.
const overhead = 160

// Bytes is the memory the letter holds.
func Bytes(d *Letter) int {
	return len(d.Payload) + len(d.Key) + len(d.Detail) + len(d.EventID) + overhead
}

// MaxBytes bounds Bytes for a letter of a value prefix of at most
// maxPayload bytes (its event id is at most 128 bytes).
func MaxBytes(maxPayload int) int { return maxPayload + MaxKey + MaxDetail + 128 + overhead }

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// Row is a stored dead letter with its re-injection audit, as the
// operator's tools read it.
type Row = driver.DeadLetterRecord

// Filter selects dead letters for a list.
type Filter = driver.LetterFilter

// ErrNotFound: no dead letter by that id.
var ErrNotFound = driver.ErrNoDeadLetter

// Audit is who re-injects a dead letter, what, and whether the checks were
// overridden.
type Audit = driver.LetterAudit

// Waiting is the dead letters of one reason not re-injected.
type Waiting = driver.LettersWaiting
