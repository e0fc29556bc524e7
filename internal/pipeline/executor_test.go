package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// memLedger is a Checkpointer over in-memory servers (memdriver): the
// executor's tests need no server.
type memLedger struct {
	servers []*memdriver.Cluster
	sink    *txsink.Sink
	ck      *Checkpointer
	epoch   map[int32]int64
	offsets map[int32]int64

	mu    sync.Mutex
	infos []CheckpointInfo
}

func newMemLedger(t *testing.T, servers, branches int, mod func(*Config)) *memLedger {
	t.Helper()
	return newMemLedgerOn(t, servers, branches, memdriver.Options{AttachPrepared: true, LockWait: time.Second}, nil, mod)
}

// newMemLedgerOn is newMemLedger on servers modelled by opts, with the
// sink's failpoints fps armed; the sink runs on the servers' clock.
func newMemLedgerOn(t *testing.T, servers, branches int, opts memdriver.Options, fps *failpoint.Set, mod func(*Config)) *memLedger {
	t.Helper()
	m := &memLedger{epoch: map[int32]int64{}, offsets: map[int32]int64{}}
	var ds []driver.Server
	var stores []driver.Store
	for range servers {
		c := memdriver.New(opts)
		s := c.As("billing")
		m.servers = append(m.servers, c)
		ds, stores = append(ds, s), append(stores, s)
	}
	ctx := context.Background()
	sink, err := txsink.New(ctx, txsink.Config{Branches: branches, Group: "g", Topic: "billing", StepTimeout: 5 * time.Second, Logger: testenv.Logger(),
		Failpoints: fps, Now: opts.Now}, ds[0].(*memdriver.Server), ds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sink.Close)
	cfg := memConfig(m)
	cfg.Clock = opts.Now // the servers' clock, as the sink's
	if mod != nil {
		mod(&cfg)
	}
	if m.ck, err = NewCheckpointer(cfg, sink, stores); err != nil {
		t.Fatal(err)
	}
	m.sink = sink
	return m
}

// memConfig is the checkpointer's configuration of the tests on the
// in-memory servers: small budgets, hourly windows, every checkpoint's
// info recorded in m.
func memConfig(m *memLedger) Config {
	return Config{Topic: "billing", Group: "g", CheckpointInterval: time.Second, CheckpointTimeout: 5 * time.Second, CheckpointMaxRecords: 1000,
		CheckpointMaxBytes: 1 << 20, MaxPollRecords: 100, DedupTTL: time.Hour, DedupCacheKeys: 100, DedupCleanupInterval: time.Second, DedupCleanupBatch: 10,
		Window: hourly, MaxEventTimeSkew: time.Hour, MaxPayloadBytes: 4096, DeadLetterPayloadBytes: 1024, RecoveryInterval: time.Second,
		DecisionRetention: time.Hour, ShutdownTimeout: time.Second, Logger: testenv.Logger(),
		OnCheckpoint: func(info CheckpointInfo) {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.infos = append(m.infos, info)
		}}
}

// event1 is a record of one event at t0 + minutes.
func event1(id, account string, amount int64, partition int32, minutes int) Record {
	ev := event.Event{EventID: id, AccountID: account, AmountMinor: amount, Currency: "EUR", OccurredAt: ts(t0).Add(time.Duration(minutes) * time.Minute)}
	v, _ := json.Marshal(ev)
	return Record{Event: ev, Partition: partition, Key: []byte(account), Value: v}
}

// checkpoint commits recs at the next offsets of their partitions,
// claiming partitions first seen.
func (m *memLedger) checkpoint(t *testing.T, recs ...Record) (bool, error) {
	t.Helper()
	ctx := context.Background()
	var cuts []txsink.PartitionCut
	seen := map[int32]bool{}
	for i := range recs {
		p := recs[i].Partition
		if _, ok := m.epoch[p]; !ok {
			pos, err := m.sink.Claim(ctx, []int32{p})
			if err != nil {
				t.Fatal(err)
			}
			m.epoch[p] = pos[p].Epoch
		}
		recs[i].Offset = m.offsets[p]
		m.offsets[p]++
		seen[p] = true
	}
	for p := range seen {
		wm := time.Time{}
		for _, r := range recs {
			if r.Partition == p && r.Event.OccurredAt.After(wm) {
				wm = r.Event.OccurredAt
			}
		}
		cuts = append(cuts, txsink.PartitionCut{Partition: p, Epoch: m.epoch[p], NextOffset: m.offsets[p], Watermark: wm})
	}
	return m.ck.Checkpoint(ctx, recs, cuts)
}

