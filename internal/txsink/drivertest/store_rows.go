package drivertest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/txsink/driver"
)

// identifiers are strings the decoder accepts as event and account ids
// that a text column would take for equal or mangle: case, trailing
// spaces, Unicode normalisation, characters beyond the BMP, and random
// mixes of them.
func identifiers(r *rand.Rand, n, maxBytes int) []string {
	out := []string{"a", "A", "a ", "a  ", " a", "ä", "a\u0308", "ß", "ss", "😀", "\u00a0a", "e\u0301"}
	pieces := []string{"a", "A", " ", "ä", "a\u0308", "😀", "ß", "\u200b", "z", "\u00ff", "ÿ"}
	seen := map[string]bool{}
	for _, s := range out {
		seen[s] = true
	}
	for len(out) < n {
		var b strings.Builder
		for k := 1 + r.IntN(8); k > 0; k-- {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		if s := b.String(); len(s) <= maxBytes && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// Property (bytes, not text): identifiers that differ in any byte are
// distinct rows and read back exactly as written, in every table that
// keys by them; record keys and payloads of any bytes round-trip; a
// detail that is not valid UTF-8 is stored as valid UTF-8.
func testCharsets(t *testing.T, ctx context.Context, f Fixture) {
	r := rand.New(rand.NewPCG(19, 5))
	accounts := identifiers(r, 40, 64)
	events := identifiers(r, 40, 128)
	now := clock()
	var bals []driver.Balance
	var wins []driver.WindowSum
	var entries []driver.Entry
	var ks []driver.DedupKey
	var letters []driver.DeadLetter
	for i, a := range accounts {
		bals = append(bals, balance(a, int64(i+1), 1, false))
		wins = append(wins, driver.WindowSum{WindowKey: driver.WindowKey{Account: a, Currency: "EUR", Start: now.Truncate(time.Hour)}, Amount: int64(i + 1), Count: 1})
		entries = append(entries, driver.Entry{Partition: 0, Offset: int64(i), EventID: events[i], Account: a, Currency: "EUR", Amount: 1, OccurredAt: now, WindowStart: now})
		ks = append(ks, driver.DedupKey{ID: events[i], ExpiresAt: now})
		junk := []byte{0, 0xff, '\'', '"', '\\', '\n', 0xc3, byte(i)}
		letters = append(letters, driver.DeadLetter{Partition: 0, Offset: int64(i), Reason: "invalid_json", Detail: "bad \xff\xfe " + a,
			EventID: events[i], Key: junk, Payload: append(junk, a...), Size: 100 + i, SHA256: sha256.Sum256([]byte(a))})
	}
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		_, err := tx.ClaimKeys(ctx, 0, ks)
		return errors.Join(err, tx.WriteBalances(ctx, bals, now), tx.WriteWindows(ctx, wins, now),
			noKept(tx.WriteEntries(ctx, "t", "c", entries, now)), tx.WriteDeadLetters(ctx, "t", "c", letters, now))
	})
	tb := tables(t, ctx, f)
	if len(tb.Balances) != len(accounts) || len(tb.Windows) != len(accounts) || len(tb.Entries) != len(accounts) || len(tb.Keys[0]) != len(events) {
		t.Fatalf("%d balances, %d windows, %d entries, %d keys for %d distinct identifiers: some were taken for equal",
			len(tb.Balances), len(tb.Windows), len(tb.Entries), len(tb.Keys[0]), len(accounts))
	}
	amount := map[string]int64{}
	for i, a := range accounts {
		amount[a] = int64(i + 1)
	}
	for _, b := range tb.Balances {
		if amount[b.Account] != b.Amount {
			t.Errorf("balance of %q is %d, want %d: the identifier did not round-trip", b.Account, b.Amount, amount[b.Account])
		}
	}
	for _, w := range tb.Windows {
		if amount[w.Account] != w.Amount {
			t.Errorf("window of %q is %d, want %d", w.Account, w.Amount, amount[w.Account])
		}
	}
	for _, e := range tb.Entries {
		if e.Account != accounts[e.Offset] || e.EventID != events[e.Offset] {
			t.Errorf("entry %d is %q/%q, want %q/%q", e.Offset, e.Account, e.EventID, accounts[e.Offset], events[e.Offset])
		}
	}
	for _, d := range tb.DeadLetters {
		want := letters[d.Offset]
		if !bytes.Equal(d.Key, want.Key) || !bytes.Equal(d.Payload, want.Payload) || d.EventID != want.EventID || d.SHA256 != want.SHA256 || d.Size != want.Size {
			t.Errorf("dead letter %d: key %q payload %q id %q, want %q %q %q", d.Offset, d.Key, d.Payload, d.EventID, want.Key, want.Payload, want.EventID)
		}
		if d.Detail != strings.ToValidUTF8(want.Detail, "?") {
			t.Errorf("dead letter %d: detail %q, want %q", d.Offset, d.Detail, strings.ToValidUTF8(want.Detail, "?"))
		}
	}
}

// logUniform picks an int in [lo, hi] with every power of two as likely.
func logUniform(r *rand.Rand, lo, hi int) int {
	f := float64(lo) * math.Exp2(r.Float64()*math.Log2(float64(hi)/float64(lo)))
	return min(hi, max(lo, int(f)))
}

// Property (statement sizes): on servers of generated max_allowed_packet
// sizes, the budget is half the packet, and every write of rows at the
// largest legal size (the longest ids, accounts, keys and a payload
// prefix as long as the server allows) succeeds whatever their number:
// every statement stays within the packet.
func testPacketSizes(t *testing.T, ctx context.Context, f Fixture) {
	r := rand.New(rand.NewPCG(19, 1))
	packets := []int{stmt.MinPacket, 512 << 10, logUniform(r, stmt.MinPacket, 2<<20)}
	for i, packet := range packets {
		t.Run(fmt.Sprint(packet), func(t *testing.T) {
			g := f.Packet(t, packet)
			if b := g.Store.MaxStatementBytes(); b != stmt.Budget(packet) {
				t.Fatalf("budget %d for max_allowed_packet %d, want %d", b, packet, stmt.Budget(packet))
			}
			n := 1 + packet/100 // rows for several statements of each kind
			now := clock()
			var ks []driver.DedupKey
			var bals []driver.Balance
			var entries []driver.Entry
			for j := range n {
				id := fmt.Sprintf("%d-%0125d", i, j)
				account := fmt.Sprintf("%d-%061d", i, j)
				ks = append(ks, driver.DedupKey{ID: id, ExpiresAt: now})
				bals = append(bals, balance(account, 1, 1, false))
				entries = append(entries, driver.Entry{Partition: int32(i), Offset: int64(j), EventID: id, Account: account, Currency: "EUR", OccurredAt: now, WindowStart: now})
			}
			big := bytes.Repeat([]byte{'\''}, 2*packet)
			letters := []driver.DeadLetter{{Partition: int32(i), Offset: 0, Reason: "payload_too_large", Payload: big, Key: big[:2000], Size: len(big)},
				{Partition: int32(i), Offset: 1, Reason: "payload_too_large", Payload: big[:10], Size: 10}}
			commit(t, ctx, g, func(tx driver.StoreTx) error {
				_, err := tx.ClaimKeys(ctx, 0, ks)
				return errors.Join(err, tx.WriteBalances(ctx, bals, now),
					noKept(tx.WriteEntries(ctx, "t", "c", entries, now)), tx.WriteDeadLetters(ctx, "t", "c", letters, now))
			})
			found, err := g.Store.LookupKeys(ctx, 0, idsOf(ks))
			must(t, err)
			if len(found) != n {
				t.Fatalf("looked up %d of %d keys", len(found), n)
			}
		})
	}
}

// Property (dead letters of any size): whatever the packet and
// the value's size, a dead letter is written, its payload a prefix of the
// value of at least a quarter of the packet less 4 KiB (or the whole value
// when shorter), its size and hash those of the whole value.
func testDeadLetterSizes(t *testing.T, ctx context.Context, f Fixture) {
	r := rand.New(rand.NewPCG(18, 7))
	for _, packet := range []int{stmt.MinPacket, 1 << 20, logUniform(r, stmt.MinPacket, 4<<20)} {
		t.Run(fmt.Sprint(packet), func(t *testing.T) {
			g := f.Packet(t, packet)
			cut := packet/4 - 4096
			pattern := []byte{0, '\'', '"', '\\', '\n', '\r', 0x1a, 0xff}
			var letters []driver.DeadLetter
			var values [][]byte
			for i, size := range []int{0, 1, cut - 1, cut, cut + 1, packet / 2, packet, 3 * packet, logUniform(r, 1, 4*packet)} {
				v := bytes.Repeat(pattern, size/len(pattern)+1)[:size]
				values = append(values, v)
				letters = append(letters, driver.DeadLetter{Partition: 9, Offset: int64(packet + i), Reason: "payload_too_large",
					Detail: strings.Repeat("é", 600), EventID: strings.Repeat("x", 200), Key: bytes.Repeat([]byte{0}, 3000),
					Payload: v, Size: len(v), SHA256: sha256.Sum256(v)})
			}
			commit(t, ctx, g, func(tx driver.StoreTx) error { return tx.WriteDeadLetters(ctx, "t", "c", letters, clock()) })
			var stored []driver.DeadLetterRow
			for _, d := range tables(t, ctx, g).DeadLetters {
				if d.Partition == 9 && d.Offset >= int64(packet) && d.Offset < int64(packet+len(letters)) {
					stored = append(stored, d)
				}
			}
			if len(stored) != len(letters) {
				t.Fatalf("%d of %d dead letters stored", len(stored), len(letters))
			}
			for _, d := range stored {
				v := values[d.Offset-int64(packet)]
				p := d.Payload
				if !bytes.Equal(p, v[:len(p)]) || len(p) < min(len(v), cut) || d.Size != len(v) || d.SHA256 != sha256.Sum256(v) {
					t.Errorf("a %d-byte value: stored %d bytes (a prefix: %v), size %d; want a prefix of at least %d", len(v), len(p), bytes.Equal(p, v[:len(p)]), d.Size, min(len(v), cut))
				}
				if len(d.Key) != driver.DeadLetterKeyBytes || len(d.EventID) != driver.DeadLetterEventIDBytes || len(d.Detail) > driver.DeadLetterDetailBytes {
					t.Errorf("key %d, event id %d, detail %d bytes: not cut to their columns", len(d.Key), len(d.EventID), len(d.Detail))
				}
			}
		})
	}
}

// Property (numbering): the ids of the dead letters one write stores
// ascend in the order of its rows, as InnoDB numbers the rows of a
// multi-row INSERT; a statement later in the write, higher ids.
func testDeadLetterOrder(t *testing.T, ctx context.Context, f Fixture) {
	var letters []driver.DeadLetter
	for i := range 64 {
		v := []byte(fmt.Sprint("letter ", i))
		letters = append(letters, driver.DeadLetter{Partition: 11, Offset: int64(1000 - i), Reason: "invalid_json", Payload: v, Size: len(v), SHA256: sha256.Sum256(v)})
	}
	commit(t, ctx, f, func(tx driver.StoreTx) error { return tx.WriteDeadLetters(ctx, "t", "c", letters, clock()) })
	var got []int64
	for _, d := range tables(t, ctx, f).DeadLetters { // in id order
		if d.Partition == 11 {
			got = append(got, d.Offset)
		}
	}
	want := make([]int64, len(letters))
	for i, d := range letters {
		want[i] = d.Offset
	}
	if !slices.Equal(got, want) {
		t.Fatalf("offsets in id order %v, want the order written %v", got, want)
	}
}

// Property (a limit that fell): a statement larger than the server's
// max_allowed_packet (an operator lowered it to 1 MiB since the budget was
// read) is refused: as TooLarge (error 1153; memdriver), or, as MariaDB
// 10.11 does with a statement this much over the limit, by dropping the
// connection while the client sends it (Transient). Once the limits are
// reread, the same write is cut to the new budget and succeeds.
func testTooLarge(t *testing.T, ctx context.Context, f Fixture) {
	if f.LowerPacket == nil {
		t.Skip("the harness cannot lower the server's max_allowed_packet")
	}
	const packet = 1 << 20
	big := bytes.Repeat([]byte{'x'}, packet+packet/4)
	letters := []driver.DeadLetter{{Partition: 0, Offset: 1, Reason: "payload_too_large", Payload: big, Size: len(big), SHA256: sha256.Sum256(big)}}
	f = f.LowerPacket(t, packet)
	b := open(t, ctx, f.Server)
	if err := b.tx().WriteDeadLetters(ctx, "t", "c", letters, clock()); code(f, err) != driver.TooLarge && code(f, err) != driver.Transient {
		t.Fatalf("a statement over the lowered limit: %v (%v), want TooLarge or a lost connection", err, code(f, err))
	}
	_ = b.end(false) // the connection may be gone
	must(t, f.Store.RefreshLimits(ctx))
	if got := f.Store.MaxStatementBytes(); got != stmt.Budget(packet) {
		t.Fatalf("budget %d after the refresh, want %d", got, stmt.Budget(packet))
	}
	commit(t, ctx, f, func(tx driver.StoreTx) error { return tx.WriteDeadLetters(ctx, "t", "c", letters, clock()) })
	if d := tables(t, ctx, f).DeadLetters; len(d) != 1 || len(d[0].Payload) < packet/4-4096 || !bytes.Equal(d[0].Payload, big[:len(d[0].Payload)]) {
		t.Fatalf("dead letters after the refresh: %d, want one with a prefix of at least %d bytes", len(d), packet/4-4096)
	}
}

func window(account string, start time.Time) driver.WindowSum {
	return driver.WindowSum{WindowKey: driver.WindowKey{Account: account, Currency: "EUR", Start: start}, Amount: 1, Count: 1}
}

// Property (sealing): SealWindows seals the open rows of the windows in
// [from, to) only, the latest window first, at most about max rows per
// call, says whether none is left, and leaves sealed rows as they were.
func testSealing(t *testing.T, ctx context.Context, f Fixture) {
	h0 := clock().Truncate(time.Hour).Add(-10 * time.Hour)
	var ws []driver.WindowSum
	for h := range 5 {
		for a := range 3 {
			ws = append(ws, window(fmt.Sprintf("acct-%d", a), h0.Add(time.Duration(h)*time.Hour)))
		}
	}
	commit(t, ctx, f, func(tx driver.StoreTx) error { return tx.WriteWindows(ctx, ws, h0) })
	first, second := h0.Add(20*time.Hour), h0.Add(21*time.Hour)
	// Windows h0+1h .. h0+3h: 9 rows; 4 per call, the latest first.
	var n int
	var done bool
	seal := func(tx driver.StoreTx, from, to time.Time, max int, now time.Time) error {
		rows, d, err := tx.SealWindows(ctx, from, to, max, now)
		n, done = len(rows), d
		// The rows as they were: the changelog's before images.
		for _, r := range rows {
			if want := (driver.WindowRow{WindowKey: r.WindowKey, Amount: 1, Count: 1, UpdatedAt: h0}); !sameWindow(r, want) ||
				r.Start.Before(from) || !r.Start.Before(to) {
				t.Errorf("sealing [%s, %s) returned %+v, want the open row %+v", from, to, r, want)
			}
		}
		return err
	}
	commit(t, ctx, f, func(tx driver.StoreTx) error { return seal(tx, h0.Add(time.Hour), h0.Add(4*time.Hour), 4, first) })
	sealedAt := func() map[time.Time]int {
		out := map[time.Time]int{}
		for _, w := range tables(t, ctx, f).Windows {
			if !w.ClosedAt.IsZero() {
				out[w.Start]++
				if !w.UpdatedAt.Equal(w.ClosedAt) {
					t.Errorf("sealed row %+v: updated_at is not closed_at", w)
				}
			}
		}
		return out
	}
	if got := sealedAt(); n != 4 || done || got[h0.Add(3*time.Hour)] != 3 || got[h0.Add(2*time.Hour)] != 1 || len(got) != 2 {
		t.Fatalf("first call sealed %d (done %v): %v; want the 3 rows of the latest window and 1 of the one before", n, done, got)
	}
	commit(t, ctx, f, func(tx driver.StoreTx) error { return seal(tx, h0.Add(time.Hour), h0.Add(4*time.Hour), 100, second) })
	got := sealedAt()
	if n != 5 || !done || got[h0.Add(time.Hour)] != 3 || got[h0.Add(2*time.Hour)] != 3 || got[h0] != 0 || got[h0.Add(4*time.Hour)] != 0 {
		t.Fatalf("second call sealed %d (done %v): %v; want the 5 left, nothing outside the range", n, done, got)
	}
	for _, w := range tables(t, ctx, f).Windows {
		if w.Start.Equal(h0.Add(3*time.Hour)) && !w.ClosedAt.Equal(first) {
			t.Errorf("a row sealed by the first call was changed by the second: %+v", w)
		}
	}
	// From zero: everything before the bound.
	commit(t, ctx, f, func(tx driver.StoreTx) error { return seal(tx, time.Time{}, h0.Add(5*time.Hour), 100, second) })
	if n != 6 || !done {
		t.Fatalf("sealing from zero sealed %d (done %v), want the 6 rows of the first and last windows", n, done)
	}
}

// Property (sealing waits): the locking reads of sealing wait for an open
// branch that writes to a window being sealed, and then seal its row too;
// they do not wait for a branch that writes to a later, open window.
func testSealingWaits(t *testing.T, ctx context.Context, f Fixture) {
	h0 := clock().Truncate(time.Hour).Add(-5 * time.Hour)
	commit(t, ctx, f, func(tx driver.StoreTx) error {
		return tx.WriteWindows(ctx, []driver.WindowSum{window("a", h0), window("a", h0.Add(time.Hour))}, h0)
	})
	open1 := open(t, ctx, f.Server) // writes to the next, open window
	must(t, open1.tx().WriteWindows(ctx, []driver.WindowSum{window("b", h0.Add(time.Hour)), window("a", h0.Add(time.Hour))}, h0))
	late := open(t, ctx, f.Server) // prepared before the frontier closed h0
	must(t, late.tx().WriteWindows(ctx, []driver.WindowSum{window("b", h0), window("a", h0)}, h0))
	sealer := open(t, ctx, f.Server)
	var rows []driver.WindowRow
	done := async(func() (err error) {
		rows, _, err = sealer.tx().SealWindows(ctx, time.Time{}, h0.Add(time.Hour), 100, h0.Add(2*time.Hour))
		return err
	})
	blocked(t, done, f.LockWait/4, "sealing a window another branch writes to")
	must(t, late.end(true))
	must(t, <-done)
	must(t, sealer.end(true))
	must(t, open1.end(true))
	if n := len(rows); n != 2 {
		t.Fatalf("sealed %d rows, want both of h0, the late branch's new row included", n)
	}
	for _, r := range rows {
		if r.Account == "a" && r.Amount != 2 {
			t.Errorf("sealed row %+v returned as it was before the late branch committed", r)
		}
	}
	for _, w := range tables(t, ctx, f).Windows {
		if sealed := !w.ClosedAt.IsZero(); sealed != w.Start.Equal(h0) {
			t.Errorf("window %+v: sealed %v", w, sealed)
		}
	}
}

// Property (bounded passes): the retention deletes the oldest entries
// first, batch per statement, at most max per call.
func testBatches(t *testing.T, ctx context.Context, f Fixture) {
	now := clock()
	old, young := now.Add(-time.Hour), now
	for i := range 10 {
		created := old.Add(time.Duration(i) * time.Second)
		if i >= 8 {
			created = young
		}
		e := driver.Entry{Partition: 0, Offset: int64(i), EventID: fmt.Sprint(i), Account: "a", Currency: "EUR", Amount: 1, OccurredAt: old, WindowStart: old}
		commit(t, ctx, f, func(tx driver.StoreTx) error {
			return noKept(tx.WriteEntries(ctx, "t", "c", []driver.Entry{e}, created))
		})
	}
	if n, err := f.Store.DeleteEntries(ctx, old.Add(time.Minute), 3, 7); err != nil || n != 7 {
		t.Fatalf("first pass deleted %d (%v), want 7: batches of 3 up to the pass's 7", n, err)
	}
	if got := tables(t, ctx, f).Entries; len(got) != 3 || got[0].Offset != 7 {
		t.Fatalf("entries left %+v, want the oldest 7 gone", got)
	}
	if n, err := f.Store.DeleteEntries(ctx, old.Add(time.Minute), 3, 7); err != nil || n != 1 {
		t.Fatalf("second pass deleted %d (%v), want the last old one", n, err)
	}
	if got := tables(t, ctx, f).Entries; len(got) != 2 {
		t.Fatalf("%d entries left, want the 2 young ones", len(got))
	}
}
