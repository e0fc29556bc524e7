package pipeline

import (
	"testing"

	"github.com/billing/ledger/internal/txsink/driver"
)

// What run does after each attempt of one snapshot, from the attempt's
// outcome and what the attempts before it did: the whole retry ladder, as
// a table.
func TestLadder(t *testing.T) {
	failed := func(code driver.Code) attemptOutcome { return attemptOutcome{failed: true, code: code} }
	data := attemptOutcome{failed: true, code: driver.Data, refused: true}
	overflow := attemptOutcome{failed: true, code: driver.Overflow, refused: true}
	moved := attemptOutcome{failed: true, moved: true}
	oversized := attemptOutcome{failed: true, refused: true, oversized: true}
	for _, c := range []struct {
		name     string
		attempts []attemptOutcome
		want     []move
	}{
		{"committed", []attemptOutcome{{}}, []move{moveReport}},
		{"a transient failure is replayed by the source", []attemptOutcome{failed(driver.Transient)}, []move{moveReport}},
		{"run's context ended", []attemptOutcome{{failed: true, stopped: true, code: driver.Data, refused: true}}, []move{moveReport}},
		{"the frontier moved: retried at once, three times", []attemptOutcome{moved, moved, moved, moved}, []move{moveRetry, moveRetry, moveRetry, moveReport}},
		{"an overflow: careful once, then data", []attemptOutcome{overflow, overflow, overflow, overflow},
			[]move{moveRetry, moveRetry, moveIsolate, moveReport}},
		{"too large: the limits reread once", []attemptOutcome{failed(driver.TooLarge), failed(driver.TooLarge)}, []move{moveRefresh, moveReport}},
		{"a write that lost its connection: the limits reread once (MariaDB's answer to a limit that fell)",
			[]attemptOutcome{{failed: true, code: driver.Transient, lostInWrite: true}, {failed: true, code: driver.Transient, lostInWrite: true}},
			[]move{moveRefresh, moveReport}},
		{"a row created since it was read absent: retried at once, three times",
			[]attemptOutcome{{failed: true, code: driver.Duplicate, raced: true}, {failed: true, code: driver.Duplicate, raced: true},
				{failed: true, code: driver.Duplicate, raced: true}, {failed: true, code: driver.Duplicate, raced: true}},
			[]move{moveRetry, moveRetry, moveRetry, moveReport}},
		{"refused data: retried once, then isolated, once", []attemptOutcome{data, data, data}, []move{moveRetry, moveIsolate, moveReport}},
		{"an oversized row is isolated like refused data", []attemptOutcome{oversized, oversized}, []move{moveRetry, moveIsolate}},
		{"each rung once, whatever the order", []attemptOutcome{failed(driver.TooLarge), overflow, moved, data, failed(driver.TooLarge), data},
			[]move{moveRefresh, moveRetry, moveRetry, moveRetry, moveReport, moveIsolate}},
	} {
		var l ladder
		var got []move
		for _, o := range c.attempts {
			var m move
			m, l = l.next(o)
			got = append(got, m)
		}
		if len(got) != len(c.want) {
			t.Fatalf("%s: %v, want %v", c.name, got, c.want)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%s: moves %v, want %v", c.name, got, c.want)
				break
			}
		}
	}
	// The careful mode sticks once taken: later attempts run careful.
	l, _ := ladder{}, move(0)
	_, l = l.next(overflow)
	if !l.careful {
		t.Error("an overflow did not make the next attempts careful")
	}
	// Rows created for nothing: retried at once, each time without
	// creating any key an earlier attempt created for nothing.
	k1, k2 := lockKey{0, 1, windowKey{"a", "EUR", 3600}}, lockKey{1, 0, windowKey{"b", "EUR", 0}}
	l = ladder{}
	for i, keys := range [][]lockKey{{k1}, {k2}} {
		var m move
		if m, l = l.next(attemptOutcome{failed: true, uncounted: keys}); m != moveRetry {
			t.Errorf("attempt %d created rows for nothing: %v, want a retry", i, m)
		}
	}
	if len(l.uncreated) != 2 || l.uncreated[0] != k1 || l.uncreated[1] != k2 {
		t.Errorf("keys not to create %v, want %v and %v", l.uncreated, k1, k2)
	}
	// Isolation's empty case: nothing found, the checkpoint fails.
	if afterIsolation(0) != moveReport || afterIsolation(2) != moveRetry {
		t.Error("after an isolation: nothing found must fail the checkpoint, records found retry the rest")
	}
}
