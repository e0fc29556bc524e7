package main

import (
	"container/heap"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/twmb/franz-go/pkg/kgo"
)

// genConfig is everything that determines the record stream. Two generators
// with equal configs produce identical records and expected ledgers.
type genConfig struct {
	Topic          string
	Partitions     int // of the topic; decides which keys share a partition
	Events         int64
	Accounts       int
	ZipfS          float64
	Currencies     []string
	DupRatio       float64
	ConflictRatio  float64
	MalformedRatio float64
	AbortedRatio   float64
	OverflowCases  int
	// Period is the service's BILLING_WINDOW in BILLING_TIMEZONE: fixed
	// windows of whole seconds, or calendar days or months; CloseAfter its
	// WINDOW_CLOSE_AFTER (0: windows never close); Entries says it writes
	// ledger entries.
	Period     ledgercheck.Period
	CloseAfter time.Duration
	Entries    bool
	Windows    int // event times span this many windows before BaseTime (nominal days and months for calendar periods)
	BaseTime   time.Time
	LateRatio  float64
	// FutureRatio is the fraction of valid events followed by a record
	// dated in the year 9000 or later, which the service dead-letters as
	// event_time_in_future whenever it runs, and later by its correction:
	// the same event id at a time of the span, which counts (a dead
	// letter is not remembered as seen).
	FutureRatio float64
	// VersionRatio is the fraction of valid events that get versions:
	// one to three higher revisions (amendments to a fresh content, one in
	// four a cancellation), each sent up to maxRepeatDelay records later
	// (so in any order, under the key of its own account: on any
	// partition), and one in five of them sent twice.
	VersionRatio float64
	Seed         uint64
	MaxPayload   int // the service's max payload; payload_too_large records exceed it
	// Format is the service's EVENT_FORMAT, which decides the reason of a
	// malformed record's dead letter (malformedReason).
	Format string
	// CloudEvents is -cloudevents: "", structured or binary (the
	// service's EVENT_CLOUDEVENTS=true).
	CloudEvents string
	// RandomIDs makes valid events' ids random-looking UUIDs (randomID)
	// instead of e-<tag>-<n>: ids that sort in no relation to the order
	// they are produced in, as UUIDv4 ids do, so that every new key lands
	// on a random page of the dedup index.
	RandomIDs bool
}

// Tuning constants of the stream (not flags: changing them changes runs).
const (
	// maxRepeatDelay bounds how many records after its original an exact
	// or conflicting duplicate is produced, keeping repeats well within
	// any sensible DEDUP_TTL.
	maxRepeatDelay = 1000
	// maxMalformedDelay bounds the delay of malformed and aborted records.
	maxMalformedDelay = 50
	// abortBatch is the number of records per aborted transaction.
	abortBatch = 5
	// slowOverflowGap separates the events of every other overflow case
	// (so they likely fall into different service checkpoints).
	slowOverflowGap = 500
)

// recordKind says why a record was produced.
type recordKind int

const (
	kindValid recordKind = iota + 1
	kindDuplicate
	kindConflict
	kindMalformed
	kindOverflow
	kindAborted
	kindFuture    // dated far in the future: event_time_in_future
	kindCorrected // a future record's id again, at a time of the span: counted
	kindVersion   // a version of a valid event (docs/corrections.md)
)

