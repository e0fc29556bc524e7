package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/event"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/driver"
)

// An item is applied whole or not at all: when its retraction or its
// addition would overflow a sum, neither changes anything, the record
// that made it is an amount_overflow dead letter, the stored key keeps its
// version and a key the checkpoint claimed is taken back.
func TestVersionItemsOverflow(t *testing.T) {
	at := time.Date(2026, 11, 29, 13, 5, 0, 0, time.UTC)
	old := func(amount int64) *dedup.Version {
		return &dedup.Version{Account: "acct-1", Currency: "EUR", Amount: amount, OccurredAt: at}
	}
	retraction := func(amount int64) *record {
		r := rec("v", "acct-1", amount, 0, 0)
		r.retract = true
		return &r
	}
	tests := []struct {
		name     string
		seed     int64 // acct-1 EUR's stored balance (and window)
		old      int64
		add      int64
		claimed  bool
		refused  bool
		balance  int64
		unclaim  int
		update   int
		overflow int
	}{
		{"amend", 100, 100, 150, false, false, 150, 0, 1, 0},
		// Taking back a negative amount at the top of the range.
		{"retraction overflows", math.MaxInt64, -1, 0, false, true, math.MaxInt64, 0, 0, 1},
		{"retraction of the least amount", 0, math.MinInt64, 1, false, true, 0, 0, 0, 1},
		// The retraction fits, the addition does not: neither is applied.
		{"addition overflows", math.MaxInt64 - 10, 10, math.MaxInt64, true, true, math.MaxInt64 - 10, 1, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			agg := newAggregate(hourly)
			bk, wk := agg.keys(&retraction(0).ev)
			agg.seedBalance(bk, total{amount: tt.seed, count: 1, exists: true})
			agg.seedWindow(wk, total{amount: tt.seed, count: 1, exists: true}, false)
			add := rec("v", "acct-1", tt.add, 0, 1)
			add.ev.Revision = 1
			o := outcomes{overflowed: map[string]bool{}, items: []versionItem{{
				change:  dedup.Change{ID: "v", Old: old(tt.old), New: dedup.VersionOf(&add.ev), Write: dedup.WriteUpdate, Claimed: tt.claimed},
				retract: retraction(tt.old), add: &add, rec: &add,
			}}}
			o.count(agg, 64, true)
			if o.items[0].refused != tt.refused || len(o.dead) != tt.overflow {
				t.Fatalf("refused %v, dead letters %v", o.items[0].refused, o.dead)
			}
			if tt.overflow > 0 && o.dead[0].Reason != "amount_overflow" {
				t.Fatalf("dead letter %+v", o.dead[0])
			}
			if b := agg.balances[bk]; b.amount != tt.balance || agg.windows[wk].amount != tt.balance || b.count != 1 {
				t.Fatalf("balance %+v, window %+v, want %d over 1", *b, *agg.windows[wk], tt.balance)
			}
			works := make([]work, 1)
			planVersionKeys(o.items, works, hashRouter(1))
			if len(works[0].unclaim) != tt.unclaim || len(works[0].update) != tt.update {
				t.Fatalf("unclaim %v, update %v", works[0].unclaim, works[0].update)
			}
		})
	}
}

// A version that changes a sum's amount but not its count is still
// written (the rows of keys no event changed are not).
func TestRetractionAndAdditionWriteTheirRow(t *testing.T) {
	agg := newAggregate(hourly)
	back := rec("v", "acct-1", 100, 0, 0)
	back.retract = true
	add := rec("v", "acct-1", 150, 0, 1)
	if !agg.apply(&back, &add) {
		t.Fatal("refused")
	}
	rows := agg.balanceRows()
	if len(rows) != 1 || rows[0].amount != 50 || rows[0].count != 0 {
		t.Fatalf("balance rows %+v, want the delta 50 over 0", rows)
	}
	if w := agg.windowRows(); len(w) != 1 || w[0].amount != 50 {
		t.Fatalf("window rows %+v", w)
	}
}

