package changelog

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/billing/ledger/internal/txsink/driver"
)

// genString draws strings a JSON encoder can get wrong: every ASCII
// control character, quotes and backslashes, 2-, 3- and 4-byte UTF-8,
// U+2028 and U+2029, HTML's specials.
func genString(rng *rand.Rand, max int) string {
	pool := []rune{'"', '\\', '/', '<', '>', '&', '\u2028', '\u2029', 'é', '账', '💶', '\x7f', 'a', 'Z', ' '}
	var b strings.Builder
	for range rng.IntN(max + 1) {
		if rng.IntN(3) == 0 {
			b.WriteRune(rune(rng.IntN(0x20)))
		} else {
			b.WriteRune(pool[rng.IntN(len(pool))])
		}
	}
	return b.String()
}

// The JSON of strings is encoding/json's (without HTML escaping), byte for
// byte, for generated strings; invalid UTF-8 is refused, never replaced.
func TestJSONStringsAsEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		s := genString(rng, 24)
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(s); err != nil {
			t.Fatal(err)
		}
		got, ok := appendJSONString(nil, s)
		if !ok || string(got) != strings.TrimSuffix(want.String(), "\n") {
			t.Fatalf("%q: got %s (ok %v), want %s", s, got, ok, want.String())
		}
		if gotB, _ := appendJSONString(nil, []byte(s)); string(gotB) != string(got) {
			t.Fatalf("%q: []byte form %s differs from string form %s", s, gotB, got)
		}
	}
	for _, bad := range []string{"\xff", "a\xc3", "\xed\xa0\x80", "ok\xe2\x82"} {
		if _, ok := appendJSONString(nil, bad); ok {
			t.Errorf("%q: accepted", bad)
		}
	}
}

// genRow draws a row of t with values at the edges of their kinds.
func genRow(rng *rand.Rand, t Table) Row {
	lo, hi := DatetimeRange()
	r := Row{}
	for _, c := range t.Columns {
		if c.Nullable && rng.IntN(3) == 0 {
			r[c.Name] = nil
			continue
		}
		switch c.Kind {
		case String:
			r[c.Name] = genString(rng, 64)
		case Int:
			r[c.Name] = []int64{math.MinInt64, math.MaxInt64, 0, -1, rng.Int64()}[rng.IntN(5)]
		case Bool:
			r[c.Name] = rng.IntN(2) == 0
		case Time:
			span := hi.Sub(lo).Microseconds()
			r[c.Name] = []time.Time{lo, hi, time.UnixMicro(rng.Int64N(span) + lo.UnixMicro()).UTC()}[rng.IntN(3)]
		}
	}
	return r
}

// Every row of every table survives its binary form, and an event's
// record from its binary change (the service's path) is Encode's.
func TestBinaryRowsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var enc Encoder
	for _, tb := range Tables() {
		for range 500 {
			r := genRow(rng, tb)
			raw, err := EncodeRow(tb, r)
			if err != nil {
				t.Fatalf("%s: %v", tb.Name, err)
			}
			back, err := RowOf(tb, raw)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range r {
				if tv, ok := v.(time.Time); ok {
					if !back[k].(time.Time).Equal(tv) {
						t.Fatalf("%s.%s: %v back as %v", tb.Name, k, v, back[k])
					}
					continue
				}
				if !reflect.DeepEqual(back[k], v) {
					t.Fatalf("%s.%s: %#v back as %#v", tb.Name, k, v, back[k])
				}
			}
			ev := Event{Table: tb.Name, Op: OpCreate, After: r, TsMs: 7, Source: Source{Ledger: "l", CommitSeq: 3}}
			wantK, wantV, err := Encode(ev)
			if err != nil {
				t.Fatal(err)
			}
			gotK, gotV, err := enc.Record(Change{Table: tb.ID, Op: OpCreate, After: raw}, 7, Source{Ledger: "l", CommitSeq: 3})
			if err != nil || string(gotK) != string(wantK) || string(gotV) != string(wantV) {
				t.Fatalf("%s: record %s %s (%v), want %s %s", tb.Name, gotK, gotV, err, wantK, wantV)
			}
			if !json.Valid(gotV) || !json.Valid(gotK) || !utf8.Valid(gotV) {
				t.Fatalf("not JSON: %s", gotV)
			}
		}
	}
}

