package driver

import (
	"database/sql"
	"errors"
	"time"
)

// The operator's statements on dead_letters, outside checkpoints: the
// tools list and show letters and record re-injections (package reinject),
// the status report and the metrics count the letters waiting. Each is a
// statement of its own on one server's pool. The consumers declare the
// methods they use (reinject.Letters, ledgerstatus.Counter, the list
// command's); mysqldriver.Letters and memdriver's Server.Letters implement
// them all, held to one contract by the conformance suite.

// ErrNoDeadLetter: no dead letter by that id on the server.
var ErrNoDeadLetter = errors.New("no such dead letter")

// DeadLetterRecord is a stored dead letter with its re-injection audit, as
// the operator's tools read it (List leaves Key and Payload nil).
type DeadLetterRecord struct {
	ID           int64        `db:"id"`
	Topic        string       `db:"kafka_topic"`
	Partition    int32        `db:"kafka_partition"`
	Offset       int64        `db:"kafka_offset"`
	Reason       string       `db:"reason"`
	Detail       string       `db:"detail"`
	EventID      []byte       `db:"event_id"`
	Key          []byte       `db:"record_key"`
	Payload      []byte       `db:"payload"`
	PayloadSize  int64        `db:"payload_size"`
	PayloadSHA   []byte       `db:"payload_sha256"`
	Checkpoint   string       `db:"checkpoint_id"`
	CreatedAt    time.Time    `db:"created_at"`
	ReinjectedAt sql.NullTime `db:"reinjected_at"`
	// The audit of the last re-injection (the log keeps every one).
	ReinjectedBy        sql.NullString `db:"reinjected_by"`
	ReinjectedForced    sql.NullBool   `db:"reinjected_forced"`
	ReinjectedPartition sql.NullInt32  `db:"reinjected_partition"`
	ReinjectedOffset    sql.NullInt64  `db:"reinjected_offset"`
	ReinjectedSHA256    []byte         `db:"reinjected_sha256"`
}

// LetterFilter selects dead letters for List.
type LetterFilter struct {
	Reason  string // only this reason, if set
	Pending bool   // only those not re-injected
	Limit   int    // at most this many, newest first
}

// LetterAudit is who re-injects a dead letter, what, and whether the
// checks were overridden.
type LetterAudit struct {
	At     time.Time
	By     string
	Forced bool
	SHA256 []byte // of the value produced
}

// LettersWaiting is the dead letters of one reason not re-injected: how
// many, and when the oldest was created.
type LettersWaiting struct {
	Reason string    `json:"reason"`
	Count  int64     `json:"count"`
	Oldest time.Time `json:"oldest"`
}