func TestSubInt64(t *testing.T) {
	for _, tt := range []struct {
		a, b int64
		ok   bool
	}{
		{0, math.MinInt64, false}, {-1, math.MinInt64, true}, {math.MaxInt64, -1, false}, {math.MinInt64, 1, false},
		{math.MinInt64, -1, true}, {5, 7, true}, {math.MaxInt64, math.MaxInt64, true},
	} {
		if s, ok := subInt64(tt.a, tt.b); ok != tt.ok || ok && s != tt.a-tt.b {
			t.Errorf("%d - %d: %d, %v; want ok %v", tt.a, tt.b, s, ok, tt.ok)
		}
	}
}

// The outbox is the tables' changelog with versions too: two instances
// amend and cancel the same events concurrently (a version's retraction
// and addition change balances and windows as any other change, windows
// that close included); the changes, applied in commit order, form an
// unbroken chain per key and end at exactly the rows stored, and the
// ledger_entries stream holds every entry once, the retractions and
// additions that explain the versions included, which sum to the sums.
func TestOutboxIsTheTablesChangelogWithVersions(t *testing.T) {
	l := newChangelogLedger(t, 2, 2, 2, func(c *Config) { c.WindowCloseAfter, c.LedgerEntries = 30*time.Minute, true })
	highest := amendConcurrently(t, l)
	evs, checkpoints, _ := l.changelogEndsAtTheTables(t)
	// Every event counts its highest revision, whichever instance
	// counted which version in which order.
	want := map[driver.BalanceKey][2]int64{}
	for _, ev := range highest {
		if !ev.Cancelled {
			k := driver.BalanceKey{Account: ev.AccountID, Currency: ev.Currency}
			want[k] = [2]int64{want[k][0] + ev.AmountMinor, want[k][1] + 1}
		}
	}
	for _, c := range l.servers {
		for _, b := range c.Tables().Balances {
			if got := [2]int64{b.Amount, b.Count}; got != want[b.BalanceKey] {
				t.Errorf("balance %v: %v, want the highest revisions' %v", b.BalanceKey, got, want[b.BalanceKey])
			}
			delete(want, b.BalanceKey)
		}
	}
	if len(want) != 0 {
		t.Errorf("balances missing: %v", want)
	}
	t.Logf("%d changes in %d checkpoints; entries by kind (late ones at -kind-1) %v", len(evs), checkpoints, entriesOfVersions(t, l))
}

