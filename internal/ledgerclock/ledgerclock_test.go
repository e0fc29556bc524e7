package ledgerclock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// server is a control server whose clock is offset from this host's real
// one, answering after delay.
type server struct {
	offset, delay time.Duration
	err           error
}

func (s server) UTCTime(ctx context.Context) (time.Time, error) {
	if s.err != nil {
		return time.Time{}, s.err
	}
	time.Sleep(s.delay / 2)
	t := time.Now().Add(s.offset)
	time.Sleep(s.delay / 2)
	return t, nil
}

// Whatever this host's clock says, Now is the server's clock, within
// MaxError; the class of skews from hours behind to hours ahead, with
// server clocks off too.
func TestNowFollowsTheServerWhateverTheHost(t *testing.T) {
	ctx := context.Background()
	for _, hostSkew := range []time.Duration{-3 * time.Hour, -90 * time.Second, -3 * time.Second, -time.Millisecond, 0, 7 * time.Millisecond, 2 * time.Second, 5 * time.Minute, 26 * time.Hour} {
		for _, serverOffset := range []time.Duration{-4 * time.Second, 0, 1500 * time.Millisecond} {
			c := New(func() time.Time { return time.Now().Add(hostSkew) })
			if err := c.Sync(ctx, server{offset: serverOffset, delay: 2 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
			want := time.Now().Add(serverOffset)
			if d := c.Now().Sub(want); d < -MaxError || d > MaxError {
				t.Errorf("host %v, server %v: Now is %v off the server's clock", hostSkew, serverOffset, d)
			}
			if off, unc := c.Offset(); off-(serverOffset-hostSkew) > MaxError || (serverOffset-hostSkew)-off > MaxError || unc > maxHalfTrip {
				t.Errorf("host %v, server %v: offset %v ±%v, want %v", hostSkew, serverOffset, off, unc, serverOffset-hostSkew)
			}
		}
	}
}

// Two instances whose hosts disagree by seconds agree on the ledger's
// clock within Margin.
func TestTwoInstancesAgreeWithinTheMargin(t *testing.T) {
	ctx := context.Background()
	src := server{offset: time.Second, delay: time.Millisecond}
	ahead, behind := New(func() time.Time { return time.Now().Add(4 * time.Second) }), New(func() time.Time { return time.Now().Add(-4 * time.Second) })
	for _, c := range []*Clock{ahead, behind} {
		if err := c.Sync(ctx, src); err != nil {
			t.Fatal(err)
		}
	}
	if d := ahead.Now().Sub(behind.Now()); d > Margin || d < -Margin {
		t.Fatalf("the two instances' clocks differ by %v, more than %v", d, Margin)
	}
}

// A measurement that cannot be trusted to MaxError is refused, and the
// last good one stays; before any, Now is the host's clock.
func TestSlowOrFailingSourceKeepsTheLastMeasurement(t *testing.T) {
	ctx := context.Background()
	c := New(nil)
	if d := time.Since(c.Now()); d < -time.Second || d > time.Second {
		t.Fatalf("before any measurement Now is %v off the host's clock", d)
	}
	if err := c.Sync(ctx, server{offset: time.Hour, delay: 2*maxHalfTrip + 50*time.Millisecond}); err == nil || !strings.Contains(err.Error(), "round trips") {
		t.Fatalf("a slow server's clock was used: %v", err)
	}
	if err := c.Sync(ctx, server{offset: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(ctx, server{err: errors.New("down")}); err == nil {
		t.Fatal("a failed read succeeded")
	}
	if d := c.Now().Sub(time.Now().Add(10 * time.Second)); d < -MaxError || d > MaxError {
		t.Fatalf("after a failed measurement Now is %v off the last good one", d)
	}
}
