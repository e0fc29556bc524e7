package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated seed brokers")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	pid := flag.Int("pid", 0, "if set, give up as soon as this process no longer exists")
	flag.Parse()

	if err := wait(strings.Split(*brokers, ","), *timeout, *pid); err != nil {
		fmt.Fprintln(os.Stderr, "kafkaready:", err)
		os.Exit(1)
	}
}

func wait(seeds []string, timeout time.Duration, pid int) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	cl, err := kgo.NewClient(
		kgo.SeedBrokers(seeds...),
		// Fail each attempt fast while the broker is still booting; the loop
		// below does the retrying and checks the pid between attempts.
		kgo.DialTimeout(time.Second),
		kgo.RequestRetries(0),
		kgo.RetryTimeout(2*time.Second),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	var lastErr error
	for {
		if pid > 0 && !alive(pid) {
			return fmt.Errorf("process %d exited before Kafka became ready (last error: %v)", pid, lastErr)
		}
		attempt, cancelAttempt := context.WithTimeout(ctx, 3*time.Second)
		md, err := adm.BrokerMetadata(attempt)
		cancelAttempt()
		switch {
		case err == nil && len(md.Brokers) > 0:
			fmt.Printf("kafkaready: cluster %s answers: %d broker(s), controller %d\n",
				md.Cluster, len(md.Brokers), md.Controller)
			return nil
		case err == nil:
			lastErr = errors.New("metadata response lists no brokers")
		default:
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no metadata from %s within %s: %v", strings.Join(seeds, ","), timeout, lastErr)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// alive reports whether a process exists; signal 0 performs only the
// existence and permission checks.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
