package pipeline_test

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/big"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/billing/ledger/internal/pipeline"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Shared helpers of the scenario harness: the clock, times as the files
// write them, record lines, the group's assignment, and the rendering of
// what the ledger holds.

// day is the day the scenario files' times are on ("13:05" is 13:05 UTC
// on it); the ledger's clock starts at 14:00 of it.
var day = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

const clockStart = 14 * time.Hour

// clock is the control server's clock of a scenario: it moves only when
// the file says (tick). The pipelines' processing time, the sinks' and the
// in-memory servers' clocks all read it (skewed by an instance's host
// offset where a file says so).
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: day.Add(clockStart)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// at prints an instant as the files write it: the time of day on day
// ("13:05", "14:00:00.5"), else RFC 3339; "none" for the zero instant.
func at(t time.Time) string {
	if t.IsZero() {
		return "none"
	}
	t = t.UTC()
	if y, m, d := t.Date(); !time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Equal(day) {
		return t.Format(time.RFC3339Nano)
	}
	switch {
	case t.Nanosecond() != 0:
		return t.Format("15:04:05.999999999")
	case t.Second() != 0:
		return t.Format("15:04:05")
	}
	return t.Format("15:04")
}

// parseAt reads an instant as at prints it (a time of day on day, or RFC
// 3339).
func parseAt(s string) (time.Time, error) {
	for _, layout := range []string{"15:04", "15:04:05", "15:04:05.999999999"} {
		if t, err := time.Parse(layout, s); err == nil {
			h, m, sec := t.Clock()
			return day.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(sec)*time.Second + time.Duration(t.Nanosecond())), nil
		}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("instant %q: want 15:04[:05] on %s, or RFC 3339", s, day.Format(time.DateOnly))
	}
	return t, nil
}

// A record line of produce and feed (brace ranges expand in lockstep:
// "p0 e-{1..3} acct-{1..3} 5 EUR 13:05" is three records):
//
//	p<partition> <event_id> <account_id> <amount_minor> <currency> <occurred_at>
//	                               a valid event, keyed by its account; max and
//	                               min are the extremes of a signed 64-bit amount;
//	                               c*N is the character c N times (a long id);
//	                               a last field pad=N adds a field "padding" of
//	                               N bytes (unknown, ignored: a large event)
//	p<partition> raw <text>        the value as written
//	p<partition> junk <bytes>      that many bytes of 'x' (not JSON)
type recordLine struct {
	partition  int32
	key, value []byte
	event      *eventLine
}

type eventLine struct {
	ID       string `json:"event_id"`
	Account  string `json:"account_id"`
	Amount   int64  `json:"amount_minor"`
	Currency string `json:"currency"`
	At       string `json:"occurred_at"`
	Padding  string `json:"padding,omitempty"`
}

var braces = regexp.MustCompile(`\{(\d+)\.\.(\d+)\}`)

// expand returns the lines of input with their brace ranges expanded.
func expand(input string) ([]string, error) {
	var out []string
	for _, line := range strings.Split(input, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := braces.FindAllStringSubmatch(line, -1)
		if len(m) == 0 {
			out = append(out, line)
			continue
		}
		lo, _ := strconv.Atoi(m[0][1])
		hi, _ := strconv.Atoi(m[0][2])
		for _, r := range m[1:] {
			l, _ := strconv.Atoi(r[1])
			h, _ := strconv.Atoi(r[2])
			if h-l != hi-lo {
				return nil, fmt.Errorf("%q: brace ranges of different lengths", line)
			}
		}
		for i := 0; i <= hi-lo; i++ {
			out = append(out, braces.ReplaceAllStringFunc(line, func(s string) string {
				l, _ := strconv.Atoi(braces.FindStringSubmatch(s)[1])
				return strconv.Itoa(l + i)
			}))
		}
	}
	return out, nil
}

var repeated = regexp.MustCompile(`^(.)\*(\d+)$`)

func repeat(tok string) string {
	if m := repeated.FindStringSubmatch(tok); m != nil {
		n, _ := strconv.Atoi(m[2])
		return strings.Repeat(m[1], n)
	}
	return tok
}

