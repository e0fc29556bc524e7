package publisher

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/txsink/driver"
)

// The snapshot of an existing ledger (issue 20 item 4, docs/changelog.md
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

// scanned is one row a snapshot chunk read: its binary row, its record
// key and, for a ledger entry, the checkpoint that wrote it.
type scanned struct {
	Raw        []byte
	Key        string
	Checkpoint string
}

// firsts is what the outbox holds of one table of one server since the
// enabling: each changed key's first before-image (nil: created since),
// and the checkpoints it read (through a commit_seq). Keys the scan has
// passed (up to after) are not kept: their r events are out. So it holds
// at most the keys ahead of the scan that the checkpoints since the
// enabling changed, themselves bounded by CHANGELOG_MAX_BACKLOG.
type firsts struct {
	table   changelog.Table
	before  map[string][]byte
	gtrids  map[string]bool
	through int64
	after   *RowKey
	vals    []changelog.Value
}

func newFirsts(table string, from int64) *firsts {
	t, _ := changelog.Lookup(table)
	return &firsts{table: t, before: map[string][]byte{}, gtrids: map[string]bool{}, through: from - 1}
}

// add records a change read from the outbox, in commit order: only a
// key's first change counts.
func (f *firsts) add(c changelog.Change) error {
	if c.Table != f.table.ID || f.table.Append {
		return nil
	}
	if behind, err := f.passed(c.After); err != nil || behind {
		return err
	}
	key, err := changelog.RawKey(f.table, c.After)
	if err != nil {
		return err
	}
	if _, ok := f.before[key]; !ok {
		var b []byte
		if c.Before != nil {
			b = append([]byte{}, c.Before...) // c aliases the outbox row
		}
		f.before[key] = b
	}
	return nil
}

// passed says whether the scan has passed the key of raw, a row of the
// table: in the tables' primary-key order, bytewise (VARBINARY account
// ids, ascii_bin currencies), then window_start.
func (f *firsts) passed(raw []byte) (bool, error) {
	if f.after == nil {
		return false, nil
	}
	var err error
	if f.vals, err = changelog.DecodeRow(f.table, raw, f.vals); err != nil {
		return false, err
	}
	c := cmp.Or(strings.Compare(string(f.vals[0].S), f.after.Account), strings.Compare(string(f.vals[1].S), f.after.Currency))
	if c == 0 && f.table.ID != changelog.TBalances {
		c = cmp.Compare(f.vals[2].I, f.after.Start.UnixMicro())
	}
	return c <= 0, nil
}

// snapshotChanges are the r events of a chunk of rows read, corrected by
// what the outbox holds (f, read through every decision made after the
// rows were read). A key looked up is forgotten: the scan reads it once.
func snapshotChanges(rows []scanned, f *firsts) ([]changelog.Change, error) {
	var out []changelog.Change
	closed, _ := changelog.Lookup(changelog.ClosedWindows)
	for _, r := range rows {
		img := r.Raw
		if f.table.Append {
			if f.gtrids[r.Checkpoint] {
				continue // written since the enabling: its c event follows
			}
		} else if b, changed := f.before[r.Key]; changed {
			delete(f.before, r.Key)
			if b == nil {
				continue // created since the enabling: its c event follows
			}
			img = b
		}
		out = append(out, changelog.Change{Table: f.table.ID, Op: changelog.OpRead, After: img})
		if f.table.ID == changelog.TWindows {
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
	add := func(table string, raw []byte, checkpoint string) error {
		t, _ := changelog.Lookup(table)
		k, err := changelog.RawKey(t, raw)
		out = append(out, scanned{Raw: raw, Key: k, Checkpoint: checkpoint})
		return err
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
			after = &driver.EntryKey{Topic: sp.After.Topic, Partition: sp.After.Partition, Offset: sp.After.Offset}
		}
		rows, e := s.ScanEntries(ctx, after, limit)
		for _, r := range rows {
			if err = add(sp.Table, changelog.EntryRow(nil, r), r.Checkpoint); err != nil {
				break
			}
			last = &RowKey{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset}
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
// lease.
func (p *Publisher) snapshot(ctx context.Context, cl *kgo.Client, enc *changelog.Encoder, pos Progress, renew func() error) (Progress, error) {
	if err := validSnapshot(*pos.Snapshot, len(p.servers)); err != nil {
		return pos, err
	}
	// Every checkpoint before the enabling applied: the rows read hold
	// them all.
	if _, err := settled(ctx, p.control, pos.From-1, p.cfg.Waits); err != nil {
		return pos, err
	}
	limit := max(1, min(p.cfg.MaxEvents/2, 10_000)) // a sealed window is two events
	var f *firsts
	server := -1
	for pos.Snapshot != nil {
		if err := renew(); err != nil {
			return pos, err
		}
		sp := *pos.Snapshot
		if f == nil || f.table.Name != sp.Table || server != sp.Server {
			f, server = newFirsts(sp.Table, pos.From), sp.Server
		}
		f.after = sp.After
		rows, last, err := scanChunk(ctx, p.servers[sp.Server], sp, limit)
		if err != nil {
			return pos, err
		}
		// Every decision that can have written a row read is made by now;
		// once applied, the outbox holds each of their changes.
		cp, err := p.control.CommitPosition(ctx)
		if err != nil {
			return pos, err
		}
		if _, err := settled(ctx, p.control, cp.Decided, p.cfg.Waits); err != nil {
			return pos, err
		}
		if err := p.readFirsts(ctx, f, sp.Server, cp.Decided); err != nil {
			return pos, err
		}
		changes, err := snapshotChanges(rows, f)
		if err != nil {
			return pos, err
		}
		next := pos
		if len(rows) < limit {
			next.Snapshot = nextTable(sp, len(p.servers))
		} else {
			next.Snapshot = &SnapshotPos{Server: sp.Server, Table: sp.Table, After: last}
		}
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
	p.log.Info("the snapshot of the ledger's rows is published", "as_of", pos.Seq)
	return pos, nil
}

// readFirsts reads into f the outbox of server through commit_seq
// through (every decision up to it applied), in commit order.
func (p *Publisher) readFirsts(ctx context.Context, f *firsts, server int, through int64) error {
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
		for _, r := range recs {
			if r.Seq > through {
				break
			}
			order[r.Gtrid] = len(gtrids)
			gtrids = append(gtrids, r.Gtrid)
			f.through = r.Seq
		}
		idx, err := p.servers[server].OutboxIndex(ctx, gtrids)
		if err != nil {
			return err
		}
		slices.SortStableFunc(idx, func(a, b driver.OutboxChunk) int { return order[a.Checkpoint] - order[b.Checkpoint] })
		for _, c := range idx {
			if err := p.eachChange(ctx, server, c, f.add); err != nil {
				return err
			}
		}
		for _, g := range gtrids {
			f.gtrids[g] = true
		}
	}
	return nil
}
