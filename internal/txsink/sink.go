package txsink

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/placement"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Failpoint names, in protocol order. Tests arm them (see package failpoint)
// to stop the process between any two steps.
const (
	FailBeforePrepare  = "before-prepare"   // all branches written, none prepared
	FailBetweenPrepare = "between-prepares" // first branch prepared, the others not
	FailAfterPrepare   = "after-prepare"    // all prepared, no decision
	FailAfterDecision  = "after-decision"   // decision and offsets durable, no XA COMMIT
	FailBetweenCommits = "between-commits"  // first branch committed, the others prepared
	FailAfterCommit    = "after-commit"     // all committed, not marked applied, Kafka group offsets not yet
)

// StartOffset is the next_offset stored for a partition never checkpointed
// before: consume it from the start of the log, so that no event written
// before the service first ran is skipped.
const StartOffset = driver.StartOffset

// Config configures a Sink.
type Config struct {
	// Branches is the number of parallel XA branches (connections) per
	// server in a checkpoint; at least 1.
	Branches int
	// Group and Topic scope the partition positions (required).
	Group, Topic string
	// StepTimeout bounds one protocol step (prepare, decide, commit of all
	// branches), detached from the caller's cancellation (required).
	StepTimeout time.Duration
	// Failpoints are armed by tests to stop between protocol steps; nil
	// arms none.
	Failpoints *failpoint.Set
	// Logger receives the sink's logs; slog.Default() when nil.
	Logger *slog.Logger
	// Now is the clock; time.Now when nil. Scenario tests drive it.
	Now func() time.Time
	// Instance is this process's owner id; random (12 hex digits) when
	// empty. Scenario tests name their instances.
	Instance string
	// Placement places keys on the servers (Route): the ledger's stored
	// layout's (package shards). The zero Placement is the modulo
	// placement over the servers given to New.
	Placement placement.Placement
	// LayoutVersion is the stored layout version Placement is (0: not
	// known). A checkpoint begun before a move from that version may then
	// commit after its begin (layoutCheck).
	LayoutVersion int
	// Layouts reads a layout version's placements when the ledger's
	// layout moves while the sink runs (see layout.go). Nil: the sink
	// cannot follow a move (Refresh fails with ErrNotPlaceable once one
	// begins).
	Layouts Layouts
	// Changelog: the checkpoints write the ledger's changelog (their
	// branches write the outbox). While the ledger's changelog is on, a
	// decision of a sink without it is refused (ErrChangelogOn).
	Changelog bool
}

func (c *Config) validate() error {
	var errs []error
	if c.Branches < 1 {
		errs = append(errs, errors.New("Branches must be at least 1"))
	}
	if c.Group == "" || c.Topic == "" {
		errs = append(errs, errors.New("Group and Topic are required"))
	}
	if c.StepTimeout <= 0 {
		errs = append(errs, errors.New("StepTimeout must be positive"))
	}
	return errors.Join(errs...)
}

// Sink is the exactly-once sink: it runs checkpoints as XA transactions over
// every participant (Branches connections on each server), decides them
// durably on the control server, and resolves branches left in doubt. It
// holds the protocol; the servers are drivers (package driver).
//
// A Sink is safe for concurrent use; the transactions it begins are not.
type Sink struct {
	cfg      Config
	log      *slog.Logger
	now      func() time.Time
	instance string
	ledger   Identity
	control  driver.Control
	servers  []driver.Server
	layout   atomic.Pointer[layout]            // where keys are placed (layout.go)
	awaited  atomic.Pointer[driver.MoveCursor] // the announced step AwaitStep last recorded

	mu       sync.Mutex     // guards idle and reported
	idle     []driver.Conn  // per participant: its connection between checkpoints
	reported map[string]int // in-doubt branches already reported, by xid (see recovery)
}

