package changelog

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/klauspost/compress/s2"
)

// Op is an event's op.
type Op string

// The ops of the spec; the current tables never emit OpDelete.
const (
	OpCreate Op = "c"
	OpUpdate Op = "u"
	OpDelete Op = "d"
	OpRead   Op = "r"
)

// Source is the envelope's source block, apart from what the encoder
// fills in (connector, table).
type Source struct {
	Version    string
	Name       string // the topic prefix
	Ledger     string
	Checkpoint string // the gtrid
	CommitSeq  int64
	TsMs       int64
	// Snapshot is "false" for a change, "true" for a snapshot read, "last"
	// for the last snapshot read of a table; empty means "false".
	Snapshot string
}

// Change is one event as the outbox keeps it: the table, the op and the
// binary rows (nil when the op has none). The rows alias the bytes it was
// decoded from.
type Change struct {
	Table         TableID
	Op            Op
	Before, After []byte
}

// AppendChange appends c as one record of an outbox blob (AppendRecord
// frames it).
func AppendChange(b []byte, c Change) []byte {
	b = append(b, byte(c.Table), c.Op[0])
	b = binary.AppendUvarint(b, uint64(len(c.Before)))
	b = append(b, c.Before...)
	return append(b, c.After...)
}

// DecodeChange decodes one record (without its frame) and checks its
// shape: the table exists and the op carries the rows it should.
func DecodeChange(rec []byte) (Change, error) {
	if len(rec) < 3 {
		return Change{}, fmt.Errorf("changelog record of %d bytes", len(rec))
	}
	c := Change{Table: TableID(rec[0]), Op: Op(string(rec[1:2]))}
	n, k := binary.Uvarint(rec[2:])
	if k <= 0 || uint64(len(rec)-2-k) < n {
		return Change{}, fmt.Errorf("changelog record: %w before row", errTruncated)
	}
	rest := rec[2+k:]
	if n > 0 {
		c.Before = rest[:n]
	}
	if len(rest[n:]) > 0 {
		c.After = rest[n:]
	}
	t, ok := ByID(c.Table)
	if !ok {
		return Change{}, fmt.Errorf("changelog record of table %d: no such table", c.Table)
	}
	if err := shape(t, c.Op, c.Before != nil, c.After != nil); err != nil {
		return Change{}, err
	}
	return c, nil
}

// shape checks which rows an op carries, on which kind of topic.
func shape(t Table, op Op, before, after bool) error {
	bad := func(reason string) error { return &FormatError{Table: t.Name, Reason: reason} }
	switch op {
	case OpCreate, OpRead:
		if before || !after {
			return bad(fmt.Sprintf("op %s needs after and no before", op))
		}
	case OpUpdate:
		if !before || !after {
			return bad("op u needs before and after")
		}
	case OpDelete:
		if !before || after {
			return bad("op d needs before and no after")
		}
	default:
		return bad(fmt.Sprintf("unknown op %q", op))
	}
	if t.Append && op != OpCreate && op != OpRead {
		return bad(fmt.Sprintf("append-only topic carries op c (and r, a snapshot's) only, not %s", op))
	}
	return nil
}

// An outbox blob is a version byte followed by records, each framed by its
// length (uvarint); in version 2 the records are compressed with S2
// (klauspost/compress/s2, Snappy's faster successor): change events repeat
// their account ids and instants, and every byte of the outbox is
// written, logged by the binary log, read and deleted again.
const (
	blobVersion = 1
	blobS2      = 2
	// maxBlobRecords bounds the records' size a version 2 blob may claim
	// (no statement carries more than max_allowed_packet's 1 GiB).
	maxBlobRecords = 1 << 30
)

// NewBlob starts an outbox blob.
func NewBlob(b []byte) []byte { return append(b[:0], blobVersion) }

// AppendRecord appends one framed record of c to a blob.
func AppendRecord(blob []byte, c Change) []byte {
	n := 2 + uvarintLen(uint64(len(c.Before))) + len(c.Before) + len(c.After)
	blob = binary.AppendUvarint(blob, uint64(n))
	return AppendChange(blob, c)
}

