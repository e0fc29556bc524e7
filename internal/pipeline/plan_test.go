package pipeline

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/dedup"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/txsink/driver"
)

// hashRouter places keys on n participants by hash, as the sink does.
type hashRouter int

func (n hashRouter) Participants() int { return int(n) }
func (n hashRouter) Route(key string) int {
	h := fnv.New64a()
	h.Write([]byte(key))
	return int(h.Sum64() % uint64(n))
}

func rec(id, account string, amount int64, partition int32, offset int64) record {
	return record{ev: event.Event{EventID: id, AccountID: account, AmountMinor: amount, Currency: "EUR",
		OccurredAt: time.Date(2026, 11, 29, 13, 5, 0, 0, time.UTC)}, partition: partition, offset: offset}
}

// The plan of a checkpoint, without a server: each id is claimed once, on
// the participant of its id, unless the cache proves it; repeats within the
// snapshot are dropped or dead-lettered in arrival order; every row is
// written by the participant that owns its key.
func TestPlan(t *testing.T) {
	r := hashRouter(4)
	now := time.Now()
	cache := dedup.NewCache(10)
	recs := []record{
		rec("a", "acct-1", 5, 0, 0),
		rec("b", "acct-2", 7, 1, 0),
		rec("a", "acct-1", 5, 2, 0),             // a repeat on another partition
		rec("b", "acct-2", 8, 1, 1),             // a conflicting repeat
		rec("c", "acct-1", math.MaxInt64, 0, 1), // overflows acct-1
		rec("cached", "acct-3", 1, 3, 0),
	}
	seen := dedup.Seen{Fingerprint: recs[5].ev.Fingerprint(), ExpiresAt: now.Add(time.Hour)}
	cache.Add("cached", seen, now)

	cp := planClaims(recs, cache, now, time.Hour, r)
	var claimed []string
	for p, ins := range cp.claims {
		for _, in := range ins {
			if r.Route(in.ID) != p {
				t.Errorf("%s claimed on participant %d, routed to %d", in.ID, p, r.Route(in.ID))
			}
			claimed = append(claimed, in.ID)
		}
	}
	slices.Sort(claimed)
	if fmt.Sprint(claimed) != "[a b c]" {
		t.Errorf("claimed %v, want each uncached id once", claimed)
	}
	if _, ok := cp.known["cached"]; !ok {
		t.Error("a cache hit is not known")
	}

	o := classify(recs, nil, cp, now, time.Hour, 64)
	if o.duplicates != 2 || len(o.fresh) != 3 {
		t.Errorf("duplicates %d, fresh %d; want the repeat of a and the cached id dropped, 3 new", o.duplicates, len(o.fresh))
	}
	agg := newAggregate(hourly)
	o.count(agg, 64, true)
	if o.counted != 2 || !o.overflowed["c"] {
		t.Errorf("counted %d, overflowed %v", o.counted, o.overflowed)
	}
	var entries []string
	for _, e := range o.entries {
		entries = append(entries, fmt.Sprintf("%s@%d:%d", e.r.ev.EventID, e.r.partition, e.r.offset))
	}
	if fmt.Sprint(entries) != "[a@0:0 b@1:0]" {
		t.Errorf("ledger entries of %v, want one per counted event (not the repeat, the conflict or the overflow)", entries)
	}
	reasons := map[string]string{}
	for _, d := range o.dead {
		reasons[d.EventID] = d.Reason
	}
	if reasons["b"] != "conflicting_duplicate" || reasons["c"] != "amount_overflow" || len(o.dead) != 2 {
		t.Errorf("dead letters %v", reasons)
	}

	works := planWrites(&o, agg, hourly, r)
	for p, w := range works {
		for _, b := range w.balances {
			if r.Route(b.Account) != p {
				t.Errorf("balance of %s written by participant %d", b.Account, p)
			}
		}
		for _, e := range w.entries {
			if r.Route(e.Account) != p {
				t.Errorf("ledger entry of %s written by participant %d", e.Account, p)
			}
		}
		for _, d := range w.dead {
			if int(d.Partition)%len(works) != p {
				t.Errorf("dead letter of partition %d written by participant %d", d.Partition, p)
			}
		}
		if slices.Contains(w.unclaim, "c") != (r.Route("c") == p) {
			t.Errorf("participant %d: unclaim %v", p, w.unclaim)
		}
	}
}

// The decision's check covers every window written as open, whatever the
// order of the rows (accounts first): a later account's earlier window
// counts.
func TestEarliestOpen(t *testing.T) {
	at := func(h int) time.Time { return time.Date(2026, 11, 29, h, 0, 0, 0, time.UTC) }
	sum := func(account string, h int) driver.WindowSum {
		return driver.WindowSum{WindowKey: driver.WindowKey{Account: account, Currency: "EUR", Start: at(h)}}
	}
	works := []work{
		{windows: []driver.WindowSum{sum("a", 12), sum("b", 9)}},
		{adjusts: []driver.WindowSum{sum("c", 3)}}, // late: not open
		{windows: []driver.WindowSum{sum("d", 10)}},
	}
	if got := earliestOpen(works); !got.Equal(at(9)) {
		t.Fatalf("earliest open window %s, want 09:00", got)
	}
	if got := earliestOpen([]work{{adjusts: works[1].adjusts}}); !got.IsZero() {
		t.Fatalf("no open window: %s", got)
	}
}
