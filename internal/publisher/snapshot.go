package publisher

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The snapshot of an existing ledger (docs/changelog.md
// "Turning it on for a ledger that holds rows").
//
// The changelog of a ledger enabled at From is every change of the
// checkpoints numbered From and later: each carries its before-image in
// the outbox. A ledger that already held rows needs, before those changes,
// one event (op r) per row as it stood after checkpoint From-1, so that
// every key's chain starts with it. The tables cannot be read at that
// instant (counting goes on), so the snapshot reads them as they are, in
// key order, one chunk at a time, and corrects each row with the outbox,
// which holds every change since From (none is published, so none is
// deleted, until the snapshot is):
//
//   - a key the outbox has no change of since From (through every
//     decision made when the chunk was read, all of them applied) is the
//     row as it stood at From-1: its r event is the row read;
//   - a key the outbox has changes of: its first change's before-image is
//     the row at From-1 (its r event), or, when that is null, the key was
//     created since From and gets no r event (its c event follows);
//   - a ledger entry written by a checkpoint numbered From or later gets
//     no r event (its c event follows);
//   - a window whose row at From-1 was sealed also gets its closed_windows
//     r event.
//
// Then the changes from From on are published as they are. Each chunk is
// one Kafka transaction with the progress record, which carries where the
// snapshot stands: a publisher that takes over goes on from there (the
// outbox's first changes are found again by reading it from From).
//
// The outbox is read into an index (firsts) once per session, for every
// server and table, bounded by CHANGELOG_SNAPSHOT_INDEX_BYTES: past the
// bound it holds the keys nearest ahead of the scan and is read again
// once the scan passes them. The lease is renewed throughout (keepLease):
// a chunk may take longer than it.

// snapshotTables are the tables a snapshot reads on each server, in order.
var snapshotTables = []string{changelog.AccountBalances, changelog.BillingWindows, changelog.WindowAdjustments, changelog.LedgerEntries}

// SnapshotPos is where the snapshot of an existing ledger stands: the
// server and table it reads, and the key of the last row published (nil:
// none of that table yet).
type SnapshotPos struct {
	Server int     `json:"server"`
	Table  string  `json:"table"`
	After  *RowKey `json:"after,omitempty"`
}

// RowKey is the primary key of a row of one of the snapshot's tables: the
// fields of that table's key are set.
type RowKey struct {
	Account   string    `json:"account_id,omitempty"`
	Currency  string    `json:"currency,omitempty"`
	Start     time.Time `json:"window_start,omitzero"`
	Topic     string    `json:"kafka_topic,omitempty"`
	Partition int32     `json:"kafka_partition,omitempty"`
	Offset    int64     `json:"kafka_offset,omitempty"`
	// Entry: a ledger entry's kind (absent in a position stored before
	// entries had kinds, when every entry's was 0).
	Entry driver.EntryKind `json:"entry,omitempty"`
}

// snapshotStart is where a snapshot starts.
func snapshotStart() *SnapshotPos { return &SnapshotPos{Table: snapshotTables[0]} }

// nextTable is where the snapshot goes once sp's table is read in whole
// on a ledger of servers servers: the next table, the next server, or nil
// (done).
func nextTable(sp SnapshotPos, servers int) *SnapshotPos {
	for i, t := range snapshotTables {
		if t != sp.Table {
			continue
		}
		if i+1 < len(snapshotTables) {
			return &SnapshotPos{Server: sp.Server, Table: snapshotTables[i+1]}
		}
		if sp.Server+1 < servers {
			return &SnapshotPos{Server: sp.Server + 1, Table: snapshotTables[0]}
		}
		return nil
	}
	return nil // an unknown table: refused by validSnapshot first
}

// validSnapshot checks a snapshot position read from Kafka.
func validSnapshot(sp SnapshotPos, servers int) error {
	if sp.Server < 0 || sp.Server >= servers {
		return fmt.Errorf("publisher: the snapshot's progress names server %d of %d", sp.Server, servers)
	}
	for _, t := range snapshotTables {
		if t == sp.Table {
			return nil
		}
	}
	return fmt.Errorf("publisher: the snapshot's progress names table %q", sp.Table)
}

// scanned is one row a snapshot chunk read: its binary row, its key in
// the scan's order (sortKey) and, for a ledger entry, the checkpoint that
// wrote it.
type scanned struct {
	Raw        []byte
	Key        string
	Checkpoint string
}

// sortKey appends the key of a row of table (balances, windows or
// adjustments) on server to b, as bytes that order as the snapshot reads
// the rows: the server, the table (TableID numbers them in snapshotTables'
// order), then the primary key in the tables' order, bytewise (VARBINARY
// account ids, ascii_bin currencies), then window_start. A string is
// written with each 0x00 as 0x00 0xff and ended by 0x00 0x01, so that a
// prefix orders first; a time as its microseconds with the sign bit
// flipped, big-endian.
func sortKey(b []byte, server int, table changelog.TableID, account, currency []byte, start int64, withStart bool) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(server))
	b = append(b, byte(table))
	for _, s := range [][]byte{account, currency} {
		for _, c := range s {
			if c == 0 {
				b = append(b, 0, 0xff)
			} else {
				b = append(b, c)
			}
		}
		b = append(b, 0, 1)
	}
	if withStart {
		b = binary.BigEndian.AppendUint64(b, uint64(start)^1<<63)
	}
	return b
}

