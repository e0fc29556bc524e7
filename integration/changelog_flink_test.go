package integration_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/changelogtest"
	"github.com/billing/ledger/internal/testenv"
)

// TestFlinkReadsDebeziumJSON is the acceptance check that the changelog's
// format (issue 20) is readable, as it is, by a consumer that is not the
// project's own code: a changelog in the spec's format, written in Kafka
// transactions (one aborted), read by Flink SQL from Maven Central jars
// (integration/jvm flink-read) with debezium-json and with upsert-kafka,
// must give exactly the final rows a read_committed consumer must hold
// (changelogtest.Model). The values are the hard ones: int64 limits,
// non-ASCII UTF-8, quotes and backslashes, microsecond timestamps across
// DATETIME's whole range, NULLs, snapshot reads.
//
// The writing side is changelogtest.Writer over generated events; once the
// service publishes the changelog, its topics and the rows in MySQL take
// their place, and flinkReads (the check) stays.
//
// JVM_TESTS=1 runs it (testenv.JVM); CHANGELOG_SEED replays a generation.
func TestFlinkReadsDebeziumJSON(t *testing.T) {
	brokers := testenv.Kafka(t)
	jvm := testenv.JVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CHANGELOG_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("CHANGELOG_SEED: %v", err)
		}
	}
	t.Logf("generation seed %d (replay with CHANGELOG_SEED=%d)", seed, seed)

	topics := map[string]string{}
	for _, tb := range changelog.Tables() {
		cfg := map[string]string{"cleanup.policy": "compact"}
		if tb.Append {
			cfg["cleanup.policy"] = "delete"
		}
		topics[tb.Name] = testenv.NewTopicWithConfigs(t, brokers, 3, cfg)
	}
	w, err := changelogtest.NewWriter(brokers, testenv.RandomName("t-changelog-"), topics)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	gen := newChangelogGen(rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), 48)
	model := changelogtest.NewModel()
	const checkpoints, aborted = 14, 6
	var written, leaked int
	for i := 0; i <= checkpoints; i++ {
		work := model.Clone()
		var evs []changelog.Event
		if i == 0 {
			evs = gen.snapshot(t, work)
		} else {
			evs = gen.checkpoint(t, work, i == aborted)
		}
		commit := i != aborted
		if err := w.Transaction(ctx, evs, commit); err != nil {
			t.Fatalf("checkpoint %d: %v", i, err)
		}
		if commit {
			model = work
			written += len(evs)
		} else {
			leaked = len(evs)
		}
	}
	t.Logf("%d events committed in %d transactions, %d in one aborted transaction", written, checkpoints, leaked)

	want := map[string][]string{}
	for _, tb := range changelog.Tables() {
		if want[tb.Name] = model.Canonical(tb.Name); len(want[tb.Name]) == 0 {
			t.Fatalf("%s: the generation wrote no committed row (seed %d)", tb.Name, seed)
		}
	}
	flinkReads(ctx, t, jvm, brokers, topics, want)
}

