package driver

import "time"

// Tables is what the ledger's tables of one server hold, as committed,
// each in its primary key's order: for tests that check what a store
// wrote (the conformance suite, scenarios over the in-memory driver). The
// service itself never reads tables whole.
type Tables struct {
	// Keys are the dedup key tables, by Generation.Table (0: dedup_keys).
	Keys        [KeyTables][]DedupKey
	Journal     []JournalRow
	Balances    []BalanceRow
	Windows     []WindowRow
	Adjustments []AdjustmentRow
	Entries     []EntryRow
	DeadLetters []DeadLetterRow
}

// JournalRow is a row of dedup_expiry, the expiry journal the version
// before generations wrote beside its keys in dedup_keys: the ids of keys
// that expire at ExpiresAt, in the order they were journaled.
type JournalRow struct {
	Seq       int64
	ExpiresAt time.Time
	IDs       []string
}

// BalanceRow is a stored account_balances row.
type BalanceRow struct {
	BalanceKey
	Amount, Count int64
	UpdatedAt     time.Time
}

// WindowRow is a stored billing_windows row; ClosedAt is zero while the
// window is not sealed.
type WindowRow struct {
	WindowKey
	Amount, Count       int64
	UpdatedAt, ClosedAt time.Time
}

// AdjustmentRow is a stored window_adjustments row, with the last
// checkpoint that changed it.
type AdjustmentRow struct {
	WindowKey
	Amount, Count int64
	UpdatedAt     time.Time
	Checkpoint    string
}

// EntryRow is a stored ledger_entries row.
type EntryRow struct {
	Topic string
	Entry
	Checkpoint string
	CreatedAt  time.Time
}

// DeadLetterRow is a stored dead_letters row (its re-injection columns
// aside).
type DeadLetterRow struct {
	ID    int64
	Topic string
	DeadLetter
	Checkpoint string
	CreatedAt  time.Time
}