// posKey is where the scan stands at sp, as a sortKey: every key up to it
// is read (sp.After nil: only the prefix of sp's table, before its first
// key).
func posKey(sp SnapshotPos) string {
	t, _ := changelog.Lookup(sp.Table)
	if sp.After == nil || t.Append {
		return string(sortKey(nil, sp.Server, t.ID, nil, nil, 0, false)[:5])
	}
	return string(sortKey(nil, sp.Server, t.ID, []byte(sp.After.Account), []byte(sp.After.Currency),
		sp.After.Start.UnixMicro(), t.ID != changelog.TBalances))
}

// entryCost is what the index counts for a key it holds: the key, the
// before-image and the map's own share (its slot, the string and slice
// headers, the allocations' rounding).
func entryCost(key string, before []byte) int { return len(key) + len(before) + 96 }

// firsts is what the snapshot knows of the outbox since the enabling,
// for every server and table at once: each changed key's first
// before-image (nil: created since), for the keys ahead of the scan
// (after at) up to horizon, and the checkpoints it read (through a
// commit_seq). It is read once per session, then only the checkpoints
// decided since are added, while every changed key ahead of the scan fits
// in limit bytes (entryCost). When they do not, the largest keys are
// dropped and horizon lowered to the largest kept: keys past it are
// neither held nor added; once the scan needs one of them (a chunk whose
// last key is past horizon) the index is read again from the enabling.
// Keys up to pin (the chunk being corrected) are never dropped, so the
// index holds at most limit bytes, or twice one chunk's changed keys when
// they alone are more.
//
// It is exact: every key in (at, horizon] has its first change since the
// enabling through commit_seq through held, because every change through
// through was read in commit order and a key in that range is dropped
// only by lowering horizon below it.
type firsts struct {
	from    int64
	through int64
	at      string
	pin     string
	horizon string // "" while nothing was dropped
	before  map[string][]byte
	bytes   int
	limit   int
	shedAt  int // bytes at which the index sheds: limit, or twice what pin kept
	gtrids  map[string]bool
	// reads counts the readings from the enabling, peak the most bytes
	// held (tests, logs).
	reads, peak int
	vals        []changelog.Value
	key         []byte
}

func newFirsts(from int64, limit int) *firsts {
	f := &firsts{from: from, limit: limit}
	f.reset()
	return f
}

// reset empties the index: it is read again from the enabling.
func (f *firsts) reset() {
	f.through, f.horizon, f.bytes, f.shedAt = f.from-1, "", 0, f.limit
	f.before, f.gtrids = map[string][]byte{}, map[string]bool{}
}

// covers says whether the index holds every changed key up to key.
func (f *firsts) covers(key string) bool { return f.horizon == "" || key <= f.horizon }