// New builds a sink over a control server's bookkeeping and the servers
// that take part in checkpoints (the control server first, then the
// shards). It reads the ledger's identity, creating it on first use. The
// instance id is new at every New: it is the owner written into the
// partition rows and part of every gtrid.
func New(ctx context.Context, cfg Config, control driver.Control, servers []driver.Server) (*Sink, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("txsink: %w", err)
	}
	place := cfg.Placement
	if place.Servers() == 0 {
		var err error
		if place, err = placement.Modulo(len(servers)); err != nil {
			return nil, fmt.Errorf("txsink: %w", err)
		}
	}
	if place.Servers() > len(servers) {
		// Servers after the placement's are to be added (a live move
		// places keys there once it begins).
		return nil, fmt.Errorf("txsink: a placement over %d servers for %d servers", place.Servers(), len(servers))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Instance == "" {
		cfg.Instance = randomHex(6)
	}
	id, secret, err := control.Identity(ctx, NewIdentity)
	if err != nil {
		return nil, fmt.Errorf("txsink: ledger identity: %w", err)
	}
	s := &Sink{
		cfg: cfg, log: cfg.Logger, now: cfg.Now, instance: cfg.Instance,
		ledger: Identity{ID: id, Secret: secret}, control: control, servers: servers,
		idle: make([]driver.Conn, len(servers)*cfg.Branches), reported: map[string]int{},
	}
	// A move's cursor that is not the start's placement's (a move under
	// way, or done since the layout was read) is followed from here.
	cur, err := control.MoveCursor(ctx)
	if err != nil {
		return nil, fmt.Errorf("txsink: read the move's cursor: %w", err)
	}
	l := &layout{cursor: cur, place: place, version: cfg.LayoutVersion}
	if cur.Version != 0 && cfg.Layouts != nil {
		if l, err = s.loadLayout(ctx, cur); err != nil {
			return nil, err
		}
	}
	s.layout.Store(l)
	return s, nil
}

// NewIdentity makes a new ledger's identity: a random id and a random
// secret (see Qualifier); the first stored is the ledger's for its life.
func NewIdentity() (string, []byte) {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	return randomHex(8), secret
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// Close gives back the connections kept between checkpoints. The drivers'
// pools are their owners' to close.
func (s *Sink) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, c := range s.idle {
		if c != nil {
			c.Close(true)
			s.idle[i] = nil
		}
	}
}

// Instance is this process's owner id.
func (s *Sink) Instance() string { return s.instance }

// Ledger is the ledger's identity (see Qualifier).
func (s *Sink) Ledger() string { return s.ledger.ID }

// Participants is the number of XA branches a checkpoint may use.
func (s *Sink) Participants() int { return len(s.servers) * s.cfg.Branches }

// ServerOf is the index (in the order given to New) of the server a
// participant's branches run on.
func (s *Sink) ServerOf(participant int) int { return participant / s.cfg.Branches }

// MaxStatementBytes is the budget of one statement on the server a
// participant's branches run on.
func (s *Sink) MaxStatementBytes(participant int) int {
	return s.servers[s.ServerOf(participant)].MaxStatementBytes()
}

// Code classifies an error of the sink's servers (see driver.Code).
func (s *Sink) Code(err error) driver.Code { return s.servers[0].Code(err) }

// Route places a key (an account id or an event id) on a participant: its
// server by the ledger's placement (Config.Placement, and a move's
// cursor: layout.go), so rows keep their server across restarts; the
// branch within a server only spreads the work. A checkpoint places its
// keys by Txn.Route.
func (s *Sink) Route(key string) int {
	p, _ := s.layout.Load().participant(key, s.cfg.Branches)
	return p
}

func (s *Sink) scope() driver.Scope { return driver.Scope{Group: s.cfg.Group, Topic: s.cfg.Topic} }

// acquire takes the participant's kept connection, or opens one.
func (s *Sink) acquire(ctx context.Context, participant int) (driver.Conn, error) {
	s.mu.Lock()
	c := s.idle[participant]
	s.idle[participant] = nil
	s.mu.Unlock()
	if c != nil {
		return c, nil
	}
	return s.servers[s.ServerOf(participant)].Conn(ctx)
}

// putBack keeps a connection whose branch ended cleanly for the
// participant's next checkpoint, and drops any other, so that no
// connection in an XA state is ever reused.
func (s *Sink) putBack(participant int, c driver.Conn, clean bool) {
	if clean {
		s.mu.Lock()
		if s.idle[participant] == nil {
			s.idle[participant], c = c, nil
		}
		s.mu.Unlock()
	}
	if c != nil {
		c.Close(clean)
	}
}