// amendConcurrently has l's instances count versions of the same events
// concurrently, round by round, and returns the highest version of each
// event produced.
func amendConcurrently(t *testing.T, l *changelogLedger) map[string]event.Event {
	t.Helper()
	base := time.Now().UTC().Add(-48 * time.Hour).Truncate(time.Hour)
	accounts := []string{"a", "b", "c", "Müller"}
	var wg sync.WaitGroup
	errs := make([]error, len(l.inst))
	var mu sync.Mutex
	highest := map[string]event.Event{} // of every record produced
	// The instances go round by round (concurrent within one): one that
	// ran far ahead, on a loaded machine, would close nearly every window
	// before the other amends, and the generation would exercise no
	// retraction of an open window.
	const rounds = 30
	round := make([]sync.WaitGroup, rounds)
	for r := range round {
		round[r].Add(len(l.inst))
	}
	for i, m := range l.inst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			passed := 0 // rounds this instance said it finished
			defer func() {
				for ; passed < rounds; passed++ {
					round[passed].Done() // an instance that failed holds no other back
				}
			}()
			rng := rand.New(rand.NewPCG(17, uint64(i)))
			for r := range rounds {
				if r > 0 {
					round[r-1].Done()
					passed = r
					round[r-1].Wait()
				}
				var recs []Record
				for range rng.IntN(10) + 1 {
					// One content per (id, revision): two copies of a
					// version are a repeat, never a conflict.
					// Ids near the round's, their event times in id
					// order (about 19 minutes apart, give or take 40):
					// versions of events whose windows are still open,
					// and of events whose windows closed (late).
					n, rev := r*4+rng.IntN(30), rng.IntN(4)
					vr := rand.New(rand.NewPCG(uint64(n), uint64(rev)))
					ev := event.Event{EventID: fmt.Sprintf("v-%d", n), Revision: int64(rev),
						AccountID: accounts[vr.IntN(len(accounts))], AmountMinor: vr.Int64N(2000) - 500, Currency: []string{"EUR", "USD"}[vr.IntN(2)],
						OccurredAt: base.Add(time.Duration(n)*48*time.Hour/150 + time.Duration(vr.IntN(40))*time.Minute)}
					if rev > 0 && vr.IntN(4) == 0 {
						ev = event.Event{EventID: ev.EventID, Revision: ev.Revision, Cancelled: true}
					}
					v, _ := json.Marshal(ev)
					recs = append(recs, Record{Event: ev, Partition: int32(i), Key: []byte(ev.AccountID), Value: v})
					mu.Lock()
					if h, ok := highest[ev.EventID]; !ok || ev.Revision > h.Revision {
						highest[ev.EventID] = ev
					}
					mu.Unlock()
				}
				for try := 0; ; try++ {
					_, err := m.checkpoint(t, recs...)
					if err == nil {
						break
					}
					m.offsets[int32(i)] -= int64(len(recs))
					if try == 20 {
						errs[i] = err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
	}
	return highest
}

// entriesOfVersions checks that the ledger's entries explain its sums,
// retractions (late ones among them) and additions included, and returns
// their number by kind (a late one's at -kind-1).
func entriesOfVersions(t *testing.T, l *changelogLedger) map[driver.EntryKind]int {
	t.Helper()
	var tbs []driver.Tables
	kinds := map[driver.EntryKind]int{}
	for _, c := range l.servers {
		tb := c.Tables()
		tbs = append(tbs, tb)
		for _, e := range tb.Entries {
			if e.Late {
				kinds[-e.Kind-1]++ // late ones apart
			} else {
				kinds[e.Kind]++
			}
		}
	}
	entriesExplainTheSums(t, tbs...)
	if kinds[driver.EntryRetraction] == 0 || kinds[driver.EntryAddition] == 0 || kinds[-driver.EntryRetraction-1] == 0 {
		t.Errorf("entries by kind (late ones negative) %v: the generation exercised no retraction, addition, or late retraction", kinds)
	}
	return kinds
}

// With LEDGER_ENTRIES=true each applied version writes the entries that
// explain it, at its own position: an amendment the retraction of the
// counted version (its account, currency, window and revision, its amount
// negated) and the addition of the new one, a tombstone the retraction
// only; a version that counts as the event itself (a higher revision
// first) the event's entry, with its revision; a stale version, a
// tombstone before its original and a repeat of a version none. The
// entries still sum to every balance and window.
func TestVersionsExplainedByLedgerEntries(t *testing.T) {
	p, server, sink, prod := memPipeline(t, 1, 1, func(c *Config) { c.LedgerEntries = true })
	ctx := context.Background()
	at, _ := time.Parse(time.RFC3339, t0)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	var offset int64
	produce := func(evs ...event.Event) {
		t.Helper()
		var recs []*kgo.Record
		for _, ev := range evs {
			v, _ := json.Marshal(ev)
			recs = append(recs, &kgo.Record{Key: []byte(ev.EventID), Value: v})
		}
		if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		offset += int64(len(evs))
		// Each step in checkpoints of its own: the next one reads the
		// versions this one stored.
		testenv.Eventually(t, 30*time.Second, "the records checkpointed", func() (bool, string) {
			pos, err := sink.Positions(ctx, []int32{0})
			return err == nil && pos[0].NextOffset == offset, fmt.Sprintf("positions %+v (%v), want %d", pos, err, offset)
		})
	}
	produce(
		event.Event{EventID: "amend", AccountID: "a", AmountMinor: 10, Currency: "EUR", OccurredAt: at},               // 0
		event.Event{EventID: "cancel", AccountID: "a", AmountMinor: 30, Currency: "EUR", OccurredAt: at},              // 1
		event.Event{EventID: "early-cancel", Revision: 1, Cancelled: true},                                            // 2
		event.Event{EventID: "higher", Revision: 2, AccountID: "a", AmountMinor: 50, Currency: "EUR", OccurredAt: at}, // 3
	)
	produce(
		event.Event{EventID: "amend", Revision: 1, AccountID: "b", AmountMinor: 20, Currency: "USD", OccurredAt: at.Add(2 * time.Hour)}, // 4
		event.Event{EventID: "cancel", Revision: 1, Cancelled: true},                                                                    // 5
		event.Event{EventID: "early-cancel", AccountID: "a", AmountMinor: 40, Currency: "EUR", OccurredAt: at},                          // 6
		event.Event{EventID: "higher", Revision: 1, AccountID: "a", AmountMinor: 60, Currency: "EUR", OccurredAt: at},                   // 7
	)
	produce(
		event.Event{EventID: "amend", Revision: 1, AccountID: "b", AmountMinor: 20, Currency: "USD", OccurredAt: at.Add(2 * time.Hour)}, // 8: a repeat
		event.Event{EventID: "amend", Revision: 2, AccountID: "a", AmountMinor: 15, Currency: "EUR", OccurredAt: at},                    // 9
	)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	tb := server.Tables()
	w, w2 := at.Truncate(time.Hour).Format(time.RFC3339), at.Truncate(time.Hour).Add(2*time.Hour).Format(time.RFC3339)
	type entry struct {
		offset   int64
		kind     driver.EntryKind
		id       string
		account  string
		currency string
		amount   int64
		start    string
		revision int64
	}
	want := []entry{
		{0, driver.EntryEvent, "amend", "a", "EUR", 10, w, 0},
		{1, driver.EntryEvent, "cancel", "a", "EUR", 30, w, 0},
		{3, driver.EntryEvent, "higher", "a", "EUR", 50, w, 2},
		{4, driver.EntryRetraction, "amend", "a", "EUR", -10, w, 0},
		{4, driver.EntryAddition, "amend", "b", "USD", 20, w2, 1},
		{5, driver.EntryRetraction, "cancel", "a", "EUR", -30, w, 0},
		{9, driver.EntryRetraction, "amend", "b", "USD", -20, w2, 1},
		{9, driver.EntryAddition, "amend", "a", "EUR", 15, w, 2},
	}
	var got []entry
	for _, e := range tb.Entries {
		got = append(got, entry{e.Offset, e.Kind, e.EventID, e.Account, e.Currency, e.Amount, e.WindowStart.Format(time.RFC3339), e.Revision})
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("entries\n got %v\nwant %v", got, want)
	}
	if len(tb.DeadLetters) != 0 {
		t.Errorf("dead letters %+v, want none", tb.DeadLetters)
	}
	entriesExplainTheSums(t, tb)
	// The balances: a 15 + higher 50 (early-cancel and cancel count nothing);
	// b USD holds nothing any more.
	for _, b := range tb.Balances {
		want := [2]int64{}
		if b.Account == "a" && b.Currency == "EUR" {
			want = [2]int64{65, 2}
		}
		if got := [2]int64{b.Amount, b.Count}; got != want {
			t.Errorf("balance %v: %v, want %v", b.BalanceKey, got, want)
		}
	}
}

// entriesExplainTheSums checks that the ledger entries of tb sum to its
// sums: per balance, and per window those counted in it to its
// billing_windows row and the late ones to its window_adjustments row
// (amounts, and event counts with a retraction counting -1).
func entriesExplainTheSums(t *testing.T, tbs ...driver.Tables) {
	t.Helper()
	type sum struct{ amount, count int64 }
	type wk struct {
		account, currency string
		start             int64
	}
	bal, win, adj := map[driver.BalanceKey]sum{}, map[wk]sum{}, map[wk]sum{}
	fromEntries := func(m map[wk]sum, k wk, e driver.Entry) {
		s := m[k]
		m[k] = sum{s.amount + e.Amount, s.count + e.Kind.Sign()}
	}
	entries := 0
	for _, tb := range tbs {
		for _, e := range tb.Entries {
			entries++
			k := driver.BalanceKey{Account: e.Account, Currency: e.Currency}
			s := bal[k]
			bal[k] = sum{s.amount + e.Amount, s.count + e.Kind.Sign()}
			if e.Late {
				fromEntries(adj, wk{e.Account, e.Currency, e.WindowStart.Unix()}, e.Entry)
			} else {
				fromEntries(win, wk{e.Account, e.Currency, e.WindowStart.Unix()}, e.Entry)
			}
		}
	}
	if entries == 0 {
		t.Fatal("no ledger entries")
	}
	for _, tb := range tbs {
		for _, b := range tb.Balances {
			if s := bal[b.BalanceKey]; s != (sum{b.Amount, b.Count}) {
				t.Errorf("balance %v holds %d over %d, its entries %d over %d", b.BalanceKey, b.Amount, b.Count, s.amount, s.count)
			}
			delete(bal, b.BalanceKey)
		}
		for _, w := range tb.Windows {
			k := wk{w.Account, w.Currency, w.Start.Unix()}
			if s := win[k]; s != (sum{w.Amount, w.Count}) {
				t.Errorf("window %v holds %d over %d, its entries %d over %d", k, w.Amount, w.Count, s.amount, s.count)
			}
			delete(win, k)
		}
		for _, a := range tb.Adjustments {
			k := wk{a.Account, a.Currency, a.Start.Unix()}
			if s := adj[k]; s != (sum{a.Amount, a.Count}) {
				t.Errorf("adjustment %v holds %d over %d, its late entries %d over %d", k, a.Amount, a.Count, s.amount, s.count)
			}
			delete(adj, k)
		}
	}
	for name, m := range map[string]int{"balances": len(bal), "windows": len(win), "adjustments": len(adj)} {
		if m != 0 {
			t.Errorf("%s: entries of %d keys without a row", name, m)
		}
	}
}

// Of a contested claim statement that holds versions, the versions are
// looked up first when they may be all the keys it met stored: when they
// are, the originals beside them are not read; when not, the originals
// are looked up next, and a stored one among them is a repeat as ever. A
// statement that met more stored keys than it holds versions is looked up
// whole at once.
func TestLookupsOfVersionsFirst(t *testing.T) {
	now := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
	at := now.Add(-time.Hour)
	s := shards{1, 1}
	for _, c := range []struct {
		name       string
		stored     []string // what the lookups find
		lookups    string
		duplicates int
		items      int
	}{
		{"the version stored", []string{"v"}, "[[v]]", 0, 3},
		{"an original stored", []string{"a"}, "[[v] [a b]]", 1, 2},
		{"both stored", []string{"v", "a"}, "[[a b v]]", 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			recs := []record{rec("a", "acct-1", 5, 0, 0), rec("b", "acct-1", 6, 0, 1), rec("v", "acct-2", 7, 0, 2)}
			recs[2].ev.Revision = 1
			for i := range recs {
				recs[i].ev.OccurredAt = at
			}
			cfg := planCfg(s, 0)
			cfg.horizon = 30 * time.Minute
			p := newPlanner(cfg, &snapshot{records: recs}, now, dedup.NewCache(10))
			stored := map[string]driver.DedupKey{
				"v": {ID: "v", ExpiresAt: now.Add(time.Hour), Version: dedup.EncodeVersion(dedup.Version{Account: "acct-2", Currency: "EUR", Amount: 3, OccurredAt: at})},
				"a": {ID: "a", Fingerprint: recs[0].ev.Fingerprint(), ExpiresAt: now.Add(time.Hour)},
			}
			var lookups [][]string
			kinds(t, p, func(st step) result {
				switch st.kind {
				case stepGenerations:
					return registered
				case stepClaim:
					var ids []string
					for _, k := range st.claims[0] {
						ids = append(ids, k.ID)
					}
					return result{contested: [][]driver.Contested{{{IDs: ids, Stored: len(c.stored)}}}}
				case stepLookup:
					var found []driver.DedupKey
					for _, id := range st.lookups[0].ids {
						if slices.Contains(c.stored, id) {
							found = append(found, stored[id])
						}
					}
					lookups = append(lookups, st.lookups[0].ids)
					return result{found: found}
				}
				return noResults(st)
			})
			if fmt.Sprint(lookups) != c.lookups {
				t.Errorf("lookups %v, want %v", lookups, c.lookups)
			}
			if d := p.o.duplicates; d != c.duplicates || len(p.o.items) != c.items || len(p.o.dead) != 0 {
				t.Errorf("%d duplicates, %d changes, dead %v: want %d and %d", d, len(p.o.items), p.o.dead, c.duplicates, c.items)
			}
		})
	}
}

// The cache remembers a key that holds a version as Versioned: a hit
// proves no repeat (an original that came late is stale, not a repeat),
// so the event is claimed, and looked up first as a version's. An
// amended event's entry replaces what the cache held of its original.
func TestCacheKnowsVersionedKeys(t *testing.T) {
	now := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
	at := now.Add(-time.Hour)
	items := []versionItem{
		{change: dedup.Change{ID: "new", New: dedup.Version{Account: "acct-1"}, ExpiresAt: now.Add(time.Hour)}},
		{change: dedup.Change{ID: "amended", Old: &dedup.Version{}, New: dedup.Version{Revision: 1}, Write: dedup.WriteUpdate, ExpiresAt: now.Add(time.Hour)}},
		{change: dedup.Change{ID: "cancelled-first", New: dedup.Version{Revision: 2, Cancelled: true}, ExpiresAt: now.Add(time.Hour)}},
		{change: dedup.Change{ID: "refused", New: dedup.Version{Revision: 1}, ExpiresAt: now.Add(time.Hour)}, refused: true},
	}
	var got []string
	for _, in := range rememberVersions(nil, items) {
		got = append(got, fmt.Sprintf("%s:%v", in.ID, in.Versioned))
	}
	if want := "[new:false amended:true cancelled-first:true]"; fmt.Sprint(got) != want {
		t.Errorf("remembered %v, want %v", got, want)
	}
	cache := dedup.NewCache(10)
	cache.Add("o", dedup.Seen{Fingerprint: [16]byte{1}, ExpiresAt: now.Add(time.Hour), Versioned: true}, now)
	recs := []record{rec("a", "acct-1", 5, 0, 0), rec("b", "acct-1", 6, 0, 1), rec("o", "acct-2", 7, 0, 2)}
	for i := range recs {
		recs[i].ev.OccurredAt = at
	}
	cfg := planCfg(shards{1, 1}, 0)
	cfg.horizon = 30 * time.Minute
	p := newPlanner(cfg, &snapshot{records: recs}, now, cache)
	var lookups [][]string
	kinds(t, p, func(st step) result {
		switch st.kind {
		case stepGenerations:
			return registered
		case stepClaim:
			var ids []string
			for _, k := range st.claims[0] {
				ids = append(ids, k.ID)
			}
			return result{contested: [][]driver.Contested{{{IDs: ids, Stored: 1}}}}
		case stepLookup:
			lookups = append(lookups, st.lookups[0].ids)
			return result{found: []driver.DedupKey{{ID: "o", ExpiresAt: now.Add(time.Hour),
				Version: dedup.EncodeVersion(dedup.Version{Revision: 2, Account: "acct-2", Currency: "EUR", Amount: 3, OccurredAt: at})}}}
		}
		return noResults(st)
	})
	if fmt.Sprint(lookups) != "[[o]]" || p.o.stale != 1 || len(p.o.items) != 2 {
		t.Errorf("lookups %v, %d stale, %d changes: want o looked up alone, stale, a and b new", lookups, p.o.stale, len(p.o.items))
	}
}
