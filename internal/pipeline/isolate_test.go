package pipeline

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
)

// Triggers that refuse a statement every checkpoint runs, whatever its
// records, while fault.active is set: the sealing of closed windows (every
// checkpoint with a window to seal runs it, one with no record too), and
// the decision's move of a partition's position (no trial runs it).
const (
	faultTable      = `CREATE TABLE fault (singleton TINYINT PRIMARY KEY, active BOOLEAN NOT NULL)`
	sealingRefused  = `CREATE TRIGGER refuse_sealing BEFORE UPDATE ON billing_windows FOR EACH ROW IF NEW.closed_at IS NOT NULL AND OLD.closed_at IS NULL AND (SELECT active FROM fault WHERE singleton = 1) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'sealing refused by an operator trigger'; END IF`
	decisionRefused = `CREATE TRIGGER refuse_positions BEFORE UPDATE ON partition_offsets FOR EACH ROW IF NEW.next_offset <> OLD.next_offset AND (SELECT active FROM fault WHERE singleton = 1) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'positions refused by an operator trigger'; END IF`
)

// Guarantee 3 against a failure no record causes (issue 18): a trigger
// refuses every statement of one kind, whatever the records, for a data
// reason (1644, SIGNAL). Isolation tries the checkpoint with no record
// first, and its writes alone: it finds no record to blame, says so in its
// outcome (billing_isolations_total, the alert
// BillingFailureNotCausedByARecord) and dead-letters nothing; once the
// trigger stops refusing, every event counts once. Also when the failure
// comes and goes while checkpoints are replayed and isolations run.
// Before, isolation bisected and blamed innocent records: every record of
// a checkpoint whose sealing was refused, one per replay when the decision
// was refused, each a rejected_by_database dead letter never counted.
func TestIsolationBlamesNoRecordForAFailureNoRecordCauses(t *testing.T) {
	for _, c := range []isolationCase{
		{"sealing refused", sealingRefused, true, IsolationNotARecord, false},
		{"sealing refused now and then", sealingRefused, true, IsolationNotARecord, true},
		{"decision refused", decisionRefused, false, IsolationNotReproduced, false},
	} {
		t.Run(c.name, func(t *testing.T) { c.run(t) })
	}
}

// isolationCase is a trigger that refuses, and what isolation makes of it.
type isolationCase struct {
	name    string
	trigger string
	closing bool
	outcome string // of the isolations while the trigger refuses
	toggle  bool   // the trigger refuses now and then
}

// isolationOutcomes counts the isolations' outcomes an instance reports.
type isolationOutcomes struct {
	mu sync.Mutex
	by map[string]int
}

// count is the number of isolations of outcome o, every one when o is "".
func (io *isolationOutcomes) count(o string) int {
	io.mu.Lock()
	defer io.mu.Unlock()
	if o == "" {
		n := 0
		for _, k := range io.by {
			n += k
		}
		return n
	}
	return io.by[o]
}

func refusingEvents(prefix string, n int, at string) []*kgo.Record {
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, ev{fmt.Sprintf("%s-%d", prefix, i), fmt.Sprintf("acct-%d", i%5), int64(i + 1), "EUR", at}.record(""))
	}
	return recs
}

func (c isolationCase) run(t *testing.T) {
	e := newEnv(t, 2)
	for _, ddl := range []string{faultTable, `INSERT INTO fault VALUES (1, FALSE)`, c.trigger} {
		if _, err := e.db.Exec(ddl); err != nil {
			t.Fatal(err)
		}
	}
	setFault := func(on bool) {
		t.Helper()
		if _, err := e.db.Exec(`UPDATE fault SET active = ? WHERE singleton = 1`, on); err != nil {
			t.Fatal(err)
		}
	}
	outcomes := &isolationOutcomes{by: map[string]int{}}
	start(t, e, func(cfg *Config, _ *sinkConfig) {
		if c.closing {
			cfg.WindowCloseAfter = 30 * time.Minute
		}
		cfg.OnCheckpoint = func(info CheckpointInfo) {
			if info.Isolation != "" {
				outcomes.mu.Lock()
				outcomes.by[info.Isolation]++
				outcomes.mu.Unlock()
			}
		}
	})
	// Counted while the trigger lets everything pass.
	produce(t, e, refusingEvents("before", 40, "2026-11-29T10:05:00Z")...)
	waitCounted(t, e.db, 40, 0)

	// The trigger refuses; these events close the 10:00 windows
	// (11:30 is their end plus 30 minutes), whose sealing is then
	// due in every checkpoint.
	setFault(true)
	produce(t, e, refusingEvents("during", 30, "2026-11-29T11:30:00Z")...)
	testenv.Eventually(t, time.Minute, "isolations", func() (bool, string) {
		return outcomes.count("") >= 2, fmt.Sprint(outcomes.count(""))
	})
	if c.toggle {
		for i := range 4 {
			setFault(false)
			time.Sleep(1500 * time.Millisecond)
			setFault(true)
			produce(t, e, refusingEvents(fmt.Sprintf("toggle-%d", i), 5, "2026-11-29T11:40:00Z")...)
			time.Sleep(1500 * time.Millisecond)
		}
	}
	var dead int
	if err := e.db.Get(&dead, `SELECT COUNT(*) FROM dead_letters`); err != nil || dead != 0 {
		t.Fatalf("%d dead letters (%v) while the trigger refused: a failure no record causes blamed records", dead, err)
	}
	if n, all := outcomes.count(c.outcome), outcomes.count(""); n != all {
		outcomes.mu.Lock()
		t.Errorf("isolations %v, want every one %s", outcomes.by, c.outcome)
		outcomes.mu.Unlock()
	}
	setFault(false)
	c.checkAfter(t, e, outcomes)
}

