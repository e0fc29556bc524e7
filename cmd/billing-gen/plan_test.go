package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/testenv"
)

func testConfig(seed uint64) genConfig {
	return genConfig{
		Topic:          "billing-test",
		Partitions:     6,
		Events:         5000,
		Accounts:       200,
		ZipfS:          1.1,
		Currencies:     []string{"EUR", "USD", "GBP", "JPY"},
		DupRatio:       0.05,
		ConflictRatio:  0.02,
		MalformedRatio: 0.03,
		AbortedRatio:   0.01,
		OverflowCases:  6,
		Period:         mustPeriod("1h", ""),
		Windows:        24,
		BaseTime:       time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC),
		LateRatio:      0.05,
		FutureRatio:    0.01,
		Seed:           seed,
		MaxPayload:     64 * 1024,
	}
}

func mustPeriod(window, zone string) ledgercheck.Period {
	p, err := ledgercheck.NewPeriod(window, zone)
	if err != nil {
		panic(err)
	}
	return p
}

// drain runs a generator to the end.
func drain(t testing.TB, cfg genConfig) ([]record, *ledgercheck.Expected) {
	t.Helper()
	g, err := newGenerator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var recs []record
	for {
		r, ok, err := g.next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		recs = append(recs, r)
	}
	return recs, g.expected(map[string]string{"test": "1"})
}

// refDecode is a minimal, independent decoder of the contract, enough to
// classify the generator's records: it returns the event, or the reason the
// service's decoder must give.
func refDecode(v []byte, maxPayload int) (ledgercheck.Event, string) {
	var e ledgercheck.Event
	switch {
	case len(v) == 0:
		return e, ledgercheck.ReasonEmptyPayload
	case len(v) > maxPayload:
		return e, ledgercheck.ReasonPayloadTooLarge
	case !utf8.Valid(v):
		return e, ledgercheck.ReasonInvalidJSON
	}
	var m map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(v))
	if err := dec.Decode(&m); err != nil || m == nil {
		return e, ledgercheck.ReasonInvalidJSON
	}
	if dec.More() {
		return e, ledgercheck.ReasonInvalidJSON
	}
	for _, k := range []string{"event_id", "account_id", "amount_minor", "currency", "occurred_at"} {
		if _, ok := m[k]; !ok {
			return e, ledgercheck.ReasonMissingField
		}
	}
	str := func(k string, dst *string) bool { return json.Unmarshal(m[k], dst) == nil && m[k][0] == '"' }
	if !str("event_id", &e.EventID) || !str("account_id", &e.AccountID) || e.EventID == "" || e.AccountID == "" {
		return e, ledgercheck.ReasonInvalidField
	}
	if len(e.EventID) > 128 || len(e.AccountID) > 64 {
		return e, ledgercheck.ReasonIDTooLong
	}
	num := string(m["amount_minor"])
	if num == "" || (num[0] != '-' && (num[0] < '0' || num[0] > '9')) {
		return e, ledgercheck.ReasonInvalidField
	}
	if strings.ContainsAny(num, ".eE") {
		return e, ledgercheck.ReasonAmountNotInteger
	}
	amount, err := strconv.ParseInt(num, 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		return e, ledgercheck.ReasonAmountOutOfRange
	} else if err != nil {
		return e, ledgercheck.ReasonInvalidJSON
	}
	e.AmountMinor = amount
	if !str("currency", &e.Currency) {
		return e, ledgercheck.ReasonInvalidField
	}
	if len(e.Currency) != 3 || strings.Trim(e.Currency, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
		return e, ledgercheck.ReasonInvalidCurrency
	}
	var ts string
	if !str("occurred_at", &ts) {
		return e, ledgercheck.ReasonInvalidField
	}
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return e, ledgercheck.ReasonInvalidTime
	}
	e.OccurredAt = at.UTC()
	return e, ""
}

