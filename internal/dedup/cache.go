package dedup

import "time"

// Cache remembers committed event ids, up to a budget of entries. It holds
// only keys whose checkpoint committed (or that were read from MySQL), so a
// hit is proof; it forgets the oldest entries first when full, and a miss
// sends the id to MySQL.
//
// A Cache is not safe for concurrent use: the checkpoint coordinator owns it.
type Cache struct {
	budget  int
	entries map[string]Seen
	order   []string // insertion order, a ring: head is the oldest
	head    int
}

// NewCache returns a cache of at most budget entries; budget 0 disables it.
func NewCache(budget int) *Cache {
	return &Cache{budget: budget, entries: make(map[string]Seen, min(budget, 1<<16))}
}

// Len is the number of entries held.
func (c *Cache) Len() int { return len(c.entries) }

// Get returns the entry for id if it is held and unexpired at now.
func (c *Cache) Get(id string, now time.Time) (Seen, bool) {
	s, ok := c.entries[id]
	if !ok || !now.Before(s.ExpiresAt) {
		return Seen{}, false
	}
	return s, true
}

// Add remembers id. Expired entries are not added.
func (c *Cache) Add(id string, s Seen, now time.Time) {
	if c.budget == 0 || !now.Before(s.ExpiresAt) {
		return
	}
	if _, ok := c.entries[id]; ok {
		c.entries[id] = s
		return
	}
	if len(c.order) < c.budget {
		c.order = append(c.order, id)
	} else {
		// Evict the oldest: with one TTL for all, it expires first.
		delete(c.entries, c.order[c.head])
		c.order[c.head] = id
		c.head = (c.head + 1) % c.budget
	}
	c.entries[id] = s
}

// Reset forgets everything.
func (c *Cache) Reset() {
	clear(c.entries)
	c.order = c.order[:0]
	c.head = 0
}
