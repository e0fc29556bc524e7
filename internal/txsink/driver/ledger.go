package driver

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"
)

// The ledger's tables, the store: what a checkpoint reads and writes in its
// branches (StoreTx, on the connection of each branch: Conn.Store), and
// what runs on a server's pools outside branches (Store). The rows are
// plain values. Every statement an implementation runs stays within the
// server's statement budget (MaxStatementBytes, package stmt), however
// many rows a call is given.
//
// Inside a branch (MySQL's READ COMMITTED, which mysqldriver sets):
//
//   - every row a call inserts, updates, deletes or reads under a lock
//     stays locked by the branch until it commits or rolls back, prepared
//     or not; a call that needs a row another open branch locked (a key it
//     claimed, a balance it wrote) waits for that branch to end, then sees
//     its outcome: committed rows exist, rolled-back ones do not; a wait
//     longer than the server's lock wait timeout fails as Transient, and so
//     does a deadlock;
//   - no gap is locked: a locking read of a row that does not exist (and
//     that no open branch is inserting) locks nothing;
//   - a statement that fails leaves no change of its own (its locks stay);
//     the caller aborts the branch anyway;
//   - a branch reads its own writes and the committed rows of others.
//
// On the pools (Store), reads see committed rows only and take no lock.
//
// Errors are classified by the server's Code: Transient (a lock wait, a
// deadlock, a lost connection), Overflow (a sum beyond a BIGINT, error
// 1690), TooLarge (a statement over the server's max_allowed_packet:
// the limit fell since the budget was read; RefreshLimits rereads it),
// Duplicate, Data (a value a column cannot hold).
//
// Identifiers (event ids, account ids, record keys, payloads) are stored
// as bytes (VARBINARY): two that differ in any byte, in case or in
// trailing spaces, are two rows, and each reads back exactly as written.
// Text meant for people (a dead letter's detail) is stored as valid UTF-8.
// Instants are stored in UTC to the microsecond (DATETIME(6)).

