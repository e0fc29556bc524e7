package publisher

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The snapshot's order: every table of a server, then the next server,
// then done.
func TestSnapshotOrder(t *testing.T) {
	var got []SnapshotPos
	for sp := snapshotStart(); sp != nil; sp = nextTable(*sp, 2) {
		if err := validSnapshot(*sp, 2); err != nil {
			t.Fatal(err)
		}
		got = append(got, *sp)
	}
	var want []SnapshotPos
	for s := range 2 {
		for _, tb := range snapshotTables {
			want = append(want, SnapshotPos{Server: s, Table: tb})
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("order %+v, want %+v", got, want)
	}
	for _, bad := range []SnapshotPos{{Server: 2, Table: changelog.AccountBalances}, {Server: -1, Table: changelog.AccountBalances},
		{Table: changelog.ClosedWindows}, {Table: "dead_letters"}} {
		if validSnapshot(bad, 2) == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// A snapshot chunk's events: a row the outbox has no change of since the
// enabling as read; a row changed since as its first change's before; a
// row created since, none; an entry written since, none; a window sealed
// as of the enabling, also its closed_windows event (and not one sealed
// since); each key is looked up once.
func TestSnapshotChanges(t *testing.T) {
	at := time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)
	win := func(acct string, amount int64, sealed bool) []byte {
		r := driver.WindowRow{WindowKey: driver.WindowKey{Account: acct, Currency: "EUR", Start: at}, Amount: amount, Count: amount, UpdatedAt: at}
		if sealed {
			r.ClosedAt = at.Add(time.Hour)
		}
		return changelog.WindowRow(nil, r)
	}
	tw, _ := changelog.Lookup(changelog.BillingWindows)
	rows := func(raws ...[]byte) []scanned {
		var out []scanned
		for _, r := range raws {
			out = append(out, scanned{Raw: r, Key: rowKey(t, 0, tw, r)})
		}
		return out
	}
	f := newFirsts(5, 1<<20)
	f.at = posKey(SnapshotPos{Table: changelog.BillingWindows})
	for _, c := range []changelog.Change{
		changelog.Update(changelog.TWindows, win("changed", 10, false), win("changed", 11, false)),
		changelog.Update(changelog.TWindows, win("changed", 11, false), win("changed", 12, true)), // not the first: ignored
		changelog.Update(changelog.TWindows, nil, win("created", 1, false)),
		changelog.Update(changelog.TWindows, win("sealed-since", 3, false), win("sealed-since", 3, true)),
		changelog.Update(changelog.TBalances, nil, changelog.BalanceRow(nil, driver.BalanceRow{BalanceKey: driver.BalanceKey{Account: "other", Currency: "EUR"}})),
	} {
		if err := f.add(0, c); err != nil {
			t.Fatal(err)
		}
	}
	got, err := snapshotChanges(tw, rows(win("as-read", 7, true), win("changed", 12, true), win("created", 1, false), win("sealed-since", 3, true)), f)
	if err != nil {
		t.Fatal(err)
	}
	want := []changelog.Change{
		{Table: changelog.TWindows, Op: changelog.OpRead, After: win("as-read", 7, true)},
		{Table: changelog.TClosedWindows, Op: changelog.OpRead, After: win("as-read", 7, true)},
		{Table: changelog.TWindows, Op: changelog.OpRead, After: win("changed", 10, false)},
		{Table: changelog.TWindows, Op: changelog.OpRead, After: win("sealed-since", 3, false)},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("changes:\n%v\nwant\n%v", got, want)
	}
	if len(f.before) != 0 || f.bytes != 0 {
		t.Errorf("%d keys (%d bytes) still held after their rows were read", len(f.before), f.bytes)
	}

	// Keys the scan has passed are not kept (their r events are out): the
	// held images are only of keys ahead, in the tables' key order, and
	// of this server's tables after this one or the next server's.
	fa := newFirsts(5, 1<<20)
	fa.at = posKey(SnapshotPos{Server: 1, Table: changelog.BillingWindows, After: &RowKey{Account: "m", Currency: "EUR", Start: at}})
	for _, acct := range []string{"a", "m", "mm", "z", "M", "m\x00"} {
		if err := fa.add(1, changelog.Update(changelog.TWindows, win(acct, 1, false), win(acct, 2, false))); err != nil {
			t.Fatal(err)
		}
	}
	earlier := changelog.WindowRow(nil, driver.WindowRow{WindowKey: driver.WindowKey{Account: "m", Currency: "EUR", Start: at.Add(-time.Hour)}, UpdatedAt: at})
	later := changelog.WindowRow(nil, driver.WindowRow{WindowKey: driver.WindowKey{Account: "m", Currency: "EUR", Start: at.Add(time.Hour)}, UpdatedAt: at})
	for _, raw := range [][]byte{earlier, later} {
		if err := fa.add(1, changelog.Update(changelog.TWindows, nil, raw)); err != nil {
			t.Fatal(err)
		}
	}
	balance := func(acct string) []byte {
		return changelog.BalanceRow(nil, driver.BalanceRow{BalanceKey: driver.BalanceKey{Account: acct, Currency: "EUR"}, UpdatedAt: at})
	}
	for s, acct := range []string{"server-0", "server-1", "server-2"} {
		if err := fa.add(s, changelog.Update(changelog.TBalances, nil, balance(acct))); err != nil {
			t.Fatal(err)
		}
	}
	tb, _ := changelog.Lookup(changelog.AccountBalances)
	wantHeld := []string{rowKey(t, 1, tw, later), rowKey(t, 1, tw, win("m\x00", 2, false)), rowKey(t, 1, tw, win("mm", 2, false)),
		rowKey(t, 1, tw, win("z", 2, false)), rowKey(t, 2, tb, balance("server-2"))}
	var held []string
	for k := range fa.before {
		held = append(held, k)
	}
	slices.Sort(held)
	if !reflect.DeepEqual(held, wantHeld) {
		t.Errorf("held %q,\nwant the keys after m/EUR/%s only: m's later window, m\\x00, mm, z, server 2's balance %q", held, at, wantHeld)
	}

	te, _ := changelog.Lookup(changelog.LedgerEntries)
	entry := func(off int64, cp string) scanned {
		raw := changelog.EntryRow(nil, driver.EntryRow{Topic: "billing", Entry: driver.Entry{Offset: off, EventID: "e", Account: "a",
			Currency: "EUR", OccurredAt: at, WindowStart: at}, Checkpoint: cp, CreatedAt: at})
		return scanned{Raw: raw, Checkpoint: cp}
	}
	fe := newFirsts(5, 1<<20)
	fe.gtrids["since"] = true
	got, err = snapshotChanges(te, []scanned{entry(1, "before"), entry(2, "since")}, fe)
	if err != nil || len(got) != 1 || !reflect.DeepEqual(got[0].After, entry(1, "before").Raw) {
		t.Errorf("entries: %v, %v; want only the one written before the enabling", got, err)
	}
}

// rowKey is the sortKey of raw, a row of t on server.
func rowKey(t *testing.T, server int, tb changelog.Table, raw []byte) string {
	t.Helper()
	v, err := changelog.DecodeRow(tb, raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	return string(sortKey(nil, server, tb.ID, v[0].S, v[1].S, v[2].I, tb.ID != changelog.TBalances))
}
