package bench

import (
	"fmt"
	"testing"
	"time"
)

// TestGroupCauses: failed attempts only, counted by cause, the most
// frequent first, ties by name.
func TestGroupCauses(t *testing.T) {
	cs := []instCkpt{
		{Failed: true, Cause: "lock_wait_timeout in dedup"},
		{Decided: true, Records: 100},
		{Failed: true, Cause: "fenced in decide"},
		{Failed: true, Cause: "lock_wait_timeout in dedup"},
		{Failed: true, Cause: "deadlock in write"},
		{Decided: true, Err: "commit: connection lost", Cause: ""}, // decided: committed by recovery, not aborted
	}
	got := groupCauses(cs)
	want := []causeCount{{"lock_wait_timeout in dedup", 2}, {"deadlock in write", 1}, {"fenced in decide", 1}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("groupCauses = %v, want %v", got, want)
	}
	if s := causesLine(got); s != "lock_wait_timeout in dedup 2, deadlock in write 1, fenced in decide 1" {
		t.Errorf("causesLine = %q", s)
	}
	if s := causesLine(groupCauses(nil)); s != "none" {
		t.Errorf("causesLine of none = %q", s)
	}
}

// TestSharedUnits: the rate of several instances starts at the last
// checkpoint before all of them held partitions.
func TestSharedUnits(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	us := []unit{{end: at(1), records: 50}, {end: at(3), records: 50}, {end: at(5), records: 10}, {end: at(6), records: 10}}
	for _, c := range []struct {
		allIn time.Time
		first int
	}{{time.Time{}, 0}, {at(0), 0}, {at(1), 0}, {at(4), 1}, {at(5), 1}, {at(7), 3}} {
		got := sharedUnits(us, c.allIn)
		if len(got) != len(us)-c.first || !got[0].end.Equal(us[c.first].end) {
			t.Errorf("allIn %v: %d units from %v, want from unit %d", c.allIn, len(got), got[0].end, c.first)
		}
	}
	if r := summarize(sharedUnits(us, at(4)), t0).Rate; r != 20.0/3 {
		t.Errorf("rate %v, want 20 records over 3 s", r)
	}
}