func (m *memLedger) tables() driver.Tables { return m.servers[0].Tables() }

func (m *memLedger) balance(account string) driver.BalanceRow {
	for _, s := range m.servers {
		for _, b := range s.Tables().Balances {
			if b.Account == account {
				return b
			}
		}
	}
	return driver.BalanceRow{}
}

func (m *memLedger) attempts() []CheckpointInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]CheckpointInfo(nil), m.infos...)
}

func reasons(tb driver.Tables) map[string]int {
	out := map[string]int{}
	for _, d := range tb.DeadLetters {
		out[d.Reason]++
	}
	return out
}

// The executor over the in-memory store, every guarantee of one
// checkpoint at once: each event counts once, a repeat within the
// snapshot and a repeat of a committed key (looked up on its server, or
// known to the cache) are dropped, a conflicting repeat and an overflow
// are dead letters, every counted event has a ledger entry, the keys it
// kept are stored (nothing journaled: expiry is by generations), and the
// positions move with the decision.
func TestExecutorCountsEachEventOnce(t *testing.T) {
	m := newMemLedger(t, 2, 2, func(c *Config) { c.LedgerEntries, c.DedupCacheKeys = true, 0 })
	decided, err := m.checkpoint(t, event1("a", "acct-1", 5, 0, 0), event1("b", "acct-2", math.MaxInt64, 1, 0), event1("a", "acct-1", 5, 1, 0))
	if !decided || err != nil {
		t.Fatalf("first checkpoint: %v, %v", decided, err)
	}
	decided, err = m.checkpoint(t, event1("a", "acct-1", 5, 0, 0), event1("a", "acct-1", 6, 0, 0), event1("c", "acct-2", 1, 1, 4),
		event1("d", "acct-1", math.MaxInt64, 0, 5))
	if !decided || err != nil {
		t.Fatalf("second checkpoint: %v, %v", decided, err)
	}
	if b := m.balance("acct-1"); b.Amount != 5 || b.Count != 1 {
		t.Errorf("acct-1 %+v, want 5 over 1: the repeats dropped, the overflow refused", b)
	}
	if b := m.balance("acct-2"); b.Amount != math.MaxInt64 || b.Count != 1 {
		t.Errorf("acct-2 %+v, want MaxInt64 over 1 (c overflows it)", b)
	}
	var dead = map[string]int{}
	var entries, keys int
	for _, s := range m.servers {
		tb := s.Tables()
		for r, n := range reasons(tb) {
			dead[r] += n
		}
		entries += len(tb.Entries)
		for _, ks := range tb.Keys {
			keys += len(ks)
		}
	}
	if dead["conflicting_duplicate"] != 1 || dead["amount_overflow"] != 2 || len(dead) != 2 {
		t.Errorf("dead letters %v, want a conflict and two overflows", dead)
	}
	if entries != 2 || keys != 2 {
		t.Errorf("%d entries, %d keys; want 2 each (a and b counted; c and d overflowed, unclaimed)", entries, keys)
	}
	pos, err := m.sink.Positions(context.Background(), []int32{0, 1})
	if err != nil || pos[0].NextOffset != 4 || pos[1].NextOffset != 3 {
		t.Errorf("positions %+v (%v), want 4 and 3", pos, err)
	}
	if st := m.ck.Stats(); st.Counted.Load() != 2 || st.Duplicates.Load() != 2 || st.Checkpoints.Load() != 2 {
		t.Errorf("stats counted %d, duplicates %d, checkpoints %d", st.Counted.Load(), st.Duplicates.Load(), st.Checkpoints.Load())
	}
}