// checkAfter checks the ledger once the trigger stopped refusing: every
// event counted once, nothing lost or twice, the windows sealed.
func (c isolationCase) checkAfter(t *testing.T, e *env, outcomes *isolationOutcomes) {
	var want int64 = 40 + 30
	if c.toggle {
		want += 4 * 5
	}
	waitCounted(t, e.db, want, 0)
	if n := outcomes.count(IsolationRejected); n != 0 {
		t.Errorf("%d isolations rejected records", n)
	}
	var sum int64
	if err := e.db.Get(&sum, `SELECT SUM(balance_minor) FROM account_balances`); err != nil {
		t.Fatal(err)
	}
	// 1..40, 1..30, and 1..5 per toggle: nothing lost or twice.
	wantSum := int64(40*41/2 + 30*31/2)
	if c.toggle {
		wantSum += 4 * 15
	}
	if sum != wantSum {
		t.Errorf("balances sum to %d, want %d", sum, wantSum)
	}
	if c.closing {
		waitFor(t, "the 10:00 windows to be sealed", func() bool { return sealedCount(t, e.db) == 5 })
		checkSplit(t, e.db, false)
	}
}

// Guarantee 3 against a bug in a size computation: a row over its
// statement's budget (*stmt.TooLargeError; by construction none is, so a
// record that makes one is fed to the Checkpointer directly: an event id
// of 600 KiB, which the decoder would refuse, on a client limited to 1 MiB
// packets) never stalls its partition.
// The checkpoint is not replayed forever: the record is isolated into a
// bare rejected_by_database dead letter whose detail names the bug, the
// other records of the checkpoint count, and the attempts report the
// error, so that billing_oversized_rows_total counts it.
func TestOversizedRowIsIsolatedNotReplayedForever(t *testing.T) {
	e := newEnvWith(t, 1, envOptions{dsnParams: "&maxAllowedPacket=1048576"})
	sink, d := openSink(t, sinkConfig{DSNs: []string{e.dsn}, Config: txsink.Config{Branches: 2, Group: "g-" + e.topic, Topic: e.topic,
		StepTimeout: 10 * time.Second, Logger: testenv.Logger()}})
	t.Cleanup(func() { sink.Close(); d.Close() })
	var (
		mu        sync.Mutex
		oversized int
		outcomes  []string
	)
	cfg := testConfig(e)
	cfg.OnCheckpoint = func(info CheckpointInfo) {
		mu.Lock()
		defer mu.Unlock()
		if info.Err != nil && strings.Contains(info.Err.Error(), "over the statement budget") {
			oversized++
		}
		if info.Isolation != "" {
			outcomes = append(outcomes, info.Isolation)
		}
	}
	ck, err := NewCheckpointer(cfg, sink, d.Stores())
	if err != nil {
		t.Fatal(err)
	}
	pos, err := sink.Claim(t.Context(), []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("h", 600<<10)
	var recs []Record
	for i, id := range []string{"fine-1", huge, "fine-2"} {
		recs = append(recs, Record{Partition: 0, Offset: int64(i), Key: []byte("acct-h"), Value: []byte(`{"event_id":"…"}`),
			Event: event.Event{EventID: id, AccountID: "acct-h", AmountMinor: int64(10 + i), Currency: "EUR", OccurredAt: ts(t0)}})
	}
	decided, err := ck.Checkpoint(t.Context(), recs, []txsink.PartitionCut{{Partition: 0, Epoch: pos[0].Epoch, NextOffset: 3}})
	if !decided || err != nil {
		t.Fatalf("checkpoint with an oversized row: decided %v, %v; want it committed without the row", decided, err)
	}
	if b := balances(t, e.db)["acct-h/EUR"]; b.Amount != 10+12 || b.Count != 2 {
		t.Errorf("balance %+v, want the two other events (22 over 2)", b)
	}
	var rows []struct {
		Reason  string  `db:"reason"`
		Detail  string  `db:"detail"`
		EventID *string `db:"event_id"`
		Offset  int64   `db:"kafka_offset"`
	}
	if err := e.db.Select(&rows, `SELECT reason, detail, event_id, kafka_offset FROM dead_letters`); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].Offset != 1 || rows[0].Reason != "rejected_by_database" || !strings.Contains(rows[0].Detail, "a bug") ||
		rows[0].EventID == nil || len(*rows[0].EventID) != 128 {
		t.Errorf("dead letters %+v, want one rejected_by_database at offset 1 naming the bug, its id cut to 128 bytes", rows)
	}
	mu.Lock()
	defer mu.Unlock()
	if oversized < 2 || len(outcomes) != 1 || outcomes[0] != IsolationRejected {
		t.Errorf("%d attempts reported the oversized row, isolations %v; want at least 2 and one rejected", oversized, outcomes)
	}
}
