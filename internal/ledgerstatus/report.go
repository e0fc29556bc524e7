package ledgerstatus

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/billing/ledger/internal/deadletters"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/billing/ledger/internal/txsink"
)

// Sources are what a report reads: the ledger's servers (the control
// server first) and the Kafka cluster.
type Sources struct {
	Servers []*sql.DB
	Kafka   *kadm.Client
	Topic   string
	Group   string
	Now     func() time.Time // time.Now when nil
}

// Report is where a ledger stands. Problems lists what could not be read;
// the rest of the report is still filled in.
type Report struct {
	Topic      string      `json:"topic"`
	Group      string      `json:"group"`
	At         time.Time   `json:"at"`
	Partitions []Partition `json:"partitions"`
	TotalLag   int64       `json:"total_lag"`
	// GroupState is the Kafka group's state (Stable, Empty, …) and Members
	// its members.
	GroupState     string      `json:"group_state"`
	Members        []Member    `json:"members"`
	LastCheckpoint *Checkpoint `json:"last_checkpoint"`
	// InDoubt are this ledger's branches in doubt (all of the service's
	// when the ledger's id is unknown); OtherLedgersInDoubt counts those of
	// other ledgers sharing the servers (theirs to resolve).
	InDoubt             []InDoubtEntry `json:"in_doubt"`
	OtherLedgersInDoubt int            `json:"other_ledgers_in_doubt"`
	DeadLetters         []Waiting      `json:"dead_letters_waiting"`
	// Periods are the ledger's period settings (billing periods show); nil
	// when they could not be read.
	Periods  *Periods `json:"periods"`
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

// Partition is one partition of the topic as the ledger and Kafka see it.
type Partition struct {
	Partition int32 `json:"partition"`
	// Claimed is false for a partition no instance of the group has ever
	// claimed (no row in partition_offsets): it will be read from the
	// start of the log.
	Claimed bool `json:"claimed"`
	// StoredOffset is the next offset stored in partition_offsets; -2 means
	// "from the start of the log" (no checkpoint has covered it yet).
	StoredOffset int64      `json:"stored_offset"`
	LogStart     int64      `json:"log_start_offset"`
	LogEnd       int64      `json:"log_end_offset"` // last stable offset
	Lag          int64      `json:"lag"`
	Owner        string     `json:"owner,omitempty"` // instance id of the last claim
	Epoch        int64      `json:"epoch"`
	UpdatedAt    *time.Time `json:"updated_at,omitempty"`
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

// Collect builds the report. It returns an error only when nothing useful
// can be said (no partition metadata); other failures are listed in
// Report.Problems.
func Collect(ctx context.Context, s Sources) (*Report, error) {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	r := &Report{Topic: s.Topic, Group: s.Group, At: now().UTC(), Partitions: []Partition{}, Members: []Member{},
		InDoubt: []InDoubtEntry{}, DeadLetters: []Waiting{}}
	problem := func(format string, args ...any) { r.Problems = append(r.Problems, fmt.Sprintf(format, args...)) }
	control := s.Servers[0]

	ends, err := s.Kafka.ListCommittedOffsets(ctx, s.Topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list the end offsets of %s: %w", s.Topic, err)
	}
	starts, err := s.Kafka.ListStartOffsets(ctx, s.Topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list the start offsets of %s: %w", s.Topic, err)
	}
	stored, err := Positions(ctx, control, s.Group, s.Topic)
	if err != nil {
		problem("%v", err)
	}
	members := map[int32]string{}
	if gs, err := s.Kafka.DescribeGroups(ctx, s.Group); err != nil {
		problem("describe group %s: %v", s.Group, err)
	} else if g, ok := gs[s.Group]; !ok || errors.Is(g.Err, kerr.GroupIDNotFound) {
		r.GroupState = "absent" // no member has joined it yet
	} else if g.Err != nil {
		problem("describe group %s: %v", s.Group, g.Err)
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
	ends.Each(func(end kadm.ListedOffset) {
		p := Partition{Partition: end.Partition, StoredOffset: txsink.StartOffset, LogEnd: end.Offset, Member: members[end.Partition]}
		if st, ok := starts.Lookup(s.Topic, end.Partition); ok {
			p.LogStart = st.Offset
		}
		if st, ok := stored[end.Partition]; ok {
			t := st.UpdatedAt.UTC()
			p.Claimed, p.StoredOffset, p.Owner, p.Epoch, p.UpdatedAt = true, st.NextOffset, st.Owner, st.Epoch, &t
		}
		p.Lag = Lag(p.StoredOffset, p.LogStart, p.LogEnd)
		r.TotalLag += p.Lag
		r.Partitions = append(r.Partitions, p)
	})
	slices.SortFunc(r.Partitions, func(a, b Partition) int { return int(a.Partition - b.Partition) })

	if d, err := LastCommit(ctx, control); err != nil {
		problem("%v", err)
	} else if d != nil {
		d.DecidedAt = d.DecidedAt.UTC()
		r.LastCheckpoint = &Checkpoint{Decision: *d, AgeSeconds: max(r.At.Sub(d.DecidedAt).Seconds(), 0)}
	}

	ledgerID, err := LedgerID(ctx, control)
	if err != nil {
		problem("%v", err)
	}
	var waiting [][]Waiting
	for i, db := range s.Servers {
		branches, err := InDoubt(ctx, db, i, ledgerID)
		if err != nil {
			problem("%v", err)
		}
		for _, b := range branches {
			if !b.Mine() {
				r.OtherLedgersInDoubt++
				continue
			}
			e := InDoubtEntry{Branch: b}
			if !b.Created.IsZero() {
				e.AgeSeconds = max(r.At.Sub(b.Created).Seconds(), 0)
			}
			if e.Decision, err = DecisionOf(ctx, control, b.Gtrid); err != nil {
				problem("%v", err)
			}
			r.InDoubt = append(r.InDoubt, e)
		}
		w, err := deadletters.CountWaiting(ctx, db, s.Topic, nil)
		if err != nil {
			problem("server %d: %v", i, err)
		}
		waiting = append(waiting, w)
	}
	r.DeadLetters = MergeWaiting(waiting...)
	return r, nil
}
