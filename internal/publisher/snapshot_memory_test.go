package publisher

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/driver"
)

// changedWindows is a ledger of one server whose billing_windows holds
// keys windows (a-00000000, a-00000001, ...) and whose outbox, since the
// enabling (checkpoint 1), changed every one of them: checkpoints of rows
// of perRow changes, keys in a scattered order (key i*stride mod keys), so
// that the keys ahead of the scan arrive in no order. A key's first change
// has before amount 1 (the row at the enabling), every tenth key is
// changed again later (before amount 2), every seventh was created since
// (before null); the table holds amount 3. Rows are generated as read.
type changedWindows struct {
	keys, perRow, rowsPer int
	at                    time.Time
	outboxReads           int
	noRows
}

func (w *changedWindows) checkpoints() int {
	return (w.keys+w.perRow*w.rowsPer-1)/(w.perRow*w.rowsPer) + 1 // the last: the second changes
}

func (w *changedWindows) win(b []byte, i, amount int) []byte {
	return changelog.WindowRow(b, driver.WindowRow{WindowKey: driver.WindowKey{Account: account(i), Currency: "EUR", Start: w.at},
		Amount: int64(amount), Count: int64(amount), UpdatedAt: w.at})
}

// account is the i-th account, a-00000000 on: their order is i's.
func account(i int) string {
	var b [10]byte
	b[0], b[1] = 'a', '-'
	for j := 9; j >= 2; j-- {
		b[j] = byte('0' + i%10)
		i /= 10
	}
	return string(b[:])
}

func (w *changedWindows) Changelog(context.Context) (driver.ChangelogState, error) {
	return driver.ChangelogState{On: true, From: 1, Snapshot: true}, nil
}
func (w *changedWindows) LeaseChangelog(context.Context, string, time.Duration) (bool, error) {
	return true, nil
}
func (w *changedWindows) ChangelogPublished(context.Context, int64) error { return nil }
func (w *changedWindows) Commits(_ context.Context, from int64, _ bool, limit int) ([]driver.CommitRecord, error) {
	var out []driver.CommitRecord
	for s := from; s <= int64(w.checkpoints()) && len(out) < limit; s++ {
		out = append(out, driver.CommitRecord{Seq: s, Gtrid: "g" + strconv.FormatInt(s, 10), CommittedAt: w.at, Applied: true})
	}
	return out, nil
}
func (w *changedWindows) CommitPosition(context.Context) (driver.CommitPosition, error) {
	n := int64(w.checkpoints())
	return driver.CommitPosition{Visible: n, Decided: n, RetainedFrom: 1}, nil
}
func (w *changedWindows) OutboxIndex(_ context.Context, gtrids []string) ([]driver.OutboxChunk, error) {
	var out []driver.OutboxChunk
	for _, g := range gtrids {
		for i := range w.rowsPer {
			out = append(out, driver.OutboxChunk{Checkpoint: g, Chunk: i, Events: w.perRow})
		}
	}
	return out, nil
}
func (w *changedWindows) ReadOutbox(_ context.Context, chunks []driver.OutboxChunk) ([][]byte, error) {
	const stride = 7919 // prime, coprime with the tests' key counts
	out := make([][]byte, len(chunks))
	var before, after []byte
	for n, c := range chunks {
		w.outboxReads++
		seq, _ := strconv.Atoi(strings.TrimPrefix(c.Checkpoint, "g"))
		b := changelog.NewBlob(nil)
		for j := range w.perRow {
			pos := ((seq-1)*w.rowsPer+c.Chunk)*w.perRow + j
			if seq == w.checkpoints() { // the second changes
				if i := pos * 10; i < w.keys {
					before, after = w.win(before[:0], i, 2), w.win(after[:0], i, 3)
					b = changelog.AppendRecord(b, changelog.Update(changelog.TWindows, before, after))
				}
				continue
			}
			if pos >= w.keys {
				break
			}
			i := pos * stride % w.keys
			before = w.win(before[:0], i, 1)
			if i%7 == 0 {
				before = nil
			}
			after = w.win(after[:0], i, 2)
			if i%10 != 0 {
				after = w.win(after[:0], i, 3)
			}
			b = changelog.AppendRecord(b, changelog.Update(changelog.TWindows, before, after))
		}
		out[n] = b
	}
	return out, nil
}
func (w *changedWindows) DeleteOutbox(context.Context, []string) (int64, error) { return 0, nil }
func (w *changedWindows) ScanWindows(_ context.Context, after *driver.WindowKey, limit int) ([]driver.WindowRow, error) {
	from := 0
	if after != nil {
		n, _ := strconv.Atoi(strings.TrimPrefix(after.Account, "a-"))
		from = n + 1
	}
	var out []driver.WindowRow
	for i := from; i < w.keys && len(out) < limit; i++ {
		out = append(out, driver.WindowRow{WindowKey: driver.WindowKey{Account: account(i), Currency: "EUR", Start: w.at},
			Amount: 3, Count: 3, UpdatedAt: w.at})
	}
	return out, nil
}

