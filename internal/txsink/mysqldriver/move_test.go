package mysqldriver_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/placement"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// MoveRows moves exactly the rows of the key range whose key moves, page
// after page of a composite primary key, and no row outside the range:
// a step freezes only its range, and a row moved from outside it would be
// written on its old server meanwhile, then lost at its own step. A range
// to the end of the keys (driver.KeysEnd) takes every key from its start.
func TestMoveRowsMovesTheRangeOnly(t *testing.T) {
	ctx := context.Background()
	dsnA, dbA := testenv.LedgerDB(t)
	dsnB, dbB := testenv.LedgerDB(t)
	d, err := mysqldriver.Open(ctx, []string{dsnA, dsnB}, mysqldriver.Options{LockWaitTimeout: lockWait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var all []string
	for a := range 30 {
		acct := fmt.Sprintf("a%02d", a)
		for _, cur := range []string{"EUR", "USD", "JPY"} {
			for w := range 4 {
				if _, err := dbA.ExecContext(ctx, `INSERT INTO billing_windows (account_id, currency, window_start, amount_minor, event_count, updated_at) VALUES (?, ?, ?, ?, 1, ?)`,
					acct, cur, start.Add(time.Duration(w)*time.Hour), a*100+w, start); err != nil {
					t.Fatal(err)
				}
			}
		}
		all = append(all, acct)
	}
	moves := func(key []byte) bool { return placement.Hash(string(key))%2 == 0 }
	accounts := func(db interface {
		SelectContext(context.Context, any, string, ...any) error
	}) []string {
		var got []string
		if err := db.SelectContext(ctx, &got, `SELECT DISTINCT account_id FROM billing_windows ORDER BY account_id`); err != nil {
			t.Fatal(err)
		}
		return got
	}
	step := func(from, below string) {
		// Batches of 5 rows: every account's 12 rows take pages.
		if _, err := mysqldriver.MoveRows(ctx, d.Server(0), d.Server(1), "billing_windows", "account_id", mysqldriver.KeyRange{From: from, Below: below}, moves, 5, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	step("a05", "a20")
	var wantB, wantA []string
	for _, a := range all {
		if a >= "a05" && a < "a20" && moves([]byte(a)) {
			wantB = append(wantB, a)
		} else {
			wantA = append(wantA, a)
		}
	}
	if got := accounts(dbB); !slices.Equal(got, wantB) {
		t.Fatalf("moved accounts %q, want those of the range that move %q", got, wantB)
	}
	if got := accounts(dbA); !slices.Equal(got, wantA) {
		t.Fatalf("accounts left %q, want %q", got, wantA)
	}
	var n int
	if err := dbB.GetContext(ctx, &n, `SELECT COUNT(*) FROM billing_windows`); err != nil || n != 12*len(wantB) {
		t.Fatalf("%d rows moved (%v), want %d", n, err, 12*len(wantB))
	}
	step("a20", driver.KeysEnd)
	step("", "a05")
	for _, a := range accounts(dbA) {
		if moves([]byte(a)) {
			t.Fatalf("account %s of a moving slot left after every range moved", a)
		}
	}
}

// A move's begin (QuiesceUnfollowing) fences only the partitions claimed
// last by an instance that does not follow the move's cursor: one of a
// version before migration 00014 (its claim leaves follower_epoch as it
// was) or a row a decision created. A claim of this version keeps its
// epoch, so its checkpoint in flight is not lost; every row is still
// locked (the change waits for a decision in progress). Quiesce, a change
// of settings, fences every partition as before.
func TestQuiesceUnfollowingFencesOnlyClaimsOfVersionsBefore(t *testing.T) {
	ctx := context.Background()
	dsn, db := testenv.LedgerDB(t)
	d := open(ctx, t, dsn)
	sc := driver.Scope{Group: "g", Topic: "t"}
	now := time.Now().UTC()
	// p0, p1 claimed by this version (p1 twice: the mark follows the
	// epoch); p2 by this version, then claimed again by one before
	// (its statement, without the column); p3 created by one before.
	for _, parts := range [][]int32{{0, 1, 2}, {1, 2}} {
		if _, err := d.Control().Claim(ctx, sc, "new", parts, now); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO partition_offsets (consumer_group, kafka_topic, kafka_partition, next_offset, watermark, caught_up, owner, epoch, updated_at)
		VALUES ('g','t',2,-2,NULL,FALSE,'old',1,?), ('g','t',3,-2,NULL,FALSE,'old',1,?)
		ON DUPLICATE KEY UPDATE epoch = epoch + 1, owner = VALUES(owner), updated_at = VALUES(updated_at)`, now, now); err != nil {
		t.Fatal(err)
	}
	epochs := func() map[int32]int64 {
		st, err := d.Control().Positions(ctx, sc, []int32{0, 1, 2, 3})
		if err != nil {
			t.Fatal(err)
		}
		out := map[int32]int64{}
		for p, s := range st {
			out[p] = s.Epoch
		}
		return out
	}
	before := epochs()
	if want := (map[int32]int64{0: 1, 1: 2, 2: 3, 3: 1}); !maps.Equal(before, want) {
		t.Fatalf("epochs after the claims: %v, want %v", before, want)
	}
	fenced := -1
	if err := d.Control().QuiesceUnfollowing(ctx, func(_ context.Context, _ *sqlx.Tx, q mysqldriver.Quiesced) error {
		fenced = q.Fenced
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := epochs(), (map[int32]int64{0: 1, 1: 2, 2: 4, 3: 2}); !maps.Equal(got, want) || fenced != 2 {
		t.Fatalf("after the begin's fence: epochs %v (%d fenced), want %v (2 fenced: the claims of a version before)", got, fenced, want)
	}
	// A claim of this version again: followed, not fenced by a begin.
	if _, err := d.Control().Claim(ctx, sc, "new", []int32{2, 3}, now); err != nil {
		t.Fatal(err)
	}
	if err := d.Control().QuiesceUnfollowing(ctx, func(context.Context, *sqlx.Tx, mysqldriver.Quiesced) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got, want := epochs(), (map[int32]int64{0: 1, 1: 2, 2: 5, 3: 3}); !maps.Equal(got, want) {
		t.Fatalf("after claims of this version and a begin: epochs %v, want %v", got, want)
	}
	// The fence of a change of settings takes every partition.
	if err := d.Control().Quiesce(ctx, func(context.Context, *sqlx.Tx, mysqldriver.Quiesced) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got, want := epochs(), (map[int32]int64{0: 2, 1: 3, 2: 6, 3: 4}); !maps.Equal(got, want) {
		t.Fatalf("after Quiesce: epochs %v, want %v", got, want)
	}
	// And a claim after it is followed again.
	if _, err := d.Control().Claim(ctx, sc, "new", []int32{0}, now); err != nil {
		t.Fatal(err)
	}
	if err := d.Control().QuiesceUnfollowing(ctx, func(context.Context, *sqlx.Tx, mysqldriver.Quiesced) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got, want := epochs(), (map[int32]int64{0: 3, 1: 4, 2: 7, 3: 5}); !maps.Equal(got, want) {
		t.Fatalf("after a claim and a begin: epochs %v, want %v", got, want)
	}
}

// The instances a step's drain and the mover's rest wait for: those that
// claimed a partition or committed a checkpoint of one within the window
// (a new instance counts from its claim, before its first checkpoint),
// but not those that said they stopped (Sink.LeaveMove), nor those whose
// partitions were last written before the window.
func TestCountingInstancesAreThoseClaimingOrCommitting(t *testing.T) {
	ctx := context.Background()
	dsn, db := testenv.LedgerDB(t)
	d := open(ctx, t, dsn)
	now := time.Now().UTC()
	// a claimed just now (no checkpoint yet), b holds two partitions, one
	// written lately, in another group; c's was last written a minute ago.
	for _, c := range []struct {
		group, owner string
		part         int32
		at           time.Time
	}{{"g", "a", 0, now}, {"g", "b", 1, now.Add(-time.Minute)}, {"h", "b", 0, now.Add(-2 * time.Second)}, {"g", "c", 2, now.Add(-time.Minute)}} {
		if _, err := d.Control().Claim(ctx, driver.Scope{Group: c.group, Topic: "t"}, c.owner, []int32{c.part}, c.at); err != nil {
			t.Fatal(err)
		}
	}
	counting := func() []string {
		got, err := mysqldriver.CountingInstances(ctx, db, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := counting(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("counting instances %q, want a and b", got)
	}
	announced := driver.MoveCursor{Version: 2, Moving: true, AnnouncedBelow: "k"}
	if err := d.Control().AwaitStep(ctx, "a", announced); err != nil {
		t.Fatal(err)
	}
	if err := d.Control().AwaitStep(ctx, "b", driver.MoveCursor{}); err != nil {
		t.Fatal(err)
	}
	if got := counting(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("counting instances after b stopped: %q, want a (waiting for a step, it counts on)", got)
	}
}
