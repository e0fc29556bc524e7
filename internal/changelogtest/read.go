package changelogtest

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Consume reads every topic of the changelog of prefix read_committed from
// its start to its last stable offset (as it is when Consume starts) and
// checks it (Checker). opts are the brokers' connection options.
func Consume(ctx context.Context, opts []kgo.Opt, prefix string) (*Checker, error) {
	topics := map[string]string{}
	var names []string
	for _, tb := range changelog.Tables() {
		topics[prefix+"."+tb.Name] = tb.Name
		names = append(names, prefix+"."+tb.Name)
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), opts...), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Control records (transaction markers) are read too, so that the
		// end is seen whatever the last transaction on a partition did.
		kgo.KeepControlRecords(),
		kgo.ConsumeTopics(names...), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, names...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("the topics' ends: %w", err)
	}
	want := map[string]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			want[fmt.Sprintf("%s/%d", o.Topic, o.Partition)] = o.Offset
		}
	})
	c := NewChecker()
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return c, fmt.Errorf("consuming: %w; partitions not read to their end: %v", ctx.Err(), want)
		}
		var rerr error
		fs.EachError(func(topic string, p int32, err error) { rerr = fmt.Errorf("%s/%d: %w", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			if rerr != nil {
				return
			}
			if !r.Attrs.IsControl() {
				if err := c.Record(topics[r.Topic], r.Partition, r.Key, r.Value); err != nil {
					rerr = fmt.Errorf("%s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
					return
				}
			}
			if p := fmt.Sprintf("%s/%d", r.Topic, r.Partition); r.Offset+1 >= want[p] {
				delete(want, p)
			}
		})
		if rerr != nil {
			return c, rerr
		}
	}
	return c, nil
}

// Scanner reads a server's tables in primary key order (driver.Store's
// scans).
type Scanner interface {
	ScanBalances(ctx context.Context, after *driver.BalanceKey, limit int) ([]driver.BalanceRow, error)
	ScanWindows(ctx context.Context, after *driver.WindowKey, limit int) ([]driver.WindowRow, error)
	ScanAdjustments(ctx context.Context, after *driver.WindowKey, limit int) ([]driver.AdjustmentRow, error)
	ScanEntries(ctx context.Context, after *driver.EntryKey, limit int) ([]driver.EntryRow, error)
}

// TableRows reads every row of the servers' tables as the changelog has
// them (Canonical forms by table): closed_windows are the sealed
// billing_windows rows.
func TableRows(ctx context.Context, servers []Scanner) (map[string][]string, error) {
	out := map[string][]string{}
	add := func(table string, raw []byte) error {
		tb, _ := changelog.Lookup(table)
		r, err := changelog.RowOf(tb, raw)
		if err != nil {
			return err
		}
		c, err := changelog.Canonical(tb, r)
		out[table] = append(out[table], c)
		return err
	}
	const chunk = 1000
	for _, s := range servers {
		for after := (*driver.BalanceKey)(nil); ; {
			rows, err := s.ScanBalances(ctx, after, chunk)
			if err != nil {
				return nil, err
			}
			for _, r := range rows {
				if err := add(changelog.AccountBalances, changelog.BalanceRow(nil, r)); err != nil {
					return nil, err
				}
			}
			if len(rows) < chunk {
				break
			}
			after = &rows[len(rows)-1].BalanceKey
		}
		for after := (*driver.WindowKey)(nil); ; {
			rows, err := s.ScanWindows(ctx, after, chunk)
			if err != nil {
				return nil, err
			}
			for _, r := range rows {
				if err := add(changelog.BillingWindows, changelog.WindowRow(nil, r)); err != nil {
					return nil, err
				}
				if !r.ClosedAt.IsZero() {
					if err := add(changelog.ClosedWindows, changelog.WindowRow(nil, r)); err != nil {
						return nil, err
					}
				}
			}
			if len(rows) < chunk {
				break
			}
			after = &rows[len(rows)-1].WindowKey
		}
		for after := (*driver.WindowKey)(nil); ; {
			rows, err := s.ScanAdjustments(ctx, after, chunk)
			if err != nil {
				return nil, err
			}
			for _, r := range rows {
				if err := add(changelog.WindowAdjustments, changelog.AdjustmentRow(nil, r)); err != nil {
					return nil, err
				}
			}
			if len(rows) < chunk {
				break
			}
			after = &rows[len(rows)-1].WindowKey
		}
		for after := (*driver.EntryKey)(nil); ; {
			rows, err := s.ScanEntries(ctx, after, chunk)
			if err != nil {
				return nil, err
			}
			for _, r := range rows {
				if err := add(changelog.LedgerEntries, changelog.EntryRow(nil, r)); err != nil {
					return nil, err
				}
			}
			if len(rows) < chunk {
				break
			}
			last := rows[len(rows)-1]
			after = &driver.EntryKey{Topic: last.Topic, Partition: last.Partition, Offset: last.Offset, Kind: last.Kind}
		}
	}
	return out, nil
}
