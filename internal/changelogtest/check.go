package changelogtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/billing/ledger/internal/changelog"
)

// DecodeEvent decodes a record of a table's topic (its key and its value,
// Debezium's envelope in JSON) as a consumer that is not the service
// would: strictly, integers as int64, instants in TimeLayout. The key must
// be the primary key of the row the event is about.
func DecodeEvent(table string, key, value []byte) (changelog.Event, error) {
	t, ok := changelog.Lookup(table)
	if !ok {
		return changelog.Event{}, fmt.Errorf("no table %q", table)
	}
	var env struct {
		Before, After map[string]any
		Op            string
		TsMs          json.Number `json:"ts_ms"`
		Source        struct {
			Connector, Version, Name, Ledger, Table, Checkpoint, Snapshot string
			CommitSeq                                                     json.Number `json:"commit_seq"`
			TsMs                                                          json.Number `json:"ts_ms"`
		}
	}
	d := json.NewDecoder(bytes.NewReader(value))
	d.UseNumber()
	d.DisallowUnknownFields()
	if err := d.Decode(&env); err != nil {
		return changelog.Event{}, fmt.Errorf("%s: %w: %s", table, err, value)
	}
	ev := changelog.Event{Table: table, Op: changelog.Op(env.Op)}
	var err error
	if ev.TsMs, err = env.TsMs.Int64(); err != nil {
		return ev, err
	}
	ev.Source = changelog.Source{Version: env.Source.Version, Name: env.Source.Name, Ledger: env.Source.Ledger,
		Checkpoint: env.Source.Checkpoint, Snapshot: env.Source.Snapshot}
	if ev.Source.CommitSeq, err = env.Source.CommitSeq.Int64(); err != nil {
		return ev, err
	}
	if ev.Source.TsMs, err = env.Source.TsMs.Int64(); err != nil {
		return ev, err
	}
	if env.Source.Connector != "billing-ledger" {
		return ev, fmt.Errorf("source.connector %q", env.Source.Connector)
	}
	if env.Source.Table != table {
		return ev, fmt.Errorf("source.table %q on the topic of %s", env.Source.Table, table)
	}
	row := func(m map[string]any) (changelog.Row, error) {
		if m == nil {
			return nil, nil
		}
		if len(m) != len(t.Columns) {
			return nil, fmt.Errorf("%s: %d columns, want %d", table, len(m), len(t.Columns))
		}
		r := changelog.Row{}
		for _, c := range t.Columns {
			v, ok := m[c.Name]
			if !ok {
				return nil, fmt.Errorf("%s: no column %s", table, c.Name)
			}
			if r[c.Name], err = parseValue(c, v); err != nil {
				return nil, fmt.Errorf("%s.%s: %w", table, c.Name, err)
			}
		}
		return r, nil
	}
	if ev.Before, err = row(env.Before); err != nil {
		return ev, err
	}
	if ev.After, err = row(env.After); err != nil {
		return ev, err
	}
	k, _, err := changelog.Encode(ev)
	if err != nil {
		return ev, err
	}
	if string(k) != string(key) {
		return ev, fmt.Errorf("%s: record key %s, the row's is %s", table, key, k)
	}
	return ev, nil
}

// Checker is the consumer's check of the changelog: the records of each
// topic's partitions, applied in partition order, to a Model (each key's
// chain unbroken: one key is on one partition); append-only topics hold
// each key once; commit_seq never goes down along a partition.
type Checker struct {
	Model   *Model
	Events  int
	seen    map[string]bool // append-only: table and key
	lastSeq map[string]int64
}

// NewChecker returns a checker that has read nothing.
func NewChecker() *Checker {
	return &Checker{Model: NewModel(), seen: map[string]bool{}, lastSeq: map[string]int64{}}
}

// Record checks and applies one committed record of table's topic, read
// from partition in order.
func (c *Checker) Record(table string, partition int32, key, value []byte) error {
	ev, err := DecodeEvent(table, key, value)
	if err != nil {
		return err
	}
	p := fmt.Sprintf("%s/%d", table, partition)
	if ev.Source.CommitSeq < c.lastSeq[p] {
		return fmt.Errorf("%s: commit_seq %d after %d", p, ev.Source.CommitSeq, c.lastSeq[p])
	}
	c.lastSeq[p] = ev.Source.CommitSeq
	if t, _ := changelog.Lookup(table); t.Append {
		k := table + " " + string(key)
		if c.seen[k] {
			return fmt.Errorf("%s: key %s twice", table, key)
		}
		c.seen[k] = true
	}
	c.Events++
	return c.Model.Apply(ev)
}

// Compare compares what the consumer holds with the tables' rows
// (Canonical forms by table, of every table the changelog has: the last
// after of every key, every append-only row); nil when they are equal.
func (c *Checker) Compare(rows map[string][]string) error {
	var out []string
	for _, t := range changelog.Tables() {
		if d := Diff(rows[t.Name], c.Model.Canonical(t.Name), 5); d != nil {
			out = append(out, t.Name+":\n"+strings.Join(d, "\n"))
		}
	}
	if out != nil {
		return fmt.Errorf("the changelog ends elsewhere than the tables:\n%s", strings.Join(out, "\n"))
	}
	return nil
}
