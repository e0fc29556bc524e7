package pipeline

import (
	"time"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink/driver"
)

// What the checkpoint writes, as the store's rows (package driver): the
// aggregation's keys and totals, the dedup operator's keys and the counted
// events become plain values the driver writes in its statements.

func (k balanceKey) row() driver.BalanceKey {
	return driver.BalanceKey{Account: k.account, Currency: k.currency}
}

func (k windowKey) row() driver.WindowKey {
	return driver.WindowKey{Account: k.account, Currency: k.currency, Start: time.Unix(k.start, 0).UTC()}
}

func toBalances(rows []balanceRow) []driver.Balance {
	out := make([]driver.Balance, len(rows))
	for i, r := range rows {
		out[i] = driver.Balance{BalanceKey: r.balanceKey.row(), Amount: r.amount, Count: r.count, Absolute: r.absolute, New: r.insert}
	}
	return out
}

func toWindows(rows []windowRow) []driver.WindowSum {
	out := make([]driver.WindowSum, len(rows))
	for i, r := range rows {
		out[i] = driver.WindowSum{WindowKey: r.windowKey.row(), Amount: r.amount, Count: r.count, Absolute: r.absolute, New: r.insert}
	}
	return out
}

func toDedupKeys(ins []dedup.Insert) []driver.DedupKey {
	out := make([]driver.DedupKey, len(ins))
	for i, in := range ins {
		out[i] = driver.DedupKey{ID: in.ID, Fingerprint: in.Fingerprint, ExpiresAt: in.ExpiresAt, Version: in.Version}
	}
	return out
}

// entryOf is a ledger entry to write: a counted record, of its kind (a
// version's retraction or addition, or the event itself).
type entryOf struct {
	r    *record
	kind driver.EntryKind
}

// toEntries are the ledger_entries rows of counted events and of
// versions' changes: a retraction at the position of the version that
// made it, with the counted version's account, currency, window and
// revision, and its amount negated (countVersions refuses one whose
// amount has no negation).
func toEntries(period event.Windows, es []entryOf) []driver.Entry {
	out := make([]driver.Entry, len(es))
	for i, e := range es {
		r := e.r
		amount := r.ev.AmountMinor
		if r.retract {
			amount = -amount
		}
		out[i] = driver.Entry{Partition: r.partition, Offset: r.offset, Kind: e.kind, EventID: r.ev.EventID, Account: r.ev.AccountID, Currency: r.ev.Currency,
			Amount: amount, OccurredAt: r.ev.OccurredAt, WindowStart: period.Start(r.ev.OccurredAt), Late: r.late, Revision: r.ev.Revision}
	}
	return out
}
