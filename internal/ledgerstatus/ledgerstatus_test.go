package ledgerstatus

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/billing/ledger/internal/txsink"
)

func TestLagOf(t *testing.T) {
	const topic = "t"
	off := func(m map[int32]int64) kadm.ListedOffsets {
		l := kadm.ListedOffsets{topic: {}}
		for p, o := range m {
			l[topic][p] = kadm.ListedOffset{Topic: topic, Partition: p, Offset: o}
		}
		return l
	}
	ends := off(map[int32]int64{0: 100, 1: 50, 2: 10, 3: 7})
	starts := off(map[int32]int64{0: 0, 1: 20, 2: 0, 3: 0})
	pos := map[int32]int64{0: 60, 1: txsink.StartOffset, 2: 12, 5: 3}
	lag, err := LagOf(topic, pos, ends, starts)
	if err == nil || !strings.Contains(err.Error(), "partition 5") {
		t.Errorf("a partition without end offset must be reported, got %v", err)
	}
	want := map[int32]int64{0: 40, 1: 30, 2: 0}
	if len(lag) != len(want) {
		t.Fatalf("lag = %v, want %v", lag, want)
	}
	for p, w := range want {
		if lag[p] != w {
			t.Errorf("partition %d: lag %d, want %d", p, lag[p], w)
		}
	}
}

func TestMergeWaiting(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	got := MergeWaiting(
		[]Waiting{{Reason: "invalid_json", Count: 2, Oldest: t0.Add(time.Hour)}, {Reason: "amount_overflow", Count: 1, Oldest: t0}},
		nil,
		[]Waiting{{Reason: "invalid_json", Count: 3, Oldest: t0}},
	)
	want := []Waiting{{Reason: "amount_overflow", Count: 1, Oldest: t0}, {Reason: "invalid_json", Count: 5, Oldest: t0}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}
