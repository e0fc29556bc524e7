package ledgerstatus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/billing/ledger/internal/periods"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
)

// Kafka is what a report asks the brokers; *kadm.Client has it.
type Kafka interface {
	ListCommittedOffsets(ctx context.Context, topics ...string) (kadm.ListedOffsets, error)
	ListStartOffsets(ctx context.Context, topics ...string) (kadm.ListedOffsets, error)
	DescribeGroups(ctx context.Context, groups ...string) (kadm.DescribedGroups, error)
}

// Sources are what a report reads: the ledger's servers (through the
// read-only view, the control server first; the dead letters waiting on
// each) and the Kafka cluster.
type Sources struct {
	View    driver.View
	Letters Letters
	Kafka   Kafka
	Topic   string
	Group   string
	// Environment are the period settings of the environment, reported
	// (with a warning on Log) for a ledger that has none stored.
	Environment Periods
	Log         *slog.Logger     // slog.Default() when nil
	Now         func() time.Time // time.Now when nil
	// ServerError, when set, rewrites an error of server i (the command
	// names the account and database of an access refusal, which it
	// knows from the DSN).
	ServerError func(server int, err error) error
}

// Report is where a ledger stands. A part that could not be read is
// unknown, never a guess: its values are null (or absent) in the JSON and
// its *Error field says why; Problems lists every such error. Nothing is
// filled in from a default that means something else (a stored position
// that could not be read is not "start").
type Report struct {
	Topic string    `json:"topic"`
	Group string    `json:"group"`
	At    time.Time `json:"at"`

	// TopicMissing is true when the brokers do not know the topic.
	// LogError says why the topic's offsets are unknown (log start, log
	// end and lag of every partition).
	TopicMissing bool   `json:"topic_missing,omitempty"`
	LogError     string `json:"log_error,omitempty"`
	// PositionsError says why the positions stored in partition_offsets
	// are unknown (stored offset, owner, epoch and lag of every
	// partition).
	PositionsError string `json:"positions_error,omitempty"`
	// StoredGroups are the groups and topics this ledger holds positions
	// of, and GroupStored whether Group has positions of Topic among them
	// (both meaningful only without PositionsError). A ledger that holds
	// positions of other groups only was most likely asked about the
	// wrong KAFKA_GROUP or KAFKA_TOPIC.
	StoredGroups []StoredGroup `json:"stored_groups"`
	GroupStored  bool          `json:"group_stored"`

	Partitions []Partition `json:"partitions"`
	// TotalLag is null when the lag of a partition is unknown.
	TotalLag *int64 `json:"total_lag"`
	// GroupState is the Kafka group's state (Stable, Empty, …; "absent"
	// when no member ever joined it), "" when GroupError says why it is
	// unknown; Members its members.
	GroupState string   `json:"group_state"`
	GroupError string   `json:"group_error,omitempty"`
	Members    []Member `json:"members"`

	// LastCheckpoint is the ledger's newest committed checkpoint (null
	// when none is recorded, or when LastCheckpointError says why it is
	// unknown).
	LastCheckpoint      *Checkpoint `json:"last_checkpoint"`
	LastCheckpointError string      `json:"last_checkpoint_error,omitempty"`
	// CommitLog is the commit log's position (null when
	// CommitLogError says why it is unknown).
	CommitLog      *CommitLog `json:"commit_log"`
	CommitLogError string     `json:"commit_log_error,omitempty"`
	// Changelog is where the changelog stands (null when ChangelogError
	// says why it is unknown; On false when it is off).
	Changelog      *Changelog `json:"changelog"`
	ChangelogError string     `json:"changelog_error,omitempty"`
	// InDoubt are this ledger's branches in doubt (all of the service's
	// when the ledger's id is unknown); OtherLedgersInDoubt counts those of
	// other ledgers sharing the servers (theirs to resolve). Both are null
	// when InDoubtError says why a server's branches are unknown.
	InDoubt             []InDoubtEntry `json:"in_doubt"`
	OtherLedgersInDoubt *int           `json:"other_ledgers_in_doubt"`
	InDoubtError        string         `json:"in_doubt_error,omitempty"`
	// DeadLetters are the dead letters not re-injected, by reason; null
	// when DeadLettersError says why a server's are unknown.
	DeadLetters      []Waiting `json:"dead_letters_waiting"`
	DeadLettersError string    `json:"dead_letters_error,omitempty"`
	// Periods are the ledger's period settings (billing periods show); nil
	// when PeriodsError says why they could not be read.
	Periods      *Periods `json:"periods"`
	PeriodsError string   `json:"periods_error,omitempty"`
	// Waits are the waits in progress of the instances asked (AddWaits):
	// what each waits for and since when, and the records each skipped.
	Waits []InstanceWaits `json:"waits,omitempty"`
	// CloudEventTypes are the CloudEvent types counted
	// (EVENT_CLOUDEVENT_TYPES in the environment of the report): with a
	// filter, the records the instances skipped are shown even when none
	// was.
	CloudEventTypes []string `json:"cloudevent_types,omitempty"`

	Problems []string `json:"problems,omitempty"`
}