// replay plays committed records through refDecode and a fresh ledger, the
// way a consumer would: records of one partition in order, partitions
// interleaved as order dictates (each entry of order is a partition to take
// the next record from).
func replay(t *testing.T, cfg genConfig, recs []record, order func(perPart [][]record) []int) *ledgercheck.Expected {
	t.Helper()
	perPart := make([][]record, cfg.Partitions)
	kp := kgo.StickyKeyPartitioner(nil).ForTopic(cfg.Topic)
	for _, r := range recs {
		if r.kind == kindAborted {
			continue // read_committed
		}
		p := kp.Partition(&kgo.Record{Key: r.key}, cfg.Partitions)
		if p != r.partition {
			t.Fatalf("record %q: partition %d, generator computed %d", r.key, p, r.partition)
		}
		perPart[p] = append(perPart[p], r)
	}
	l, err := ledgercheck.NewModelWith(ledgercheck.Options{Period: cfg.Period})
	if err != nil {
		t.Fatal(err)
	}
	next := make([]int, cfg.Partitions)
	for _, p := range order(perPart) {
		r := perPart[p][next[p]]
		next[p]++
		e, reason := refDecode(r.value, cfg.MaxPayload)
		if reason != "" {
			if r.kind != kindMalformed {
				t.Fatalf("%v record rejected as %s: %s", r.kind, reason, r.value)
			}
			l.DeadLetter(reason)
			continue
		}
		if r.kind == kindMalformed {
			t.Fatalf("malformed record accepted: %q", r.value)
		}
		// The service's bound (MAX_EVENT_TIME_SKEW 1h), judged now: the
		// generator only dates records far from it.
		if ledgercheck.InFuture(e.OccurredAt, time.Now(), time.Hour) {
			if r.kind != kindFuture {
				t.Fatalf("%v record in the future: %s", r.kind, r.value)
			}
			l.DeadLetter(ledgercheck.ReasonEventTimeInFuture)
			continue
		}
		if r.kind == kindFuture {
			t.Fatalf("future record not in the future: %s", r.value)
		}
		l.Add(e)
	}
	for p := range next {
		if next[p] != len(perPart[p]) {
			t.Fatalf("order left records of partition %d", p)
		}
	}
	return l.Expected()
}

func partitionMajor(perPart [][]record) []int {
	var o []int
	for p := range perPart {
		for range perPart[p] {
			o = append(o, p)
		}
	}
	return o
}

func reversePartitions(perPart [][]record) []int {
	var o []int
	for p := len(perPart) - 1; p >= 0; p-- {
		for range perPart[p] {
			o = append(o, p)
		}
	}
	return o
}

func randomInterleave(seed uint64) func([][]record) []int {
	return func(perPart [][]record) []int {
		rng := rand.New(rand.NewPCG(seed, seed))
		left := make([]int, len(perPart))
		total := 0
		for p := range perPart {
			left[p] = len(perPart[p])
			total += left[p]
		}
		o := make([]int, 0, total)
		for len(o) < total {
			p := rng.IntN(len(perPart))
			if left[p] > 0 {
				left[p]--
				o = append(o, p)
			}
		}
		return o
	}
}

// TestReplayMatchesExpected is the generator's central property: whatever
// order the partitions are consumed in, an independent decoder plus the
// contract model reach exactly the expected ledger.
func TestReplayMatchesExpected(t *testing.T) {
	for _, seed := range []uint64{1, 42, 20261129} {
		cfg := testConfig(seed)
		recs, exp := drain(t, cfg)
		if err := exp.Validate(); err != nil {
			t.Fatal(err)
		}
		for name, order := range map[string]func([][]record) []int{
			"partition-major": partitionMajor, "reversed": reversePartitions,
			"random-1": randomInterleave(1), "random-2": randomInterleave(2),
		} {
			got := replay(t, cfg, recs, order)
			act := &ledgercheck.Actual{}
			for _, b := range got.Balances {
				act.Balances = append(act.Balances, ledgercheck.ActualBalance{BalanceRow: b})
			}
			for _, w := range got.Windows {
				act.Windows = append(act.Windows, ledgercheck.ActualWindow{WindowRow: w})
			}
			var off int64
			for reason, n := range got.DeadLetters {
				for range n {
					act.DeadLetters = append(act.DeadLetters, ledgercheck.DeadLetterRow{Topic: cfg.Topic, Offset: off, Reason: reason})
					off++
				}
			}
			r := ledgercheck.Compare(exp, act)
			if !r.Exact() {
				var b strings.Builder
				_ = r.WriteDiffs(&b, 20)
				t.Fatalf("seed %d, %s: %s\n%s", seed, name, r.Verdict(), b.String())
			}
		}
	}
}

