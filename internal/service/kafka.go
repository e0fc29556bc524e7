package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TopicError stops the service at start when its topic cannot be consumed:
// the brokers do not know it (a topic not created yet, or a mistyped
// KAFKA_TOPIC), or the principal may not describe it. Without the check
// the consumer waits for the topic's metadata forever, logging nothing,
// and /readyz says only that the group does not exist.
type TopicError struct {
	Topic   string
	Brokers []string
	Err     error
}

func (e *TopicError) Error() string {
	if errors.Is(e.Err, kerr.UnknownTopicOrPartition) {
		return fmt.Sprintf("KAFKA_TOPIC %q does not exist on the brokers %s: create it first (docs/production.md), or correct KAFKA_TOPIC", e.Topic, strings.Join(e.Brokers, ","))
	}
	if errors.Is(e.Err, kerr.TopicAuthorizationFailed) {
		return fmt.Sprintf("the Kafka principal may not describe KAFKA_TOPIC %q (it needs Describe and Read on the topic, see docs/operations.md): %v", e.Topic, e.Err)
	}
	return fmt.Sprintf("cannot read the metadata of KAFKA_TOPIC %q from the brokers %s: %v", e.Topic, strings.Join(e.Brokers, ","), e.Err)
}

func (e *TopicError) Unwrap() error { return e.Err }

// checkTopic asks the brokers for the topic's metadata, bounded by a
// minute (a broker that does not answer is an error too).
func checkTopic(ctx context.Context, kopts []kgo.Opt, brokers []string, topic string) error {
	cl, err := kgo.NewClient(append(slices.Clip(kopts), kgo.WithLogger(kgo.BasicLogger(io.Discard, kgo.LogLevelNone, nil)))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tds, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err == nil {
		err = tds.Error()
	}
	if err == nil && !tds.Has(topic) {
		err = kerr.UnknownTopicOrPartition
	}
	if err != nil {
		return &TopicError{Topic: topic, Brokers: brokers, Err: err}
	}
	return nil
}

// membership asks the group coordinator whether the pipeline's client is
// a member of the group (kgo's own view, GroupMetadata, says whether it
// believes it joined; DescribeGroups confirms it and that the group is
// Stable, not in the middle of a rebalance), and how many partitions of
// the topic the group assigned it.
func membership(cl *kgo.Client, adm *kadm.Client, group, topic string) func(context.Context) (bool, int, error) {
	return func(ctx context.Context) (bool, int, error) {
		gs, err := adm.DescribeGroups(ctx, group)
		if err != nil {
			return false, 0, fmt.Errorf("describe group: %w", err)
		}
		g, ok := gs[group]
		if !ok {
			return false, 0, nil
		}
		if g.Err != nil {
			return false, 0, fmt.Errorf("describe group: %w", g.Err)
		}
		id, _ := cl.GroupMetadata()
		if id == "" || g.State != "Stable" {
			// Not joined, or the group is rebalancing: nobody consumes
			// until the assignment is settled.
			return false, 0, nil
		}
		for _, mem := range g.Members {
			if mem.MemberID != id {
				continue
			}
			n := 0
			if ca, ok := mem.Assigned.AsConsumer(); ok {
				for _, t := range ca.Topics {
					if t.Topic == topic {
						n += len(t.Partitions)
					}
				}
			}
			return true, n, nil
		}
		return false, 0, nil
	}
}
