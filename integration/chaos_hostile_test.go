package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/ledgercheck"
)

// The hostile fault: a burst of records at the limits of the input
// contract, produced beside billing-gen's stream. Every burst holds
//
//   - junk records of 1 MiB and more (payload_too_large: each must become
//     one dead letter with a bounded prefix, and no statement or buffer may
//     grow with them);
//   - invalid JSON padded to just under MAX_PAYLOAD_BYTES (invalid_json;
//     invalid_encoding in a registry format);
//   - valid events padded with an unknown field to just under
//     MAX_PAYLOAD_BYTES, on accounts of their own (each must count once).
//
// The burst's contribution to the ledger is modelled in hostileLedger and
// merged into billing-gen's expected ledger before billing-verify runs.
//
// With windows that close, the valid events are dated long before
// billing-gen's span (which ends at its -base-time, 2026-11-29): they do
// not move the watermark (which would close every window of the run at
// once), and land in the adjustments of an old window, or in the window
// itself if they come first.
type hostileSource struct {
	brokers []string
	topic   string
	rng     *rand.Rand
	at      time.Time // of the first burst's valid events
	// enc writes the valid events in a registry format (nil: JSON), and
	// invalidReason is what the invalid records become.
	enc           *format.Encoder
	invalidReason string

	mu      sync.Mutex
	cl      *kgo.Client
	ledger  *ledgercheck.Model
	records int
	bursts  int
}

// The burst's shape. MAX_PAYLOAD_BYTES is the service's default (64 KiB).
const (
	hostileJunk       = 3 // of 1 MiB to 3 MiB
	hostileInvalid    = 10
	hostileValid      = 30
	hostileMaxPayload = 64 << 10
)

func newHostileSource(t *testing.T, brokers []string, topic string, seed uint64, p chaosPeriod) *hostileSource {
	period, err := ledgercheck.NewPeriod(p.window, p.zone)
	if err != nil {
		t.Fatal(err)
	}
	var closeAfter time.Duration
	at := time.Date(2026, 11, 29, 13, 0, 0, 0, time.UTC)
	if p.closing() {
		closeAfter, _ = time.ParseDuration(p.closeAfter)
		at = time.Date(2024, 6, 15, 12, 0, 0, 0, time.UTC)
	}
	l, err := ledgercheck.NewModelWith(ledgercheck.Options{Period: period, CloseAfter: closeAfter, Entries: p.entries})
	if err != nil {
		t.Fatal(err)
	}
	h := &hostileSource{brokers: brokers, topic: topic, rng: rand.New(rand.NewPCG(seed, 0x686f7374)), ledger: l, at: at, invalidReason: "invalid_json"}
	if format.NeedsRegistry(p.format) {
		// The bursts' valid events in the instances' format, without the
		// padding (the format's schema has no field for it); their invalid
		// records have no magic byte.
		h.enc, err = format.NewEncoder(context.Background(), p.format, "", p.registry, topic+"-value", hostileMaxPayload)
		if err != nil {
			t.Fatal(err)
		}
		h.invalidReason = "invalid_encoding"
	}
	return h
}

// burst produces one burst and records it in the ledger model once Kafka
// acknowledged every record of it.
func (h *hostileSource) burst(ctx context.Context) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cl == nil {
		cl, err := kgo.NewClient(kgo.SeedBrokers(h.brokers...), kgo.DefaultProduceTopic(h.topic),
			kgo.ProducerBatchMaxBytes(8<<20), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))
		if err != nil {
			return "", err
		}
		h.cl = cl
	}
	h.bursts++
	var recs []*kgo.Record
	var events []ledgercheck.Event
	junkBytes := 0
	for i := range hostileJunk {
		size := 1<<20 + h.rng.IntN(2<<20)
		junkBytes += size
		v := make([]byte, size)
		for j := range v {
			v[j] = byte(h.rng.IntN(256))
		}
		recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprintf("junk-%d-%d", h.bursts, i)), Value: v})
	}
	for i := range hostileInvalid {
		v := `{"event_id":"hostile-bad-` + fmt.Sprint(h.bursts, "-", i) + `","pad":"` + strings.Repeat("x", hostileMaxPayload-200) // unterminated
		recs = append(recs, &kgo.Record{Key: []byte("bad"), Value: []byte(v)})
	}
	at := h.at.Add(time.Duration(h.bursts) * 17 * time.Minute)
	for i := range hostileValid {
		ev := ledgercheck.Event{EventID: fmt.Sprintf("hostile-%d-%d", h.bursts, i), AccountID: fmt.Sprintf("hostile-acct-%d", i%5),
			AmountMinor: int64(1 + h.rng.IntN(10000)), Currency: "EUR", OccurredAt: at}
		v, err := json.Marshal(map[string]any{"event_id": ev.EventID, "account_id": ev.AccountID, "amount_minor": ev.AmountMinor,
			"currency": ev.Currency, "occurred_at": at.Format(time.RFC3339), "padding": strings.Repeat("p", hostileMaxPayload-300)})
		if err == nil && h.enc != nil {
			v, _, err = h.enc.Record(v)
		}
		if err != nil {
			return "", err
		}
		recs = append(recs, &kgo.Record{Key: []byte(ev.AccountID), Value: v})
		events = append(events, ev)
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := h.cl.ProduceSync(pctx, recs...).FirstErr(); err != nil {
		return "", fmt.Errorf("producing the hostile burst: %w", err)
	}
	for range hostileJunk {
		h.ledger.DeadLetter("payload_too_large")
	}
	for range hostileInvalid {
		h.ledger.DeadLetter(h.invalidReason)
	}
	for _, ev := range events {
		h.ledger.Add(ev)
	}
	h.records += len(recs)
	return fmt.Sprintf("%d records: %d junk (%d MiB), %d invalid, %d padded valid", len(recs), hostileJunk, junkBytes>>20, hostileInvalid, hostileValid), nil
}

// produced is the number of records the bursts wrote.
func (h *hostileSource) produced() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.records
}

// mergeInto writes expected (billing-gen's) plus the bursts' contribution
// to a new file and returns its path.
func (h *hostileSource) mergeInto(expected, out string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.records == 0 {
		return expected, nil
	}
	exp, err := ledgercheck.ReadFile(expected)
	if err != nil {
		return "", err
	}
	if err := exp.Merge(h.ledger.Expected()); err != nil {
		return "", err
	}
	exp.Produced.Records += int64(h.records)
	return out, ledgercheck.WriteFile(out, exp)
}

func (h *hostileSource) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cl != nil {
		h.cl.Close()
	}
}
