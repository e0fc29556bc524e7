package publisher

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/txsink/driver"
)

// entryTable is a server whose ledger_entries hold rows (sorted by key),
// and no other table.
type entryTable struct {
	noRows
	rows []driver.EntryRow
}

func (e entryTable) ScanEntries(_ context.Context, after *driver.EntryKey, limit int) ([]driver.EntryRow, error) {
	var out []driver.EntryRow
	for _, r := range e.rows {
		k := driver.EntryKey{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Kind: r.Kind}
		if after == nil || cmp.Or(strings.Compare(k.Topic, after.Topic), cmp.Compare(k.Partition, after.Partition),
			cmp.Compare(k.Offset, after.Offset), cmp.Compare(k.Kind, after.Kind)) > 0 {
			out = append(out, r)
		}
	}
	return out[:min(len(out), limit)], nil
}

// The snapshot of ledger_entries resumes after a version's retraction at
// its position, not before it: the position it stores (as progress, in
// JSON) names the entry's kind, so the addition beside the retraction is
// read once, and the retraction once.
func TestSnapshotOfEntriesResumesWithinAPosition(t *testing.T) {
	var rows []driver.EntryRow
	for _, k := range []struct {
		offset int64
		kind   driver.EntryKind
	}{{5, driver.EntryEvent}, {6, driver.EntryRetraction}, {6, driver.EntryAddition}, {7, driver.EntryEvent}} {
		rows = append(rows, driver.EntryRow{Topic: "billing", Entry: driver.Entry{Partition: 1, Offset: k.offset, Kind: k.kind, EventID: "e", Account: "a", Currency: "EUR"}})
	}
	sp := SnapshotPos{Table: changelog.LedgerEntries}
	var got []string
	for range 10 {
		scanned, last, err := scanChunk(context.Background(), entryTable{rows: rows}, sp, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(scanned) == 0 {
			break
		}
		got = append(got, fmt.Sprintf("%d/%d", last.Offset, last.Entry))
		// As the progress record keeps it.
		sp.After = last
		b, _ := json.Marshal(sp)
		if err := json.Unmarshal(b, &sp); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"5/0", "6/1", "6/2", "7/0"}; !slices.Equal(got, want) {
		t.Errorf("read %v, want %v", got, want)
	}
}
