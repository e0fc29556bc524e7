package main

import (
	"testing"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/ledgercheck"
)

// With versions, the stream's records decode as the service decodes them,
// and the expected ledger is that of each event's highest revision: what
// the records say, replayed by their event ids alone, whatever order
// they came in.
func TestVersionsExpectTheHighestRevision(t *testing.T) {
	cfg := testConfig(11)
	cfg.DupRatio, cfg.ConflictRatio, cfg.MalformedRatio, cfg.AbortedRatio, cfg.FutureRatio, cfg.OverflowCases = 0.05, 0, 0, 0, 0, 0
	cfg.VersionRatio = 0.3
	recs, exp := drain(t, cfg)
	highest := map[string]event.Event{}
	versions, cancelled, moved := 0, 0, 0
	for _, r := range recs {
		ev, err := event.NewDecoder(cfg.MaxPayload).Decode(r.value)
		if err != nil {
			t.Fatalf("%s record %s: %v", r.kind, r.value, err)
		}
		if r.kind == kindVersion {
			versions++
			if ev.Cancelled {
				cancelled++
			} else if string(r.key) != ev.AccountID {
				t.Fatalf("version %s keyed %s", r.value, r.key)
			}
		}
		if h, ok := highest[ev.EventID]; !ok || ev.Revision > h.Revision {
			if ok && !ev.Cancelled && !h.Cancelled && h.AccountID != ev.AccountID {
				moved++
			}
			highest[ev.EventID] = ev
		}
	}
	if versions == 0 || cancelled == 0 || moved == 0 || exp.Produced.Versions != int64(versions) {
		t.Fatalf("%d versions (%d in the file), %d cancellations, %d moved to another account", versions, exp.Produced.Versions, cancelled, moved)
	}
	want, err := ledgercheck.NewModelWith(ledgercheck.Options{Period: cfg.Period})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range highest {
		if !ev.Cancelled {
			want.Add(ledgercheck.Event{EventID: ev.EventID, AccountID: ev.AccountID, AmountMinor: ev.AmountMinor, Currency: ev.Currency, OccurredAt: ev.OccurredAt})
		}
	}
	w := want.Expected()
	if exp.EventsValid != w.EventsValid {
		t.Fatalf("expected %d events, the highest revisions are %d", exp.EventsValid, w.EventsValid)
	}
	rows := map[ledgercheck.BalanceRow]bool{}
	for _, b := range exp.Balances {
		if b.BalanceMinor != 0 || b.EventCount != 0 {
			rows[b] = true
		}
	}
	for _, b := range w.Balances {
		if !rows[b] {
			t.Fatalf("balance %+v of the highest revisions is not expected", b)
		}
		delete(rows, b)
	}
	if len(rows) != 0 {
		t.Fatalf("expected balances the highest revisions do not have: %v", rows)
	}
}