// flinkReads is the acceptance check of a changelog: Flink SQL
// (flink-read) reads every topic of topics (table -> topic) read_committed
// with debezium-json, the table topics also with upsert-kafka, and every
// reading must give exactly want (table -> Canonical rows: the final row per
// key of a table topic, every row of an append-only one), with no chain
// broken. The rows of the spec's tables in MySQL, in Canonical form, are the
// want of a service that publishes the changelog.
func flinkReads(ctx context.Context, t *testing.T, jvm *testenv.JVMHarness, brokers []string, topics map[string]string,
	want map[string][]string) {
	t.Helper()
	args := []string{"--brokers", strings.Join(brokers, ",")}
	for _, tb := range changelog.Tables() {
		if topic, ok := topics[tb.Name]; ok {
			args = append(args, tb.Name+"="+topic)
		}
	}
	run, err := jvm.Run(ctx, "flink-read", args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("flink-read took %s:\n%s", run.Took.Round(time.Millisecond), run.Stderr)
	// 3: flink-read found chains broken (reported below, with the rows).
	if run.ExitCode != 0 && run.ExitCode != 3 {
		t.Fatalf("flink-read exit status %d:\n%s", run.ExitCode, run.Stdout)
	}
	got, err := changelogtest.ParseReadings(run.Stdout)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range got.Violations {
		if i == 10 {
			t.Errorf("... and %d more violations", len(got.Violations)-i)
			break
		}
		t.Errorf("flink-read: %s", v)
	}
	if run.ExitCode == 3 && len(got.Violations) == 0 {
		t.Errorf("flink-read exit status 3 without a violation line")
	}
	for _, tb := range changelog.Tables() {
		if _, ok := topics[tb.Name]; !ok {
			continue
		}
		readings := []string{changelogtest.ReadingDebeziumJSON}
		if !tb.Append {
			readings = append(readings, changelogtest.ReadingUpsertKafka)
		}
		for _, reading := range readings {
			read := got.Rows[reading][tb.Name]
			if diff := changelogtest.Diff(want[tb.Name], read, 10); diff != nil {
				t.Errorf("%s read with %s differs from the committed changelog (%d rows wanted, %d read):\n%s",
					tb.Name, reading, len(want[tb.Name]), len(read), strings.Join(diff, "\n"))
			} else {
				t.Logf("%s with %s: %d rows, as committed", tb.Name, reading, len(read))
			}
		}
	}
}

// changelogGen generates the changelog of a made-up ledger: accounts with
// hard strings, windows across DATETIME's range, amounts at the int64
// limits. It builds each checkpoint's events against a working copy of the
// committed state (a Model), so every event's before is the committed
// after and an aborted checkpoint leaves no trace in the state.
type changelogGen struct {
	rng      *rand.Rand
	accounts [][2]string // account_id, currency
	windows  []changelog.Row
	sealed   map[int]bool // index into windows
	offset   int64        // next ledger_entries kafka_offset
	seq      int64        // next commit_seq
	now      time.Time
}

func newChangelogGen(rng *rand.Rand, accounts int) *changelogGen {
	g := &changelogGen{rng: rng, sealed: map[int]bool{}, now: time.Date(2026, 11, 29, 13, 5, 1, 123456000, time.UTC)}
	// Strings a JSON encoder or decoder can get wrong: quotes,
	// backslashes, control characters, multi-byte UTF-8 (2, 3 and 4
	// bytes), and 64 bytes, VARBINARY(64)'s limit (6 + 29 × 2).
	patterns := []string{"acct-%03d", `quote"back\slash-%d`, "Kunde-Müller-%d", "账户-%d", "emoji-💶-%d",
		"tab\tnewline\n-%d", "</script>&<%d>", "x%05d" + strings.Repeat("é", 29)}
	currencies := []string{"EUR", "USD", "JPY", "CHF"}
	for i := range accounts {
		id := fmt.Sprintf(patterns[i%len(patterns)], i)
		g.accounts = append(g.accounts, [2]string{id, currencies[rng.IntN(len(currencies))]})
	}
	// Two windows per account; timestamps repeat (the range's ends are
	// likely), keys must not.
	seen := map[string]bool{}
	for i := 0; len(g.windows) < accounts*2; i++ {
		a := g.accounts[i%accounts]
		ws := g.timestamp()
		if k := a[0] + "\x00" + a[1] + "\x00" + ws.String(); !seen[k] {
			seen[k] = true
			g.windows = append(g.windows, changelog.Row{"account_id": a[0], "currency": a[1], "window_start": ws})
		}
	}
	return g
}

// int64 values with the limits, zero and small values over-represented.
func (g *changelogGen) amount() int64 {
	switch g.rng.IntN(8) {
	case 0:
		return math.MaxInt64
	case 1:
		return math.MinInt64
	case 2:
		return 0
	case 3:
		return g.rng.Int64N(2000) - 1000
	default:
		return int64(g.rng.Uint64())
	}
}

// timestamp: any microsecond of DATETIME's range, its ends included.
func (g *changelogGen) timestamp() time.Time {
	lo, hi := changelog.DatetimeRange()
	switch g.rng.IntN(10) {
	case 0:
		return lo
	case 1:
		return hi
	case 2:
		return time.Unix(0, 1000).UTC() // one microsecond after the epoch
	default:
		span := hi.Sub(lo).Microseconds()
		return lo.Add(time.Duration(g.rng.Int64N(span+1)) * time.Microsecond)
	}
}

func (g *changelogGen) source(snapshot string) (changelog.Source, int64) {
	g.seq++
	g.now = g.now.Add(time.Duration(g.rng.Int64N(5_000_000)+1) * time.Microsecond)
	ts := g.now.UnixMilli()
	return changelog.Source{Version: "test", Name: "t", Ledger: "ledger-1",
		Checkpoint: fmt.Sprintf("blg1-%012x-%d", g.rng.Uint64()>>16, g.seq), CommitSeq: g.seq, TsMs: ts,
		Snapshot: snapshot}, ts
}

// apply adds ev to the checkpoint being built, through the working state
// (which checks the chain).
func apply(t *testing.T, work *changelogtest.Model, evs *[]changelog.Event, ev changelog.Event) {
	t.Helper()
	if err := work.Apply(ev); err != nil {
		t.Fatalf("generator: %v", err)
	}
	*evs = append(*evs, ev)
}

// snapshot: the rows a ledger held when its changelog was turned on, as op
// r events (the last of each table marked "last").
func (g *changelogGen) snapshot(t *testing.T, work *changelogtest.Model) []changelog.Event {
	var evs []changelog.Event
	src, ts := g.source("true")
	var balances, windows []changelog.Row
	for i, a := range g.accounts {
		if i%3 == 0 {
			balances = append(balances, g.balance(a, work))
		}
	}
	for i, w := range g.windows {
		if i%4 == 0 {
			windows = append(windows, g.window(i, w, work, false))
		}
	}
	for _, tr := range []struct {
		table string
		rows  []changelog.Row
	}{{changelog.AccountBalances, balances}, {changelog.BillingWindows, windows}} {
		table, rows := tr.table, tr.rows
		for j, r := range rows {
			s := src
			if j == len(rows)-1 {
				s.Snapshot = "last"
			}
			apply(t, work, &evs, changelog.Event{Table: table, Op: changelog.OpRead, After: r, TsMs: ts, Source: s})
		}
	}
	return evs
}

// balance: the next row of an account's balance.
func (g *changelogGen) balance(a [2]string, work *changelogtest.Model) changelog.Row {
	r := changelog.Row{"account_id": a[0], "currency": a[1], "balance_minor": g.amount(),
		"event_count": int64(1), "updated_at": g.timestamp()}
	if prev, ok := work.Get(changelog.AccountBalances, r); ok {
		r["event_count"] = prev["event_count"].(int64) + g.rng.Int64N(100) + 1
	}
	return r
}

func (g *changelogGen) window(i int, key changelog.Row, work *changelogtest.Model, seal bool) changelog.Row {
	r := changelog.Row{"account_id": key["account_id"], "currency": key["currency"],
		"window_start": key["window_start"], "amount_minor": g.amount(), "event_count": g.rng.Int64N(1000) + 1,
		"updated_at": g.timestamp(), "closed_at": nil}
	if seal {
		r["closed_at"] = g.timestamp()
		g.sealed[i] = true
	}
	return r
}

// event is a c or u event of table for row r, against the working state.
func event(work *changelogtest.Model, table string, r changelog.Row, src changelog.Source, ts int64) changelog.Event {
	ev := changelog.Event{Table: table, Op: changelog.OpCreate, After: r, TsMs: ts, Source: src}
	if prev, ok := work.Get(table, r); ok {
		ev.Op, ev.Before = changelog.OpUpdate, prev
	}
	return ev
}

// checkpoint: the events of one checkpoint, at most one per key and table.
// An aborted one also creates a key that no committed checkpoint has.
func (g *changelogGen) checkpoint(t *testing.T, work *changelogtest.Model, aborted bool) []changelog.Event {
	var evs []changelog.Event
	src, ts := g.source("false")
	for _, a := range g.accounts {
		if g.rng.IntN(3) == 0 {
			apply(t, work, &evs, event(work, changelog.AccountBalances, g.balance(a, work), src, ts))
		}
	}
	if aborted {
		ghost := [2]string{"aborted-only-ĝhost", "EUR"}
		apply(t, work, &evs, event(work, changelog.AccountBalances, g.balance(ghost, work), src, ts))
	}
	// A sealed window never changes again: later events of its key go to
	// window_adjustments.
	sealing := map[int]bool{}
	for i, w := range g.windows {
		if g.rng.IntN(3) != 0 {
			continue
		}
		if g.sealed[i] {
			adj := g.window(i, w, work, false)
			delete(adj, "closed_at")
			adj["checkpoint_id"] = src.Checkpoint
			if g.rng.IntN(4) == 0 {
				adj["checkpoint_id"] = nil // rows from before migration 00006
			}
			apply(t, work, &evs, event(work, changelog.WindowAdjustments, adj, src, ts))
			continue
		}
		seal := g.rng.IntN(4) == 0
		r := g.window(i, w, work, seal)
		apply(t, work, &evs, event(work, changelog.BillingWindows, r, src, ts))
		if seal {
			sealing[i] = true
			apply(t, work, &evs, changelog.Event{Table: changelog.ClosedWindows, Op: changelog.OpCreate,
				After: r, TsMs: ts, Source: src})
		}
	}
	if aborted {
		// The aborted checkpoint's seals never happened.
		for i := range sealing {
			delete(g.sealed, i)
		}
	}
	for range g.rng.IntN(12) + 1 {
		a := g.accounts[g.rng.IntN(len(g.accounts))]
		apply(t, work, &evs, changelog.Event{Table: changelog.LedgerEntries, Op: changelog.OpCreate,
			After: changelog.Row{"kafka_topic": "billing-events", "kafka_partition": g.rng.Int64N(12),
				"kafka_offset": g.offset, "event_id": fmt.Sprintf("évt-%d-\"%x\"", g.offset, g.rng.Uint32()),
				"account_id": a[0], "currency": a[1], "amount_minor": g.amount(), "occurred_at": g.timestamp(),
				"window_start": g.timestamp(), "late": g.rng.IntN(2) == 0, "checkpoint_id": src.Checkpoint,
				"created_at": g.timestamp(), "entry": g.rng.Int64N(3), "revision": g.rng.Int64N(3)},
			TsMs: ts, Source: src})
		g.offset++
	}
	return evs
}
