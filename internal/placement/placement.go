package placement

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
)

// SlotsPerServer is how many slots each server of a ledger's first
// slotted layout brings: enough that a slot is a small share of a server
// (1/4096), few enough that a layout's slot table stays small (a few
// kilobytes per server).
const SlotsPerServer = 4096

// MaxServers bounds a layout (an ordinal is stored as a 16-bit number).
const MaxServers = 1 << 15

// Hash is the one hash a key is placed by.
func Hash(key string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return h.Sum64()
}

// Placement maps a key's hash to a server ordinal (0 is the control
// server). The zero Placement places nothing; make one with Modulo or
// FromSlots.
type Placement struct {
	servers int
	// owner is the server of each slot; nil: the modulo placement.
	owner []uint16
}

// Modulo is the placement of the ledgers that predate slots: server =
// hash mod servers.
func Modulo(servers int) (Placement, error) {
	if servers < 1 || servers > MaxServers {
		return Placement{}, fmt.Errorf("placement: %d servers (1 to %d)", servers, MaxServers)
	}
	return Placement{servers: servers}, nil
}

// ErrSlots refuses a slot table that is not a placement.
var ErrSlots = errors.New("placement: not a slot table")

// FromSlots is the placement whose slot s belongs to server owner[s], on
// servers servers: every server must own a slot.
func FromSlots(servers int, owner []int) (Placement, error) {
	if servers < 1 || servers > MaxServers || len(owner) < servers {
		return Placement{}, fmt.Errorf("%w: %d slots on %d servers", ErrSlots, len(owner), servers)
	}
	p := Placement{servers: servers, owner: make([]uint16, len(owner))}
	seen := make([]bool, servers)
	for s, o := range owner {
		if o < 0 || o >= servers {
			return Placement{}, fmt.Errorf("%w: slot %d on server %d of %d", ErrSlots, s, o, servers)
		}
		p.owner[s] = uint16(o)
		seen[o] = true
	}
	if i := slices.Index(seen, false); i >= 0 {
		return Placement{}, fmt.Errorf("%w: server %d owns no slot", ErrSlots, i)
	}
	return p, nil
}

// Servers is the number of servers placed over.
func (p Placement) Servers() int { return p.servers }

// Slots is the number of slots (0: the modulo placement).
func (p Placement) Slots() int { return len(p.owner) }

// Server is the ordinal of the server a hash is placed on.
func (p Placement) Server(h uint64) int {
	if p.owner == nil {
		return int(h % uint64(p.servers))
	}
	return int(p.owner[h%uint64(len(p.owner))])
}

// Slot is the slot of a hash (under the modulo placement, the server).
func (p Placement) Slot(h uint64) int {
	if p.owner == nil {
		return int(h % uint64(p.servers))
	}
	return int(h % uint64(len(p.owner)))
}

// Branch spreads the hashes of one server over its branches. Under the
// modulo placement it is the one the ledgers before slots used.
func (p Placement) Branch(h uint64, branches int) int {
	n := uint64(p.servers)
	if p.owner != nil {
		n = uint64(len(p.owner))
	}
	return int((h / n) % uint64(branches))
}

// Owners is the server of each slot (nil under the modulo placement).
func (p Placement) Owners() []int {
	if p.owner == nil {
		return nil
	}
	out := make([]int, len(p.owner))
	for s, o := range p.owner {
		out[s] = int(o)
	}
	return out
}

// Slotted is p as a slot placement that places every hash on the same
// server: p itself when it has slots; for the modulo placement of n
// servers, n·SlotsPerServer slots, slot s on server s mod n (hash mod
// n·k mod n is hash mod n).
func (p Placement) Slotted() Placement {
	if p.owner != nil {
		return p
	}
	owner := make([]uint16, p.servers*SlotsPerServer)
	for s := range owner {
		owner[s] = uint16(s % p.servers)
	}
	return Placement{servers: p.servers, owner: owner}
}

// Counts is how many slots each server owns.
func (p Placement) Counts() []int {
	c := make([]int, p.servers)
	for _, o := range p.Slotted().owner {
		c[o]++
	}
	return c
}

// Move is one slot's change of server.
type Move struct {
	Slot, From, To int
}

// Grow is the placement after adding added servers (ordinals servers,
// servers+1, ...) and the slots it moves to them: each new server takes
// its even share of the slots (every server then owns floor or ceil of
// slots/servers), from the servers that own the most, so that no slot
// moves between two old servers and no more slots move than the shares
// need. The choice is deterministic: a donor gives its highest slots
// first.
func (p Placement) Grow(added int) (Placement, []Move, error) {
	if added < 1 || p.servers+added > MaxServers {
		return Placement{}, nil, fmt.Errorf("placement: cannot add %d servers to %d", added, p.servers)
	}
	cur := p.Slotted()
	n := p.servers + added
	slots := len(cur.owner)
	if slots < n {
		return Placement{}, nil, fmt.Errorf("placement: %d slots cannot spread over %d servers", slots, n)
	}
	owner := slices.Clone(cur.owner)
	count := make([]int, n)
	bySrv := make([][]int, n) // each server's slots, ascending
	for s, o := range owner {
		count[o]++
		bySrv[o] = append(bySrv[o], s)
	}
	var moves []Move
	// share is the even share of server i: the first slots%n servers
	// take one more, the old servers first, so that the old keep as many
	// as they can.
	share := func(i int) int {
		q := slots / n
		if i < slots%n {
			q++
		}
		return q
	}
	for to := p.servers; to < n; to++ {
		for count[to] < share(to) {
			from := 0
			for i := 1; i < p.servers; i++ {
				if count[i]-share(i) > count[from]-share(from) {
					from = i
				}
			}
			s := bySrv[from][len(bySrv[from])-1]
			bySrv[from] = bySrv[from][:len(bySrv[from])-1]
			owner[s] = uint16(to)
			count[from]--
			count[to]++
			moves = append(moves, Move{Slot: s, From: from, To: to})
		}
	}
	slices.SortFunc(moves, func(a, b Move) int { return a.Slot - b.Slot })
	return Placement{servers: n, owner: owner}, moves, nil
}

// ShrinkLast is the placement after removing the last server, and the
// slots it moves from it: each goes to the server that owns the fewest
// slots then (the lowest ordinal among equals), so that the others end
// with floor or ceil of slots/servers each when they began so; no other
// slot moves. The choice is deterministic: the removed server gives its
// lowest slots first.
func (p Placement) ShrinkLast() (Placement, []Move, error) {
	if p.servers < 2 {
		return Placement{}, nil, fmt.Errorf("placement: cannot remove a server of %d", p.servers)
	}
	cur := p.Slotted()
	n := p.servers - 1
	owner := slices.Clone(cur.owner)
	count := make([]int, n)
	for _, o := range owner {
		if int(o) < n {
			count[o]++
		}
	}
	var moves []Move
	for s, o := range owner {
		if int(o) != n {
			continue
		}
		to := 0
		for i := 1; i < n; i++ {
			if count[i] < count[to] {
				to = i
			}
		}
		owner[s] = uint16(to)
		count[to]++
		moves = append(moves, Move{Slot: s, From: n, To: to})
	}
	return Placement{servers: n, owner: owner}, moves, nil
}
