package periods

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// TestShowReadsTheView: billing periods show's report, read through the
// read-only view (here of the in-memory driver): every definition in
// order with the instant it takes effect from, the closing frontier, and
// the latest watermark of the group's partitions; a ledger without
// settings is said so.
func TestShowReadsTheView(t *testing.T) {
	ctx := t.Context()
	s := memdriver.New(memdriver.Options{}).As("billing")
	v := memdriver.NewView(s)
	scope := driver.Scope{Group: "g", Topic: "events"}
	if _, err := Show(ctx, v, scope); err != ErrNoneStored {
		t.Fatalf("no settings stored: %v", err)
	}
	at := time.Date(2026, 2, 28, 23, 0, 0, 0, time.UTC) // midnight in Berlin
	s.Cluster().StorePeriods(
		driver.PeriodRow{Seq: 1, Window: "1h", Timezone: "UTC", RecordedAt: at.Add(-time.Hour), RecordedBy: "instance a"},
		driver.PeriodRow{Seq: 2, From: at, Window: "day", Timezone: "Europe/Berlin", Close: true, RecordedAt: at, RecordedBy: "billing periods change by ops"})
	if _, err := s.Claim(ctx, scope, "a", []int32{0, 1}, at); err != nil {
		t.Fatal(err)
	}
	wm := at.Add(5 * time.Hour)
	closed := at.Add(-24 * time.Hour)
	d := driver.Decision{Gtrid: "g1", Outcome: driver.Committed, By: "a", At: at}
	if _, err := s.Commit(ctx, d, scope, []driver.Cut{{Partition: 0, NextOffset: 5, Watermark: wm.Add(-time.Hour)}, {Partition: 1, NextOffset: 9, Watermark: wm}},
		func([]driver.Stored) error { return nil }, &driver.FrontierChange{Raise: driver.Frontier{Closed: closed}}, nil, nil,
		true); err != nil {
		t.Fatal(err)
	}
	r, err := Show(ctx, v, scope)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Definitions) != 2 || r.Definitions[0].From != nil || r.Definitions[1].From == nil || !r.Definitions[1].From.Equal(at) ||
		r.Definitions[1].Window != "day" || r.Definitions[1].Timezone != "Europe/Berlin" || !r.Definitions[1].WindowsClose {
		t.Errorf("definitions %+v", r.Definitions)
	}
	if !r.WindowsClose || !strings.Contains(r.Windows, "day in Europe/Berlin") {
		t.Errorf("windows %q, close %v", r.Windows, r.WindowsClose)
	}
	if r.ClosedBefore == nil || !r.ClosedBefore.Equal(closed) || r.SealedBefore != nil || r.Watermark == nil || !r.Watermark.Equal(wm) {
		t.Errorf("frontier %v / %v, watermark %v", r.ClosedBefore, r.SealedBefore, r.Watermark)
	}
}

// TestMembersNamesEveryRunningInstance: a change is refused while any of
// the groups has a member, each named (safely: a client id is outside
// text); a group Kafka does not know, or could not describe, has none.
func TestMembersNamesEveryRunningInstance(t *testing.T) {
	described := kadm.DescribedGroups{
		"billing-ledger": {Group: "billing-ledger", Members: []kadm.DescribedGroupMember{{MemberID: "m-1", ClientID: "billing-abc\x1b[2J", ClientHost: "/10.0.0.7"}}},
		"billing-blue":   {Group: "billing-blue", State: "Empty"},
	}
	got := members(described, []string{"billing-blue", "billing-ledger", "never-seen"})
	if len(got) != 1 || !strings.Contains(got[0], "m-1 (group billing-ledger") || !strings.Contains(got[0], `"billing-abc\x1b[2J"`) || strings.ContainsRune(got[0], 0x1b) {
		t.Fatalf("members %q", got)
	}
	if got := members(described, []string{"billing-blue"}); len(got) != 0 {
		t.Fatalf("an empty group has members: %q", got)
	}
}