// Pack keeps every blob within its bound (a change larger than the bound
// alone in its blob), and Records gives the changes back in order.
func TestPackAndRecords(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	tb, _ := Lookup(AccountBalances)
	for i, max := range []int{1, 64, 300, 4096, 1 << 20, 1, 64, 300, 4096, 1 << 20} {
		compress := i >= 5 // the second round compressed, as the pipeline writes them
		p := Pack{Max: max}
		var want []Change
		for range rng.IntN(2000) + 1 {
			after, _ := EncodeRow(tb, genRow(rng, tb))
			c := Change{Table: TBalances, Op: OpCreate, After: after}
			if rng.IntN(2) == 0 {
				before, _ := EncodeRow(tb, genRow(rng, tb))
				c = Change{Table: TBalances, Op: OpUpdate, Before: before, After: after}
			}
			p.Add(c)
			want = append(want, c)
		}
		if compress {
			p.Compress()
		}
		var got []Change
		total := 0
		for i, blob := range p.Blobs {
			if len(blob) > max && p.Counts[i] != 1 {
				t.Fatalf("max %d: blob %d of %d bytes holds %d changes", max, i, len(blob), p.Counts[i])
			}
			n := 0
			if err := Records(blob, func(c Change) error {
				got = append(got, Change{Table: c.Table, Op: c.Op, Before: bytes.Clone(c.Before), After: bytes.Clone(c.After)})
				n++
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if n != p.Counts[i] {
				t.Fatalf("blob %d: %d changes, counted %d", i, n, p.Counts[i])
			}
			total += n
		}
		if !reflect.DeepEqual(got, want) || total != len(want) {
			t.Fatalf("max %d (compressed %v): %d changes back, %d packed", max, compress, len(got), len(want))
		}
		if compress && max == 1<<20 && p.Blobs[0][0] != blobS2 {
			t.Fatalf("a blob of %d bytes stayed uncompressed", len(p.Blobs[0]))
		}
	}
}

// Damaged bytes are errors, never a panic or a wrong row.
func TestDamagedOutboxIsAnError(t *testing.T) {
	tb, _ := Lookup(BillingWindows)
	rng := rand.New(rand.NewPCG(7, 8))
	raw, _ := EncodeRow(tb, genRow(rng, tb))
	blob := AppendRecord(NewBlob(nil), Change{Table: TWindows, Op: OpCreate, After: raw})
	for cut := 2; cut < len(blob); cut++ { // cut at 1: a blob of no record
		if err := Records(blob[:cut], func(Change) error { return nil }); err == nil {
			t.Errorf("blob cut at %d of %d: no error", cut, len(blob))
		}
	}
	for name, c := range map[string]Change{
		"c with before":        {Table: TWindows, Op: OpCreate, Before: raw, After: raw},
		"u without before":     {Table: TWindows, Op: OpUpdate, After: raw},
		"r outside a snapshot": {Table: TClosedWindows, Op: OpRead, After: raw},
		"unknown table":        {Table: 9, Op: OpCreate, After: raw},
		"unknown op":           {Table: TWindows, Op: "x", After: raw},
		"row of another kind":  {Table: TEntries, Op: OpCreate, After: raw},
	} {
		blob := AppendRecord(NewBlob(nil), c)
		err := Records(blob, func(c Change) error {
			var e Encoder
			_, _, err := e.Record(c, 0, Source{})
			return err
		})
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// A compressed blob cut anywhere, or claiming more than any statement
	// holds, is an error, not a crash or an allocation of that size.
	var pk Pack
	pk.Max = 1 << 20
	for range 50 {
		pk.Add(Change{Table: TWindows, Op: OpCreate, After: raw})
	}
	pk.Compress()
	zb := pk.Blobs[0]
	if zb[0] != blobS2 {
		t.Fatal("not compressed")
	}
	for cut := 1; cut < len(zb); cut++ {
		if err := Records(zb[:cut], func(Change) error { return nil }); err == nil {
			t.Errorf("compressed blob cut at %d of %d: no error", cut, len(zb))
		}
	}
	huge := append([]byte{blobS2}, binary.AppendUvarint(nil, 1<<40)...)
	if err := Records(append(huge, 0, 0, 0), func(Change) error { return nil }); err == nil {
		t.Error("a compressed blob claiming 1 TiB: no error")
	}
	bad := append([]byte{tagTrue}, raw[1:]...) // a bool where a string is
	if _, err := DecodeRow(tb, bad, nil); err == nil {
		t.Error("a bool in a string column decoded")
	}
}

// The store's rows in the binary form decode as the table's columns.
func TestStoreRowsAsTheTablesColumns(t *testing.T) {
	at := time.Date(2026, 11, 29, 13, 5, 1, 123456000, time.UTC)
	start := at.Truncate(time.Hour)
	for name, c := range map[string]struct {
		table string
		raw   []byte
		want  Row
	}{
		"balance": {AccountBalances, BalanceRow(nil, driver.BalanceRow{BalanceKey: driver.BalanceKey{Account: "a", Currency: "EUR"}, Amount: -5, Count: 2, UpdatedAt: at}),
			Row{"account_id": "a", "currency": "EUR", "balance_minor": int64(-5), "event_count": int64(2), "updated_at": at}},
		"open window": {BillingWindows, WindowRow(nil, driver.WindowRow{WindowKey: driver.WindowKey{Account: "a", Currency: "EUR", Start: start}, Amount: 1, Count: 1, UpdatedAt: at}),
			Row{"account_id": "a", "currency": "EUR", "window_start": start, "amount_minor": int64(1), "event_count": int64(1), "updated_at": at, "closed_at": nil}},
		"sealed window": {ClosedWindows, WindowRow(nil, driver.WindowRow{WindowKey: driver.WindowKey{Account: "a", Currency: "EUR", Start: start}, Amount: 1, Count: 1, UpdatedAt: at, ClosedAt: at}),
			Row{"account_id": "a", "currency": "EUR", "window_start": start, "amount_minor": int64(1), "event_count": int64(1), "updated_at": at, "closed_at": at}},
		"old adjustment": {WindowAdjustments, AdjustmentRow(nil, driver.AdjustmentRow{WindowKey: driver.WindowKey{Account: "a", Currency: "EUR", Start: start}, Amount: 1, Count: 1, UpdatedAt: at}),
			Row{"account_id": "a", "currency": "EUR", "window_start": start, "amount_minor": int64(1), "event_count": int64(1), "updated_at": at, "checkpoint_id": nil}},
		"entry": {LedgerEntries, EntryRow(nil, driver.EntryRow{Topic: "t", Checkpoint: "g", CreatedAt: at, Entry: driver.Entry{Partition: 3, Offset: 9, EventID: "e", Account: "a",
			Currency: "EUR", Amount: 4, OccurredAt: at, WindowStart: start, Late: true}}),
			Row{"kafka_topic": "t", "kafka_partition": int64(3), "kafka_offset": int64(9), "event_id": "e", "account_id": "a", "currency": "EUR",
				"amount_minor": int64(4), "occurred_at": at, "window_start": start, "late": true, "checkpoint_id": "g", "created_at": at, "entry": int64(0), "revision": int64(0)}},
		"retraction": {LedgerEntries, EntryRow(nil, driver.EntryRow{Topic: "t", Checkpoint: "g", CreatedAt: at, Entry: driver.Entry{Partition: 3, Offset: 9, Kind: driver.EntryRetraction,
			EventID: "e", Account: "a", Currency: "EUR", Amount: -4, OccurredAt: at, WindowStart: start, Revision: 2}}),
			Row{"kafka_topic": "t", "kafka_partition": int64(3), "kafka_offset": int64(9), "event_id": "e", "account_id": "a", "currency": "EUR",
				"amount_minor": int64(-4), "occurred_at": at, "window_start": start, "late": false, "checkpoint_id": "g", "created_at": at, "entry": int64(1), "revision": int64(2)}},
		// An outbox row of a version before entries had kinds ends at
		// created_at: the kind and the revision read as 0.
		"entry before kinds": {LedgerEntries, oldEntryRow(driver.EntryRow{Topic: "t", Checkpoint: "g", CreatedAt: at, Entry: driver.Entry{Partition: 3, Offset: 9, EventID: "e", Account: "a",
			Currency: "EUR", Amount: 4, OccurredAt: at, WindowStart: start}}),
			Row{"kafka_topic": "t", "kafka_partition": int64(3), "kafka_offset": int64(9), "event_id": "e", "account_id": "a", "currency": "EUR",
				"amount_minor": int64(4), "occurred_at": at, "window_start": start, "late": false, "checkpoint_id": "g", "created_at": at, "entry": int64(0), "revision": int64(0)}},
	} {
		tb, _ := Lookup(c.table)
		want, err := Canonical(tb, c.want)
		if err != nil {
			t.Fatal(err)
		}
		got, err := RowOf(tb, c.raw)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if g, _ := Canonical(tb, got); g != want {
			t.Errorf("%s: %s, want %s", name, g, want)
		}
	}
}

// oldEntryRow is r as a binary row before ledger entries had a kind and
// a revision: up to created_at.
func oldEntryRow(r driver.EntryRow) []byte {
	b := AppendString(nil, r.Topic)
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
	return AppendTime(b, r.CreatedAt)
}

// A version's retraction and addition share their Kafka position: their
// record keys differ by the entry's kind, and a row cut before a column
// that is not one added later is refused still.
func TestEntriesOfOnePositionHaveKeysOfTheirOwn(t *testing.T) {
	tb, _ := Lookup(LedgerEntries)
	at := time.Date(2026, 11, 29, 13, 5, 1, 0, time.UTC)
	e := driver.EntryRow{Topic: "t", Checkpoint: "g", CreatedAt: at, Entry: driver.Entry{Partition: 3, Offset: 9, Kind: driver.EntryRetraction, EventID: "e", Account: "a",
		Currency: "EUR", Amount: -4, OccurredAt: at, WindowStart: at}}
	retraction, err := RawKey(tb, EntryRow(nil, e))
	if err != nil {
		t.Fatal(err)
	}
	e.Kind, e.Amount = driver.EntryAddition, 5
	addition, err := RawKey(tb, EntryRow(nil, e))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"kafka_topic":"t","kafka_partition":3,"kafka_offset":9,"entry":1}`; retraction != want || addition == retraction {
		t.Errorf("keys %s and %s, want %s and another", retraction, addition, want)
	}
	old := oldEntryRow(e)
	if _, err := DecodeRow(tb, old[:len(old)-3], nil); err == nil {
		t.Error("a row cut inside created_at decoded")
	}
}

// The digit-by-digit time writer is TimeLayout's AppendFormat over the
// whole DATETIME(6) range (random instants, before and after 1970, the
// range's ends), and refuses just outside it.
func TestJSONTimeAsAppendFormat(t *testing.T) {
	lo, hi := DatetimeRange()
	if lo.UnixMicro() != datetimeMinMicros || hi.UnixMicro() != datetimeMaxMicros {
		t.Fatalf("range constants %d..%d, DatetimeRange %d..%d", datetimeMinMicros, datetimeMaxMicros, lo.UnixMicro(), hi.UnixMicro())
	}
	rng := rand.New(rand.NewPCG(11, 12))
	samples := []int64{datetimeMinMicros, datetimeMaxMicros, 0, -1, 1, 999_999, -1_000_000, 951_782_400_000_000 /* 2000-02-29 */}
	for range 100_000 {
		samples = append(samples, datetimeMinMicros+rng.Int64N(datetimeMaxMicros-datetimeMinMicros+1))
	}
	for _, us := range samples {
		got, ok := appendJSONTime(nil, us)
		want := `"` + time.UnixMicro(us).UTC().Format(TimeLayout) + `"`
		if !ok || string(got) != want {
			t.Fatalf("%d: %s (%v), want %s", us, got, ok, want)
		}
	}
	for _, us := range []int64{datetimeMinMicros - 1, datetimeMaxMicros + 1} {
		if _, ok := appendJSONTime(nil, us); ok {
			t.Errorf("%d outside DATETIME's range accepted", us)
		}
	}
}
