package changelog

import (
	"github.com/billing/ledger/internal/txsink/driver"
)

// The binary rows of the store's rows (package driver), in the tables'
// column order: the one mapping of the ledger's rows to the changelog's,
// for the outbox and for the snapshot.

// BalanceRow appends r as an account_balances row.
func BalanceRow(b []byte, r driver.BalanceRow) []byte {
	b = AppendString(b, r.Account)
	b = AppendString(b, r.Currency)
	b = AppendInt(b, r.Amount)
	b = AppendInt(b, r.Count)
	return AppendTime(b, r.UpdatedAt)
}

// WindowRow appends r as a billing_windows (or closed_windows) row.
func WindowRow(b []byte, r driver.WindowRow) []byte {
	b = AppendString(b, r.Account)
	b = AppendString(b, r.Currency)
	b = AppendTime(b, r.Start)
	b = AppendInt(b, r.Amount)
	b = AppendInt(b, r.Count)
	b = AppendTime(b, r.UpdatedAt)
	return AppendNullTime(b, r.ClosedAt)
}

// AdjustmentRow appends r as a window_adjustments row (checkpoint_id NULL
// for a row written before migration 00006).
func AdjustmentRow(b []byte, r driver.AdjustmentRow) []byte {
	b = AppendString(b, r.Account)
	b = AppendString(b, r.Currency)
	b = AppendTime(b, r.Start)
	b = AppendInt(b, r.Amount)
	b = AppendInt(b, r.Count)
	b = AppendTime(b, r.UpdatedAt)
	return AppendNullString(b, r.Checkpoint)
}

// EntryRow appends r as a ledger_entries row.
func EntryRow(b []byte, r driver.EntryRow) []byte {
	b = AppendString(b, r.Topic)
	b = AppendInt(b, int64(r.Partition))
	b = AppendInt(b, r.Offset)
	b = AppendString(b, r.EventID)
	b = AppendString(b, r.Account)
	b = AppendString(b, r.Currency)
	b = AppendInt(b, r.Amount)
	b = AppendTime(b, r.OccurredAt)
	b = AppendTime(b, r.WindowStart)
	b = AppendBool(b, r.Late)
	b = AppendString(b, r.Checkpoint)
	b = AppendTime(b, r.CreatedAt)
	b = AppendInt(b, int64(r.Kind))
	return AppendInt(b, r.Revision)
}

// Update is the change of one row of a sums table: op c when it had no
// row before (before nil), u otherwise.
func Update(t TableID, before, after []byte) Change {
	if before == nil {
		return Change{Table: t, Op: OpCreate, After: after}
	}
	return Change{Table: t, Op: OpUpdate, Before: before, After: after}
}
