package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/changelogtest"
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// changelogLedger is a ledger of in-memory servers with several instances
// (each a sink and a Checkpointer of its own, on its own partition), all
// running the changelog: the outbox's tests.
type changelogLedger struct {
	servers []*memdriver.Cluster
	inst    []*memLedger
}

func newChangelogLedger(t *testing.T, servers, branches, instances int, mod func(*Config)) *changelogLedger {
	t.Helper()
	l := &changelogLedger{}
	var ds []driver.Server
	var stores []driver.Store
	for range servers {
		c := memdriver.New(memdriver.Options{AttachPrepared: true, LockWait: 200 * time.Millisecond})
		l.servers = append(l.servers, c)
		s := c.As("billing")
		ds, stores = append(ds, s), append(stores, s)
	}
	ctx := context.Background()
	if _, err := ds[0].(*memdriver.Server).EnableChangelog(ctx, "cl", time.Now()); err != nil {
		t.Fatal(err)
	}
	for range instances {
		sink, err := txsink.New(ctx, txsink.Config{Branches: branches, Group: "g", Topic: "billing", StepTimeout: 5 * time.Second,
			Logger: testenv.Logger(), Changelog: true}, ds[0].(*memdriver.Server), ds)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sink.Close)
		m := &memLedger{servers: l.servers, sink: sink, epoch: map[int32]int64{}, offsets: map[int32]int64{}}
		cfg := memConfig(m)
		cfg.CheckpointTimeout, cfg.Changelog = 10*time.Second, true
		if mod != nil {
			mod(&cfg)
		}
		if m.ck, err = NewCheckpointer(cfg, sink, stores); err != nil {
			t.Fatal(err)
		}
		l.inst = append(l.inst, m)
	}
	return l
}

// changelogEndsAtTheTables applies the outbox's events (outboxEvents) to
// a model of the tables, in commit order, checks that every chain is
// unbroken and that it ends at exactly the rows stored, none of the
// result tables empty, and returns the events, the number of
// checkpoints and the model.
func (l *changelogLedger) changelogEndsAtTheTables(t *testing.T) ([]changelog.Event, int, *changelogtest.Model) {
	t.Helper()
	evs, checkpoints := l.outboxEvents(t)
	model := changelogtest.NewModel()
	for i, ev := range evs {
		if err := model.Apply(ev); err != nil {
			t.Fatalf("event %d (checkpoint %d): %v", i, ev.Source.CommitSeq, err)
		}
	}
	rows := l.tableRows(t)
	for _, table := range []string{changelog.AccountBalances, changelog.BillingWindows, changelog.WindowAdjustments, changelog.LedgerEntries} {
		if d := changelogtest.Diff(rows[table], model.Canonical(table), 5); d != nil {
			t.Errorf("%s: the changelog ends elsewhere than the table:\n%s", table, strings.Join(d, "\n"))
		}
		if len(rows[table]) == 0 {
			t.Errorf("%s: no row: the generation exercised nothing", table)
		}
	}
	return evs, checkpoints, model
}

