package integration_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/billing/ledger/internal/publisher"
	"github.com/billing/ledger/internal/testenv"
)

// The progress topic on real servers: a publisher killed after its Kafka
// commit (Kafka ahead of MySQL's hint), then the progress topic deleted and
// created again by hand with three partitions (an operator who created
// every <prefix>.* topic alike). An instance then refuses to start, naming
// the topic and the way out; the operator deletes the topic and runs
// `billing changelog recover-progress`, which rebuilds the record from the
// changelog's topics; the next instance publishes the rest. A
// read_committed consumer finds every change once and the last images
// equal to MariaDB's rows.
func TestChangelogProgressTopicRepaired(t *testing.T) {
	e := newTestEnv(t, 3)
	prefix := "cl-" + e.topic
	progress := publisher.ProgressTopic(prefix)
	cleanupChangelogTopics(t, e.brokers, prefix)
	w := newWorkload("clp", 1500)
	half := len(w.records) / 2
	testenv.Produce(t, e.brokers, e.topic, w.records[:half]...)
	env := func(fps string) map[string]string {
		return map[string]string{"CHANGELOG_TOPIC_PREFIX": prefix, "CHANGELOG_LEASE": "2s", "CHANGELOG_TOPIC_PARTITIONS": "3",
			"CHANGELOG_TOPIC_REPLICATION": "1", "CHANGELOG_TRANSACTION_MAX_EVENTS": "150", "LEDGER_ENTRIES": "true",
			"WINDOW_CLOSE_AFTER": "30m", "BILLING_FAILPOINTS": fps}
	}
	p0 := e.start(t, "p0", env("changelog-after-kafka=kill@3"))
	if err := p0.Wait(t, 120*time.Second); err == nil || !strings.Contains(p0.Output(), "failpoint changelog-after-kafka: SIGKILL") {
		t.Fatalf("ended with %v, want killed after its Kafka commit:\n%s", err, p0.Output())
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recreate := func(partitions int32) {
		t.Helper()
		if _, err := adm.DeleteTopic(ctx, progress); err != nil {
			t.Fatal(err)
		}
		if partitions == 0 {
			return
		}
		testenv.Eventually(t, 30*time.Second, "the topic created again", func() (bool, string) {
			r, err := adm.CreateTopic(ctx, partitions, 1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, progress)
			if err == nil {
				err = r.Err
			}
			return err == nil, errString(err)
		})
	}
	recreate(3)
	refused := e.start(t, "refused", env(""))
	if err := refused.Wait(t, 120*time.Second); err == nil ||
		!strings.Contains(refused.Output(), progress+" has 3 partitions") || !strings.Contains(refused.Output(), "billing changelog recover-progress") {
		t.Fatalf("an instance with a progress topic of 3 partitions ended with %v, want a refusal naming the topic and the way out:\n%s", err, refused.Output())
	}

	recreate(0)
	out, code := e.cliRun(t, env(""), "changelog", "recover-progress")
	if code != 0 || !strings.Contains(out, "rebuilt and written") {
		t.Fatalf("recover-progress: exit %d:\n%s", code, out)
	}
	t.Log(out)

	testenv.Produce(t, e.brokers, e.topic, w.records[half:]...)
	next := e.start(t, "next", env(""))
	waitCounted(t, e, w, 120*time.Second)
	waitSealed(t, e, 60*time.Second)
	waitPublished(t, e.dsn, 60*time.Second)
	next.Signal(syscall.SIGTERM)
	if err := next.Wait(t, 30*time.Second); err != nil {
		t.Errorf("exit: %v", err)
	}
	checkChangelog(t, e.brokers, e.dsn, prefix)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// cliRun runs a billing subcommand with the service's environment to
// completion and returns its output and exit status.
func (e *testEnv) cliRun(t *testing.T, extra map[string]string, args ...string) (string, int) {
	t.Helper()
	p := testenv.Start(t, "billing "+strings.Join(args, " "), e.bin, e.serviceEnv(extra), args...)
	err := p.Wait(t, 2*time.Minute)
	var ee *exec.ExitError
	switch {
	case err == nil:
		return p.Output(), 0
	case errors.As(err, &ee):
		return p.Output(), ee.ExitCode()
	}
	t.Fatalf("billing %v: %v", args, err)
	return "", -1
}