// StoreTx is the ledger's tables in one checkpoint's branch. Its methods
// are called by one goroutine at a time, between the branch's XA START and
// XA END.
type StoreTx interface {
	// ClaimKeys inserts into generation g's table the dedup keys that are
	// not stored there and leaves every stored one as it was (fingerprint
	// and expiry included), in id order, as statements of many keys each.
	// It returns every statement that met a stored key (contested: its
	// ids, to be looked up, and how many of them were stored); every other
	// id was inserted by this call. A key another open branch inserted
	// makes it wait for that branch: committed, the key counts as stored;
	// rolled back, it is inserted here.
	ClaimKeys(ctx context.Context, g Generation, keys []DedupKey) (contested []Contested, err error)
	// LockKeys reads the stored keys of ids in generation g's table under
	// shared row locks, in id order (ids without a row are left out, and
	// not locked). A key another open branch inserted there makes it wait
	// for that branch, as a claim's duplicate check does: committed, the
	// key is returned; rolled back, it is not. Two branches' shared locks
	// on one key do not wait for each other.
	LockKeys(ctx context.Context, g Generation, ids []string) ([]DedupKey, error)
	// SetLockWait bounds how long the branch's later statements wait for
	// another transaction's row lock, in whole seconds (at least 1 s),
	// until the branch ends or d is 0 (the server's bound again:
	// innodb_lock_wait_timeout, MYSQL_LOCK_WAIT_TIMEOUT).
	SetLockWait(ctx context.Context, d time.Duration) error
	// UnclaimKeys deletes keys this branch claimed in generation g's table
	// but does not keep.
	UnclaimKeys(ctx context.Context, g Generation, ids []string) error
	// ReplaceKeys deletes the stored rows of keys in generation g's table
	// that are expired at now, then inserts keys there (a stored row that
	// is not expired is a Duplicate error), in id order.
	ReplaceKeys(ctx context.Context, g Generation, keys []DedupKey, now time.Time) error
	// UpdateKeys sets the fingerprint, expiry and version of keys whose
	// rows are stored in generation g's table (a stored row this branch
	// holds: claimed by it, or met by its claim), in id order; a key
	// without a row there is inserted.
	UpdateKeys(ctx context.Context, g Generation, keys []DedupKey) error

	// LockBalances, LockWindows and LockAdjustments read the stored rows of
	// keys, whole, under row locks, by primary key and in key order (keys
	// without a row are left out, and not locked).
	LockBalances(ctx context.Context, keys []BalanceKey) ([]BalanceRow, error)
	LockWindows(ctx context.Context, keys []WindowKey) ([]WindowRow, error)
	LockAdjustments(ctx context.Context, keys []WindowKey) ([]AdjustmentRow, error)
	// CreateBalances, CreateWindows and CreateAdjustments are the locking
	// reads above over rows that may not exist: every key's row is locked
	// in key order, a stored one as it is and a missing one inserted at
	// zero (a row another open branch is inserting is waited for, as a
	// locking read waits), and every key's row is returned, the inserted
	// ones at zero (their updated_at is no instant), with the keys of the
	// rows inserted. A locking read locks no row that does not exist (no
	// gap locks); these lock the missing ones in the same order. A row
	// inserted here must be written (WriteBalances, ...) before the
	// branch is prepared, or the branch rolled back.
	CreateBalances(ctx context.Context, keys []BalanceKey) ([]BalanceRow, []BalanceKey, error)
	CreateWindows(ctx context.Context, keys []WindowKey) ([]WindowRow, []WindowKey, error)
	CreateAdjustments(ctx context.Context, keys []WindowKey) ([]AdjustmentRow, []WindowKey, error)

	// WriteBalances upserts rows (in the order given, which callers keep in
	// key order: one lock order for every writer): a row's amount and
	// count are added to the stored ones, or set when Absolute, or
	// inserted when New (a stored row, created since a locking read found
	// none, fails the call as Duplicate); updated_at is now. A sum beyond
	// a signed 64-bit integer fails as Overflow.
	WriteBalances(ctx context.Context, rows []Balance, now time.Time) error
	// WriteWindows is WriteBalances for billing_windows.
	WriteWindows(ctx context.Context, rows []WindowSum, now time.Time) error
	// WriteAdjustments is WriteWindows for window_adjustments; every row
	// written records checkpoint, the last checkpoint that changed it.
	WriteAdjustments(ctx context.Context, rows []WindowSum, checkpoint string, now time.Time) error
	// WriteEntries inserts one ledger_entries row per entry, keyed by its
	// Kafka position in topic and its Kind; an entry already stored at that position is
	// kept as it is, and its key is returned in kept (in no particular
	// order): the checkpoint created no row there, so its changelog must
	// not say it did.
	WriteEntries(ctx context.Context, topic, checkpoint string, entries []Entry, now time.Time) (kept []EntryKey, err error)
	// WriteDeadLetters inserts the letters, each cut to its columns
	// (DeadLetter.Columns) with the longest payload prefix a row alone can
	// carry within the statement budget, keyed by their Kafka position in
	// topic: a letter already stored at that position is kept as it is.
	WriteDeadLetters(ctx context.Context, topic, checkpoint string, letters []DeadLetter, now time.Time) error
	// SealWindows sets closed_at (and updated_at) to now on the open rows
	// of billing_windows whose window starts in [from, to) (from zero:
	// every window before to), the latest window first, up to about max
	// rows; it returns the rows it sealed, as they were before, and
	// whether no open row is left there. The rows are found by locking reads on the index of
	// (window_start, closed_at), which wait for every row another open
	// branch is writing there, so that a row is sealed only once every
	// write to it that can still commit has committed.
	SealWindows(ctx context.Context, from, to time.Time, max int, now time.Time) (sealed []WindowRow, done bool, err error)
	// WriteOutbox writes the branch's changes to the changelog's outbox:
	// one row per blob (each at most MaxOutboxBlob of the budget), chunks
	// numbered from 0 under the checkpoint and the participant, counts
	// giving each blob's changes.
	WriteOutbox(ctx context.Context, checkpoint string, participant int, blobs [][]byte, counts []int, now time.Time) error
}