func TestStreamComposition(t *testing.T) {
	cfg := testConfig(7)
	recs, exp := drain(t, cfg)
	p := exp.Produced
	t.Logf("produced %+v; dead letters %v; %d balances, %d windows", p, exp.DeadLetters, len(exp.Balances), len(exp.Windows))

	kinds := map[recordKind]int64{}
	ids := map[string]bool{}
	for _, r := range recs {
		kinds[r.kind]++
		if r.kind == kindValid {
			var v struct {
				EventID string `json:"event_id"`
			}
			if err := json.Unmarshal(r.value, &v); err != nil || ids[v.EventID] {
				t.Fatalf("valid record %s: %v (repeated id?)", r.value, err)
			}
			ids[v.EventID] = true
			if string(r.key) != strings.Split(strings.Split(string(r.value), `"account_id":"`)[1], `"`)[0] {
				t.Fatalf("valid record not keyed by account: %q %s", r.key, r.value)
			}
		}
	}
	if kinds[kindValid] != cfg.Events || p.Valid != cfg.Events {
		t.Errorf("%d valid records, want %d", kinds[kindValid], cfg.Events)
	}
	if kinds[kindDuplicate] != p.Duplicates || kinds[kindConflict] != p.Conflicts || kinds[kindMalformed] != p.Malformed ||
		kinds[kindAborted] != p.Aborted || kinds[kindOverflow] != p.OverflowEvents || kinds[kindFuture] != p.Future || kinds[kindCorrected] != p.Future {
		t.Errorf("kinds %v disagree with stats %+v", kinds, p)
	}
	if p.Records+p.Aborted != int64(len(recs)) {
		t.Errorf("records %d + aborted %d != %d", p.Records, p.Aborted, len(recs))
	}
	// Ratios are per valid event; allow generous statistical slack.
	near := func(name string, got int64, ratio float64) {
		want := ratio * float64(cfg.Events)
		if float64(got) < want*0.6 || float64(got) > want*1.4 {
			t.Errorf("%s: %d, want about %.0f", name, got, want)
		}
	}
	near("duplicates", p.Duplicates, cfg.DupRatio)
	near("cross-partition duplicates", p.CrossPartitionDuplicates, cfg.DupRatio/2)
	near("conflicts", p.Conflicts, cfg.ConflictRatio)
	near("malformed", p.Malformed, cfg.MalformedRatio)
	near("aborted", p.Aborted, cfg.AbortedRatio)
	near("late", p.Late, cfg.LateRatio)
	near("future", p.Future, cfg.FutureRatio)
	if exp.DeadLetters[ledgercheck.ReasonEventTimeInFuture] != p.Future {
		t.Errorf("event_time_in_future dead letters %d, future records %d", exp.DeadLetters[ledgercheck.ReasonEventTimeInFuture], p.Future)
	}
	// Every malformed kind appears (round robin), with its reason.
	for _, k := range ledgercheck.MalformedKinds() {
		if exp.DeadLetters[k.Reason()] == 0 {
			t.Errorf("no dead letter %s", k.Reason())
		}
	}
	if exp.DeadLetters[ledgercheck.ReasonConflictingDuplicate] != p.Conflicts {
		t.Errorf("conflict dead letters %d, conflicts %d", exp.DeadLetters[ledgercheck.ReasonConflictingDuplicate], p.Conflicts)
	}
	if exp.DeadLetters[ledgercheck.ReasonAmountOverflow] != int64(cfg.OverflowCases) {
		t.Errorf("overflow dead letters %d, want %d", exp.DeadLetters[ledgercheck.ReasonAmountOverflow], cfg.OverflowCases)
	}
	// 6 cases: variants 0,1,2 twice; 3+3+4 events each pair, one dead each.
	if p.OverflowEvents != 20 || exp.EventsValid != cfg.Events+20-6+p.Future {
		t.Errorf("overflow events %d, events_valid %d", p.OverflowEvents, exp.EventsValid)
	}
	if p.AbortedTransactions != (p.Aborted+abortBatch-1)/abortBatch {
		t.Errorf("aborted transactions %d for %d records", p.AbortedTransactions, p.Aborted)
	}
	// Windows: all within the span, except overflow-case windows.
	first := cfg.BaseTime.Add(-time.Duration(cfg.Windows) * cfg.Period.Size())
	for _, w := range exp.Windows {
		if w.WindowStart.Before(first) || !w.WindowStart.Before(cfg.BaseTime.Add(cfg.Period.Size())) {
			t.Errorf("window %v outside the span", w.Key())
		}
	}
}