// outboxEvents reads every committed checkpoint's outbox, in commit order,
// as events (the publisher's reading, without Kafka), and the number of
// checkpoints.
func (l *changelogLedger) outboxEvents(t *testing.T) ([]changelog.Event, int) {
	t.Helper()
	ctx := context.Background()
	control := l.servers[0].As("billing")
	recs, err := control.Commits(ctx, 1, false, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var out []changelog.Event
	for _, r := range recs {
		for _, c := range l.servers {
			s := c.As("billing")
			idx, err := s.OutboxIndex(ctx, []string{r.Gtrid})
			if err != nil {
				t.Fatal(err)
			}
			bodies, err := s.ReadOutbox(ctx, idx)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range bodies {
				if err := changelog.Records(b, func(ch changelog.Change) error {
					ev, err := eventOf(ch, r.Gtrid, r.Seq)
					out = append(out, ev)
					return err
				}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return out, len(recs)
}

func eventOf(ch changelog.Change, gtrid string, seq int64) (changelog.Event, error) {
	tb, _ := changelog.ByID(ch.Table)
	ev := changelog.Event{Table: tb.Name, Op: ch.Op, Source: changelog.Source{Checkpoint: gtrid, CommitSeq: seq}}
	var err error
	if ch.Before != nil {
		if ev.Before, err = changelog.RowOf(tb, ch.Before); err != nil {
			return ev, err
		}
	}
	if ch.After != nil {
		ev.After, err = changelog.RowOf(tb, ch.After)
	}
	return ev, err
}

// tableRows are the rows of every server, in the changelog's Canonical
// form, by table.
func (l *changelogLedger) tableRows(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	add := func(table string, raw []byte) {
		tb, _ := changelog.Lookup(table)
		r, err := changelog.RowOf(tb, raw)
		if err != nil {
			t.Fatal(err)
		}
		c, err := changelog.Canonical(tb, r)
		if err != nil {
			t.Fatal(err)
		}
		out[table] = append(out[table], c)
	}
	for _, c := range l.servers {
		tb := c.Tables()
		for _, r := range tb.Balances {
			add(changelog.AccountBalances, changelog.BalanceRow(nil, r))
		}
		for _, r := range tb.Windows {
			add(changelog.BillingWindows, changelog.WindowRow(nil, r))
		}
		for _, r := range tb.Adjustments {
			add(changelog.WindowAdjustments, changelog.AdjustmentRow(nil, r))
		}
		for _, r := range tb.Entries {
			add(changelog.LedgerEntries, changelog.EntryRow(nil, r))
		}
	}
	return out
}

// The outbox is the tables' changelog: two instances checkpoint events of
// the same accounts concurrently (rows created by one while the other
// reads them absent, lock waits, windows that close and are sealed, late
// events, overflows, repeats), on two servers of two branches each; the
// changes of the committed checkpoints, applied in commit order, form an
// unbroken chain per key (every before is exactly the previous after,
// updated_at included) and end at exactly the rows stored, entries
// included.
func TestOutboxIsTheTablesChangelog(t *testing.T) { outboxIsTheTablesChangelog(t, false) }

// The same beside other instances: the seeds lock every key in one
// order, creating the rows that do not exist yet (lockOrder); a created
// row's change is a create, and one created for no counted event (an
// overflow) is rolled back with its attempt.
func TestOutboxIsTheTablesChangelogBesideOthers(t *testing.T) { outboxIsTheTablesChangelog(t, true) }

func outboxIsTheTablesChangelog(t *testing.T, shared bool) {
	l := newChangelogLedger(t, 2, 2, 2, func(c *Config) {
		c.LedgerEntries, c.WindowCloseAfter = true, 30*time.Minute
	})
	for _, m := range l.inst {
		m.ck.alone.Store(!shared)
	}
	l.checkpointConcurrently(t, 30)
	evs, checkpoints, model := l.changelogEndsAtTheTables(t)
	// closed_windows holds every sealed window once, as billing_windows
	// holds it (a sealed row never changes).
	closed := sealedRows(l.servers)
	slices.Sort(closed)
	if d := changelogtest.Diff(closed, model.Canonical(changelog.ClosedWindows), 5); d != nil {
		t.Errorf("closed_windows is not the sealed windows once each:\n%s", strings.Join(d, "\n"))
	}
	var sealed, careful, changes, raced, uncounted int
	for _, m := range l.inst {
		for _, info := range m.attempts() {
			var u *uncountedError
			switch {
			case info.Retrying && info.FailedPhase == stepWrite.phase():
				raced++
			case errors.As(info.Err, &u):
				uncounted++
			}
			if !info.Decided {
				continue
			}
			sealed += info.Sealed
			changes += info.Changes
			if info.Careful {
				careful++
			}
		}
	}
	if sealed == 0 || careful == 0 {
		t.Errorf("%d rows sealed, %d careful checkpoints: the generation missed sealing or overflow", sealed, careful)
	}
	t.Logf("%d changes in %d checkpoints (%d written, %d rows sealed, %d careful, %d retried after a write met a new row, %d after creating a row for nothing)",
		len(evs), checkpoints, changes, sealed, careful, raced, uncounted)
	if changes != len(evs) {
		t.Errorf("the checkpoints report %d changes, the outbox holds %d", changes, len(evs))
	}
}

// checkpointConcurrently runs checkpoints checkpoints on every instance at
// once, of generated events of shared accounts (rows created by one while
// another reads them absent, lock waits, windows that close, late events,
// overflows, repeats); a checkpoint that fails is replayed.
func (l *changelogLedger) checkpointConcurrently(t *testing.T, checkpoints int) {
	t.Helper()
	base := time.Now().UTC().Add(-48 * time.Hour).Truncate(time.Hour)
	accounts := []string{"a", "b", "c", "Müller", `q"uote`, "long-" + strings.Repeat("x", 59), "max", "min"}
	var wg sync.WaitGroup
	errs := make([]error, len(l.inst))
	for i, m := range l.inst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(11, uint64(i)))
			minute := 0
			for ck := range checkpoints {
				var recs []Record
				for range rng.IntN(12) + 1 {
					a := accounts[rng.IntN(len(accounts))]
					if rng.IntN(4) == 0 {
						a = fmt.Sprintf("new-%d", ck) // both instances create it
					}
					amount := rng.Int64N(2000) - 500
					switch a {
					case "max":
						amount = math.MaxInt64 / 3 // the fourth overflows
					case "min":
						amount = math.MinInt64 / 3
					}
					minute += rng.IntN(20)
					late := rng.IntN(5) == 0
					at := base.Add(time.Duration(minute) * time.Minute)
					if late {
						at = at.Add(-3 * time.Hour)
					}
					id := fmt.Sprintf("i%d-c%d-%d", i, ck, len(recs))
					if rng.IntN(10) == 0 && len(recs) > 0 {
						id = recs[0].Event.EventID // a repeat
					}
					ev := event.Event{EventID: id, AccountID: a, AmountMinor: amount, Currency: "EUR", OccurredAt: at}
					v, _ := json.Marshal(ev)
					recs = append(recs, Record{Event: ev, Partition: int32(i), Key: []byte(a), Value: v})
				}
				// A checkpoint that failed (two instances each holding a
				// row the other's other branch waits for: a lock wait
				// timeout no server sees as a deadlock) is replayed, as
				// the source replays it.
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
}

// A row created by another instance between a checkpoint's locking read
// (which found none: its change would say before null) and its write: the
// checkpoint's insert fails as a duplicate, it is retried at once, its
// reading then finds the row, and its change follows the other's.
func TestRowCreatedSinceTheReadIsReadAgain(t *testing.T) {
	l := newChangelogLedger(t, 1, 1, 2, nil)
	var once sync.Once
	l.inst[0].ck.beforeWrite = func() {
		once.Do(func() {
			if _, err := l.inst[1].checkpoint(t, event1("b1", "acct", 5, 1, 0)); err != nil {
				t.Errorf("the other instance: %v", err)
			}
		})
	}
	if _, err := l.inst[0].checkpoint(t, event1("a1", "acct", 7, 0, 1)); err != nil {
		t.Fatal(err)
	}
	evs, _ := l.outboxEvents(t)
	model := changelogtest.NewModel()
	for i, ev := range evs {
		if err := model.Apply(ev); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if d := changelogtest.Diff(l.tableRows(t)[changelog.AccountBalances], model.Canonical(changelog.AccountBalances), 5); d != nil {
		t.Errorf("the changelog ends elsewhere than the table:\n%s", strings.Join(d, "\n"))
	}
	raced := 0
	for _, info := range l.inst[0].attempts() {
		if info.Retrying && info.FailedPhase == stepWrite.phase() {
			raced++
		}
	}
	if raced != 1 {
		t.Errorf("%d attempts retried after the write met the new row, want 1", raced)
	}
}

// sealedRows are the sealed billing_windows rows of servers, as
// closed_windows rows (Canonical forms).
func sealedRows(servers []*memdriver.Cluster) []string {
	var out []string
	tb, _ := changelog.Lookup(changelog.ClosedWindows)
	for _, s := range servers {
		for _, r := range s.Tables().Windows {
			if !r.ClosedAt.IsZero() {
				row, _ := changelog.RowOf(tb, changelog.WindowRow(nil, r))
				cr, _ := changelog.Canonical(tb, row)
				out = append(out, cr)
			}
		}
	}
	return out
}

// A replay of the topic (a group started over it, ALLOW_GROUP_CHANGE)
// counts an event again at a position whose ledger entry is stored: the
// stored row is kept, so the checkpoint's changelog creates no entry for
// it (ledger_entries is append-only: a second create would carry the key
// twice, with a checkpoint that is not the stored one), while the sums it
// changed and the entries it created are in the changelog as ever.
func TestReplayedEntryIsNotCreatedAgain(t *testing.T) {
	l := newChangelogLedger(t, 1, 1, 2, func(c *Config) { c.LedgerEntries = true })
	if _, err := l.inst[0].checkpoint(t, event1("e1", "acct", 5, 0, 1)); err != nil {
		t.Fatal(err)
	}
	// The replaying instance reads the partition from its start: its
	// first record is the stored entry's position, its key expired (a new
	// id here), its second a position not stored yet.
	if _, err := l.inst[1].checkpoint(t, event1("e1-again", "acct", 5, 0, 1), event1("e2", "acct", 7, 0, 2)); err != nil {
		t.Fatal(err)
	}
	evs, _ := l.outboxEvents(t)
	model := changelogtest.NewModel()
	var creates []string
	for i, ev := range evs {
		if err := model.Apply(ev); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if ev.Table == changelog.LedgerEntries {
			creates = append(creates, fmt.Sprintf("%s by %s", ev.After["event_id"], ev.Source.Checkpoint))
		}
	}
	rows := l.tableRows(t)
	for _, table := range []string{changelog.AccountBalances, changelog.LedgerEntries} {
		if d := changelogtest.Diff(rows[table], model.Canonical(table), 5); d != nil {
			t.Errorf("%s: the changelog ends elsewhere than the table:\n%s", table, strings.Join(d, "\n"))
		}
	}
	if len(creates) != 2 || len(rows[changelog.LedgerEntries]) != 2 {
		t.Errorf("ledger_entries changes %v for %d rows, want one create per row", creates, len(rows[changelog.LedgerEntries]))
	}
	if b := l.inst[0].balance("acct"); b.Amount != 17 || b.Count != 3 {
		t.Errorf("balance %d over %d events, want 17 over 3", b.Amount, b.Count)
	}
}
