package pipeline

import (
	"time"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The checkpoint's changelog (docs/changelog.md): with
// Config.Changelog every key the checkpoint changes was read under a row
// lock first (seeded), so each participant knows the row before and
// writes the row after as an absolute value (or inserts it); its changes
// go to the outbox in the same branch (executor.write). Computed without
// I/O from the seeded rows, the work's rows and the checkpoint's time.

// images are the stored rows a checkpoint's seeding read: the before
// images of its changes.
type images struct {
	balances map[balanceKey]driver.BalanceRow
	windows  map[windowKey]driver.WindowRow
	adjusts  map[windowKey]driver.AdjustmentRow
}

// A row the seeding created (beside other instances: lockOrder) has no
// before image: its change is a create, as when the checkpoint inserts it.
func newImages(seeded []seededSums) images {
	im := images{balances: map[balanceKey]driver.BalanceRow{}, windows: map[windowKey]driver.WindowRow{}, adjusts: map[windowKey]driver.AdjustmentRow{}}
	for _, s := range seeded {
		for _, b := range s.balances {
			im.balances[balanceKey{b.Account, b.Currency}] = b
		}
		for _, w := range s.windows {
			im.windows[windowKey{w.Account, w.Currency, w.Start.Unix()}] = w
		}
		for _, a := range s.adjusts {
			im.adjusts[windowKey{a.Account, a.Currency, a.Start.Unix()}] = a
		}
		for _, k := range s.created.balances {
			delete(im.balances, balanceKey{k.Account, k.Currency})
		}
		for _, k := range s.created.windows {
			delete(im.windows, windowKey{k.Account, k.Currency, k.Start.Unix()})
		}
		for _, k := range s.created.adjusts {
			delete(im.adjusts, windowKey{k.Account, k.Currency, k.Start.Unix()})
		}
	}
	return im
}

// rowChanges are the changes of one participant's rows, written by the
// checkpoint gtrid at now (the instant as DATETIME(6) keeps it) for the
// source topic: a sums row's after is its before (or a new row) with the
// checkpoint's sums, counts and time; a ledger entry is created, unless
// it was stored already (kept: a replay of the topic after
// ALLOW_GROUP_CHANGE counts an event again at the same position), when the
// stored row stays as it was and nothing changed.
func rowChanges(w *work, im *images, kept []driver.EntryKey, gtrid, topic string, now time.Time) []changelog.Change {
	var stored map[driver.EntryKey]bool
	if len(kept) > 0 {
		stored = make(map[driver.EntryKey]bool, len(kept))
		for _, k := range kept {
			stored[k] = true
		}
	}
	out := make([]changelog.Change, 0, len(w.balances)+len(w.windows)+len(w.adjusts)+len(w.entries))
	for _, r := range w.balances {
		k := balanceKey{r.Account, r.Currency}
		after := driver.BalanceRow{BalanceKey: r.BalanceKey, Amount: r.Amount, Count: r.Count, UpdatedAt: now}
		var before []byte
		if old, ok := im.balances[k]; ok {
			before = changelog.BalanceRow(nil, old)
		}
		out = append(out, changelog.Update(changelog.TBalances, before, changelog.BalanceRow(nil, after)))
	}
	for _, r := range w.windows {
		k := windowKey{r.Account, r.Currency, r.Start.Unix()}
		after := driver.WindowRow{WindowKey: r.WindowKey, Amount: r.Amount, Count: r.Count, UpdatedAt: now}
		var before []byte
		if old, ok := im.windows[k]; ok {
			before, after.ClosedAt = changelog.WindowRow(nil, old), old.ClosedAt
		}
		out = append(out, changelog.Update(changelog.TWindows, before, changelog.WindowRow(nil, after)))
	}
	for _, r := range w.adjusts {
		k := windowKey{r.Account, r.Currency, r.Start.Unix()}
		after := driver.AdjustmentRow{WindowKey: r.WindowKey, Amount: r.Amount, Count: r.Count, UpdatedAt: now, Checkpoint: gtrid}
		var before []byte
		if old, ok := im.adjusts[k]; ok {
			before = changelog.AdjustmentRow(nil, old)
		}
		out = append(out, changelog.Update(changelog.TAdjustments, before, changelog.AdjustmentRow(nil, after)))
	}
	for _, e := range w.entries {
		if stored[driver.EntryKey{Topic: topic, Partition: e.Partition, Offset: e.Offset, Kind: e.Kind}] {
			continue
		}
		e.OccurredAt, e.WindowStart = e.OccurredAt.UTC().Truncate(time.Microsecond), e.WindowStart.UTC()
		row := driver.EntryRow{Topic: topic, Entry: e, Checkpoint: gtrid, CreatedAt: now}
		out = append(out, changelog.Change{Table: changelog.TEntries, Op: changelog.OpCreate, After: changelog.EntryRow(nil, row)})
	}
	return out
}

// sealChanges are the changes of the rows a participant sealed (as they
// were before): closed_at and updated_at become now; and each sealed row
// once more, as the closed_windows event (op c) of its window.
func sealChanges(sealed []driver.WindowRow, now time.Time) []changelog.Change {
	out := make([]changelog.Change, 0, 2*len(sealed))
	for _, r := range sealed {
		after := r
		after.ClosedAt, after.UpdatedAt = now, now
		row := changelog.WindowRow(nil, after)
		out = append(out, changelog.Update(changelog.TWindows, changelog.WindowRow(nil, r), row),
			changelog.Change{Table: changelog.TClosedWindows, Op: changelog.OpCreate, After: row})
	}
	return out
}

// pack packs changes into outbox blobs of at most the bound a row of the
// branch's server takes.
func pack(changes []changelog.Change, budget int) changelog.Pack {
	p := changelog.Pack{Max: driver.MaxOutboxBlob(budget)}
	for _, c := range changes {
		p.Add(c)
	}
	p.Compress()
	return p
}