// TestConflictsFollowOriginalOnSamePartition checks the ordering guarantee
// the model relies on, directly on the stream: conflicts, and the
// corrections of future records, follow their first record on its
// partition.
func TestConflictsFollowOriginalOnSamePartition(t *testing.T) {
	cfg := testConfig(99)
	recs, _ := drain(t, cfg)
	type pos struct{ index, partition int }
	first := map[string]pos{}
	var conflicts, overflow, corrected int
	for i, r := range recs {
		if r.kind == kindAborted || r.kind == kindMalformed {
			continue
		}
		e, reason := refDecode(r.value, cfg.MaxPayload)
		if reason != "" {
			t.Fatalf("%v record rejected: %s", r.kind, reason)
		}
		switch r.kind {
		case kindValid, kindOverflow:
			if _, dup := first[e.EventID]; dup {
				t.Fatalf("id %s repeated as %v", e.EventID, r.kind)
			}
			first[e.EventID] = pos{i, r.partition}
		case kindConflict:
			conflicts++
			o, ok := first[e.EventID]
			if !ok || o.index >= i || o.partition != r.partition {
				t.Fatalf("conflict %s at %d/p%d, original %+v", e.EventID, i, r.partition, o)
			}
		case kindDuplicate:
			if o, ok := first[e.EventID]; !ok || o.index >= i {
				t.Fatalf("duplicate %s before its original", e.EventID)
			}
		case kindFuture:
			if _, dup := first[e.EventID]; dup {
				t.Fatalf("future record %s repeats an id", e.EventID)
			}
			first[e.EventID] = pos{i, r.partition}
		case kindCorrected:
			corrected++
			o, ok := first[e.EventID]
			if !ok || o.index >= i || o.partition != r.partition || recs[o.index].kind != kindFuture {
				t.Fatalf("correction %s at %d/p%d, its future record %+v", e.EventID, i, r.partition, o)
			}
		}
		if r.kind == kindOverflow {
			overflow++
		}
	}
	if conflicts == 0 || overflow == 0 || corrected == 0 {
		t.Fatalf("conflicts %d, overflow %d, corrections %d", conflicts, overflow, corrected)
	}
}

func TestDeterminism(t *testing.T) {
	digest := func(seed uint64, partitions int) (string, []byte) {
		cfg := testConfig(seed)
		cfg.Partitions = partitions
		recs, exp := drain(t, cfg)
		h := sha256.New()
		for _, r := range recs {
			fmt.Fprintf(h, "%d|%q|%q|%d\n", r.kind, r.key, r.value, r.partition)
		}
		b, err := ledgercheck.Marshal(exp)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%x", h.Sum(nil)), b
	}
	d1, e1 := digest(5, 6)
	d2, e2 := digest(5, 6)
	if d1 != d2 || !bytes.Equal(e1, e2) {
		t.Fatal("same seed and config produced different runs")
	}
	d3, e3 := digest(6, 6)
	if d1 == d3 || bytes.Equal(e1, e3) {
		t.Fatal("different seeds produced the same run")
	}
}

func TestMalformedPayloads(t *testing.T) {
	e := ledgercheck.Event{EventID: "m-1", AccountID: "acct-000001", AmountMinor: 1250, Currency: "EUR",
		OccurredAt: time.Date(2026, 11, 29, 13, 5, 0, 0, time.UTC)}
	if _, reason := refDecode(validPayload(e, timeStyle{}), 65536); reason != "" {
		t.Fatalf("valid payload rejected: %s", reason)
	}
	for _, k := range ledgercheck.MalformedKinds() {
		for n := int64(0); n < 2; n++ {
			v := malformedPayload(k, e, n, 65536)
			_, reason := refDecode(v, 65536)
			if reason != k.Reason() {
				t.Errorf("%v (n=%d): decoded as %q: %.200s", k, n, reason, v)
			}
			if k == ledgercheck.MalformedPayloadTooLarge && len(v) != 70*1024 {
				t.Errorf("too-large payload is %d bytes, want 70 KiB", len(v))
			}
			if k == ledgercheck.MalformedIDTooLong {
				var m struct {
					EventID string `json:"event_id"`
				}
				if err := json.Unmarshal(v, &m); err != nil || len(m.EventID) != 129 {
					t.Errorf("id_too_long payload %s: %v", v, err)
				}
			}
		}
	}
	if v := malformedPayload(ledgercheck.MalformedEmptyPayload, e, 0, 65536); v == nil || len(v) != 0 {
		t.Errorf("empty payload must be zero-length and non-nil, got %#v", v)
	}
}