// Periods are the period settings a ledger's windows follow: as stored in
// the ledger (Source "ledger"), or, for a ledger without any stored (never
// started by this version), the environment's (Source "environment").
type Periods struct {
	Source       string `json:"source"`
	Windows      string `json:"windows"`
	WindowsClose bool   `json:"windows_close"`
}

// Complete reports whether every part of the report was read (a topic
// that does not exist was read: see Absent).
func (r *Report) Complete() bool { return len(r.Problems) == 0 }

// Absent says, in one sentence, that what the report was asked about does
// not exist: the topic on the brokers, or the group's positions on a
// ledger that holds other groups' positions (a wrong KAFKA_GROUP or
// KAFKA_TOPIC, most likely); "" when both exist or cannot be told.
func (r *Report) Absent() string {
	var s []string
	if r.TopicMissing {
		s = append(s, fmt.Sprintf("topic %q does not exist on the brokers", r.Topic))
	}
	if r.PositionsError == "" && !r.GroupStored && len(r.StoredGroups) > 0 {
		var held []string
		for _, g := range r.StoredGroups {
			held = append(held, fmt.Sprintf("group %q on topic %q (%d partitions)", g.Group, g.Topic, g.Partitions))
		}
		s = append(s, fmt.Sprintf("group %q has no positions of topic %q in this ledger, which holds positions of %s: check KAFKA_GROUP and KAFKA_TOPIC",
			r.Group, r.Topic, strings.Join(held, ", ")))
	}
	return strings.Join(s, "; ")
}

// StoredGroup is a group whose positions of a topic partition_offsets
// holds.
type StoredGroup struct {
	Group      string `json:"group"`
	Topic      string `json:"topic"`
	Partitions int    `json:"partitions"`
}

// What a partition's stored position is (Partition.Stored).
const (
	StoredAt        = "offset"    // StoredOffset is the next offset the ledger will count
	StoredStart     = "start"     // from the start of the log: no checkpoint covered it yet (StoredOffset -2, as in partition_offsets)
	StoredUnclaimed = "unclaimed" // no instance of the group ever claimed it: it will be read from the start
	StoredUnknown   = "unknown"   // partition_offsets could not be read (Report.PositionsError)
)

// Partition is one partition of the topic as the ledger and Kafka see it.
// A nil number is unknown (the part it comes from could not be read).
type Partition struct {
	Partition int32 `json:"partition"`
	// Stored is StoredAt, StoredStart, StoredUnclaimed or StoredUnknown;
	// StoredOffset is set for the first two, Claimed for them too.
	Stored       string `json:"stored"`
	StoredOffset *int64 `json:"stored_offset,omitempty"`
	Claimed      bool   `json:"claimed"`
	LogStart     *int64 `json:"log_start_offset"`
	LogEnd       *int64 `json:"log_end_offset"` // last stable offset
	Lag          *int64 `json:"lag"`
	// InLog is false for a partition the ledger stores but the topic's
	// listing (when known) does not have.
	InLog     bool       `json:"in_log"`
	Owner     string     `json:"owner,omitempty"` // instance id of the last claim
	Epoch     int64      `json:"epoch,omitempty"`
	UpdatedAt *time.Time `json:"updated_at,omitempty"`
	// Member is the Kafka group member the partition is assigned to now
	// (client id and host), empty when none.
	Member string `json:"member,omitempty"`
}

// Member is a member of the Kafka group.
type Member struct {
	ClientID   string  `json:"client_id"`
	Host       string  `json:"host"`
	Partitions []int32 `json:"partitions"`
}

// Checkpoint is the last committed checkpoint.
type Checkpoint struct {
	Decision
	AgeSeconds float64 `json:"age_seconds"`
}

// InDoubtEntry is a branch in doubt with its age and the decision recorded
// for it ("" when undecided: recovery aborts it once it is older than
// CHECKPOINT_TIMEOUT).
type InDoubtEntry struct {
	Branch
	AgeSeconds float64 `json:"age_seconds"`
	Decision   string  `json:"decision"`
}

