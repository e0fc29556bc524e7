package periods

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/billing/ledger/internal/safetext"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// ErrRefused marks a change refused because instances may be running.
var ErrRefused = errors.New("refused")

// Groups describes consumer groups (*kadm.Client).
type Groups interface {
	DescribeGroups(ctx context.Context, groups ...string) (kadm.DescribedGroups, error)
}

// ChangeStopped applies req to the ledger of d (Apply), recorded by by,
// only once Kafka says that no instance runs: neither group nor any group
// with positions of topic in the ledger has a member. A group Kafka does
// not know has none.
func ChangeStopped(ctx context.Context, d *mysqldriver.Driver, g Groups, group, topic string, req Change, by string, dryRun bool) (Plan, Definition, error) {
	groups, err := d.Control().Groups(ctx, topic)
	if err != nil {
		return Plan{}, Definition{}, err
	}
	groups = append(groups, group)
	slices.Sort(groups)
	groups = slices.Compact(groups)
	described, err := g.DescribeGroups(ctx, groups...)
	if err != nil {
		return Plan{}, Definition{}, fmt.Errorf("describe the consumer groups %q: %w (every instance must be stopped, and Kafka must say so)", groups, err)
	}
	if running := members(described, groups); len(running) > 0 {
		return Plan{}, Definition{}, fmt.Errorf("%w: stop every instance first; the consumer groups have members: %s", ErrRefused, strings.Join(running, "; "))
	}
	return Apply(ctx, d, req, by, dryRun)
}

// members names every member of groups, as Kafka described them.
func members(described kadm.DescribedGroups, groups []string) []string {
	var running []string
	for _, g := range groups {
		dg, ok := described[g]
		if !ok || dg.Err != nil {
			continue // unknown to Kafka: no members
		}
		for _, m := range dg.Members {
			running = append(running, fmt.Sprintf("%s (group %s, client %s, host %s)", safetext.Text(m.MemberID, 128), safetext.Text(g, 255), safetext.Text(m.ClientID, 128), safetext.Text(m.ClientHost, 128)))
		}
	}
	return running
}
