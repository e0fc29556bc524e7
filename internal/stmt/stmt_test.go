package stmt

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/stmt/stmttest"
)

// Every range Split yields respects both bounds, the ranges cover every row
// once and in order, for row sizes from tiny to nearly the whole budget.
func TestSplitBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		n := r.IntN(5000)
		budget := 1024 + r.IntN(1<<20)
		fixed := r.IntN(200)
		sizes := make([]int, n)
		for i := range sizes {
			switch r.IntN(3) {
			case 0:
				sizes[i] = 1 + r.IntN(40)
			case 1:
				sizes[i] = 1 + r.IntN(budget/8)
			default:
				sizes[i] = 1 + r.IntN(budget-fixed)
			}
		}
		next := 0
		err := Split(n, fixed, budget, func(i int) int { return sizes[i] }, func(start, end int) error {
			if start != next || end <= start {
				t.Fatalf("trial %d: range [%d,%d) after %d", trial, start, end, next)
			}
			if end-start > MaxRows {
				t.Fatalf("trial %d: %d rows", trial, end-start)
			}
			total := fixed
			for i := start; i < end; i++ {
				total += sizes[i]
			}
			if total > budget {
				t.Fatalf("trial %d: range [%d,%d) is %d bytes, budget %d", trial, start, end, total, budget)
			}
			next = end
			return nil
		})
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if next != n {
			t.Fatalf("trial %d: covered %d of %d rows", trial, next, n)
		}
	}
}

// Small rows fill statements up to MaxRows: the bound in bytes does not
// cost round trips when rows are small.
func TestSplitFillsToMaxRows(t *testing.T) {
	var got []int
	_ = Split(2500, 100, 1<<20, func(int) int { return 50 }, func(start, end int) error {
		got = append(got, end-start)
		return nil
	})
	if len(got) != 3 || got[0] != MaxRows || got[1] != MaxRows || got[2] != 500 {
		t.Errorf("statement sizes = %v", got)
	}
}

func TestSplitRowTooLarge(t *testing.T) {
	err := Split(3, 10, 100, func(i int) int { return []int{5, 91, 5}[i] }, func(int, int) error { return nil })
	var tl *TooLargeError
	if !errors.As(err, &tl) || tl.Row != 1 || tl.Bytes != 101 {
		t.Errorf("err = %v", err)
	}
}

func TestSplitStopsAtError(t *testing.T) {
	boom := errors.New("boom")
	calls := 0
	err := Split(3000, 0, 1<<20, func(int) int { return 1 }, func(int, int) error {
		calls++
		return boom
	})
	if !errors.Is(err, boom) || calls != 1 {
		t.Errorf("err = %v after %d calls", err, calls)
	}
}

// ArgBytes bounds what the driver's interpolation can make of an argument:
// every byte escaped, quotes and an introducer around it.
func TestArgBytesIsAnUpperBound(t *testing.T) {
	worst := strings.Repeat("'\\\x00\n", 100)
	for _, v := range []any{worst, []byte(worst), nil, int64(-9223372036854775808), uint64(18446744073709551615),
		time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC), true, int32(-2147483648)} {
		if n := stmttest.Arg(v); ArgBytes(v) < n+1 {
			t.Errorf("ArgBytes(%T) = %d, rendering is %d bytes", v, ArgBytes(v), n)
		}
	}
}

// FitText is the exact inverse of TextBytes: a value cut to FitText(room)
// fits room, and one byte more would not (once room holds an empty value),
// for every room from nothing to 1 GiB.
func TestFitTextInvertsTextBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	check := func(room int) {
		n := FitText(room)
		if n < 0 || (room >= TextBytes(0) && TextBytes(n) > room) {
			t.Fatalf("FitText(%d) = %d, whose text takes %d", room, n, TextBytes(n))
		}
		if room >= TextBytes(0) && TextBytes(n+1) <= room {
			t.Fatalf("FitText(%d) = %d, but %d bytes fit too", room, n, n+1)
		}
	}
	for n := range 1000 {
		if ArgBytes(make([]byte, n)) != TextBytes(n) || ArgBytes(strings.Repeat("x", n)) != TextBytes(n) {
			t.Fatalf("ArgBytes of %d bytes = %d, TextBytes = %d", n, ArgBytes(make([]byte, n)), TextBytes(n))
		}
	}
	for room := -10; room < 100_000; room++ {
		check(room)
	}
	for range 10_000 {
		check(r.IntN(1 << 30))
	}
}

// A row that takes at most Room never makes Split fail, and one byte more
// alone is refused: Room is what Split allows.
func TestRoomIsWhatSplitAllows(t *testing.T) {
	const head, tail = "INSERT INTO t (a) VALUES ", " ON DUPLICATE KEY UPDATE a = a"
	for _, budget := range []int{MinPacket / 2, 1 << 20, 32 << 20} {
		room := Room(budget, head, tail)
		if err := Split(1, Fixed(head, tail), budget, func(int) int { return room }, func(int, int) error { return nil }); err != nil {
			t.Errorf("budget %d: a row of Room = %d bytes: %v", budget, room, err)
		}
		var tl *TooLargeError
		if err := Split(1, Fixed(head, tail), budget, func(int) int { return room + 1 }, func(int, int) error { return nil }); !errors.As(err, &tl) {
			t.Errorf("budget %d: a row of Room+1 bytes: %v, want a TooLargeError", budget, err)
		}
	}
}