func parseRecordLine(line string) (recordLine, error) {
	f := strings.Fields(line)
	if len(f) < 2 || !strings.HasPrefix(f[0], "p") {
		return recordLine{}, fmt.Errorf("record %q: want p<partition> first", line)
	}
	p, err := strconv.Atoi(f[0][1:])
	if err != nil {
		return recordLine{}, fmt.Errorf("record %q: %w", line, err)
	}
	r := recordLine{partition: int32(p)}
	switch f[1] {
	case "raw":
		r.value = []byte(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(strings.TrimPrefix(line, f[0])), "raw")))
		return r, nil
	case "junk":
		n, err := strconv.Atoi(f[2])
		if err != nil {
			return recordLine{}, fmt.Errorf("record %q: %w", line, err)
		}
		r.value = bytes.Repeat([]byte("x"), n)
		return r, nil
	}
	var pad int
	if len(f) == 7 && strings.HasPrefix(f[6], "pad=") {
		if pad, err = strconv.Atoi(strings.TrimPrefix(f[6], "pad=")); err != nil {
			return recordLine{}, fmt.Errorf("record %q: %w", line, err)
		}
		f = f[:6]
	}
	if len(f) != 6 {
		return recordLine{}, fmt.Errorf("record %q: want p<partition> id account amount currency occurred_at [pad=N]", line)
	}
	var amount int64
	switch f[3] {
	case "max":
		amount = math.MaxInt64
	case "min":
		amount = math.MinInt64
	default:
		if amount, err = strconv.ParseInt(f[3], 10, 64); err != nil {
			return recordLine{}, fmt.Errorf("record %q: %w", line, err)
		}
	}
	t, err := parseAt(f[5])
	if err != nil {
		return recordLine{}, err
	}
	r.event = &eventLine{ID: repeat(f[1]), Account: repeat(f[2]), Amount: amount, Currency: f[4], At: t.Format(time.RFC3339Nano), Padding: strings.Repeat("p", pad)}
	r.key = []byte(r.event.Account)
	r.value, _ = json.Marshal(r.event)
	return r, nil
}

