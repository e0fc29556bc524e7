package mysqldriver

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/deadletters"
	"github.com/billing/ledger/internal/stmt"
	"github.com/billing/ledger/internal/stmt/stmttest"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The class of input of a dead letter's statement, generated rather than
// picked: the server's max_allowed_packet from the smallest the service
// accepts to 64 MiB, the configured prefix from 1 KiB to 16 MiB (the
// column's bound; DEAD_LETTER_PAYLOAD_BYTES allows 1 MiB), record values
// from empty to brokerMax, and every field made of the bytes that cost
// most when quoted (NUL, both quotes, backslash, newline, carriage return,
// Ctrl-Z) mixed with invalid UTF-8.
const (
	minPacket = stmt.MinPacket
	maxPacket = 64 << 20
	minPrefix = 1 << 10
	maxPrefix = 16 << 20
	// brokerMax is the largest record value generated: Kafka's default
	// limit is 1 MiB, the tests' topics here take 8 MiB; 64 MiB is beyond
	// any max.message.bytes this service is meant to read.
	brokerMax = 64 << 20
)

// worst is brokerMax bytes of worst-case content: every byte escapes to
// two, with invalid UTF-8 (0xff, a lone 0xc3) between.
func worst() []byte {
	pattern := []byte{0, '\'', '"', '\\', '\n', '\r', 0x1a, 0xff, '\'', 0xc3}
	b := make([]byte, 0, brokerMax)
	for len(b) < brokerMax {
		b = append(b, pattern...)
	}
	return b[:brokerMax]
}

// logUniform picks an int in [lo, hi] with every power of two as likely
// (and 0 now and then when lo is 0).
func logUniform(r *rand.Rand, lo, hi int) int {
	if lo < 1 {
		if r.IntN(8) == 0 {
			return 0
		}
		lo = 1
	}
	f := float64(lo) * math.Exp2(r.Float64()*math.Log2(float64(hi)/float64(lo)))
	return min(hi, max(lo, int(f)))
}

// Guarantee 3 for dead letters of any size on a server of any allowed
// packet size: writeDeadLetters never returns a *stmt.TooLargeError (the stall of
// issue 18: a row estimate over the budget its payload prefix was cut
// for), every statement as the driver sends it stays within the budget,
// every letter is written once and in order, its payload is a prefix of
// the record's value of at most the configured length, and where the
// server's limit cut it shorter it still keeps at least a quarter of
// max_allowed_packet less 4 KiB.
func TestWriteFitsAnyPacketPrefixAndRecord(t *testing.T) {
	r := rand.New(rand.NewPCG(18, 1))
	junk := worst()
	topic := strings.Repeat("t", 249) // the longest topic name
	checkpoint := strings.Repeat("c", 64)
	now := time.Date(2026, 11, 29, 13, 5, 0, 123456000, time.UTC)
	trials := 300
	if testing.Short() {
		trials = 60
	}
	for trial := range trials {
		packet := logUniform(r, minPacket, maxPacket)
		prefix := logUniform(r, minPrefix, maxPrefix)
		switch trial {
		case 0: // issue 18: a 1 MiB server, a 1 MiB prefix
			packet, prefix = 1<<20, 1<<20
		case 1: // and a 128 KiB server with the default prefix
			packet, prefix = minPacket, 64<<10
		case 2:
			packet, prefix = minPacket, maxPrefix
		case 3:
			packet, prefix = maxPacket, maxPrefix
		}
		budget := stmt.Budget(packet)
		// Sizes around what the server's limit allows and the prefix, and
		// anywhere up to the broker's largest.
		cut := packet / 4
		sizes := []int{0, 1, prefix - 1, prefix, prefix + 1, cut - 4096, cut - 1, cut, cut + 1}
		n := 1 + r.IntN(8)
		if trial < 4 {
			n = 10
		}
		var letters []driver.DeadLetter
		var values [][]byte
		for i := range n {
			size := logUniform(r, 0, brokerMax)
			if r.IntN(2) == 0 {
				size = sizes[r.IntN(len(sizes))]
			}
			size = min(max(size, 0), brokerMax)
			off := r.IntN(brokerMax - size + 1)
			v := junk[off : off+size]
			key := junk[:r.IntN(3*deadletters.MaxKey)]
			if r.IntN(4) == 0 {
				key = nil
			}
			id := ""
			if r.IntN(2) == 0 {
				id = string(junk[:1+r.IntN(128)])
			}
			detail := string(junk[:r.IntN(4*deadletters.MaxDetail)])
			letters = append(letters, deadletters.New(int32(i), int64(1e12+i), key, v, prefix, "invalid_json", detail, id))
			values = append(values, v)
		}
		x := &stmttest.Execer{Budget: budget}
		if err := writeDeadLetters(context.Background(), x, topic, checkpoint, letters, now); err != nil {
			t.Fatalf("trial %d (max_allowed_packet %d, prefix %d, values of %v bytes): %v", trial, packet, prefix, lens(values), err)
		}
		var rows [][]any
		for _, s := range x.Statements() {
			if s.Bytes > budget {
				t.Fatalf("trial %d: a statement of %d bytes over the budget of %d", trial, s.Bytes, budget)
			}
			if len(s.Args)%12 != 0 {
				t.Fatalf("trial %d: %d arguments", trial, len(s.Args))
			}
			for i := 0; i < len(s.Args); i += 12 {
				rows = append(rows, s.Args[i:i+12])
			}
		}
		if len(rows) != n {
			t.Fatalf("trial %d: %d rows written for %d letters", trial, len(rows), n)
		}
		stored := -1 // the length the server's limit cut payloads to, if it did
		for i, row := range rows {
			if row[1] != int32(i) {
				t.Fatalf("trial %d: row %d is letter %v", trial, i, row[1])
			}
			p := row[7].([]byte)
			v := values[i]
			if len(p) > prefix || !bytes.Equal(p, v[:len(p)]) {
				t.Fatalf("trial %d, letter %d: stored %d bytes, not a prefix of the value of at most %d", trial, i, len(p), prefix)
			}
			if want := min(len(v), prefix); len(p) < want {
				if stored >= 0 && len(p) != stored {
					t.Fatalf("trial %d: payloads cut to %d and to %d bytes in one checkpoint", trial, stored, len(p))
				}
				stored = len(p)
				if len(p) < packet/4-4096 {
					t.Fatalf("trial %d: max_allowed_packet %d cut a payload to %d bytes, under a quarter of it less 4 KiB", trial, packet, len(p))
				}
			}
			if row[9].([]byte) == nil || row[8] != len(v) {
				t.Fatalf("trial %d, letter %d: size %v of %d, hash %x", trial, i, row[8], len(v), row[9])
			}
		}
	}
}

func lens(vs [][]byte) string {
	var b strings.Builder
	for i, v := range vs {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, len(v))
	}
	return b.String()
}