func (k recordKind) String() string {
	switch k {
	case kindValid:
		return "valid"
	case kindDuplicate:
		return "duplicate"
	case kindConflict:
		return "conflict"
	case kindMalformed:
		return "malformed"
	case kindOverflow:
		return "overflow"
	case kindAborted:
		return "aborted"
	case kindFuture:
		return "future"
	case kindCorrected:
		return "corrected"
	case kindVersion:
		return "version"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// record is one Kafka record of the stream. Aborted records must be produced
// inside a transaction that is then aborted; all others are committed.
type record struct {
	kind      recordKind
	key       []byte
	value     []byte
	partition int // where the key hashes (Kafka's murmur2 partitioner)
}

// pending is a record scheduled for a later step.
type pending struct {
	due  int64
	seq  uint64
	kind recordKind
	// event to send (duplicate: the original; conflict: the altered copy;
	// overflow: the case's event; aborted: a fresh event).
	ev      ledgercheck.Event
	key     string
	value   []byte // exact bytes (duplicates), or nil to build
	want    ledgercheck.Outcome
	mkind   ledgercheck.MalformedKind // malformed, and aborted malformed
	counter int64
	next    *pending // scheduled once this one is emitted (a future record's correction)
	version ledgercheck.Version
}

type pendingHeap []*pending

func (h pendingHeap) Len() int { return len(h) }
func (h pendingHeap) Less(i, j int) bool {
	if h[i].due != h[j].due {
		return h[i].due < h[j].due
	}
	return h[i].seq < h[j].seq
}
func (h pendingHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pendingHeap) Push(x any)   { *h = append(*h, x.(*pending)) }
func (h *pendingHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return p
}

// generator produces the deterministic record stream of a run and keeps the
// expected ledger in step with it. Committed records are applied to the
// ledger in stream order, which is the produced order; since one key maps to
// one partition and the idempotent producer keeps each partition in order,
// that is the order the service sees each account's records in.
type generator struct {
	cfg      genConfig
	rng      *rand.Rand
	zipf     *rand.Zipf
	part     kgo.TopicPartitioner
	ledger   *ledgercheck.Model
	stats    ledgercheck.Produced
	pending  pendingHeap
	seq      uint64
	step     int64 // records emitted (committed and aborted)
	tag      string
	kinds    []ledgercheck.MalformedKind
	nextKind int
	mcount   int64 // malformed records scheduled (committed ones)
	acount   int64 // aborted records scheduled
	fcount   int64 // future records scheduled
	start    time.Time
	spanSec  int64
	winSec   int64
}

// Nominal lengths of calendar periods, for spreading event times: a day
// of 24 hours, a month of a Gregorian year's twelfth.
const (
	nominalDay   = 86400
	nominalMonth = 2629746 // 365.2425 days / 12
)

// windowSeconds is the length of a window in seconds: exact for fixed
// windows, nominal for calendar periods.
func (c *genConfig) windowSeconds() int64 {
	switch c.Period.Window() {
	case "day":
		return nominalDay
	case "month":
		return nominalMonth
	}
	return int64(c.Period.Size() / time.Second)
}

// newGenerator validates cfg and schedules the overflow cases. With one
// partition the expected ledger splits windows and adjustments exactly:
// the records are its log, in order; not with versions, whose retractions
// count in the adjustments of a window closed when their checkpoint began,
// which the model cannot know.
func newGenerator(cfg genConfig) (*generator, error) {
	ledger, err := ledgercheck.NewModelWith(ledgercheck.Options{Period: cfg.Period, CloseAfter: cfg.CloseAfter,
		SplitExact: cfg.Partitions == 1 && cfg.VersionRatio == 0, Entries: cfg.Entries})
	if err != nil {
		return nil, err
	}
	if w := cfg.Period.Size(); !cfg.Period.Calendar() && (w < time.Second || w%time.Second != 0) {
		return nil, fmt.Errorf("window %v must be a whole number of seconds", w)
	}
	if cfg.Accounts < 1 || cfg.Partitions < 1 || cfg.Windows < 1 || len(cfg.Currencies) == 0 || cfg.ZipfS <= 1 {
		return nil, fmt.Errorf("invalid generator config %+v", cfg)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x62696c6c696e67)) // "billing"
	g := &generator{
		cfg:    cfg,
		rng:    rng,
		zipf:   rand.NewZipf(rng, cfg.ZipfS, 1, uint64(cfg.Accounts-1)),
		part:   kgo.StickyKeyPartitioner(nil).ForTopic(cfg.Topic),
		ledger: ledger,
		tag:    fmt.Sprintf("%016x", cfg.Seed),
		kinds:  ledgercheck.MalformedKinds(),
		winSec: cfg.windowSeconds(),
	}
	g.spanSec = int64(cfg.Windows) * g.winSec
	g.start = cfg.BaseTime.UTC().Add(-time.Duration(g.spanSec) * time.Second)
	g.scheduleOverflowCases()
	return g, nil
}

// partitionOf returns the partition key hashes to, exactly as the producer's
// partitioner (kgo.StickyKeyPartitioner, Kafka's murmur2) will choose.
func (g *generator) partitionOf(key string) int {
	return g.part.Partition(&kgo.Record{Key: []byte(key)}, g.cfg.Partitions)
}

func (g *generator) schedule(p *pending) {
	p.seq = g.seq
	g.seq++
	heap.Push(&g.pending, p)
}

// scheduleOverflowCases plans cfg.OverflowCases cases on dedicated accounts,
// spread through the run. Variants, by case number modulo 3:
//
//	0: MaxInt64, then +1 (balance and window overflow), then -1
//	1: MinInt64, then -1 (underflow), then +1
//	2: MaxInt64 in window A, -MaxInt64 in window B, then +1 in A (only the
//	   window sum overflows; the balance would not), then -1 in A
//
// The dead-lettered event counts nowhere; the last event shows the account
// still works. All events of a case share a key, so they are consumed in
// order. Overflow events are never duplicated.
//
// When windows close, variant 2 is left out: whether A's events count in
// its window or in its adjustment (two separate sums) depends on when A
// closes, which depends on the timing of the partitions; variants 0 and 1
// overflow the balance, whichever sum takes the events.
func (g *generator) scheduleOverflowCases() {
	cur := g.cfg.Currencies[0]
	variants := 3
	if g.cfg.CloseAfter > 0 {
		variants = 2
	}
	for i := range g.cfg.OverflowCases {
		acct := fmt.Sprintf("acct-overflow-%d", i)
		winA := g.start.Add(time.Duration(int64(i%g.cfg.Windows)*g.winSec) * time.Second)
		winB := winA.Add(time.Duration(g.winSec) * time.Second)
		lenA := g.winSec
		if g.cfg.Period.Calendar() {
			// Calendar periods are not all of one length: A is a whole
			// period, B the next.
			winA = g.cfg.Period.Start(winA)
			winB = g.cfg.Period.Next(winA)
			lenA = int64(winB.Sub(winA) / time.Second)
		}
		inA := func(j int) time.Time {
			return winA.Add(time.Duration(int64(j)*lenA/8) * time.Second)
		}
		type step struct {
			amount int64
			at     time.Time
			want   ledgercheck.Outcome
		}
		var steps []step
		switch i % variants {
		case 0:
			steps = []step{{math.MaxInt64, inA(1), ledgercheck.Counted}, {1, inA(2), ledgercheck.Overflow}, {-1, inA(3), ledgercheck.Counted}}
		case 1:
			steps = []step{{math.MinInt64, inA(1), ledgercheck.Counted}, {-1, inA(2), ledgercheck.Overflow}, {1, inA(3), ledgercheck.Counted}}
		case 2:
			steps = []step{{math.MaxInt64, inA(1), ledgercheck.Counted}, {-math.MaxInt64, winB, ledgercheck.Counted},
				{1, inA(2), ledgercheck.Overflow}, {-1, inA(3), ledgercheck.Counted}}
		}
		gap := int64(1)
		if i%2 == 1 {
			gap = slowOverflowGap
		}
		due := int64(i+1) * g.cfg.Events / int64(g.cfg.OverflowCases+1)
		for j, s := range steps {
			g.schedule(&pending{
				due:  due + int64(j)*gap,
				kind: kindOverflow,
				ev:   ledgercheck.Event{EventID: fmt.Sprintf("o-%s-%d-%d", g.tag, i, j), AccountID: acct, AmountMinor: s.amount, Currency: cur, OccurredAt: s.at},
				key:  acct,
				want: s.want,
			})
		}
	}
}

// next returns the next record of the stream, or ok == false at the end.
// An error means the model disagrees with the generator's intent (a bug).
func (g *generator) next() (r record, ok bool, err error) {
	if len(g.pending) > 0 && (g.pending[0].due <= g.step || g.stats.Valid >= g.cfg.Events) {
		p := heap.Pop(&g.pending).(*pending)
		r, err = g.emitPending(p)
	} else if g.stats.Valid < g.cfg.Events {
		r, err = g.emitValid()
	} else {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, err
	}
	g.step++
	if r.kind == kindAborted {
		g.stats.Aborted++
	} else {
		g.stats.Records++
	}
	return r, true, nil
}

// apply feeds a committed event to the ledger and checks the outcome. An
// exact repeat of an event that has versions may come after a higher
// revision (stale): dropped either way.
func (g *generator) apply(e ledgercheck.Event, kind recordKind, want ledgercheck.Outcome) error {
	if got := g.ledger.Add(e); got != want && !(want == ledgercheck.Duplicate && got == ledgercheck.Stale) {
		return fmt.Errorf("internal error: %s event %s: model says %v, generator intended %v", kind, e.EventID, got, want)
	}
	return nil
}

func (g *generator) account() string { return fmt.Sprintf("acct-%06d", g.zipf.Uint64()) }

// newEvent draws a fresh valid event with the given id: a Zipf-chosen
// account, mostly its primary currency, a small amount (some refunds and
// zeros, so no regular account can overflow), and a time that moves through
// the span with the run (some moved back to older windows).
func (g *generator) newEvent(id string, progress int64) (ledgercheck.Event, bool) {
	rank := g.zipf.Uint64()
	acct := fmt.Sprintf("acct-%06d", rank)
	cur := g.cfg.Currencies[rank%uint64(len(g.cfg.Currencies))]
	if g.rng.IntN(5) == 0 {
		cur = g.cfg.Currencies[g.rng.IntN(len(g.cfg.Currencies))]
	}
	var amount int64
	switch x := g.rng.IntN(200); {
	case x == 0:
		amount = 0
	case x < 15:
		amount = -(1 + g.rng.Int64N(50_000)) // refund
	default:
		amount = 1 + g.rng.Int64N(200_000)
	}
	events := max(g.cfg.Events, 1)
	sec := g.spanSec*min(progress, events)/events + g.rng.Int64N(g.winSec) - g.winSec/2
	late := g.rng.Float64() < g.cfg.LateRatio
	if late {
		sec -= (1 + g.rng.Int64N(max(int64(g.cfg.Windows)/2, 1))) * g.winSec
		if sec < 0 {
			sec = g.rng.Int64N(g.winSec) // the oldest window
		}
	}
	sec = min(max(sec, 0), g.spanSec-1)
	at := g.start.Add(time.Duration(sec) * time.Second)
	if g.rng.IntN(10) == 0 {
		at = at.Add(time.Duration(g.rng.IntN(1000)) * time.Millisecond)
	}
	return ledgercheck.Event{EventID: id, AccountID: acct, AmountMinor: amount, Currency: cur, OccurredAt: at}, late
}

// style draws how a valid event is written.
func (g *generator) style(at time.Time) timeStyle {
	var s timeStyle
	if g.rng.IntN(7) == 0 {
		s.offset = []int{2 * 3600, -5 * 3600, 5*3600 + 1800, -(9*3600 + 30*60)}[g.rng.IntN(4)]
	}
	s.millis = at.Nanosecond() != 0 || g.rng.IntN(20) == 0
	s.unknown = g.rng.IntN(30) == 0
	return s
}

// randomID is name's UUID-shaped digest (the first 16 bytes of its
// SHA-256 with a version 4 UUID's version and variant bits): distinct names
// give distinct ids (up to a 122-bit hash's collisions), in no relation to
// the names' order.
func randomID(name string) string {
	h := sha256.Sum256([]byte(name))
	h[6] = h[6]&0x0f | 0x40
	h[8] = h[8]&0x3f | 0x80
	x := hex.EncodeToString(h[:16])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}

// emitValid emits a fresh valid event and schedules what follows from it:
// an exact duplicate, a conflicting duplicate, a malformed record and an
// aborted record, each with its probability.
func (g *generator) emitValid() (record, error) {
	n := g.stats.Valid
	id := fmt.Sprintf("e-%s-%d", g.tag, n)
	if g.cfg.RandomIDs {
		id = randomID(id)
	}
	e, late := g.newEvent(id, n)
	value := validPayload(e, g.style(e.OccurredAt))
	if err := g.apply(e, kindValid, ledgercheck.Counted); err != nil {
		return record{}, err
	}
	g.stats.Valid++
	if late {
		g.stats.Late++
	}
	// Draw every probability in a fixed order (determinism).
	dup, conflict := g.rng.Float64() < g.cfg.DupRatio, g.rng.Float64() < g.cfg.ConflictRatio
	malformed, aborted := g.rng.Float64() < g.cfg.MalformedRatio, g.rng.Float64() < g.cfg.AbortedRatio
	// Drawn only when enabled, so that runs without it are as before.
	future := g.cfg.FutureRatio > 0 && g.rng.Float64() < g.cfg.FutureRatio
	versioned := g.cfg.VersionRatio > 0 && g.rng.Float64() < g.cfg.VersionRatio
	if versioned {
		// A conflicting copy of the original would be judged against
		// whichever version came first on the service's partitions.
		conflict = false
		g.scheduleVersions(e, n)
	}
	if dup {
		key := e.AccountID
		if g.rng.IntN(2) == 0 {
			key = g.otherPartitionKey(e.AccountID)
		}
		g.schedule(&pending{due: g.step + 1 + g.rng.Int64N(maxRepeatDelay), kind: kindDuplicate,
			ev: e, key: key, value: value, want: ledgercheck.Duplicate})
	}
	if conflict {
		c := e
		switch g.rng.IntN(3) {
		case 0:
			c.AmountMinor++ // small amounts: cannot overflow
		case 1:
			if len(g.cfg.Currencies) > 1 {
				c.Currency = g.cfg.Currencies[(indexOf(g.cfg.Currencies, e.Currency)+1)%len(g.cfg.Currencies)]
			} else {
				c.AmountMinor--
			}
		case 2:
			c.OccurredAt = c.OccurredAt.Add(time.Second)
		}
		// Same key as the original: same partition, strictly after it.
		g.schedule(&pending{due: g.step + 1 + g.rng.Int64N(maxRepeatDelay), kind: kindConflict,
			ev: c, key: e.AccountID, want: ledgercheck.Conflict})
	}
	if malformed {
		k := g.kinds[g.nextKind%len(g.kinds)]
		g.nextKind++
		g.mcount++
		g.schedule(&pending{due: g.step + 1 + g.rng.Int64N(maxMalformedDelay), kind: kindMalformed,
			key: g.account(), mkind: k, counter: g.mcount})
	}
	if aborted {
		g.acount++
		p := &pending{due: g.step + 1 + g.rng.Int64N(maxMalformedDelay), kind: kindAborted, counter: g.acount}
		p.ev, _ = g.newEvent(fmt.Sprintf("a-%s-%d", g.tag, g.acount), n)
		p.key = p.ev.AccountID
		if g.acount%8 == 0 {
			p.mkind = ledgercheck.MalformedInvalidJSON // must not be dead-lettered either
		}
		g.schedule(p)
	}
	if future {
		g.fcount++
		f, _ := g.newEvent(fmt.Sprintf("f-%s-%d", g.tag, g.fcount), n)
		corrected := f
		// Year 9000 and later: in the future of any processing time the
		// service will see, so the outcome does not depend on when it runs.
		f.OccurredAt = farFuture.Add(time.Duration(g.rng.Int64N(int64(farFutureSpan/time.Second))) * time.Second)
		g.schedule(&pending{due: g.step + 1 + g.rng.Int64N(maxMalformedDelay), kind: kindFuture, ev: f, key: f.AccountID, value: validPayload(f, timeStyle{}),
			next: &pending{kind: kindCorrected, ev: corrected, key: corrected.AccountID, want: ledgercheck.Counted}})
	}
	return record{kind: kindValid, key: []byte(e.AccountID), value: value, partition: g.partitionOf(e.AccountID)}, nil
}

// scheduleVersions schedules the versions of e (VersionRatio).
func (g *generator) scheduleVersions(e ledgercheck.Event, n int64) {
	for rev := range int64(1 + g.rng.IntN(3)) {
		v := ledgercheck.Version{Revision: rev + 1}
		if g.rng.IntN(4) == 0 {
			v.Event, v.Cancelled = ledgercheck.Event{EventID: e.EventID}, true
		} else {
			v.Event, _ = g.newEvent(e.EventID, n)
		}
		key := v.AccountID
		if v.Cancelled {
			key = e.AccountID
		}
		copies := 1
		if g.rng.IntN(5) == 0 {
			copies = 2
		}
		for range copies {
			g.schedule(&pending{due: g.step + 1 + g.rng.Int64N(maxRepeatDelay), kind: kindVersion, key: key, version: v})
		}
	}
}

// otherPartitionKey returns a key derived from account that hashes to a
// different partition than account (when the topic has more than one).
func (g *generator) otherPartitionKey(account string) string {
	home := g.partitionOf(account)
	for i := 0; ; i++ {
		k := fmt.Sprintf("%s~dup%d", account, i)
		if g.cfg.Partitions == 1 || g.partitionOf(k) != home || i >= 64 {
			return k
		}
	}
}

func (g *generator) emitPending(p *pending) (record, error) {
	r := record{kind: p.kind, key: []byte(p.key), partition: g.partitionOf(p.key)}
	switch p.kind {
	case kindDuplicate:
		r.value = p.value
		g.stats.Duplicates++
		if r.partition != g.partitionOf(p.ev.AccountID) {
			g.stats.CrossPartitionDuplicates++
		}
		return r, g.apply(p.ev, p.kind, p.want)
	case kindConflict:
		r.value = validPayload(p.ev, timeStyle{})
		g.stats.Conflicts++
		return r, g.apply(p.ev, p.kind, p.want)
	case kindOverflow:
		r.value = validPayload(p.ev, timeStyle{})
		g.stats.OverflowEvents++
		return r, g.apply(p.ev, p.kind, p.want)
	case kindMalformed:
		e, _ := g.newEvent(fmt.Sprintf("m-%s-%d", g.tag, p.counter), g.stats.Valid)
		r.value = malformedPayload(p.mkind, e, p.counter, g.cfg.MaxPayload)
		g.stats.Malformed++
		g.ledger.DeadLetter(malformedReason(g.cfg.Format, g.cfg.CloudEvents, p.mkind))
		return r, nil
	case kindFuture:
		// Same key as its correction, which follows it on its partition.
		r.value = p.value
		g.stats.Future++
		g.ledger.DeadLetter(ledgercheck.ReasonEventTimeInFuture)
		c := p.next
		c.due = g.step + 1 + g.rng.Int64N(maxMalformedDelay)
		g.schedule(c)
		return r, nil
	case kindCorrected:
		r.value = validPayload(p.ev, timeStyle{})
		return r, g.apply(p.ev, p.kind, p.want)
	case kindVersion:
		r.value = versionPayload(p.version)
		g.stats.Versions++
		// Whether this version is applied, stale or a repeat depends on
		// the order the service's partitions deliver; the tables do not.
		if got := g.ledger.AddVersion(p.version); got == ledgercheck.Conflict || got == ledgercheck.Overflow {
			return record{}, fmt.Errorf("internal error: version %d of %s: model says %v", p.version.Revision, p.version.EventID, got)
		}
		return r, nil
	case kindAborted:
		// Never shown to the ledger: read_committed consumers skip it.
		if p.mkind != 0 {
			r.value = malformedPayload(p.mkind, p.ev, p.counter, g.cfg.MaxPayload)
		} else {
			r.value = validPayload(p.ev, timeStyle{})
		}
		return r, nil
	}
	return record{}, fmt.Errorf("internal error: pending record of kind %v", p.kind)
}

// farFuture starts the times of future records, which span farFutureSpan:
// far beyond any processing time plus MAX_EVENT_TIME_SKEW, within the
// contract's years.
var farFuture = time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC)

const farFutureSpan = 365 * 24 * time.Hour

// latestEventTime is the latest occurred_at of the events the stream
// counts or repeats (every record but the future ones): before BaseTime,
// or in an overflow case's second window. A run whose latest event time is
// later than the service's processing time plus MAX_EVENT_TIME_SKEW would
// see those events dead-lettered: the generator refuses it.
func (g *generator) latestEventTime() time.Time {
	latest := g.cfg.BaseTime
	for _, p := range g.pending {
		if p.kind == kindOverflow && p.ev.OccurredAt.After(latest) {
			latest = p.ev.OccurredAt
		}
	}
	return latest
}

// expected returns the expected ledger of the records emitted so far, with
// the run's metadata. Call it after the stream ended.
func (g *generator) expected(params map[string]string) *ledgercheck.Expected {
	e := g.ledger.Expected()
	e.Seed = g.cfg.Seed
	e.Topic = g.cfg.Topic
	e.Partitions = g.cfg.Partitions
	e.Produced = g.stats
	e.Produced.AbortedTransactions = (g.stats.Aborted + abortBatch - 1) / abortBatch
	e.Params = params
	return e
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}