// StoredGroups reads which groups hold positions of which topics in
// partition_offsets.
func StoredGroups(ctx context.Context, v driver.View) ([]StoredGroup, error) {
	scopes, err := v.Scopes(ctx)
	if err != nil {
		return nil, err
	}
	out := []StoredGroup{}
	for _, s := range scopes {
		out = append(out, StoredGroup{Group: s.Group, Topic: s.Topic, Partitions: s.Partitions})
	}
	return out, nil
}

// Collect builds the report. It always returns one: whatever could not be
// read is unknown in it, with the error (Report.Problems).
func Collect(ctx context.Context, s Sources) *Report {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	r := &Report{Topic: s.Topic, Group: s.Group, At: now().UTC(), Partitions: []Partition{}, Members: []Member{}}
	problem := func(part string, err error) string {
		msg := part + ": " + err.Error()
		r.Problems = append(r.Problems, msg)
		return msg
	}
	serverErr := func(i int, err error) error {
		if s.ServerError != nil {
			return s.ServerError(i, err)
		}
		return err
	}
	control := s.View

	// The topic's log, from the brokers.
	ends, starts, err := logOffsets(ctx, s.Kafka, s.Topic)
	switch {
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		// A fact, not a failure to read: Absent says it.
		r.TopicMissing = true
		r.LogError = fmt.Sprintf("topic %q does not exist on the brokers", s.Topic)
	case err != nil:
		r.LogError = problem("log offsets", err)
	}

	// The positions, from the ledger.
	stored, err := Positions(ctx, control, s.Group, s.Topic)
	if err == nil {
		r.StoredGroups, err = StoredGroups(ctx, control)
	}
	if err != nil {
		r.PositionsError = problem("stored positions", serverErr(0, err))
	} else {
		r.GroupStored = slices.ContainsFunc(r.StoredGroups, func(g StoredGroup) bool { return g.Group == s.Group && g.Topic == s.Topic })
	}

	// The group, from its coordinator.
	members := map[int32]string{}
	if gs, err := s.Kafka.DescribeGroups(ctx, s.Group); err != nil {
		r.GroupError = problem("group "+s.Group, err)
	} else if g, ok := gs[s.Group]; !ok || errors.Is(g.Err, kerr.GroupIDNotFound) {
		r.GroupState = "absent" // no member has joined it yet
	} else if g.Err != nil {
		r.GroupError = problem("group "+s.Group, g.Err)
	} else {
		r.GroupState = g.State
		for _, m := range g.Members {
			mem := Member{ClientID: m.ClientID, Host: m.ClientHost, Partitions: []int32{}}
			if ca, ok := m.Assigned.AsConsumer(); ok {
				for _, t := range ca.Topics {
					if t.Topic == s.Topic {
						mem.Partitions = append(mem.Partitions, t.Partitions...)
					}
				}
			}
			slices.Sort(mem.Partitions)
			for _, p := range mem.Partitions {
				members[p] = m.ClientID + "/" + strings.TrimPrefix(m.ClientHost, "/")
			}
			r.Members = append(r.Members, mem)
		}
	}

	r.Partitions = partitions(s.Topic, ends, starts, r.LogError == "", stored, r.PositionsError == "", members)
	if r.LogError == "" && r.PositionsError == "" {
		var total int64
		for _, p := range r.Partitions {
			if p.Lag == nil {
				total = -1
				break
			}
			total += *p.Lag
		}
		if total >= 0 {
			r.TotalLag = &total
		}
	}

	if d, err := LastCommit(ctx, control); err != nil {
		r.LastCheckpointError = problem("last checkpoint", serverErr(0, err))
	} else if d != nil {
		d.DecidedAt = d.DecidedAt.UTC()
		r.LastCheckpoint = &Checkpoint{Decision: *d, AgeSeconds: max(r.At.Sub(d.DecidedAt).Seconds(), 0)}
	}

	if cl, err := CommitLogOf(ctx, control); err != nil {
		r.CommitLogError = problem("commit log", serverErr(0, err))
	} else {
		r.CommitLog = cl
	}
	if c, err := ChangelogOf(ctx, control, r.CommitLog); err != nil {
		r.ChangelogError = problem("changelog", serverErr(0, err))
	} else {
		r.Changelog = c
	}

	r.InDoubt, r.OtherLedgersInDoubt, err = inDoubt(ctx, s.View, r.At, serverErr)
	if err != nil {
		r.InDoubtError = problem("branches in doubt", err)
	}

	var waiting [][]Waiting
	var dlErrs []error
	for i := range s.View.Servers() {
		w, err := s.Letters.Waiting(ctx, i, s.Topic, nil)
		if err != nil {
			dlErrs = append(dlErrs, fmt.Errorf("server %d: %w", i, serverErr(i, err)))
		}
		waiting = append(waiting, w)
	}
	if err := errors.Join(dlErrs...); err != nil {
		r.DeadLettersError = problem("dead letters", err)
	} else {
		r.DeadLetters = MergeWaiting(waiting...)
	}

	// The period settings are the ledger's; the environment's only for a
	// ledger that has none stored.
	switch stored, err := periods.Read(ctx, s.View); {
	case err != nil:
		r.PeriodsError = serverErr(0, err).Error()
		r.Problems = append(r.Problems, "period settings: "+r.PeriodsError)
	case len(stored) > 0:
		r.Periods = &Periods{Source: "ledger", Windows: stored.Describe(), WindowsClose: stored.Current().Close}
	default:
		log := s.Log
		if log == nil {
			log = slog.Default()
		}
		log.Warn("this ledger has no period settings stored (never started by this version): showing this environment's")
		env := s.Environment
		env.Source = "environment"
		r.Periods = &env
	}
	return r
}

