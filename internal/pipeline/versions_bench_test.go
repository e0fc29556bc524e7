package pipeline

import (
	"fmt"
	"testing"
	"time"

	"github.com/billing/ledger/internal/dedup"
)

// BenchmarkPlanOriginals is the dedup part of a checkpoint of originals
// (no versions): the claims' plan and the classification of 1,000 new
// events, what every checkpoint of a ledger without corrections pays.
func BenchmarkPlanOriginals(b *testing.B) {
	recs := make([]record, 1000)
	for i := range recs {
		recs[i] = rec(fmt.Sprintf("evt-%08d", i), fmt.Sprintf("acct-%06d", i%500), int64(i), int32(i%4), int64(i))
	}
	now := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
	cache := dedup.NewCache(0)
	b.ReportAllocs()
	for b.Loop() {
		cp := planClaims(recs, cache, now, time.Hour, hashRouter(4))
		o := classify(recs, nil, cp, now, time.Hour, 64)
		if len(o.fresh) != len(recs) {
			b.Fatal(len(o.fresh))
		}
	}
}

// BenchmarkPlanVersions is the dedup part of a checkpoint whose records
// are in part versions (one in five a higher revision of a stored
// event): the claims' plan and the classification as versions of 1,000
// records, what a checkpoint of a ledger with corrections pays.
func BenchmarkPlanVersions(b *testing.B) {
	recs := make([]record, 1000)
	now := time.Date(2026, 11, 29, 14, 0, 0, 0, time.UTC)
	for i := range recs {
		recs[i] = rec(fmt.Sprintf("evt-%08d", i), fmt.Sprintf("acct-%06d", i%500), int64(i), int32(i%4), int64(i))
		if i%5 == 0 {
			recs[i].ev.Revision = 1
		}
	}
	cache := dedup.NewCache(0)
	b.ReportAllocs()
	for b.Loop() {
		cp := planClaims(recs, cache, now, time.Hour, hashRouter(4))
		cp.knownV = map[string]string{}
		for i := range recs {
			if i%5 == 0 { // stored: the original, counted before
				id := recs[i].ev.EventID
				cp.known[id] = dedup.Seen{ExpiresAt: now.Add(time.Hour)}
				cp.knownV[id] = dedup.EncodeVersion(dedup.Version{Account: recs[i].ev.AccountID, Currency: "EUR", Amount: 1, OccurredAt: now})
			}
		}
		o := classifyVersions(recs, nil, cp, now, time.Hour, 30*time.Minute, 64, hourly, time.Time{})
		if len(o.items) != len(recs) {
			b.Fatal(len(o.items))
		}
	}
}
