package placement_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/billing/ledger/internal/placement"
)

// The slot placement a modulo placement converts to puts every hash on the
// server the modulo placement does: a ledger moves to slots without moving
// a row.
func TestSlottedPlacesAsModulo(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 12; n++ {
		m, err := placement.Modulo(n)
		if err != nil {
			t.Fatal(err)
		}
		s := m.Slotted()
		if s.Slots() != n*placement.SlotsPerServer {
			t.Fatalf("%d servers: %d slots", n, s.Slots())
		}
		for range 20000 {
			h := r.Uint64()
			if a, b := m.Server(h), s.Server(h); a != b {
				t.Fatalf("%d servers, hash %d: modulo places it on %d, its slots on %d", n, h, a, b)
			}
		}
	}
}

// Route's placement of a key under the modulo placement is the one the
// ledgers before slots used: FNV-1a, then mod n, the branch from the
// quotient.
func TestModuloIsThePlacementBeforeSlots(t *testing.T) {
	m, _ := placement.Modulo(3)
	for _, k := range []string{"acct-42", "e-7f3a", "", "ü"} {
		h := placement.Hash(k)
		if got, want := m.Server(h), int(h%3); got != want {
			t.Errorf("%q: server %d, want %d", k, got, want)
		}
		if got, want := m.Branch(h, 4), int((h/3)%4); got != want {
			t.Errorf("%q: branch %d, want %d", k, got, want)
		}
	}
}