// Store is the ledger's tables on one server outside branches: statements
// on the server's pools, each its own short transaction. The cleanup
// (EmptyKeys, DeleteEntries) runs on connections of its own, so that
// however much there is to delete it never holds one a checkpoint needs.
type Store interface {
	// LookupKeys reads the stored dedup keys of ids in generation g's
	// table as committed, expired ones included, without locks.
	LookupKeys(ctx context.Context, g Generation, ids []string) ([]DedupKey, error)
	// EmptyKeys empties generation g's table at once (TRUNCATE), without
	// looking at its rows: the caller has proven every key in it expired
	// (package dedup). It waits at most about a second for the branches
	// that touched the table to end (a prepared branch holds the table
	// until it is resolved), then fails as Transient, changing nothing;
	// it never holds up other tables. The table of generation 0 is also
	// where the version before generations wrote its keys, with their
	// expiry in the journal (dedup_expiry): that table is emptied, with
	// the journal, only when no journal row expires after journalDue, else
	// the call fails with ErrKeysLive.
	EmptyKeys(ctx context.Context, g Generation, journalDue time.Time) error
	// DeleteEntries deletes the ledger entries created before before, the
	// oldest first, in statements of at most batch rows, up to max rows;
	// it returns how many it deleted.
	DeleteEntries(ctx context.Context, before time.Time, batch, max int) (int64, error)
	// RefreshLimits rereads the server's max_allowed_packet and so the
	// statement budget (after a TooLarge error: an operator lowered it).
	RefreshLimits(ctx context.Context) error
	// MaxStatementBytes is the statement budget (package stmt).
	MaxStatementBytes() int

	// OutboxIndex lists the outbox rows of checkpoints, without bodies, in
	// primary key order (checkpoint, participant, chunk).
	OutboxIndex(ctx context.Context, checkpoints []string) ([]OutboxChunk, error)
	// ReadOutbox reads the bodies of chunks, in the order given.
	ReadOutbox(ctx context.Context, chunks []OutboxChunk) ([][]byte, error)
	// DeleteOutbox deletes every outbox row of checkpoints.
	DeleteOutbox(ctx context.Context, checkpoints []string) (int64, error)
	// ScanBalances, ScanWindows, ScanAdjustments and ScanEntries read up to
	// limit committed rows whose primary key is after after (nil: from the
	// first), in primary key order (bytes, then instants and numbers), as
	// committed, without locks: the changelog's snapshot.
	ScanBalances(ctx context.Context, after *BalanceKey, limit int) ([]BalanceRow, error)
	ScanWindows(ctx context.Context, after *WindowKey, limit int) ([]WindowRow, error)
	ScanAdjustments(ctx context.Context, after *WindowKey, limit int) ([]AdjustmentRow, error)
	ScanEntries(ctx context.Context, after *EntryKey, limit int) ([]EntryRow, error)
}

// DedupKey is a row of a dedup key table (dedup_keys, dedup_keys_g1,
// dedup_keys_g2: a generation's): an event id with the fingerprint of its
// first arrival's content and the instant it expires.
type DedupKey struct {
	ID          string
	Fingerprint [16]byte
	ExpiresAt   time.Time
	// Version is the version of the event the ledger counts, as package
	// dedup encodes it (empty: a key stored before versions were kept).
	Version string
}

// Contested is a claim statement that met stored keys: its ids, and how
// many of them were stored (its rows it did not insert). A lookup that
// finds that many stored rows among some of its ids has found them all.
type Contested struct {
	IDs    []string
	Stored int
}

