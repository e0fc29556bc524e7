package ledgerstatus

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
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

// fakeKafka answers a report's admin requests from fixed listings.
type fakeKafka struct {
	ends, starts kadm.ListedOffsets
	groups       kadm.DescribedGroups
	err          error // of every request
}

func (k fakeKafka) ListCommittedOffsets(context.Context, ...string) (kadm.ListedOffsets, error) {
	return k.ends, k.err
}

func (k fakeKafka) ListStartOffsets(context.Context, ...string) (kadm.ListedOffsets, error) {
	return k.starts, k.err
}

func (k fakeKafka) DescribeGroups(context.Context, ...string) (kadm.DescribedGroups, error) {
	return k.groups, k.err
}

func listed(topic string, m map[int32]int64) kadm.ListedOffsets {
	l := kadm.ListedOffsets{topic: {}}
	for p, o := range m {
		l[topic][p] = kadm.ListedOffset{Topic: topic, Partition: p, Offset: o}
	}
	return l
}

// unreachable is the view and dead letters of a ledger whose one server
// refuses every connection.
func unreachable(t *testing.T) (driver.View, Letters) {
	db := sqlx.NewDb(unreachableDB(t), "mysql")
	return mysqldriver.NewView(db), ServerLetters{mysqldriver.NewLetters(db)}
}

