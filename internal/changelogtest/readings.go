package changelogtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/billing/ledger/internal/changelog"
)

// The readings of the JVM harness's flink-read (integration/jvm).
const (
	// ReadingDebeziumJSON is Flink SQL's debezium-json format over a topic
	// (every topic).
	ReadingDebeziumJSON = "debezium-json"
	// ReadingUpsertKafka is the upsert-kafka connector over a table topic:
	// the record key and the latest value's after.
	ReadingUpsertKafka = "upsert-kafka"
)

// Readings is what flink-read printed: per reading and table the rows
// (Canonical forms, in the order printed), and the chain violations it
// reported.
type Readings struct {
	Rows       map[string]map[string][]string
	Violations []string
}

// ParseReadings parses flink-read's stdout strictly: every line one JSON
// object with "reading" and "table", then either "violation" or exactly the
// table's columns, integers parsed as int64 and timestamps in TimeLayout.
func ParseReadings(out []byte) (*Readings, error) {
	r := &Readings{Rows: map[string]map[string][]string{}}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		if err := r.parseLine(sc.Bytes()); err != nil {
			return nil, fmt.Errorf("flink-read output line %d: %w: %s", n, err, sc.Bytes())
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("flink-read output: %w", err)
	}
	return r, nil
}

func (r *Readings) parseLine(line []byte) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber() // int64 limits survive
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return err
	}
	reading, _ := obj["reading"].(string)
	tableName, _ := obj["table"].(string)
	t, ok := changelog.Lookup(tableName)
	if reading == "" || !ok {
		return fmt.Errorf("no reading or unknown table")
	}
	delete(obj, "reading")
	delete(obj, "table")
	if v, ok := obj["violation"]; ok {
		r.Violations = append(r.Violations, fmt.Sprintf("%s %s: %v", reading, tableName, v))
		return nil
	}
	row := changelog.Row{}
	for _, c := range t.Columns {
		v, ok := obj[c.Name]
		if !ok {
			return fmt.Errorf("column %s missing", c.Name)
		}
		parsed, err := parseValue(c, v)
		if err != nil {
			return fmt.Errorf("column %s: %w", c.Name, err)
		}
		row[c.Name] = parsed
		delete(obj, c.Name)
	}
	if len(obj) > 0 {
		return fmt.Errorf("unknown fields %v", obj)
	}
	canon, err := changelog.Canonical(t, row)
	if err != nil {
		return err
	}
	if r.Rows[reading] == nil {
		r.Rows[reading] = map[string][]string{}
	}
	r.Rows[reading][tableName] = append(r.Rows[reading][tableName], canon)
	return nil
}

func parseValue(c changelog.Column, v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	switch c.Kind {
	case changelog.String:
		if s, ok := v.(string); ok {
			return s, nil
		}
	case changelog.Int:
		if n, ok := v.(json.Number); ok {
			return strconv.ParseInt(n.String(), 10, 64)
		}
	case changelog.Bool:
		if b, ok := v.(bool); ok {
			return b, nil
		}
	case changelog.Time:
		if s, ok := v.(string); ok {
			return time.Parse(changelog.TimeLayout, s)
		}
	}
	return nil, fmt.Errorf("unexpected value %v (%T)", v, v)
}