// Growing keeps every server's share even, moves slots only to the new
// servers, no more than the shares need, and keeps every other hash where
// it was; the same growth gives the same moves.
func TestGrowMovesOnlyTheNewServersShare(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, path := range [][]int{{1, 1, 1, 1}, {3, 1}, {2, 3}, {1, 7}, {5, 1, 1, 2}} {
		p, err := placement.Modulo(path[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, add := range path[1:] {
			before := p.Slotted()
			next, moves, err := p.Grow(add)
			if err != nil {
				t.Fatal(err)
			}
			again, moves2, _ := p.Grow(add)
			if !slices.Equal(moves, moves2) || !slices.Equal(again.Owners(), next.Owners()) {
				t.Fatalf("%v: two growths differ", path)
			}
			counts := next.Counts()
			if lo, hi := slices.Min(counts), slices.Max(counts); hi-lo > 1 {
				t.Fatalf("%v: uneven shares %v", path, counts)
			}
			need := 0
			for i := before.Servers(); i < next.Servers(); i++ {
				need += counts[i]
			}
			if len(moves) != need {
				t.Fatalf("%v: %d slots moved, the new servers own %d", path, len(moves), need)
			}
			moved := map[int]placement.Move{}
			for _, m := range moves {
				if m.To < before.Servers() || m.From >= before.Servers() {
					t.Fatalf("%v: move %+v is not from an old server to a new one", path, m)
				}
				moved[m.Slot] = m
			}
			for range 20000 {
				h := r.Uint64()
				m, ok := moved[next.Slot(h)]
				switch {
				case ok && (before.Server(h) != m.From || next.Server(h) != m.To):
					t.Fatalf("%v: hash %d of moved slot %+v: on %d, then %d", path, h, m, before.Server(h), next.Server(h))
				case !ok && before.Server(h) != next.Server(h):
					t.Fatalf("%v: hash %d moved from %d to %d outside the moves", path, h, before.Server(h), next.Server(h))
				}
			}
			p = next
		}
	}
}

func TestFromSlotsRefusesWhatIsNoPlacement(t *testing.T) {
	for _, c := range []struct {
		servers int
		owner   []int
	}{{2, []int{0, 0, 0}}, {2, []int{0, 2}}, {2, []int{0, -1}}, {3, []int{0, 1}}, {0, nil}} {
		if _, err := placement.FromSlots(c.servers, c.owner); err == nil {
			t.Errorf("FromSlots(%d, %v) accepted", c.servers, c.owner)
		}
	}
	p, err := placement.FromSlots(2, []int{1, 0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if p.Server(0) != 1 || p.Server(1) != 0 || p.Server(5) != 1 {
		t.Errorf("FromSlots(2, [1 0 1]) places 0, 1, 5 on %d, %d, %d", p.Server(0), p.Server(1), p.Server(5))
	}
}

// The growth scenarios of testdata/grow.txt: a ledger's placement step by
// step, each server's slots and where the moved ones came from.
func TestGrowScenarios(t *testing.T) {
	var p placement.Placement
	datadriven.RunTest(t, "testdata/grow.txt", func(t *testing.T, d *datadriven.TestData) string {
		arg := func(name string) int {
			var v int
			d.ScanArgs(t, name, &v)
			return v
		}
		switch d.Cmd {
		case "modulo":
			var err error
			if p, err = placement.Modulo(arg("servers")); err != nil {
				return err.Error()
			}
			return describe(p, nil)
		case "grow":
			next, moves, err := p.Grow(arg("add"))
			if err != nil {
				return err.Error()
			}
			p = next
			return describe(p, moves)
		case "shrink":
			next, moves, err := p.ShrinkLast()
			if err != nil {
				return err.Error()
			}
			p = next
			return describe(p, moves)
		case "place":
			var b strings.Builder
			for _, k := range strings.Fields(d.Input) {
				h := placement.Hash(k)
				fmt.Fprintf(&b, "%s: slot %d, server %d\n", k, p.Slot(h), p.Server(h))
			}
			return b.String()
		}
		return "unknown command " + d.Cmd
	})
}

func describe(p placement.Placement, moves []placement.Move) string {
	var b strings.Builder
	fmt.Fprintf(&b, "servers %d, slots %d\n", p.Servers(), p.Slots())
	if p.Slots() > 0 {
		for i, c := range p.Counts() {
			fmt.Fprintf(&b, "server %d: %d slots\n", i, c)
		}
	}
	if len(moves) > 0 {
		flows := map[[2]int]int{}
		for _, m := range moves {
			flows[[2]int{m.From, m.To}]++
		}
		keys := make([][2]int, 0, len(flows))
		for k := range flows {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b [2]int) int { return a[0]*1000 + a[1] - b[0]*1000 - b[1] })
		fmt.Fprintf(&b, "moved %d slots:", len(moves))
		for _, k := range keys {
			b.WriteString(" " + strconv.Itoa(k[0]) + "→" + strconv.Itoa(k[1]) + " " + strconv.Itoa(flows[k]))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Removing the last server moves exactly its slots, each to a server
// left, and leaves the others' slots where they were; shares stay even,
// and a grow then a shrink leaves each old server as many slots as before.
func TestShrinkLastMovesOnlyTheLastServersSlots(t *testing.T) {
	for servers := 2; servers <= 6; servers++ {
		p, err := placement.Modulo(servers - 1)
		if err != nil {
			t.Fatal(err)
		}
		grown, _, err := p.Grow(1)
		if err != nil {
			t.Fatal(err)
		}
		shrunk, moves, err := grown.ShrinkLast()
		if err != nil {
			t.Fatal(err)
		}
		if shrunk.Servers() != servers-1 {
			t.Fatalf("%d servers: shrunk to %d", servers, shrunk.Servers())
		}
		moved := map[int]bool{}
		for _, m := range moves {
			if m.From != servers-1 || m.To >= servers-1 || shrunk.Owners()[m.Slot] != m.To {
				t.Fatalf("%d servers: move %+v", servers, m)
			}
			moved[m.Slot] = true
		}
		before, after := grown.Owners(), shrunk.Owners()
		for s := range before {
			switch {
			case before[s] == servers-1 && !moved[s]:
				t.Fatalf("%d servers: slot %d of the removed server did not move", servers, s)
			case before[s] != servers-1 && after[s] != before[s]:
				t.Fatalf("%d servers: slot %d moved from %d to %d", servers, s, before[s], after[s])
			}
		}
		counts := shrunk.Counts()
		if slices.Max(counts)-slices.Min(counts) > 1 {
			t.Fatalf("%d servers: uneven shares after the shrink %v", servers, counts)
		}
		if !slices.Equal(counts, p.Slotted().Counts()) && servers > 2 {
			// The slotted modulo placement of n servers has n*4096
			// slots; the grown one keeps that count.
			t.Logf("%d servers: counts %v, before the grow %v", servers, counts, p.Slotted().Counts())
		}
	}
	one, err := placement.Modulo(1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := one.ShrinkLast(); err == nil {
		t.Fatal("removed the only server")
	}
}