// An overflow only the server sees (a sum that never leaves its range in
// the checkpoint, added to a stored balance near the maximum) fails the
// fast path; the attempt is retried at once in careful mode, which refuses
// the event that overflows and counts the others.
func TestExecutorRetriesCarefulAfterAnOverflowOfTheServer(t *testing.T) {
	m := newMemLedger(t, 1, 1, nil)
	if ok, err := m.checkpoint(t, event1("big", "acct", math.MaxInt64-10, 0, 0)); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := m.checkpoint(t, event1("x", "acct", 4, 0, 1), event1("y", "acct", 20, 0, 2), event1("z", "acct", 5, 0, 3)); !ok || err != nil {
		t.Fatalf("the careful retry did not commit: %v, %v", ok, err)
	}
	if b := m.balance("acct"); b.Amount != math.MaxInt64-1 || b.Count != 3 {
		t.Errorf("balance %+v, want MaxInt64-1 over 3: y refused", b)
	}
	as := m.attempts()
	if len(as) != 3 || !errors.Is(as[1].Err, errNeedCareful) || !as[1].Retrying || as[1].FailedPhase != "write" || !as[2].Careful || as[2].Err != nil {
		t.Fatalf("attempts %+v: want the fast path refused in write, then a careful commit", as)
	}
}

// A statement over a max_allowed_packet lowered since the budget was read
// is refused as too large; the limits are reread and the same snapshot
// commits in smaller statements.
func TestExecutorRereadsTheLimitsAfterTooLarge(t *testing.T) {
	m := newMemLedger(t, 1, 1, nil)
	m.servers[0].SetMaxAllowedPacket(stmt.MinPacket)
	var recs []Record
	for i := range 3000 {
		recs = append(recs, event1(fmt.Sprintf("%s-%d", strings.Repeat("e", 100), i), fmt.Sprintf("acct-%d", i%50), 1, 0, 0))
	}
	if ok, err := m.checkpoint(t, recs...); !ok || err != nil {
		t.Fatalf("after rereading the limits: %v, %v", ok, err)
	}
	as := m.attempts()
	if len(as) != 2 || m.sink.Code(as[0].Err) != driver.TooLarge || !as[0].Retrying || as[1].Err != nil {
		t.Fatalf("attempts %+v, want one refused as too large, then a commit", as)
	}
	if got := m.sink.MaxStatementBytes(0); got != stmt.Budget(stmt.MinPacket) {
		t.Errorf("budget %d after the refresh, want %d", got, stmt.Budget(stmt.MinPacket))
	}
	if n := len(m.tables().Keys[0]); n != 3000 {
		t.Errorf("%d keys stored, want 3000", n)
	}
}

// A record the database refuses (a trigger on its account) fails the
// checkpoint twice; the record is isolated by trials into a
// rejected_by_database dead letter, the others count. A refusal that no
// record causes (the sealing, which every checkpoint with closed windows
// runs) blames none: nothing is dead-lettered and the checkpoint fails.
func TestExecutorIsolatesWhatTheDatabaseRefuses(t *testing.T) {
	m := newMemLedger(t, 1, 2, nil)
	m.servers[0].SetTrigger(func(table string, row any) error {
		if b, ok := row.(driver.BalanceRow); ok && b.Account == "acct-bad" {
			return memdriver.Refusal("acct-bad refused by a trigger")
		}
		return nil
	})
	var recs []Record
	for i := range 9 {
		account := fmt.Sprintf("acct-%d", i%3)
		if i == 6 {
			account = "acct-bad"
		}
		recs = append(recs, event1(fmt.Sprintf("e%d", i), account, int64(i+1), 0, i))
	}
	if ok, err := m.checkpoint(t, recs...); !ok || err != nil {
		t.Fatalf("after isolation: %v, %v", ok, err)
	}
	tb := m.tables()
	if r := reasons(tb); r["rejected_by_database"] != 1 || len(tb.DeadLetters) != 1 || tb.DeadLetters[0].Offset != 6 {
		t.Fatalf("dead letters %+v, want the record at offset 6 rejected", tb.DeadLetters)
	}
	var sum int64
	for _, b := range tb.Balances {
		sum += b.Amount
	}
	if sum != 45-7 {
		t.Errorf("balances sum to %d, want every other event (38)", sum)
	}
	as := m.attempts()
	if last := as[len(as)-2]; last.Isolation != IsolationRejected {
		t.Errorf("attempts %+v: want an isolation that rejected", as)
	}
}

