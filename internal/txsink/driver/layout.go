package driver

import (
	"errors"
	"strings"
)

// The live move of rows to a new server (package shards: billing shards
// add). A layout version places every key on a server by its slot
// (package placement); growing the ledger gives some slots a new server,
// and their rows move there step by step while the instances count. The
// move goes through the keys in byte order (account ids and event ids
// alike, as the result tables store them: VARBINARY): a key of a moving
// slot is on its new server once it is below the cursor, on its old one
// before. One row on the control server holds the cursor (MoveCursor),
// changed only by the mover's steps and read, under a shared lock, by
// every commit decision (Control.Commit, layout).
//
// A step is announced before it freezes its keys: an instance that reads
// an announced (or frozen) step before a checkpoint waits for it, and
// says so (Control.AwaitStep), so that the mover can freeze once the
// checkpoints begun before the announcement have decided. A checkpoint in
// flight when the freeze comes that wrote one of its keys is refused at
// its decision and built again; the announcement spares that work.

// KeysEnd is above every key: a step that moves the rest of the keys
// freezes up to it. Keys are at most 128 bytes (dedup_keys.event_id).
var KeysEnd = strings.Repeat("\xff", 129)

// MoveCursor is how far the move to a layout version went.
type MoveCursor struct {
	// Version is the layout version of the move under way or last done
	// (0: none).
	Version int
	// Moving: the move to Version is under way. Else every key is where
	// Version's placement puts it.
	Moving bool
	// MovedBelow: while moving, the keys of moving slots below it are on
	// their new server; the others on their old one.
	MovedBelow string
	// FrozenBelow: while a step is under way, the keys of moving slots
	// from MovedBelow up to it are being moved, and no decision of a
	// checkpoint that wrote one commits. Empty: no step is under way.
	FrozenBelow string
	// AnnouncedBelow: the step the mover will freeze next, from
	// MovedBelow up to it (empty: none). Decisions do not check it.
	AnnouncedBelow string
	// Mover names the run of billing shards add that holds the move.
	Mover string
}

// Frozen says whether a step is under way.
func (c MoveCursor) Frozen() bool { return c.FrozenBelow != "" }

// Announced says whether a step is announced and not yet frozen.
func (c MoveCursor) Announced() bool { return c.AnnouncedBelow != "" && !c.Frozen() }

// Settled is the bound below which the keys' places are known for good
// from the cursor's point of view: a key of a moving slot at or above
// MovedBelow and below Settled is moving or moved since the cursor was
// read. It is FrozenBelow during a step, MovedBelow otherwise, and
// KeysEnd once the move is done.
func (c MoveCursor) Settled() string {
	switch {
	case !c.Moving:
		return KeysEnd
	case c.Frozen():
		return c.FrozenBelow
	}
	return c.MovedBelow
}

// ErrMoveCursorMoved: a change of the move's cursor found it other than
// the mover expected (another run of billing shards add took the move
// over, or the step was done meanwhile).
var ErrMoveCursorMoved = errors.New("driver: the move's cursor is not where this mover left it")
