package driver

import (
	"errors"
	"time"
)

// Generations of dedup keys (package dedup decides what they mean; this
// is what the servers store). Keys are written to the table of the
// current generation and a whole table is emptied once every key in it
// has expired, instead of a delete per key: KeyTables tables on every
// server, reused in rotation, and one row of state on the control server
// (KeyGenerations), changed by Control.RotateKeys and
// Control.MarkKeysEmptied and read by every checkpoint that claims keys.

// Generation numbers the generations of dedup keys, from 0, one after the
// other: the keys first claimed while it was the current one.
type Generation int64

// KeyTables is the number of tables the generations rotate through: the
// current one, the previous one (its keys live on), and the one before
// that, emptied while the current one fills.
const KeyTables = 3

// Table is the index of g's table, 0 to KeyTables-1: generation g is
// written to the table that generation g-KeyTables was, once that one was
// emptied.
func (g Generation) Table() int { return int(((g % KeyTables) + KeyTables) % KeyTables) }

// KeyGenerations is the state of the generations, one row on the control
// server.
type KeyGenerations struct {
	// Current is the generation claims write to.
	Current Generation
	// Since is when Current became current, by the control server's clock,
	// read after every commit decision taken under the generation before
	// had committed (see Control.RotateKeys). PreviousSince is the same
	// for Current-1 (zero when Current is 0).
	Since, PreviousSince time.Time
	// Emptied: every generation up to Emptied has had its table emptied
	// since it was last written (-1: none).
	Emptied Generation
	// Lifetime is the longest lifetime (expiry minus processing time) any
	// instance has registered for the keys it writes
	// (Control.RegisterKeyLifetime): it only grows.
	Lifetime time.Duration
	// Now is the control server's clock when the state was read.
	Now time.Time
}

var (
	// ErrKeysMoved: a commit decision was refused because the current
	// generation is no longer the one its checkpoint claimed its keys in.
	ErrKeysMoved = errors.New("driver: the dedup keys' generation changed since the checkpoint claimed its keys")
	// ErrKeysLive: a table was not emptied because keys the version before
	// generations wrote (dedup_expiry) may still be live.
	ErrKeysLive = errors.New("driver: keys of the expiry journal may still be live")
)