// RecordBytes is what AppendRecord adds to a blob for c.
func RecordBytes(c Change) int {
	n := 2 + uvarintLen(uint64(len(c.Before))) + len(c.Before) + len(c.After)
	return uvarintLen(uint64(n)) + n
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// Records calls fn with each change of a blob, in order; the changes alias
// the blob. It stops at fn's first error.
func Records(blob []byte, fn func(Change) error) error {
	if len(blob) == 0 || blob[0] != blobVersion && blob[0] != blobS2 {
		return fmt.Errorf("outbox blob: unknown version")
	}
	rest := blob[1:]
	if blob[0] == blobS2 {
		n, err := s2.DecodedLen(rest)
		if err != nil || n > maxBlobRecords {
			return fmt.Errorf("outbox blob: compressed records of %d bytes: %v", n, err)
		}
		if rest, err = s2.Decode(nil, rest); err != nil {
			return fmt.Errorf("outbox blob: %w", err)
		}
	}
	for len(rest) > 0 {
		n, k := binary.Uvarint(rest)
		if k <= 0 || uint64(len(rest)-k) < n {
			return fmt.Errorf("outbox blob: %w record", errTruncated)
		}
		c, err := DecodeChange(rest[k : k+int(n)])
		if err != nil {
			return err
		}
		if err := fn(c); err != nil {
			return err
		}
		rest = rest[k+int(n):]
	}
	return nil
}

// Pack appends changes to blobs of at most max bytes each (one change
// larger than that gets a blob of its own: the caller bounds its rows
// below max), with the number of changes in each.
type Pack struct {
	Max    int
	Blobs  [][]byte
	Counts []int
}

// Compress replaces each blob by its compressed form (version 2) where that
// is smaller; a blob stays within Max.
func (p *Pack) Compress() {
	for i, b := range p.Blobs {
		if len(b) < 64 {
			continue
		}
		out := make([]byte, 1+s2.MaxEncodedLen(len(b)-1))
		out[0] = blobS2
		enc := s2.Encode(out[1:], b[1:])
		if len(enc)+1 < len(b) {
			p.Blobs[i] = out[:1+len(enc)]
		}
	}
}

// Add appends c to the last blob, or to a new one when it would not fit.
func (p *Pack) Add(c Change) {
	n := len(p.Blobs)
	if n == 0 || len(p.Blobs[n-1])+RecordBytes(c) > p.Max && p.Counts[n-1] > 0 {
		p.Blobs, p.Counts = append(p.Blobs, NewBlob(nil)), append(p.Counts, 0)
		n++
	}
	p.Blobs[n-1] = AppendRecord(p.Blobs[n-1], c)
	p.Counts[n-1]++
}

// Encoder turns changes into Kafka records: the key and the envelope. It
// reuses its buffers: one per goroutine.
type Encoder struct {
	before, after []Value
	buf           []byte
	// The sizes of the last record's key and value: each new one is
	// allocated once at about that size.
	keyLen, valueLen int
}

// Record returns the record key and value of c with the envelope's
// ts_ms and source (the key and value are new slices, the caller's).
func (e *Encoder) Record(c Change, tsMs int64, src Source) (key, value []byte, err error) {
	t, ok := ByID(c.Table)
	if !ok {
		return nil, nil, fmt.Errorf("changelog: no table %d", c.Table)
	}
	if err := e.decode(t, c); err != nil {
		return nil, nil, err
	}
	return e.encode(t, c.Op, tsMs, src)
}

func (e *Encoder) decode(t Table, c Change) error {
	var err error
	e.before, e.after = e.before[:0], e.after[:0]
	if c.Before != nil {
		if e.before, err = DecodeRow(t, c.Before, e.before); err != nil {
			return err
		}
	}
	if c.After != nil {
		if e.after, err = DecodeRow(t, c.After, e.after); err != nil {
			return err
		}
	}
	return nil
}

func (e *Encoder) encode(t Table, op Op, tsMs int64, src Source) (key, value []byte, err error) {
	before, after := e.before, e.after
	if len(before) == 0 {
		before = nil
	}
	if len(after) == 0 {
		after = nil
	}
	keyRow := after
	if op == OpDelete {
		keyRow = before
	}
	if key, err = appendJSONKey(make([]byte, 0, e.keyLen+16), t, keyRow); err != nil {
		return nil, nil, err
	}
	e.keyLen = len(key)
	if op == OpUpdate {
		bk, err := appendJSONKey(e.buf[:0], t, before)
		e.buf = bk
		if err != nil {
			return nil, nil, err
		}
		if string(bk) != string(key) {
			return nil, nil, &FormatError{Table: t.Name, Reason: fmt.Sprintf("u event changes the key from %s to %s", bk, key)}
		}
	}
	snapshot := src.Snapshot
	if snapshot == "" {
		snapshot = "false"
	}
	if err := snapshotShape(t, op, snapshot); err != nil {
		return nil, nil, err
	}
	b := make([]byte, 0, max(e.valueLen+64, 64+len(key)*4+len(src.Version)+len(src.Name)+len(src.Ledger)+len(src.Checkpoint)+128))
	b = append(b, `{"before":`...)
	if b, err = appendJSONRow(b, t, before); err != nil {
		return nil, nil, err
	}
	b = append(b, `,"after":`...)
	if b, err = appendJSONRow(b, t, after); err != nil {
		return nil, nil, err
	}
	b = append(b, `,"op":"`...)
	b = append(b, op...)
	b = append(b, `","ts_ms":`...)
	b = strconv.AppendInt(b, tsMs, 10)
	b = append(b, `,"source":{"connector":"billing-ledger","version":`...)
	var ok [5]bool
	b, ok[0] = appendJSONString(b, src.Version)
	b = append(b, `,"name":`...)
	b, ok[1] = appendJSONString(b, src.Name)
	b = append(b, `,"ledger":`...)
	b, ok[2] = appendJSONString(b, src.Ledger)
	b = append(b, `,"table":`...)
	b, _ = appendJSONString(b, t.Name)
	b = append(b, `,"checkpoint":`...)
	b, ok[3] = appendJSONString(b, src.Checkpoint)
	b = append(b, `,"commit_seq":`...)
	b = strconv.AppendInt(b, src.CommitSeq, 10)
	b = append(b, `,"ts_ms":`...)
	b = strconv.AppendInt(b, src.TsMs, 10)
	b = append(b, `,"snapshot":`...)
	b, ok[4] = appendJSONString(b, snapshot)
	b = append(b, "}}"...)
	e.valueLen = len(b)
	for _, v := range ok {
		if !v {
			return nil, nil, &FormatError{Table: t.Name, Reason: "source field is not valid UTF-8"}
		}
	}
	return key, b, nil
}

// snapshotShape: source.snapshot goes with op r, and only with it.
func snapshotShape(t Table, op Op, snapshot string) error {
	switch snapshot {
	case "false":
		if op == OpRead {
			return &FormatError{Table: t.Name, Reason: `op r is a snapshot read: source.snapshot "true" or "last"`}
		}
	case "true", "last":
		if op != OpRead {
			return &FormatError{Table: t.Name, Reason: fmt.Sprintf("source.snapshot %q on op %s", snapshot, op)}
		}
	default:
		return &FormatError{Table: t.Name, Reason: fmt.Sprintf("source.snapshot %q", snapshot)}
	}
	return nil
}
