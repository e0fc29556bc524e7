package txsink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/integration/harness"
	"github.com/billing/ledger/migrations"
)

// newSink opens a Sink over a fresh database with the schema applied. Two
// sinks over the same dsn are two instances of the service.
func newSink(t *testing.T, dsn string, branches int) *Sink {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, Config{
		DSNs: []string{dsn}, Branches: branches, Group: "g", Topic: "billing",
		LockWaitTimeout: 2 * time.Second, StepTimeout: 10 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func newDatabase(t *testing.T) string {
	t.Helper()
	dsn := harness.NewDatabase(t)
	db, err := sqlx.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(context.Background(), db.DB, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	return dsn
}

func writeBalance(account string, amount int64) func(context.Context, *Branch) error {
	return func(ctx context.Context, b *Branch) error {
		_, err := b.Exec(ctx, `INSERT INTO account_balances (account_id, currency, balance_minor, event_count, updated_at)
			VALUES (?, 'EUR', ?, 1, NOW(6)) ON DUPLICATE KEY UPDATE balance_minor = balance_minor + VALUES(balance_minor), event_count = event_count + 1`, account, amount)
		return err
	}
}

func balance(t *testing.T, s *Sink, account string) (int64, bool) {
	t.Helper()
	var v []int64
	if err := s.Control().Select(&v, `SELECT balance_minor FROM account_balances WHERE account_id = ?`, account); err != nil {
		t.Fatal(err)
	}
	if len(v) == 0 {
		return 0, false
	}
	return v[0], true
}

func inDoubt(t *testing.T, s *Sink) []InDoubt {
	t.Helper()
	b, err := s.InDoubtBranches(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// XA RECOVER is server-wide: keep the branches of this test's sinks.
	var mine []InDoubt
	for _, x := range b {
		if x.ID.Instance == s.instance {
			mine = append(mine, x)
		}
	}
	return mine
}

// crash drops the coordinator's connections without resolving anything, as
// a killed process would: prepared branches stay in doubt on the server.
func crash(tx *Txn) {
	for _, b := range tx.started() {
		b.release(false)
	}
}

func claim(t *testing.T, s *Sink, parts ...int32) map[int32]Position {
	t.Helper()
	p, err := s.Claim(context.Background(), parts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Property: a checkpoint's writes on several participants become visible
// together, only after the decision and XA COMMIT, and its offsets move in
// the same decision.
func TestCheckpointCommitsAllParticipantsAndOffsets(t *testing.T) {
	ctx := context.Background()
	s := newSink(t, newDatabase(t), 3)
	pos := claim(t, s, 0, 1)
	if pos[0].NextOffset != StartOffset || pos[0].Epoch != 1 {
		t.Fatalf("fresh claim = %+v", pos[0])
	}
	tx := s.Begin(1)
	if err := tx.Each(ctx, []int{0, 2}, func(ctx context.Context, b *Branch) error {
		return writeBalance("acct-"+string(rune('a'+b.Participant)), 100)(ctx, b)
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	if got := len(inDoubt(t, s)); got != 2 {
		t.Fatalf("prepared branches = %d, want 2", got)
	}
	if _, ok := balance(t, s, "acct-a"); ok {
		t.Fatal("prepared write visible before commit")
	}
	if err := tx.Decide(ctx, []PartitionCut{{Partition: 0, Epoch: 1, NextOffset: 10}, {Partition: 1, Epoch: 1, NextOffset: 7}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"acct-a", "acct-c"} {
		if v, ok := balance(t, s, a); !ok || v != 100 {
			t.Fatalf("%s = %d,%v", a, v, ok)
		}
	}
	got, err := s.Positions(ctx, []int32{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].NextOffset != 10 || got[1].NextOffset != 7 {
		t.Fatalf("offsets = %+v", got)
	}
	if n := len(inDoubt(t, s)); n != 0 {
		t.Fatalf("%d branches left in doubt", n)
	}
}

// Property (prepared statements): a statement prepared on a participant's
// connection runs inside that checkpoint's branch, is reused by later
// checkpoints on the kept connection (also after a clean abort), and never
// outlives it: once a failed checkpoint dropped the connection, the next
// one prepares again on its new connection.
func TestExecPreparedFollowsTheConnection(t *testing.T) {
	ctx := context.Background()
	s := newSink(t, newDatabase(t), 1)
	claim(t, s, 0)
	const q = `INSERT INTO account_balances (account_id, currency, balance_minor, event_count, updated_at)
		VALUES (?, 'EUR', ?, 1, NOW(6)) ON DUPLICATE KEY UPDATE balance_minor = balance_minor + VALUES(balance_minor), event_count = event_count + 1`
	var conns []*pinned
	const (
		commit = iota
		abort
		drop
	)
	run := func(ckpt uint64, amount int64, end int) {
		t.Helper()
		tx := s.Begin(ckpt)
		err := tx.Each(ctx, []int{0}, func(ctx context.Context, b *Branch) error {
			conns = append(conns, b.pc)
			_, err := b.ExecPrepared(ctx, q, "p", amount)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		switch end {
		case abort:
			if err := tx.Abort(ctx); err != nil {
				t.Fatal(err)
			}
			return
		case drop:
			crash(tx)
			return
		}
		if err := tx.Prepare(ctx); err != nil {
			t.Fatal(err)
		}
		if err := tx.Decide(ctx, []PartitionCut{{Partition: 0, Epoch: 1, NextOffset: int64(ckpt)}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	run(1, 1, commit)
	run(2, 10, abort)
	run(3, 100, commit)
	if conns[0] != conns[2] || len(conns[2].stmts) != 1 {
		t.Fatalf("later checkpoints did not reuse the connection and its statement (%p %p, %d statements)", conns[0], conns[2], len(conns[2].stmts))
	}
	run(4, 1000, drop)
	run(5, 10000, commit)
	if conns[4] == conns[3] || len(conns[4].stmts) != 1 {
		t.Fatal("the dropped connection or its statement was reused")
	}
	if v, ok := balance(t, s, "p"); !ok || v != 10101 {
		t.Fatalf("balance = %d,%v, want 10101 (the aborted 10 and the dropped 1000 left out)", v, ok)
	}
	if n := len(inDoubt(t, s)); n != 0 {
		t.Fatalf("%d branches left in doubt", n)
	}
}

// Property: an empty (read-only) branch is not prepared.
func TestReadOnlyBranchIsNotPrepared(t *testing.T) {
	ctx := context.Background()
	s := newSink(t, newDatabase(t), 2)
	claim(t, s, 0)
	tx := s.Begin(1)
	err := tx.Each(ctx, []int{0, 1}, func(ctx context.Context, b *Branch) error {
		if b.Participant == 1 {
			var n []int
			return b.Select(ctx, &n, `SELECT COUNT(*) FROM dedup_keys`)
		}
		return writeBalance("x", 1)(ctx, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	b := inDoubt(t, s)
	if len(b) != 1 || !strings.HasPrefix(b[0].Xid.Bqual, "p0-c") {
		t.Fatalf("in doubt = %+v, want only p0", b)
	}
	if err := tx.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(inDoubt(t, s)); n != 0 {
		t.Fatalf("%d branches left after abort", n)
	}
}

// Property (fencing): once another instance claimed a partition, nothing the
// previous owner decides for it commits, even a checkpoint already prepared.
func TestZombieIsFenced(t *testing.T) {
	ctx := context.Background()
	dsn := newDatabase(t)
	zombie, successor := newSink(t, dsn, 1), newSink(t, dsn, 1)
	held := claim(t, zombie, 0)
	tx := zombie.Begin(1)
	if err := tx.Each(ctx, []int{0}, writeBalance("z", 5)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	claim(t, successor, 0) // the group moved partition 0
	err := tx.Decide(ctx, []PartitionCut{{Partition: 0, Epoch: held[0].Epoch, NextOffset: 99}})
	var fe *FencedError
	if !errors.Is(err, ErrFenced) || !errors.As(err, &fe) || fe.StoredOwner != successor.instance {
		t.Fatalf("Decide = %v, want fenced by successor", err)
	}
	if err := tx.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := balance(t, zombie, "z"); ok {
		t.Fatal("fenced checkpoint's write is visible")
	}
	pos, _ := successor.Positions(ctx, []int32{0})
	if pos[0].NextOffset != StartOffset || pos[0].Epoch != 2 {
		t.Fatalf("fenced checkpoint moved offsets: %+v", pos[0])
	}
}

// Property (recovery, roll forward): branches of a checkpoint decided commit
// whose coordinator died before XA COMMIT are committed by the next
// instance's recovery.
func TestRecoveryCommitsDecidedBranches(t *testing.T) {
	ctx := context.Background()
	dsn := newDatabase(t)
	dead := newSink(t, dsn, 2)
	claim(t, dead, 0)
	tx := dead.Begin(7)
	if err := tx.Each(ctx, []int{0, 1}, func(ctx context.Context, b *Branch) error {
		return writeBalance(fmt.Sprintf("r%d", b.Participant), 42)(ctx, b)
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Decide(ctx, []PartitionCut{{Partition: 0, Epoch: 1, NextOffset: 3}}); err != nil {
		t.Fatal(err)
	}
	crash(tx)
	if _, ok := balance(t, dead, "rp0"); ok {
		t.Fatal("visible before commit")
	}
	next := newSink(t, dsn, 2)
	// Even a huge minimum age does not hold back a decided branch.
	res, err := next.Recover(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if res.Committed != 2 || res.RolledBack != 0 {
		t.Fatalf("recovery = %+v", res)
	}
	for _, a := range []string{"r0", "r1"} {
		if v, ok := balance(t, next, a); !ok || v != 42 {
			t.Fatalf("%s = %d,%v after recovery", a, v, ok)
		}
	}
}

// Property (recovery, roll back): an undecided branch is left alone while
// young, rolled back under a compare-and-set abort once old, and its
// coordinator coming back late cannot commit it.
func TestRecoveryAbortsOldUndecidedBranches(t *testing.T) {
	ctx := context.Background()
	dsn := newDatabase(t)
	slow := newSink(t, dsn, 1)
	claim(t, slow, 0)
	tx := slow.Begin(1)
	if err := tx.Each(ctx, []int{0}, writeBalance("u", 1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	// Detach the branch as a frozen or dead process's would be.
	crash(tx)
	other := newSink(t, dsn, 1)
	res, err := other.Recover(ctx, time.Hour)
	if err != nil || res.Skipped != 1 || len(inDoubt(t, slow)) != 1 {
		t.Fatalf("young branch: res=%+v err=%v", res, err)
	}
	res, err = other.Recover(ctx, 0)
	if err != nil || res.RolledBack != 1 {
		t.Fatalf("old branch: res=%+v err=%v", res, err)
	}
	if len(inDoubt(t, slow)) != 0 {
		t.Fatal("branch still in doubt")
	}
	err = tx.Decide(ctx, []PartitionCut{{Partition: 0, Epoch: 1, NextOffset: 5}})
	if !errors.Is(err, ErrAborted) {
		t.Fatalf("late Decide = %v, want ErrAborted", err)
	}
	if _, ok := balance(t, other, "u"); ok {
		t.Fatal("rolled-back write visible")
	}
	pos, _ := other.Positions(ctx, []int32{0})
	if pos[0].NextOffset != StartOffset {
		t.Fatalf("aborted checkpoint moved offsets: %+v", pos[0])
	}
}

// Property (recovery is scoped to its deployment): XA RECOVER lists the
// prepared branches of every database on the server. Another ledger on the
// same server, whose decision table says nothing of them, must leave them
// alone however old they are, even a branch already decided commit in its
// own database; that deployment's next instance then commits it.
func TestRecoveryLeavesOtherDeploymentsBranches(t *testing.T) {
	ctx := context.Background()
	mine := newDatabase(t)
	dead := newSink(t, mine, 1)
	claim(t, dead, 0)
	decided := dead.Begin(1)
	if err := decided.Each(ctx, []int{0}, writeBalance("d", 5)); err != nil {
		t.Fatal(err)
	}
	if err := decided.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	if err := decided.Decide(ctx, []PartitionCut{{Partition: 0, Epoch: 1, NextOffset: 2}}); err != nil {
		t.Fatal(err)
	}
	crash(decided)
	undecided := dead.Begin(2)
	if err := undecided.Each(ctx, []int{0}, writeBalance("u", 7)); err != nil {
		t.Fatal(err)
	}
	if err := undecided.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	crash(undecided)

	neighbour := newSink(t, newDatabase(t), 1)
	res, err := neighbour.Recover(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(inDoubt(t, dead)); n != 2 {
		t.Fatalf("another deployment's recovery (%+v) resolved our branches: %d left in doubt, want 2", res, n)
	}
	for _, b := range mustInDoubt(t, neighbour) {
		if b.ID.Instance == dead.instance {
			t.Fatalf("another deployment lists our branch %s as its own", b.Xid.Gtrid)
		}
	}

	next := newSink(t, mine, 1)
	res, err = next.Recover(ctx, 0)
	if err != nil || res.Committed != 1 || res.RolledBack != 1 {
		t.Fatalf("own recovery = %+v, %v; want 1 committed, 1 rolled back", res, err)
	}
	if v, ok := balance(t, next, "d"); !ok || v != 5 {
		t.Fatalf("decided write = %d,%v after recovery, want 5", v, ok)
	}
	if _, ok := balance(t, next, "u"); ok {
		t.Fatal("undecided write visible")
	}
}

func mustInDoubt(t *testing.T, s *Sink) []InDoubt {
	t.Helper()
	b, err := s.InDoubtBranches(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Property (recovery of a frozen coordinator): on MariaDB a prepared branch
// stays attached to the live connection that prepared it, and XA ROLLBACK
// from anywhere else answers XAER_NOTA. Recovery must not take that for
// "resolved": it ends the holding connection once the branch is old, then
// rolls it back; the frozen coordinator, thawed, cannot commit.
func TestRecoveryDetachesBranchOfFrozenCoordinator(t *testing.T) {
	ctx := context.Background()
	dsn := newDatabase(t)
	frozen := newSink(t, dsn, 1)
	claim(t, frozen, 0)
	tx := frozen.Begin(1)
	if err := tx.Each(ctx, []int{0}, writeBalance("f", 1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	// The coordinator keeps its connection open, as a frozen process does.
	other := newSink(t, dsn, 1)
	res, err := other.Recover(ctx, 0)
	if err != nil || res.RolledBack != 0 || !res.Remaining[tx.Gtrid()] {
		t.Fatalf("first pass: %+v, %v; want the attached branch still in doubt", res, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for res.RolledBack == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if res, err = other.Recover(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	if res.RolledBack != 1 || len(inDoubt(t, frozen)) != 0 {
		t.Fatalf("after ending the holder: %+v, in doubt %d", res, len(inDoubt(t, frozen)))
	}
	// A row the branch locked is free again.
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := other.Control().ExecContext(lctx, `INSERT INTO account_balances VALUES ('f', 'EUR', 7, 1, NOW(6))`); err != nil {
		t.Fatalf("row still locked: %v", err)
	}
	if err := tx.Decide(ctx, []PartitionCut{{Partition: 0, Epoch: 1, NextOffset: 5}}); !errors.Is(err, ErrAborted) {
		t.Fatalf("thawed coordinator's Decide = %v, want ErrAborted", err)
	}
	if v, _ := balance(t, other, "f"); v != 7 {
		t.Fatalf("balance = %d, want only the later insert", v)
	}
}

// Property: decision rows are pruned only when old and no branch of their
// checkpoint is in doubt.
func TestPruneDecisionsKeepsInDoubt(t *testing.T) {
	ctx := context.Background()
	s := newSink(t, newDatabase(t), 1)
	for _, g := range []string{"blg1-aa-1-1", "blg1-aa-2-1"} {
		if _, err := s.decide(ctx, g, outcomeAbort); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.PruneDecisions(ctx, 0, map[string]bool{"?server0": true}, 100); err == nil {
		t.Fatal("pruned with an unreachable server")
	}
	n, err := s.PruneDecisions(ctx, 0, map[string]bool{"blg1-aa-2-1": true}, 100)
	if err != nil || n != 1 {
		t.Fatalf("pruned %d, %v", n, err)
	}
	if _, found, _ := s.lookupDecision(ctx, "blg1-aa-2-1"); !found {
		t.Fatal("in-doubt checkpoint's decision was pruned")
	}
}

func TestBqualRoundTrip(t *testing.T) {
	b := bqual(12, 0xdeadbeef, "0123456789abcdef")
	p, c, scope, ok := parseBqual(b)
	if !ok || p != 12 || c != 0xdeadbeef || scope != "0123456789abcdef" || len(b) > 64 {
		t.Fatalf("%q -> %d %x %q %v", b, p, c, scope, ok)
	}
	for _, bad := range []string{"", "p", "p1", "p-c1", "px-c1", "p1-cz", "q1-c1", "p1-c1", "p1-c1-s"} {
		if _, _, _, ok := parseBqual(bad); ok {
			t.Errorf("parsed %q", bad)
		}
	}
}

func TestXidRoundTrip(t *testing.T) {
	id := GlobalID{Instance: "0a1b2c3d4e5f", Checkpoint: 1<<64 - 1, Created: time.UnixMilli(1<<43 - 1)}
	g := id.String()
	if len(g) > 64 {
		t.Fatalf("gtrid %q is %d bytes", g, len(g))
	}
	back, ok := ParseGlobalID(g)
	if !ok || back.Instance != id.Instance || back.Checkpoint != id.Checkpoint || !back.Created.Equal(id.Created) {
		t.Fatalf("round trip %q -> %+v", g, back)
	}
	for _, bad := range []string{"", "blg1-", "blg2-a-1-1", "blg1-a-x-1", "blg1-a-1", "other"} {
		if _, ok := ParseGlobalID(bad); ok {
			t.Errorf("parsed %q", bad)
		}
	}
}

// Branch sessions run READ COMMITTED, whichever name the server gives the
// variable: under REPEATABLE READ, locking reads of absent rows take gap
// locks that deadlock instances seeding new accounts.
func TestBranchesRunReadCommitted(t *testing.T) {
	ctx := context.Background()
	s := newSink(t, newDatabase(t), 1)
	tx := s.Begin(1)
	var level string
	err := tx.Each(ctx, []int{0}, func(ctx context.Context, b *Branch) error {
		var v []string
		if err := b.Select(ctx, &v, `SELECT @@session.tx_isolation`); err != nil {
			if err2 := b.Select(ctx, &v, `SELECT @@session.transaction_isolation`); err2 != nil {
				return errors.Join(err, err2)
			}
		}
		level = v[0]
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if level != "READ-COMMITTED" {
		t.Fatalf("isolation = %q", level)
	}
	if err := tx.Abort(ctx); err != nil {
		t.Fatal(err)
	}
}
