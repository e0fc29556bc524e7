package publisher

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/testenv"
)

// The topics are created when missing with the settings' defaults (-1:
// the brokers' partitions and replication), the table topics and the
// progress topic compacted, the append-only ones not, the progress topic
// of one partition; a second creation leaves them as they are.
func TestTopicsCreatedIfMissing(t *testing.T) {
	brokers := testenv.Kafka(t)
	prefix := testenv.RandomName("t-cl-topics-")
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	t.Cleanup(func() { deleteTopics(opts, prefix) })
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := Config{Prefix: prefix, Partitions: -1, Replication: -1}
	for range 2 {
		if err := ensureTopics(ctx, cl, cfg); err != nil {
			t.Fatal(err)
		}
	}
	adm := kadm.NewClient(cl)
	want := map[string]string{ProgressTopic(prefix): "compact"}
	for _, tb := range changelog.Tables() {
		want[Topic(prefix, tb.Name)] = map[bool]string{false: "compact", true: "delete"}[tb.Append]
	}
	var names []string
	for n := range want {
		names = append(names, n)
	}
	details, err := adm.ListTopics(ctx, names...)
	if err != nil {
		t.Fatal(err)
	}
	configs, err := adm.DescribeTopicConfigs(ctx, names...)
	if err != nil {
		t.Fatal(err)
	}
	for name, policy := range want {
		d, ok := details[name]
		if !ok || d.Err != nil || len(d.Partitions) == 0 {
			t.Errorf("%s: not created (%v)", name, d.Err)
			continue
		}
		if name == ProgressTopic(prefix) && len(d.Partitions) != 1 {
			t.Errorf("%s: %d partitions, want 1", name, len(d.Partitions))
		}
		rc, err := configs.On(name, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, c := range rc.Configs {
			if c.Key == "cleanup.policy" && c.Value != nil {
				got = *c.Value
			}
		}
		if got != policy {
			t.Errorf("%s: cleanup.policy %q, want %q", name, got, policy)
		}
	}
}