// BalanceKey is the primary key of account_balances.
type BalanceKey struct {
	Account, Currency string
}

// Balance is a row of account_balances, or what a checkpoint writes to it:
// its amount and event count are added to the stored row (created at zero)
// unless Absolute, when they replace it (a value read under a row lock),
// or New, when the row is inserted (a locking read found none).
type Balance struct {
	BalanceKey
	Amount, Count int64
	Absolute, New bool
}

// WindowKey is the primary key of billing_windows and window_adjustments:
// Start is the window's first instant, in UTC.
type WindowKey struct {
	Account, Currency string
	Start             time.Time
}

// WindowSum is a row of billing_windows or window_adjustments, or what a
// checkpoint writes to one (as Balance).
type WindowSum struct {
	WindowKey
	Amount, Count int64
	Absolute, New bool
}

// Entry is a ledger_entries row: one counted event, at its Kafka position,
// or one half of a version's change there (Kind).
type Entry struct {
	Partition               int32
	Offset                  int64
	Kind                    EntryKind
	EventID, Account        string
	Currency                string
	Amount                  int64 // negated in a retraction
	OccurredAt, WindowStart time.Time
	Late                    bool  // counted in window_adjustments
	Revision                int64 // the revision counted or taken back
}

// EntryKind numbers the entries of one Kafka position (the entry column):
// a version that amends a counted event writes the retraction of the
// counted version and the addition of the new one at its position
// (docs/corrections.md).
type EntryKind int8

const (
	EntryEvent      EntryKind = 0 // the event counted (every entry of an original)
	EntryRetraction EntryKind = 1 // the counted version taken back: its account, currency, window; its amount negated
	EntryAddition   EntryKind = 2 // the new version counted in its place
)

// Sign is what the entry adds to its window's event count: -1 for a
// retraction, 1 otherwise.
func (k EntryKind) Sign() int64 {
	if k == EntryRetraction {
		return -1
	}
	return 1
}

// DeadLetter is a dead_letters row: a record that was not counted, at its
// Kafka position, with why, a prefix of its value (Payload), the whole
// value's size and SHA-256.
type DeadLetter struct {
	Partition int32
	Offset    int64
	Reason    string
	Detail    string
	EventID   string // empty when the payload named none (stored as NULL)
	Key       []byte // nil: the record had none (stored as NULL)
	Payload   []byte
	Size      int // of the whole value
	SHA256    [32]byte
}

// Bounds of the dead_letters columns, in bytes.
const (
	DeadLetterKeyBytes     = 1024 // record_key
	DeadLetterDetailBytes  = 500  // detail: 512 characters, kept to bytes of UTF-8 below that
	DeadLetterReasonBytes  = 64   // reason
	DeadLetterEventIDBytes = 128  // event_id
)

// Columns is the letter as its columns hold it, with a payload of at most
// prefix bytes: every field cut to its column's bound (DeadLetter*Bytes),
// the detail made valid UTF-8 and cut on a rune boundary. Every store
// writes letters so.
func (d DeadLetter) Columns(prefix int) DeadLetter {
	d.Reason = d.Reason[:min(len(d.Reason), DeadLetterReasonBytes)]
	d.Detail = cutText(d.Detail, DeadLetterDetailBytes)
	d.EventID = d.EventID[:min(len(d.EventID), DeadLetterEventIDBytes)]
	if d.Key != nil {
		d.Key = d.Key[:min(len(d.Key), DeadLetterKeyBytes)]
	}
	d.Payload = d.Payload[:min(len(d.Payload), max(prefix, 0))]
	if d.Payload == nil {
		d.Payload = []byte{} // the column is NOT NULL
	}
	return d
}

// cutText cuts s to at most n bytes on a rune boundary and makes it valid
// UTF-8, so that it fits a VARCHAR column of utf8mb4.
func cutText(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