func unreachableDB(t *testing.T) *sql.DB {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	db, err := sql.Open("mysql", "u:p@tcp("+addr+")/ledger?timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestCollectNeverInventsWhatItCannotRead (issue 22): with the ledger's
// MySQL unreadable, the report had every partition "start" (stored_offset
// -2) with the whole log as lag, "no checkpoint", "no branch in doubt" and
// "no dead letter". Now every part that comes from MySQL is unknown, with
// its error, and what Kafka said is kept; the JSON carries no number for
// what is unknown.
func TestCollectNeverInventsWhatItCannotRead(t *testing.T) {
	const topic = "events"
	k := fakeKafka{ends: listed(topic, map[int32]int64{0: 4333, 1: 10}), starts: listed(topic, map[int32]int64{0: 0, 1: 0}),
		groups: kadm.DescribedGroups{"g": {Group: "g", State: "Empty"}}}
	wrapped := 0
	v, letters := unreachable(t)
	r := Collect(t.Context(), Sources{View: v, Letters: letters, Kafka: k, Topic: topic, Group: "g",
		ServerError: func(i int, err error) error { wrapped++; return fmt.Errorf("server %d said: %w", i, err) }})
	if r.Complete() || len(r.Problems) != 7 {
		t.Fatalf("problems = %q; want the seven MySQL parts", r.Problems)
	}
	if r.PositionsError == "" || r.LastCheckpointError == "" || r.CommitLogError == "" || r.InDoubtError == "" || r.DeadLettersError == "" || r.PeriodsError == "" || r.ChangelogError == "" || r.LogError != "" {
		t.Errorf("errors: positions %q, checkpoint %q, commit log %q, in doubt %q, dead letters %q, periods %q, log %q", r.PositionsError, r.LastCheckpointError, r.CommitLogError, r.InDoubtError, r.DeadLettersError, r.PeriodsError, r.LogError)
	}
	if r.Periods != nil {
		t.Errorf("periods = %+v; want null when they could not be read", r.Periods)
	}
	if r.CommitLog != nil {
		t.Errorf("commit log = %+v; want null when it could not be read", r.CommitLog)
	}
	if r.Changelog != nil {
		t.Errorf("changelog = %+v; want null when it could not be read (not off)", r.Changelog)
	}
	if wrapped < 7 || !strings.Contains(r.PositionsError, "server 0 said") {
		t.Errorf("ServerError not applied to the MySQL errors (%d times): %q", wrapped, r.PositionsError)
	}
	if len(r.Partitions) != 2 || r.TotalLag != nil || r.LastCheckpoint != nil || r.InDoubt != nil || r.OtherLedgersInDoubt != nil || r.DeadLetters != nil {
		t.Fatalf("report invents values: %+v", r)
	}
	for _, p := range r.Partitions {
		if p.Stored != StoredUnknown || p.StoredOffset != nil || p.Lag != nil || p.Claimed || p.LogEnd == nil || !p.InLog {
			t.Errorf("partition %d = %+v; want stored unknown, no offset, no lag, the log end kept", p.Partition, p)
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{`"stored_offset"`, `"total_lag":0`, `"lag":4333`, `"in_doubt":[]`, `"dead_letters_waiting":[]`} {
		if strings.Contains(string(b), bad) {
			t.Errorf("JSON has %s for a value that could not be read:\n%s", bad, b)
		}
	}
	for _, want := range []string{`"stored":"unknown"`, `"total_lag":null`, `"lag":null`, `"positions_error":`, `"in_doubt":null`, `"dead_letters_waiting":null`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON lacks %s:\n%s", want, b)
		}
	}
}

// TestCollectTopicMissing: a topic the brokers do not know is said so
// (not an error that prints no report), and Kafka that cannot be reached
// leaves the log unknown, with its error.
func TestCollectTopicMissing(t *testing.T) {
	missing := kadm.ListedOffsets{"nope": {-1: {Topic: "nope", Partition: -1, Err: kerr.UnknownTopicOrPartition}}}
	v, letters := unreachable(t)
	r := Collect(t.Context(), Sources{View: v, Letters: letters, Kafka: fakeKafka{ends: missing, starts: missing, groups: kadm.DescribedGroups{}}, Topic: "nope", Group: "g"})
	if !r.TopicMissing || !strings.Contains(r.Absent(), `topic "nope" does not exist on the brokers`) || r.GroupState != "absent" {
		t.Errorf("missing topic: missing %v, absent %q, group %q", r.TopicMissing, r.Absent(), r.GroupState)
	}
	for _, p := range r.Problems {
		if strings.Contains(p, "nope") {
			t.Errorf("a missing topic is a fact, not a part that could not be read: %q", p)
		}
	}
	r = Collect(t.Context(), Sources{View: v, Letters: letters, Kafka: fakeKafka{err: errors.New("broker down")}, Topic: "t", Group: "g"})
	if r.TopicMissing || !strings.Contains(r.LogError, "broker down") || r.GroupError == "" || r.GroupState != "" || len(r.Partitions) != 0 {
		t.Errorf("Kafka down: missing %v, log error %q, group %q %q, partitions %v", r.TopicMissing, r.LogError, r.GroupError, r.GroupState, r.Partitions)
	}
}

// TestPartitionsJoinLogAndStored: the rows of a report from the log and
// the stored positions, each known or not: lag only where both are known,
// "unclaimed" lags by the whole log, a stored partition the log lacks is
// marked.
func TestPartitionsJoinLogAndStored(t *testing.T) {
	const topic = "t"
	ends, starts := listed(topic, map[int32]int64{0: 100, 1: 50, 2: 10}), listed(topic, map[int32]int64{0: 0, 1: 20, 2: 0})
	now := time.Unix(1_700_000_000, 0)
	at := func(next int64, owner string, epoch int64) Stored {
		return Stored{Stored: driver.Stored{NextOffset: next, Owner: owner, Epoch: epoch}, UpdatedAt: now}
	}
	stored := map[int32]Stored{0: at(60, "a", 3), 1: at(txsink.StartOffset, "a", 1), 7: at(5, "b", 1)}
	ps := partitions(topic, ends, starts, true, stored, true, map[int32]string{0: "m0"})
	type row struct {
		stored string
		lag    int64 // -1: unknown
		inLog  bool
	}
	want := map[int32]row{0: {StoredAt, 40, true}, 1: {StoredStart, 30, true}, 2: {StoredUnclaimed, 10, true}, 7: {StoredAt, -1, false}}
	if len(ps) != len(want) {
		t.Fatalf("partitions %+v", ps)
	}
	for _, p := range ps {
		lag := int64(-1)
		if p.Lag != nil {
			lag = *p.Lag
		}
		if w := want[p.Partition]; p.Stored != w.stored || lag != w.lag || p.InLog != w.inLog {
			t.Errorf("partition %d: stored %s lag %d in log %v; want %+v", p.Partition, p.Stored, lag, p.InLog, w)
		}
	}
	if ps[0].Member != "m0" || ps[0].Epoch != 3 || *ps[1].StoredOffset != txsink.StartOffset {
		t.Errorf("rows lost fields: %+v", ps[:2])
	}
	for _, p := range partitions(topic, ends, starts, false, stored, true, nil) {
		if p.Lag != nil || p.LogEnd != nil || p.InLog {
			t.Errorf("log unknown, yet partition %d has %+v", p.Partition, p)
		}
	}
	if ps := partitions(topic, ends, starts, true, nil, false, nil); len(ps) != 3 || ps[0].Stored != StoredUnknown || ps[0].Lag != nil {
		t.Errorf("positions unknown: %+v", ps)
	}
}

// TestAbsentNamesTheGroupsTheLedgerHolds: a group without positions of
// the topic in a ledger that holds other groups' positions (a forgotten
// KAFKA_GROUP) is said plainly, naming those groups; a fresh ledger with
// no positions at all is not "absent".
func TestAbsentNamesTheGroupsTheLedgerHolds(t *testing.T) {
	r := &Report{Topic: "events", Group: "billing-ledger", StoredGroups: []StoredGroup{{"billing-blue", "events", 6}}}
	if a := r.Absent(); !strings.Contains(a, `group "billing-ledger" has no positions`) || !strings.Contains(a, `group "billing-blue" on topic "events" (6 partitions)`) {
		t.Errorf("Absent() = %q", a)
	}
	r.StoredGroups = nil
	if a := r.Absent(); a != "" {
		t.Errorf("fresh ledger: Absent() = %q", a)
	}
	r.StoredGroups, r.GroupStored = []StoredGroup{{"billing-ledger", "events", 6}}, true
	if a := r.Absent(); a != "" {
		t.Errorf("the group is stored: Absent() = %q", a)
	}
}