func parseRecords(input string) ([]recordLine, error) {
	lines, err := expand(input)
	if err != nil {
		return nil, err
	}
	out := make([]recordLine, 0, len(lines))
	for _, l := range lines {
		r, err := parseRecordLine(l)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// byName is the scenarios' group balancer: eager, the partitions of the
// topic in ranges over the members in the order of their names (carried
// in the member metadata), so that which instance holds which partition
// is the file's to say. assignment computes the same.
type byName struct{ name string }

var _ kgo.GroupBalancer = byName{}

func (byName) ProtocolName() string { return "scenario-by-name" }
func (byName) IsCooperative() bool  { return false }

func (b byName) JoinGroupMetadata(interests []string, _ map[string][]int32, generation int32) []byte {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Version = 3
	meta.Topics = interests
	meta.UserData = []byte(b.name)
	meta.Generation = generation
	return meta.AppendTo(nil)
}

func (byName) ParseSyncAssignment(assignment []byte) (map[string][]int32, error) {
	return kgo.ParseConsumerSyncAssignment(assignment)
}

func (b byName) MemberBalancer(members []kmsg.JoinGroupResponseMember) (kgo.GroupMemberBalancer, map[string]struct{}, error) {
	cb, err := kgo.NewConsumerBalancer(b, members)
	if err != nil {
		return nil, nil, err
	}
	return cb, cb.MemberTopics(), nil
}

func (byName) Balance(cb *kgo.ConsumerBalancer, topics map[string]int32) kgo.IntoSyncAssignment {
	type member struct {
		name string
		m    *kmsg.JoinGroupResponseMember
	}
	var ms []member
	cb.EachMember(func(m *kmsg.JoinGroupResponseMember, meta *kmsg.ConsumerMemberMetadata) {
		ms = append(ms, member{string(meta.UserData), m})
	})
	sort.Slice(ms, func(i, j int) bool { return ms[i].name < ms[j].name })
	names := make([]string, len(ms))
	for i := range ms {
		names[i] = ms[i].name
	}
	plan := cb.NewPlan()
	for topic, n := range topics {
		for i, parts := range assignment(names, int(n)) {
			plan.AddPartitions(ms[i].m, topic, parts)
		}
	}
	return plan
}

// assignment is the partitions each member holds: ranges in name order,
// the first members one more when they do not divide evenly.
func assignment(names []string, partitions int) [][]int32 {
	out := make([][]int32, len(names))
	if len(names) == 0 {
		return out
	}
	div, rem := partitions/len(names), partitions%len(names)
	p := 0
	for i := range names {
		n := div
		if i < rem {
			n++
		}
		for range n {
			out[i] = append(out[i], int32(p))
			p++
		}
	}
	return out
}

// checkpointName names a checkpoint by its gtrid: instance#number.
func checkpointName(gtrid string) string {
	g, ok := txsink.ParseGlobalID(gtrid)
	if !ok {
		return gtrid
	}
	return fmt.Sprintf("%s#%d", g.Instance, g.Checkpoint)
}

func plural(n int64, one string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %ss", n, one)
}

// attemptLine describes one checkpoint attempt as OnCheckpoint reported it:
// what it covered, where it cut, and its outcome.
func attemptLine(info pipeline.CheckpointInfo) string {
	parts := []string{plural(int64(info.Records), "record")}
	if info.Counted > 0 {
		parts = append(parts, fmt.Sprintf("%d counted", info.Counted))
	}
	if info.Late > 0 {
		parts = append(parts, fmt.Sprintf("%d late", info.Late))
	}
	if info.Duplicates > 0 {
		parts = append(parts, plural(int64(info.Duplicates), "repeat")+" dropped")
	}
	for _, r := range slices.Sorted(maps.Keys(info.DeadLetters)) {
		parts = append(parts, fmt.Sprintf("%s %d", r, info.DeadLetters[r]))
	}
	if info.Sealed > 0 {
		parts = append(parts, plural(int64(info.Sealed), "row")+" sealed")
	}
	if info.Careful {
		parts = append(parts, "careful")
	}
	out := []string{checkpointName(info.Gtrid) + ": " + strings.Join(parts, ", ")}
	if len(info.Cuts) > 0 {
		out = append(out, cutsText(info.Cuts))
	}
	switch {
	case info.Err == nil:
		out = append(out, "committed")
	case info.Decided:
		out = append(out, fmt.Sprintf("decided, then failed at %s: %v", info.FailedPhase, info.Err))
	default:
		out = append(out, fmt.Sprintf("failed at %s: %v", info.FailedPhase, info.Err))
	}
	switch {
	case info.Isolation != "":
		out = append(out, "isolation: "+info.Isolation)
	case info.Retrying:
		out = append(out, "retried at once")
	}
	return strings.Join(out, "; ")
}

// cutsText names where a checkpoint cuts its partitions: "cut p0 at 3, p1
// at start (epoch 1)", each cut's epoch when they differ.
func cutsText(cuts []txsink.PartitionCut) string {
	same := true
	for _, c := range cuts {
		same = same && c.Epoch == cuts[0].Epoch
	}
	var cs []string
	for _, c := range cuts {
		s := fmt.Sprintf("p%d at %s", c.Partition, offset(c.NextOffset))
		if !same {
			s += fmt.Sprintf(" (epoch %d)", c.Epoch)
		}
		cs = append(cs, s)
	}
	s := "cut " + strings.Join(cs, ", ")
	if same {
		s += fmt.Sprintf(" (epoch %d)", cuts[0].Epoch)
	}
	return s
}

func offset(o int64) string {
	if o == txsink.StartOffset {
		return "start"
	}
	return strconv.FormatInt(o, 10)
}

// positionLine describes a partition's stored row.
func positionLine(p driver.Stored) string {
	s := fmt.Sprintf("p%d: next %s, epoch %d, owner %s", p.Partition, offset(p.NextOffset), p.Epoch, p.Owner)
	if !p.Watermark.IsZero() {
		s += ", watermark " + at(p.Watermark)
	}
	if p.CaughtUp {
		s += ", caught up"
	}
	return s
}

// maxListed is the most rows a table lists; a larger one is summed up.
const maxListed = 24

// tableLines renders one table's rows, or their summary when there are
// more than maxListed (or summary is set).
func tableLines(name string, rows []string, summary func() string, all bool) []string {
	if len(rows) == 0 {
		return nil
	}
	if len(rows) > maxListed && !all {
		return []string{fmt.Sprintf("%s: %s", name, summary())}
	}
	out := []string{name + ":"}
	for _, r := range rows {
		out = append(out, "  "+r)
	}
	return out
}

// ledgerLines renders what one server's ledger tables hold, each in its
// primary key's order except two: the dead letters are listed by
// partition and offset, and the expiry journal's rows by expiry and first
// id, not by their auto-increment ids. A server holds several branches of
// a checkpoint (MYSQL_BRANCHES), which write concurrently: which of them
// takes the next id first is the race's, not the pipeline's to say. With
// sums, a dead letter shows the first bytes of its stored SHA-256.
func ledgerLines(tb driver.Tables, tables map[string]bool, all, sums bool) []string {
	slices.SortStableFunc(tb.DeadLetters, func(a, b driver.DeadLetterRow) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	slices.SortStableFunc(tb.Journal, func(a, b driver.JournalRow) int {
		return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), strings.Compare(strings.Join(a.IDs, " "), strings.Join(b.IDs, " ")))
	})
	var out []string
	want := func(t string) bool { return len(tables) == 0 || tables[t] }
	if want("balances") {
		var rows []string
		var amount big.Int // a sum of sums may leave 64 bits
		var count int64
		for _, r := range tb.Balances {
			rows = append(rows, fmt.Sprintf("%s %s: %d over %s", r.Account, r.Currency, r.Amount, plural(r.Count, "event")))
			amount.Add(&amount, big.NewInt(r.Amount))
			count += r.Count
		}
		out = append(out, tableLines("account_balances", rows, func() string {
			return fmt.Sprintf("%d rows, %s over %s", len(rows), amount.String(), plural(count, "event"))
		}, all)...)
	}
	if want("windows") {
		var rows []string
		var amount big.Int
		var count, sealed int64
		for _, r := range tb.Windows {
			state := "open"
			if !r.ClosedAt.IsZero() {
				state = "sealed at " + at(r.ClosedAt)
				sealed++
			}
			rows = append(rows, fmt.Sprintf("%s %s %s: %d over %s, %s", r.Account, r.Currency, at(r.Start), r.Amount, plural(r.Count, "event"), state))
			amount.Add(&amount, big.NewInt(r.Amount))
			count += r.Count
		}
		out = append(out, tableLines("billing_windows", rows, func() string {
			return fmt.Sprintf("%d rows (%d sealed), %s over %s", len(rows), sealed, amount.String(), plural(count, "event"))
		}, all)...)
	}
	if want("adjustments") {
		var rows []string
		for _, r := range tb.Adjustments {
			rows = append(rows, fmt.Sprintf("%s %s %s: %d over %s (%s)", r.Account, r.Currency, at(r.Start), r.Amount, plural(r.Count, "event"), checkpointName(r.Checkpoint)))
		}
		out = append(out, tableLines("window_adjustments", rows, func() string { return fmt.Sprintf("%d rows", len(rows)) }, all)...)
	}
	if want("entries") {
		var rows []string
		for _, r := range tb.Entries {
			late := ""
			if r.Late {
				late = ", late"
			}
			rows = append(rows, fmt.Sprintf("p%d:%d %s %s %s %d at %s in %s%s (%s)", r.Partition, r.Offset, r.EventID, r.Account, r.Currency, r.Amount,
				at(r.OccurredAt), at(r.WindowStart), late, checkpointName(r.Checkpoint)))
		}
		out = append(out, tableLines("ledger_entries", rows, func() string { return fmt.Sprintf("%d rows", len(rows)) }, all)...)
	}
	if want("deadletters") {
		var rows []string
		reasons := map[string]int{}
		for _, r := range tb.DeadLetters {
			id := ""
			if r.EventID != "" {
				id = fmt.Sprintf(" (%s)", shorten(r.EventID))
			}
			row := fmt.Sprintf("p%d:%d %s%s: %s; payload %d of %d bytes", r.Partition, r.Offset, r.Reason, id, r.Detail, len(r.Payload), r.Size)
			if sums {
				row += fmt.Sprintf(", sha256 %x…", r.SHA256[:8])
			}
			rows = append(rows, row)
			reasons[r.Reason]++
		}
		out = append(out, tableLines("dead_letters", rows, func() string {
			var rs []string
			for _, r := range slices.Sorted(maps.Keys(reasons)) {
				rs = append(rs, fmt.Sprintf("%s %d", r, reasons[r]))
			}
			return fmt.Sprintf("%d rows: %s", len(rows), strings.Join(rs, ", "))
		}, all)...)
	}
	if want("keys") {
		out = append(out, keyLines(tb, all)...)
	}
	return out
}

// keyTableNames are the dedup key tables' names, by driver.Generation.Table.
var keyTableNames = [driver.KeyTables]string{"dedup_keys", "dedup_keys_g1", "dedup_keys_g2"}

// keyLines renders the dedup key tables of generations that hold keys,
// and the expiry journal of the version before generations (migration
// 00002), if it holds rows.
func keyLines(tb driver.Tables, all bool) []string {
	var out []string
	for i, table := range tb.Keys {
		var rows []string
		for _, k := range table {
			rows = append(rows, fmt.Sprintf("%s expires %s", shorten(k.ID), at(k.ExpiresAt)))
		}
		out = append(out, tableLines(keyTableNames[i], rows, func() string { return fmt.Sprintf("%d rows", len(rows)) }, all)...)
	}
	var rows []string
	var ids int
	for _, j := range tb.Journal {
		rows = append(rows, fmt.Sprintf("expires %s: %s", at(j.ExpiresAt), strings.Join(shortenAll(j.IDs), " ")))
		ids += len(j.IDs)
	}
	return append(out, tableLines("dedup_expiry", rows, func() string { return fmt.Sprintf("%d rows listing %d ids", len(rows), ids) }, all)...)
}

// shorten keeps an identifier readable: a long one by its first bytes and
// length.
func shorten(s string) string {
	if len(s) <= 40 {
		return s
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:16], len(s))
}

func shortenAll(ids []string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = shorten(id)
	}
	return out
}
