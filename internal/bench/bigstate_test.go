package bench

import (
	"strings"
	"testing"
)

// The counters are read by name from SHOW GLOBAL STATUS; a missing one is
// an error, not a zero that would report no IO.
func TestParseInnoDBStatus(t *testing.T) {
	rows := map[string]string{
		"Innodb_buffer_pool_reads": "7", "Innodb_buffer_pool_read_requests": "100", "Innodb_buffer_pool_read_ahead": "3",
		"Innodb_data_reads": "11", "Innodb_data_writes": "13", "Innodb_pages_written": "17", "Innodb_log_writes": "19",
	}
	got, err := parseInnoDBStatus(rows)
	if err != nil {
		t.Fatal(err)
	}
	want := innodbIO{PoolReads: 7, ReadRequests: 100, ReadAhead: 3, DataReads: 11, DataWrites: 13, PagesWritten: 17, LogWrites: 19}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	delete(rows, "Innodb_pages_written")
	if _, err := parseInnoDBStatus(rows); err == nil || !strings.Contains(err.Error(), "Innodb_pages_written") {
		t.Fatalf("missing counter: %v", err)
	}
	rows["Innodb_pages_written"] = "x"
	if _, err := parseInnoDBStatus(rows); err == nil {
		t.Fatal("a counter that is not a number was accepted")
	}
}

// Reads per event are the counters' difference over the catch-up divided
// by its events, for every counter.
func TestIOPerEvent(t *testing.T) {
	before := innodbIO{PoolReads: 1000, ReadRequests: 50_000, ReadAhead: 5, DataReads: 1010, DataWrites: 300, PagesWritten: 900, LogWrites: 40}
	after := innodbIO{PoolReads: 251_000, ReadRequests: 10_050_000, ReadAhead: 9, DataReads: 261_010, DataWrites: 50_300, PagesWritten: 200_900, LogWrites: 90}
	d := after.sub(before)
	if d != (innodbIO{PoolReads: 250_000, ReadRequests: 10_000_000, ReadAhead: 4, DataReads: 260_000, DataWrites: 50_000, PagesWritten: 200_000, LogWrites: 50}) {
		t.Fatalf("difference %+v", d)
	}
	if got := perEvent(d.PoolReads, 500_000); got != 0.5 {
		t.Fatalf("reads per event %v, want 0.5", got)
	}
	if got := perEvent(d.PoolReads, 0); got != 0 {
		t.Fatalf("no events: %v", got)
	}
	line := ioLine(d, 500_000)
	for _, want := range []string{"0.500 pool reads (disk)", "20.0 read requests", "0.520 data reads", "0.100 data writes", "0.400 pages written", "(500000 events)"} {
		if !strings.Contains(line, want) {
			t.Errorf("%q lacks %q", line, want)
		}
	}
}

// The state line gives the table's size over the pool, bytes on disk per
// key, and says when the table is not the 10 × the pool the variant needs.
func TestStateLine(t *testing.T) {
	st := stateInfo{Pool: 32 << 20,
		Before: stateSize{Rows: 4_000_000, DataIndex: 480 << 20, File: 500 << 20},
		After:  stateSize{Rows: 4_500_000, DataIndex: 560 << 20, File: 4_500_000 * 130}}
	line := stateLine(st, 0.42)
	for _, want := range []string{"480 MiB (data+index", "= 15.0 × the 32 MiB buffer pool before", "130 bytes on disk per key", "= 17.5 × after", "service ÷ default's service 0.42"} {
		if !strings.Contains(line, want) {
			t.Errorf("%q lacks %q", line, want)
		}
	}
	if strings.Contains(line, "BELOW") {
		t.Errorf("15 × flagged as below 10 ×: %q", line)
	}
	st.Before.DataIndex = 300 << 20 // 9.4 ×
	if line := stateLine(st, 0); !strings.Contains(line, "BELOW the 10 ×") || strings.Contains(line, "default's") {
		t.Errorf("9.4 × not flagged, or a ratio without a default: %q", line)
	}
}

func TestResizeDone(t *testing.T) {
	for status, done := range map[string]bool{
		"": true, "Completed resizing buffer pool at 241201 18:00:00.": true, // MariaDB idle; MySQL done
		"Resizing buffer pool from 268435456 to 33554432 (unit=134217728).": false,
		"Withdrawing blocks to be shrunken.":                                false,
	} {
		if got := resizeDone(status); got != done {
			t.Errorf("resizeDone(%q) = %v", status, got)
		}
	}
}

// The table's notes give every row's IO per event and, for the
// larger-than-memory service, its state and its rate over the default
// variant's service of the same repetition.
func TestRenderTableIOAndState(t *testing.T) {
	o := &options{Config: Config{NaiveBatch: 1, SinkChunk: 1}}
	io := &innodbIO{PoolReads: 300, ReadRequests: 4000}
	st := &stateInfo{Pool: 32 << 20, Before: stateSize{Rows: 10, DataIndex: 400 << 20, File: 1000}, After: stateSize{Rows: 10, DataIndex: 400 << 20, File: 1000}}
	row := func(v, mode string, rate float64, io *innodbIO, st *stateInfo) measurement {
		return measurement{Variant: v, Mode: mode, Rep: 1, State: st, Result: childResult{Records: 1000, CatchUpS: 1, IO: io, CatchUp: unitStats{Rate: rate}}}
	}
	ms := []measurement{
		row("default", modeService, 100_000, nil, nil),
		row("larger-than-memory", modeNaive, 80_000, io, nil),
		row("larger-than-memory", modeService, 40_000, io, st),
	}
	out := renderTable(o, []variantInfo{{Name: "default"}, {Name: "larger-than-memory"}}, ms)
	for _, want := range []string{
		"larger-than-memory naive: InnoDB during the catch-up, 0.300 pool reads (disk), 4.0 read requests",
		"larger-than-memory service: InnoDB during the catch-up, 0.300 pool reads",
		"larger-than-memory service: dedup tables 400 MiB", "12.5 × the 32 MiB buffer pool", "service ÷ default's service 0.40",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "default service: InnoDB") {
		t.Errorf("a row without counters reported IO:\n%s", out)
	}
}