// logOffsets lists the end (last stable) and start offsets of topic.
func logOffsets(ctx context.Context, k Kafka, topic string) (ends, starts kadm.ListedOffsets, err error) {
	ends, err = k.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list the end offsets of %s: %w", topic, err)
	}
	starts, err = k.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list the start offsets of %s: %w", topic, err)
	}
	return ends, starts, nil
}

// partitions joins the topic's log (when logKnown) and the stored
// positions (when storedKnown) into one row per partition of either, in
// partition order. A value from a part that is not known stays unknown.
func partitions(topic string, ends, starts kadm.ListedOffsets, logKnown bool, stored map[int32]Stored, storedKnown bool, members map[int32]string) []Partition {
	ids := map[int32]bool{}
	if logKnown {
		ends.Each(func(o kadm.ListedOffset) { ids[o.Partition] = true })
	}
	for id := range stored {
		ids[id] = true
	}
	out := []Partition{}
	for _, id := range slices.Sorted(func(yield func(int32) bool) {
		for id := range ids {
			if !yield(id) {
				return
			}
		}
	}) {
		p := Partition{Partition: id, Stored: StoredUnknown, Member: members[id]}
		if logKnown {
			if end, ok := ends.Lookup(topic, id); ok {
				p.InLog, p.LogEnd = true, ptr(end.Offset)
				if st, ok := starts.Lookup(topic, id); ok {
					p.LogStart = ptr(st.Offset)
				}
			}
		}
		if storedKnown {
			p.Stored = StoredUnclaimed
			if st, ok := stored[id]; ok {
				t := st.UpdatedAt.UTC()
				p.Claimed, p.StoredOffset, p.Owner, p.Epoch, p.UpdatedAt = true, ptr(st.NextOffset), st.Owner, st.Epoch, &t
				p.Stored = StoredAt
				if st.NextOffset == txsink.StartOffset {
					p.Stored = StoredStart
				}
			}
		}
		if p.Stored != StoredUnknown && p.LogEnd != nil && p.LogStart != nil {
			var next int64 = txsink.StartOffset // unclaimed: read from the start of the log
			if p.StoredOffset != nil {
				next = *p.StoredOffset
			}
			p.Lag = ptr(Lag(next, *p.LogStart, *p.LogEnd))
		}
		out = append(out, p)
	}
	return out
}

// inDoubt lists this ledger's branches in doubt on every server, with the
// decisions recorded for them, and counts those of other ledgers. Any
// server that cannot be read makes the whole answer unknown: "none" must
// mean none.
func inDoubt(ctx context.Context, v driver.View, at time.Time, serverErr func(int, error) error) ([]InDoubtEntry, *int, error) {
	ledger, err := Identity(ctx, v)
	if err != nil {
		return nil, nil, serverErr(0, err)
	}
	entries := []InDoubtEntry{}
	others := 0
	var errs []error
	for i := range v.Servers() {
		branches, err := InDoubt(ctx, v, i, ledger)
		if err != nil {
			errs = append(errs, serverErr(i, err))
			continue
		}
		for _, b := range branches {
			if !b.Mine() {
				others++
				continue
			}
			e := InDoubtEntry{Branch: b}
			if !b.Created.IsZero() {
				e.AgeSeconds = max(at.Sub(b.Created).Seconds(), 0)
			}
			if e.Decision, err = DecisionOf(ctx, v, b.Gtrid); err != nil {
				errs = append(errs, serverErr(0, err))
			}
			entries = append(entries, e)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	return entries, &others, nil
}

func ptr[T any](v T) *T { return &v }