func TestFormatTime(t *testing.T) {
	at := time.Date(2026, 11, 29, 13, 5, 0, 0, time.UTC)
	tests := []struct {
		t    time.Time
		s    timeStyle
		want string
	}{
		{at, timeStyle{}, "2026-11-29T13:05:00Z"},
		{at, timeStyle{offset: 5*3600 + 1800}, "2026-11-29T18:35:00+05:30"},
		{at, timeStyle{millis: true}, "2026-11-29T13:05:00.000Z"},
		{at.Add(7 * time.Millisecond), timeStyle{}, "2026-11-29T13:05:00.007Z"},
		{at, timeStyle{offset: -(9*3600 + 1800)}, "2026-11-29T03:35:00-09:30"},
	}
	for _, tc := range tests {
		got := formatTime(tc.t, tc.s)
		if got != tc.want {
			t.Errorf("formatTime(%v, %+v) = %s, want %s", tc.t, tc.s, got, tc.want)
		}
		back, err := time.Parse(time.RFC3339Nano, got)
		if err != nil || !back.Equal(tc.t) {
			t.Errorf("%s does not parse back to %v", got, tc.t)
		}
	}
}

// TestPartitionerIsKafkas pins the partitioner to Kafka's murmur2 placement
// (vector from Kafka's UtilsTest: murmur2("21") = -973932308).
func TestPartitionerIsKafkas(t *testing.T) {
	g, err := newGenerator(testConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	h := int32(-973932308)
	want := int(uint32(h)&0x7fffffff) % 6
	if got := g.partitionOf("21"); got != want {
		t.Errorf("partition of \"21\" = %d, want %d", got, want)
	}
	for _, acct := range []string{"acct-000001", "acct-000002", "acct-overflow-0"} {
		k := g.otherPartitionKey(acct)
		if g.partitionOf(k) == g.partitionOf(acct) {
			t.Errorf("%s: %s is on the same partition", acct, k)
		}
	}
}

func TestParseFlags(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parseFlags([]string{"-events", "10", "-seed", "123", "-currencies", "EUR,USD"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if o.gen.Seed != 123 || !o.seedSet || o.params["seed"] != "123" || o.params["events"] != "10" || len(o.gen.Currencies) != 2 {
		t.Errorf("%+v", o)
	}
	o, err = parseFlags(nil, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if o.seedSet || o.gen.Seed == 0 || o.params["seed"] != fmt.Sprint(o.gen.Seed) {
		t.Errorf("default seed not recorded: %+v", o.params)
	}
	for _, bad := range [][]string{
		{"-zipf-s", "1"}, {"-currencies", "eur"}, {"-currencies", "EUR,EUR"}, {"-dup-ratio", "2"},
		{"-window", "1500ms"}, {"-events", "-1"}, {"-progress", "fancy"}, {"-base-time", "yesterday"},
		{"-base-time", "0500-01-01T00:00:00Z"}, {"extra"}, {"-max-payload", "100"},
	} {
		if _, err := parseFlags(bad, &stderr); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestRunUsageExitCode(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"-events", "x"}, &out, &errb); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
}

func TestZeroEventsOnlyOverflowCases(t *testing.T) {
	cfg := testConfig(3)
	cfg.Events = 0
	cfg.OverflowCases = 3
	recs, exp := drain(t, cfg)
	if len(recs) != 10 || exp.EventsValid != 7 || exp.DeadLetters[ledgercheck.ReasonAmountOverflow] != 3 {
		t.Errorf("%d records, %d events, dead letters %v", len(recs), exp.EventsValid, exp.DeadLetters)
	}
	cfg.OverflowCases = 0
	recs, exp = drain(t, cfg)
	if len(recs) != 0 || exp.EventsValid != 0 {
		t.Errorf("%d records for an empty run", len(recs))
	}
}

// TestHelpDescribesAndListsExitCodes: -help says what the tool does and
// what each exit status means (issue 22: it printed the flags only).
func TestHelpDescribesAndListsExitCodes(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"-help"}, &out, &errb); code != 0 {
		t.Fatalf("-help: exit %d", code)
	}
	help := out.String() + errb.String()
	for _, want := range []string{"Usage of billing-gen", "Produces a reproducible billing workload", "Exit status:", "0  every record acknowledged", "1  a produce failed", "2  usage error", "-events", "-create-topic"} {
		if !strings.Contains(help, want) {
			t.Errorf("-help lacks %q:\n%s", want, help)
		}
	}
}

// TestDocsListEveryFlag: docs/operations.md documents every flag of the
// tool (it was only in scripts/demo.sh).
func TestDocsListEveryFlag(t *testing.T) {
	var out, errb bytes.Buffer
	run(t.Context(), []string{"-help"}, &out, &errb)
	testenv.DocumentsEveryFlag(t, out.String()+errb.String(), "../../docs/operations.md")
}

// The generator agrees with the service on what is in the future: a run
// whose event times would reach past now plus the service's
// MAX_EVENT_TIME_SKEW is refused before anything is produced (the service
// would dead-letter events the expected ledger counts), and one that stays
// inside it is accepted, for base times on both sides of the bound.
func TestRunsReachingIntoTheFutureAreRefused(t *testing.T) {
	for _, tc := range []struct {
		base time.Duration // from now
		skew string
		ok   bool
	}{
		{-24 * time.Hour, "1h", true}, {30 * time.Minute, "1h", true}, {2 * time.Hour, "1h", false},
		{2 * time.Hour, "3h", true}, {-time.Hour, "1m", true}, {10 * time.Minute, "1m", false}, {40 * 365 * 24 * time.Hour, "1h", false},
	} {
		base := time.Now().Add(tc.base).UTC().Format(time.RFC3339)
		var stderr bytes.Buffer
		_, err := parseFlags([]string{"-base-time", base, "-max-event-time-skew", tc.skew}, &stderr)
		if tc.ok && err != nil {
			t.Errorf("base time %s (now %+v), skew %s: refused: %v", base, tc.base, tc.skew, err)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "event_time_in_future")) {
			t.Errorf("base time %s (now %+v), skew %s: %v, want a refusal naming event_time_in_future", base, tc.base, tc.skew, err)
		}
	}
}

// With RandomIDs every valid event's id is a distinct version 4 UUID, its
// exact repeats carry it again, and the ids sort in no relation to the
// order they are produced in (about half of the consecutive pairs in
// order, against all but a few for the counter ids), so that new keys land
// anywhere in the dedup index.
func TestRandomIDs(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	for _, random := range []bool{false, true} {
		cfg := testConfig(3)
		cfg.RandomIDs = random
		recs, exp := drain(t, cfg)
		if err := exp.Validate(); err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		var order []string
		for _, r := range recs {
			if r.kind != kindValid && r.kind != kindDuplicate {
				continue
			}
			var v struct {
				EventID string `json:"event_id"`
			}
			if err := json.Unmarshal(r.value, &v); err != nil {
				t.Fatal(err)
			}
			if r.kind == kindValid {
				if seen[v.EventID] > 0 {
					t.Fatalf("random=%v: id %s of two valid events", random, v.EventID)
				}
				order = append(order, v.EventID)
			} else if seen[v.EventID] == 0 {
				t.Fatalf("random=%v: repeat %s before its original", random, v.EventID)
			}
			seen[v.EventID]++
			if random != uuid.MatchString(v.EventID) {
				t.Fatalf("random=%v: id %q", random, v.EventID)
			}
		}
		if int64(len(order)) != cfg.Events {
			t.Fatalf("random=%v: %d valid events, want %d", random, len(order), cfg.Events)
		}
		inOrder := 0
		for i := 1; i < len(order); i++ {
			if order[i-1] < order[i] {
				inOrder++
			}
		}
		share := float64(inOrder) / float64(len(order)-1)
		if random && (share < 0.45 || share > 0.55) || !random && share < 0.8 {
			t.Fatalf("random=%v: %.2f of consecutive ids in order", random, share)
		}
	}
}
