package pipeline

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	place "github.com/billing/ledger/internal/placement"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/memdriver"
)

// A live move's step is announced before it freezes (driver.MoveCursor).
// An idle checkpointer says within a poll that it waits for the step
// (followSteps), and a checkpoint that begins while the step is announced
// or frozen waits for it (followLayout) and then commits, unrefused: the
// mover can freeze once every counting instance says so, and no work of a
// checkpoint is lost to the step.
func TestCheckpointsWaitForAnAnnouncedStep(t *testing.T) {
	ctx := context.Background()
	m, srv := stepLedger(t, 5*time.Second)
	sink := m.sink
	wctx, stop := context.WithCancel(ctx)
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		m.ck.followSteps(wctx)
	}()
	t.Cleanup(func() { stop(); <-watching })

	moving := driver.MoveCursor{Version: 2, Moving: true, Mover: "test"}
	if _, err := srv.ChangeMoveCursor(ctx, driver.MoveCursor{}, moving); err != nil {
		t.Fatal(err)
	}
	if ok, err := m.checkpoint(t, event1("e1", "acct-1", 100, 0, 1)); !ok || err != nil {
		t.Fatalf("the checkpoint across the move's begin: %v, %v", ok, err)
	}
	announced := moving
	announced.AnnouncedBelow = driver.KeysEnd
	if _, err := srv.ChangeMoveCursor(ctx, moving, announced); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(srv.StepWaiters(announced), []string{sink.Instance()}) {
		if time.Now().After(deadline) {
			t.Fatalf("an idle checkpointer never said it waits for the announced step: %q", srv.StepWaiters(announced))
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A checkpoint begun now waits through the announcement and the
	// freeze, and commits once the step is done.
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ok, err := m.checkpoint(t, event1("e2", "acct-1", 5, 0, 2))
		done <- result{ok, err}
	}()
	frozen := announced
	frozen.FrozenBelow, frozen.AnnouncedBelow = announced.AnnouncedBelow, ""
	cur := announced
	for _, next := range []driver.MoveCursor{frozen, {Version: 2, MovedBelow: driver.KeysEnd, Mover: "test"}} {
		select {
		case r := <-done:
			t.Fatalf("a checkpoint ran while a step was announced or frozen (%+v): %+v", cur, r)
		case <-time.After(200 * time.Millisecond):
		}
		if _, err := srv.ChangeMoveCursor(ctx, cur, next); err != nil {
			t.Fatal(err)
		}
		cur = next
	}
	if r := <-done; !r.ok || r.err != nil {
		t.Fatalf("the checkpoint that waited for the step: %v, %v", r.ok, r.err)
	}
	for _, info := range m.infos {
		if info.Err != nil {
			t.Errorf("checkpoint %s failed: %v", info.Gtrid, info.Err)
		}
	}
	if got := m.balance("acct-1").Amount; got != 105 {
		t.Fatalf("balance %d, want 105", got)
	}
}

// A step that outlasts half a checkpoint's timeout (its mover was killed
// between the announcement and the freeze, or during the step) holds one
// checkpoint for that long, not every one: the next checkpoints see the
// same cursor and go on at once, and commit (nothing is frozen, or they
// write no frozen key). A new cursor is waited for again.
func TestCheckpointsWaitOnceForAStalledStep(t *testing.T) {
	ctx := context.Background()
	const timeout = 2 * time.Second
	m, srv := stepLedger(t, timeout)
	announced := driver.MoveCursor{Version: 2, Moving: true, Mover: "killed", AnnouncedBelow: driver.KeysEnd}
	if _, err := srv.ChangeMoveCursor(ctx, driver.MoveCursor{}, announced); err != nil {
		t.Fatal(err)
	}
	timed := func(id string, minutes int) time.Duration {
		t.Helper()
		start := time.Now()
		if ok, err := m.checkpoint(t, event1(id, "acct-1", 1, 0, minutes)); !ok || err != nil {
			t.Fatalf("checkpoint %s: %v, %v", id, ok, err)
		}
		return time.Since(start)
	}
	if d := timed("e1", 1); d < timeout/2 {
		t.Fatalf("the first checkpoint under the announced step took %v: it did not wait for it", d)
	}
	// Each of these would wait a second more if they waited again.
	var rest time.Duration
	for i := range 3 {
		rest += timed(fmt.Sprintf("e%d", i+2), i+2)
	}
	if rest >= 3*timeout/2 {
		t.Fatalf("three checkpoints after the stalled step took %v: they waited for it again", rest)
	}
	again := announced
	again.Version = 3
	if _, err := srv.ChangeMoveCursor(ctx, announced, again); err != nil {
		t.Fatal(err)
	}
	if d := timed("e5", 5); d < timeout/2 {
		t.Fatalf("the checkpoint under a new announced step took %v: it did not wait for it", d)
	}
	if got := m.balance("acct-1").Amount; got != 5 {
		t.Fatalf("balance %d, want 5", got)
	}
	var stalled []string
	for _, info := range m.infos {
		if info.StepStalled {
			stalled = append(stalled, info.Gtrid)
		}
	}
	if len(stalled) != 2 {
		t.Fatalf("%d attempts reported a stalled step (%q), want 2: one per cursor", len(stalled), stalled)
	}
}

// stepLedger is a one-server memdriver ledger whose checkpointer follows
// a live move, with checkpoints of the given timeout.
func stepLedger(t *testing.T, timeout time.Duration) (*memLedger, *memdriver.Server) {
	t.Helper()
	ctx := context.Background()
	one, err := place.Modulo(1)
	if err != nil {
		t.Fatal(err)
	}
	cluster := memdriver.New(memdriver.Options{AttachPrepared: true, LockWait: time.Second})
	srv := cluster.As("billing")
	layouts := func(context.Context, int) (place.Placement, place.Placement, error) { return one, one, nil }
	sink, err := txsink.New(ctx, txsink.Config{Branches: 1, Group: "g", Topic: "billing", StepTimeout: 5 * time.Second, Logger: testenv.Logger(),
		Placement: one, LayoutVersion: 1, Layouts: layouts}, srv, []driver.Server{srv})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sink.Close)
	m := &memLedger{servers: []*memdriver.Cluster{cluster}, sink: sink, epoch: map[int32]int64{}, offsets: map[int32]int64{}}
	cfg := memConfig(m)
	cfg.CheckpointTimeout = timeout
	if m.ck, err = NewCheckpointer(cfg, sink, []driver.Store{srv}); err != nil {
		t.Fatal(err)
	}
	return m, srv
}