// add records a change read from server's outbox, in commit order: only a
// key's first change counts.
func (f *firsts) add(server int, c changelog.Change) error {
	t, ok := changelog.ByID(c.Table)
	if !ok || t.Append {
		return nil
	}
	var err error
	if f.vals, err = changelog.DecodeRow(t, c.After, f.vals); err != nil {
		return err
	}
	f.key = sortKey(f.key[:0], server, t.ID, f.vals[0].S, f.vals[1].S, f.vals[2].I, t.ID != changelog.TBalances)
	if string(f.key) <= f.at || !f.covers(string(f.key)) {
		return nil // passed (its r event is out), or past the horizon
	}
	if _, ok := f.before[string(f.key)]; ok {
		return nil
	}
	var b []byte
	if c.Before != nil {
		b = append([]byte{}, c.Before...) // c aliases the outbox row
	}
	k := string(f.key)
	f.before[k] = b
	f.bytes += entryCost(k, b)
	f.peak = max(f.peak, f.bytes)
	if f.bytes > f.shedAt {
		f.shed()
	}
	return nil
}

// shed drops the keys the scan passed without reading them (none but a
// row deleted since), then the largest keys past pin until the index holds
// three quarters of its limit, and lowers horizon to the largest kept.
func (f *firsts) shed() {
	keys := make([]string, 0, len(f.before))
	for k, b := range f.before {
		if k <= f.at {
			f.bytes -= entryCost(k, b)
			continue
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	n := len(keys)
	for n > 0 && f.bytes > f.limit/4*3 && keys[n-1] > f.pin {
		n--
		f.bytes -= entryCost(keys[n], f.before[keys[n]])
	}
	kept := make(map[string][]byte, n)
	for _, k := range keys[:n] {
		kept[k] = f.before[k]
	}
	f.before = kept
	f.shedAt = f.limit
	if f.bytes > f.limit/4*3 {
		f.shedAt = 2 * f.bytes // what pin keeps: shed again only once it doubled
	}
	f.horizon = max(f.at, f.pin)
	if n > 0 {
		f.horizon = max(f.horizon, keys[n-1])
	}
}

// first is the first before-image of key since the enabling (changed:
// there is a change of it), forgotten once looked up: the scan reads a
// key once.
func (f *firsts) first(key string) (before []byte, changed bool, err error) {
	if key <= f.at || !f.covers(key) {
		return nil, false, fmt.Errorf("publisher: snapshot key %x outside the index (%x, %x]", key, f.at, f.horizon)
	}
	before, changed = f.before[key]
	if changed {
		delete(f.before, key)
		f.bytes -= entryCost(key, before)
	}
	return before, changed, nil
}

// snapshotChanges are the r events of a chunk of rows read of table,
// corrected by what the outbox holds (f, read through every decision made
// after the rows were read).
func snapshotChanges(table changelog.Table, rows []scanned, f *firsts) ([]changelog.Change, error) {
	var out []changelog.Change
	closed, _ := changelog.Lookup(changelog.ClosedWindows)
	for _, r := range rows {
		img := r.Raw
		if table.Append {
			if f.gtrids[r.Checkpoint] {
				continue // written since the enabling: its c event follows
			}
		} else {
			b, changed, err := f.first(r.Key)
			if err != nil {
				return nil, err
			}
			if changed {
				if b == nil {
					continue // created since the enabling: its c event follows
				}
				img = b
			}
		}
		out = append(out, changelog.Change{Table: table.ID, Op: changelog.OpRead, After: img})
		if table.ID == changelog.TWindows {
			sealed, err := changelog.Sealed(img)
			if err != nil {
				return nil, err
			}
			if sealed {
				out = append(out, changelog.Change{Table: closed.ID, Op: changelog.OpRead, After: img})
			}
		}
	}
	return out, nil
}

// scanChunk reads up to limit rows of sp's table on sp's server after
// sp.After, in key order, and returns them with the key of the last.
func scanChunk(ctx context.Context, s Tables, sp SnapshotPos, limit int) ([]scanned, *RowKey, error) {
	var out []scanned
	var last *RowKey
	t, _ := changelog.Lookup(sp.Table)
	var vals []changelog.Value
	add := func(_ string, raw []byte, checkpoint string) error {
		r := scanned{Raw: raw, Checkpoint: checkpoint}
		if !t.Append {
			var err error
			if vals, err = changelog.DecodeRow(t, raw, vals); err != nil {
				return err
			}
			r.Key = string(sortKey(nil, sp.Server, t.ID, vals[0].S, vals[1].S, vals[2].I, t.ID != changelog.TBalances))
		}
		out = append(out, r)
		return nil
	}
	var err error
	switch sp.Table {
	case changelog.AccountBalances:
		var after *driver.BalanceKey
		if sp.After != nil {
			after = &driver.BalanceKey{Account: sp.After.Account, Currency: sp.After.Currency}
		}
		rows, e := s.ScanBalances(ctx, after, limit)
		for _, r := range rows {
			if err = add(sp.Table, changelog.BalanceRow(nil, r), ""); err != nil {
				break
			}
			last = &RowKey{Account: r.Account, Currency: r.Currency}
		}
		err = firstErr(e, err)
	case changelog.BillingWindows, changelog.WindowAdjustments:
		var after *driver.WindowKey
		if sp.After != nil {
			after = &driver.WindowKey{Account: sp.After.Account, Currency: sp.After.Currency, Start: sp.After.Start}
		}
		if sp.Table == changelog.BillingWindows {
			rows, e := s.ScanWindows(ctx, after, limit)
			for _, r := range rows {
				if err = add(sp.Table, changelog.WindowRow(nil, r), ""); err != nil {
					break
				}
				last = &RowKey{Account: r.Account, Currency: r.Currency, Start: r.Start}
			}
			err = firstErr(e, err)
		} else {
			rows, e := s.ScanAdjustments(ctx, after, limit)
			for _, r := range rows {
				if err = add(sp.Table, changelog.AdjustmentRow(nil, r), ""); err != nil {
					break
				}
				last = &RowKey{Account: r.Account, Currency: r.Currency, Start: r.Start}
			}
			err = firstErr(e, err)
		}
	case changelog.LedgerEntries:
		var after *driver.EntryKey
		if sp.After != nil {
			after = &driver.EntryKey{Topic: sp.After.Topic, Partition: sp.After.Partition, Offset: sp.After.Offset, Kind: sp.After.Entry}
		}
		rows, e := s.ScanEntries(ctx, after, limit)
		for _, r := range rows {
			if err = add(sp.Table, changelog.EntryRow(nil, r), r.Checkpoint); err != nil {
				break
			}
			last = &RowKey{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Entry: r.Kind}
		}
		err = firstErr(e, err)
	default:
		err = fmt.Errorf("publisher: no snapshot of table %q", sp.Table)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("publisher: snapshot of %s on server %d: %w", sp.Table, sp.Server, err)
	}
	return out, last, nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// snapshot publishes the snapshot of an existing ledger from pos, a chunk
// of rows per Kafka transaction, and returns the position once Kafka holds
// it in whole (the changes from the enabling on follow). renew keeps the
// lease: a chunk (the outbox read from the enabling, the wait for the
// decisions to apply, the transaction) can take longer than the lease, so
// it is called throughout (keepLease), and the work stops once the lease
// is lost.
func (p *Publisher) snapshot(ctx context.Context, cl *kgo.Client, enc *changelog.Encoder, pos Progress, renew func() error) (_ Progress, err error) {
	if err := validSnapshot(*pos.Snapshot, len(p.servers)); err != nil {
		return pos, err
	}
	ctx, stop := p.keepLease(ctx, renew)
	defer func() { err = stop(err) }()
	// Every checkpoint before the enabling applied: the rows read hold
	// them all.
	if _, err := settled(ctx, p.control, pos.From-1, p.cfg.Waits); err != nil {
		return pos, err
	}
	limit := max(1, min(p.cfg.MaxEvents/2, 10_000)) // a sealed window is two events
	f := newFirsts(pos.From, p.cfg.SnapshotIndexBytes)
	for pos.Snapshot != nil {
		changes, nextSnap, err := p.snapshotChunk(ctx, f, *pos.Snapshot, limit)
		if err != nil {
			return pos, err
		}
		next := pos
		next.Snapshot = nextSnap
		src := changelog.Source{Version: p.cfg.Version, Name: p.cfg.Prefix, Ledger: p.cfg.Ledger,
			CommitSeq: pos.Seq, TsMs: p.cfg.Now().UnixMilli(), Snapshot: "true"}
		if err := p.transaction(ctx, cl, next, func(produce func(*kgo.Record)) error {
			for _, c := range changes {
				r, err := p.record(enc, c, src)
				if err != nil {
					return err
				}
				produce(r)
			}
			return nil
		}); err != nil {
			return pos, err
		}
		p.published.Add(1)
		if err := p.cfg.Failpoints.Inject(FailAfterKafka); err != nil {
			return pos, err
		}
		if next.Snapshot == nil {
			if err := p.control.SkipChangelogSnapshot(ctx, pos.From); err != nil {
				return pos, err
			}
		}
		if err := p.cfg.Failpoints.Inject(FailAfterBookkeep); err != nil {
			return pos, err
		}
		pos = next
	}
	p.log.Info("the snapshot of the ledger's rows is published", "as_of", pos.Seq, "outbox_reads", f.reads)
	return pos, nil
}

// snapshotChunk reads the chunk of up to limit rows at sp and returns its
// r events, corrected by f (read on through every decision that can have
// written a row read), and where the snapshot goes next.
func (p *Publisher) snapshotChunk(ctx context.Context, f *firsts, sp SnapshotPos, limit int) ([]changelog.Change, *SnapshotPos, error) {
	table, _ := changelog.Lookup(sp.Table)
	rows, last, err := scanChunk(ctx, p.servers[sp.Server], sp, limit)
	if err != nil {
		return nil, nil, err
	}
	// Every decision that can have written a row read is made by now;
	// once applied, the outbox holds each of their changes.
	cp, err := p.control.CommitPosition(ctx)
	if err != nil {
		return nil, nil, err
	}
	if _, err := settled(ctx, p.control, cp.Decided, p.cfg.Waits); err != nil {
		return nil, nil, err
	}
	f.at, f.pin, f.shedAt = posKey(sp), posKey(sp), f.limit
	if n := len(rows); n > 0 && !table.Append {
		f.pin = rows[n-1].Key
	}
	if !table.Append && !f.covers(f.pin) {
		f.reset()
		p.log.Info("the snapshot reads the outbox again from the enabling: the keys changed since, ahead of the scan, exceed CHANGELOG_SNAPSHOT_INDEX_BYTES",
			"server", sp.Server, "table", sp.Table, "reads", f.reads+1)
	}
	if err := p.readFirsts(ctx, f, cp.Decided); err != nil {
		return nil, nil, err
	}
	changes, err := snapshotChanges(table, rows, f)
	if err != nil {
		return nil, nil, err
	}
	if len(rows) < limit {
		return changes, nextTable(sp, len(p.servers)), nil
	}
	return changes, &SnapshotPos{Server: sp.Server, Table: sp.Table, After: last}, nil
}

// keepLease calls renew (which renews the lease every third of its term)
// every sixth of the term from a goroutine of its own, until stop; a
// failed renewal cancels the returned context, and stop then returns that
// failure instead of the error the work ended with.
func (p *Publisher) keepLease(ctx context.Context, renew func() error) (context.Context, func(error) error) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(max(p.cfg.Lease/6, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := renew(); err != nil {
					cancel(err)
					return
				}
			}
		}
	}()
	return ctx, func(err error) error {
		cause := context.Cause(ctx)
		cancel(nil)
		<-done
		if err != nil && cause != nil {
			return cause
		}
		return err
	}
}

// readFirsts reads into f the outbox of every server through commit_seq
// through (every decision up to it applied), in commit order.
func (p *Publisher) readFirsts(ctx context.Context, f *firsts, through int64) error {
	if f.through == f.from-1 && f.through < through {
		f.reads++
	}
	for f.through < through {
		from := f.through + 1
		recs, err := p.control.Commits(ctx, from, false, int(min(int64(p.cfg.Batch), through-f.through)))
		if err != nil {
			return err
		}
		if len(recs) == 0 || recs[0].Seq != from {
			return fmt.Errorf("%w: wanted %d", ErrCommitLogPruned, from)
		}
		order := map[string]int{}
		var gtrids []string
		upTo := f.through
		for _, r := range recs {
			if r.Seq > through {
				break
			}
			order[r.Gtrid] = len(gtrids)
			gtrids = append(gtrids, r.Gtrid)
			upTo = r.Seq
		}
		for s, o := range p.servers {
			idx, err := o.OutboxIndex(ctx, gtrids)
			if err != nil {
				return err
			}
			slices.SortStableFunc(idx, func(a, b driver.OutboxChunk) int { return order[a.Checkpoint] - order[b.Checkpoint] })
			add := func(c changelog.Change) error { return f.add(s, c) }
			for _, c := range idx {
				if err := p.eachChange(ctx, s, c, add); err != nil {
					return err
				}
			}
		}
		for _, g := range gtrids {
			f.gtrids[g] = true
		}
		f.through = upTo
	}
	return nil
}