// A row over its statement's budget (a bug: every row is sized below its
// budget by construction, so the record that makes one is fed directly: an
// event id of 600 KiB, which the decoder would refuse) is isolated into a
// rejected_by_database dead letter naming the bug; the others count.
func TestExecutorIsolatesAnOversizedRow(t *testing.T) {
	m := newMemLedger(t, 1, 2, nil)
	m.servers[0].SetMaxAllowedPacket(1 << 20)
	if err := m.ck.pools[0].RefreshLimits(context.Background()); err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("h", 600<<10)
	start := time.Now()
	if ok, err := m.checkpoint(t, event1("fine-1", "acct-h", 10, 0, 0), event1(huge, "acct-h", 11, 0, 1), event1("fine-2", "acct-h", 12, 0, 2)); !ok || err != nil {
		t.Fatalf("checkpoint with an oversized row: %v, %v", ok, err)
	}
	if b := m.balance("acct-h"); b.Amount != 22 || b.Count != 2 {
		t.Errorf("balance %+v, want the two other events", b)
	}
	tb := m.tables()
	if len(tb.DeadLetters) != 1 || tb.DeadLetters[0].Offset != 1 || !strings.Contains(tb.DeadLetters[0].Detail, "a bug") || len(tb.DeadLetters[0].EventID) != 128 {
		t.Errorf("dead letters %+v, want one at offset 1 naming the bug, its event id cut to 128 bytes", tb.DeadLetters)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the isolation took %s", d)
	}
}

// Closing windows over the in-memory store: a checkpoint whose records
// pass a window's end plus WINDOW_CLOSE_AFTER closes it (its later events
// are adjustments), the next checkpoint, even without records, seals its
// rows; a refusal of the sealing (which no record causes) is isolated to
// no record: nothing is dead-lettered, the checkpoint fails, and seals
// once the refusal stops.
func TestExecutorClosesSealsAndBlamesNoRecordForTheSealing(t *testing.T) {
	m := newMemLedger(t, 1, 2, func(c *Config) { c.WindowCloseAfter = 30 * time.Minute })
	if ok, err := m.checkpoint(t, event1("a", "acct-1", 1, 0, 0), event1("b", "acct-2", 2, 0, 1)); !ok || err != nil {
		t.Fatal(ok, err)
	}
	// 14:40 passes the 13:00 window's end plus 30 minutes.
	if ok, err := m.checkpoint(t, event1("c", "acct-1", 4, 0, 95), event1("late", "acct-1", 8, 0, 10)); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if !m.ck.EventTimeDue() {
		t.Fatal("a checkpoint that closed windows leaves the next one due")
	}
	if tb := m.tables(); len(tb.Adjustments) != 1 || tb.Adjustments[0].Amount != 8 {
		t.Fatalf("adjustments %+v, want the late event's", tb.Adjustments)
	}
	refuse := func(on bool) {
		m.servers[0].SetTrigger(func(table string, row any) error {
			if w, ok := row.(driver.WindowRow); on && ok && !w.ClosedAt.IsZero() {
				return memdriver.Refusal("sealing refused by an operator trigger")
			}
			return nil
		})
	}
	refuse(true)
	ok, err := m.ck.Checkpoint(context.Background(), nil, nil)
	as := m.attempts()
	if ok || err == nil || as[len(as)-1].Isolation != IsolationNotARecord || len(m.tables().DeadLetters) != 0 {
		t.Fatalf("sealing refused: decided %v, %v, isolation %q, %d dead letters; want a failure blaming no record",
			ok, err, as[len(as)-1].Isolation, len(m.tables().DeadLetters))
	}
	refuse(false)
	if ok, err := m.ck.Checkpoint(context.Background(), nil, nil); !ok || err != nil {
		t.Fatal(ok, err)
	}
	sealed := 0
	for _, w := range m.tables().Windows {
		if !w.ClosedAt.IsZero() {
			sealed++
			if !w.Start.Equal(ts(t0).Truncate(time.Hour)) {
				t.Errorf("window %+v sealed: only 13:00 is closed", w)
			}
		}
	}
	if sealed != 2 {
		t.Errorf("%d rows sealed, want the 13:00 window's 2", sealed)
	}
}