// The snapshot of a table of which millions of keys changed since the
// enabling, every one ahead of the scan when it starts: the outbox's
// index holds at most CHANGELOG_SNAPSHOT_INDEX_BYTES (64 MiB, the
// default), counted per key (entryCost) and measured on the heap, where
// holding every key's first before-image took 233 MiB per million keys;
// and every key's r event is still its first change's before (none for a
// key created since), the outbox read again from the enabling each time
// the scan passes what the index holds. Of the millions, the outbox is
// read once and the first chunks checked; the smaller ledger is read to
// its end, the outbox read again many times.
func TestSnapshotIndexIsBounded(t *testing.T) {
	for _, c := range []struct {
		name        string
		keys, bound int
		chunks      int // of 10,000 rows read (0: the whole table)
	}{
		{"millions", 3_000_000, 64 << 20, 10},
		{"whole", 200_000, 4 << 20, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if testing.Short() && c.keys > 1_000_000 {
				c.keys, c.bound = c.keys/10, c.bound/8
			}
			snapshotChangedWindows(t, c.keys, c.bound, c.chunks)
		})
	}
}

func snapshotChangedWindows(t *testing.T, keys, bound, chunks int) {
	w := &changedWindows{keys: keys, perRow: 1000, rowsPer: 50, at: time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)}
	p := New(Config{MaxEvents: 20_000, Lease: time.Minute, SnapshotIndexBytes: bound, Logger: testenv.Logger()}, w, []Server{w})
	ctx := context.Background()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, peak := ms.HeapAlloc, ms.HeapAlloc
	f := newFirsts(1, p.cfg.SnapshotIndexBytes)
	sp := &SnapshotPos{Table: changelog.BillingWindows}
	tw, _ := changelog.Lookup(changelog.BillingWindows)
	reads, want, started := 0, 0, time.Now()
	for n := 0; sp != nil && sp.Table == changelog.BillingWindows && (chunks == 0 || n < chunks); n++ {
		changes, next, err := p.snapshotChunk(ctx, f, *sp, 10_000)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range changes {
			if c.Table != changelog.TWindows {
				continue
			}
			v, err := changelog.DecodeRow(tw, c.After, nil)
			if err != nil {
				t.Fatal(err)
			}
			i, _ := strconv.Atoi(strings.TrimPrefix(string(v[0].S), "a-"))
			for want%7 == 0 {
				want++ // created since the enabling: no r event
			}
			if i != want {
				t.Fatalf("r event of key %d, want %d: a key missed, read twice or created since", i, want)
			}
			if v[3].I != 1 {
				t.Fatalf("key %d: r event of amount %d, want 1 (its first change's before)", i, v[3].I)
			}
			want++
			reads++
		}
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapAlloc)
		sp = next
	}
	if chunks == 0 && want < keys {
		t.Errorf("%d r events, the last of key %d, want every key to %d but the ones created since", reads, want-1, keys-1)
	}
	if chunks == 0 && f.reads < 2 {
		t.Errorf("the outbox was read %d times: the scan never passed the index", f.reads)
	}
	if f.peak > bound+1024 {
		t.Errorf("the index held %d bytes, bound %d", f.peak, bound)
	}
	if grew := peak - base; grew > uint64(3*bound+64<<20) {
		t.Errorf("the heap grew by %d MiB while the index was bounded by %d MiB", grew>>20, bound>>20)
	}
	// What the index retains, garbage collected: about what it counts.
	runtime.GC()
	runtime.ReadMemStats(&ms)
	retained := int64(ms.HeapAlloc) - int64(base)
	if retained > int64(bound+16<<20) {
		t.Errorf("the index retains %d MiB on the heap, bound %d MiB", retained>>20, bound>>20)
	}
	t.Logf("%d keys changed: %d r events to key %d, index peak %d MiB (bound %d MiB) holding %d keys (%d MiB retained), heap peak +%d MiB, outbox read %d times (%d rows) in %s",
		keys, reads, want-1, f.peak>>20, bound>>20, len(f.before), retained>>20, (peak-base)>>20, f.reads, w.outboxReads, time.Since(started).Round(time.Millisecond))
	runtime.KeepAlive(f)
}
