package mysqldriver_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/billing/ledger/internal/failpoint"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/driver"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

// The protocol's rules are specified by the scenario files of package
// txsink over the in-memory driver. These tests run the sink on the real
// server where the server's own behaviour matters: prepared statements on
// pinned connections, isolation, MariaDB's attached branches and the
// connection it takes to end them, accounts, pools.

// ledgerDB migrates a new database on the server of admin (the test
// server when admin is empty).
func ledgerDB(t *testing.T, admin, name string) string {
	t.Helper()
	if admin == "" {
		admin = testenv.MySQL(t)
	}
	if name == "" {
		name = testenv.RandomName("t_")
	}
	dsn, _ := testenv.LedgerDBOn(t, admin, name)
	return dsn
}

func openSink(t *testing.T, branches int, fps string, dsns ...string) (*txsink.Sink, *mysqldriver.Driver) {
	t.Helper()
	fp, err := failpoint.Parse(fps)
	if err != nil {
		t.Fatal(err)
	}
	s, d, err := mysqldriver.OpenSink(context.Background(), dsns, mysqldriver.Options{LockWaitTimeout: 2 * time.Second},
		txsink.Config{Branches: branches, Group: "g", Topic: "billing", StepTimeout: 10 * time.Second, Logger: testenv.Logger(), Failpoints: fp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		d.Close()
	})
	return s, d
}

func writeBalance(account string, amount int64) func(context.Context, *txsink.Branch) error {
	return func(ctx context.Context, b *txsink.Branch) error {
		return b.WriteConn(func(c driver.Conn) error {
			_, err := c.(*mysqldriver.Conn).ExecPrepared(ctx, `INSERT INTO account_balances (account_id, currency, balance_minor, event_count, updated_at)
			VALUES (?, 'EUR', ?, 1, NOW(6)) ON DUPLICATE KEY UPDATE balance_minor = balance_minor + VALUES(balance_minor), event_count = event_count + 1`, account, amount)
			return err
		})
	}
}

func balance(t *testing.T, d *mysqldriver.Driver, server int, account string) (int64, bool) {
	t.Helper()
	var v []int64
	if err := d.Server(server).DB().Select(&v, `SELECT balance_minor FROM account_balances WHERE account_id = ?`, account); err != nil {
		t.Fatal(err)
	}
	if len(v) == 0 {
		return 0, false
	}
	return v[0], true
}

// checkpoint runs one checkpoint writing account on the given participants
// up to the end given: "prepare", "decide" or "commit".
func checkpoint(t *testing.T, s *txsink.Sink, n uint64, end string, participants []int, account string) *txsink.Txn {
	t.Helper()
	ctx := context.Background()
	tx := s.Begin(n)
	err := tx.Each(ctx, participants, func(ctx context.Context, b *txsink.Branch) error {
		return writeBalance(fmt.Sprintf("%s%d", account, b.Participant), 1)(ctx, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	if end == "prepare" {
		return tx
	}
	if err := tx.Decide(ctx, []txsink.PartitionCut{{Partition: 0, Epoch: 1, NextOffset: int64(n)}}, nil, nil); err != nil {
		t.Fatal(err)
	}
	if end == "decide" {
		return tx
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return tx
}

// Prepared statements run inside the branch, are kept with the pinned
// connection for later checkpoints (also after a clean abort) and never
// outlive it; read-only branches are not prepared; branches run READ
// COMMITTED, whichever name the server gives the variable.
func TestBranchesOnPinnedConnections(t *testing.T) {
	ctx := context.Background()
	s, d := openSink(t, 1, "", ledgerDB(t, "", ""))
	if _, err := s.Claim(ctx, []int32{0}); err != nil {
		t.Fatal(err)
	}
	var conns []*mysqldriver.Conn
	var level string
	run := func(n uint64, amount int64, end string) {
		t.Helper()
		tx := s.Begin(n)
		err := tx.Each(ctx, []int{0}, func(ctx context.Context, b *txsink.Branch) error {
			_ = b.WriteConn(func(c driver.Conn) error { conns = append(conns, c.(*mysqldriver.Conn)); return nil })
			c := conns[len(conns)-1]
			var v []string
			if err := c.Select(ctx, &v, `SELECT @@session.tx_isolation`); err != nil {
				if err2 := c.Select(ctx, &v, `SELECT @@session.transaction_isolation`); err2 != nil {
					return errors.Join(err, err2)
				}
			}
			level = v[0]
			return writeBalance("p", amount)(ctx, b)
		})
		if err != nil {
			t.Fatal(err)
		}
		switch end {
		case "abort":
			if err := tx.Abort(ctx); err != nil {
				t.Fatal(err)
			}
			return
		case "drop": // the coordinator dies with its connection
			tx.Abandon()
			return
		}
		if err := tx.Prepare(ctx); err != nil {
			t.Fatal(err)
		}
		if err := tx.Decide(ctx, []txsink.PartitionCut{{Partition: 0, Epoch: 1, NextOffset: int64(n)}}, nil, nil); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	run(1, 1, "commit")
	run(2, 10, "abort")
	run(3, 100, "commit")
	if conns[0] != conns[2] || conns[2].Prepared() != 1 {
		t.Fatalf("later checkpoints did not reuse the connection and its statement (%p %p, %d statements)", conns[0], conns[2], conns[2].Prepared())
	}
	run(4, 1000, "drop")
	run(5, 10000, "commit")
	if conns[4] == conns[3] || conns[4].Prepared() != 1 {
		t.Fatal("the dropped connection or its statement was reused")
	}
	if v, ok := balance(t, d, 0, "p"); !ok || v != 10101 {
		t.Fatalf("balance = %d,%v, want 10101 (the aborted 10 and the dropped 1000 left out)", v, ok)
	}
	if level != "READ-COMMITTED" {
		t.Fatalf("isolation = %q", level)
	}

	// A read-only branch is not prepared.
	tx := s.Begin(6)
	err := tx.Each(ctx, []int{0}, func(ctx context.Context, b *txsink.Branch) error {
		return b.Read(func(st driver.StoreTx) error {
			_, err := st.LockBalances(ctx, []driver.BalanceKey{{Account: "p", Currency: "EUR"}})
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := s.InDoubtBranches(ctx); len(b) != 0 {
		t.Fatalf("a read-only branch was prepared: %+v", b)
	}
}

// On MariaDB a prepared branch stays attached to the live connection that
// prepared it: recovery of a frozen coordinator's old branch ends that
// connection (the service's own account may), then rolls the branch back;
// the rows it locked are free again, and the coordinator, thawed, cannot
// commit.
func TestRecoveryEndsFrozenCoordinatorsConnection(t *testing.T) {
	ctx := context.Background()
	dsn := ledgerDB(t, "", "")
	frozen, _ := openSink(t, 1, "", dsn)
	if _, err := frozen.Claim(ctx, []int32{0}); err != nil {
		t.Fatal(err)
	}
	tx := checkpoint(t, frozen, 1, "prepare", []int{0}, "f") // writes "f0"
	other, d := openSink(t, 1, "", dsn)
	deadline := time.Now().Add(20 * time.Second)
	var res txsink.RecoveryResult
	for res.RolledBack == 0 {
		var err error
		if res, err = other.Recover(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the frozen coordinator's branch is still in doubt: %+v", res)
		}
		time.Sleep(200 * time.Millisecond)
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := d.Server(0).DB().ExecContext(lctx, `INSERT INTO account_balances VALUES ('f0', 'EUR', 7, 1, NOW(6))`); err != nil {
		t.Fatalf("row still locked: %v", err)
	}
	if err := tx.Decide(ctx, []txsink.PartitionCut{{Partition: 0, Epoch: 1, NextOffset: 5}}, nil, nil); !errors.Is(err, txsink.ErrAborted) {
		t.Fatalf("thawed coordinator's Decide = %v, want ErrAborted", err)
	}
	if v, _ := balance(t, d, 0, "f0"); v != 7 {
		t.Fatalf("balance = %d, want only the later insert", v)
	}
}

// Two ledgers whose control databases have the same name, on two servers,
// share a shard server. One's recovery must leave the other's branches
// alone however old, even one decided commit in the other's control
// database; the owner's next instance then commits it. (When the recovery
// scope was a hash of the control database's name, the neighbour rolled
// back both.)
func TestTwoLedgersShareAShardServer(t *testing.T) {
	ctx := context.Background()
	name := testenv.RandomName("t_same_")
	shared := testenv.MySQL(t)
	controlA, controlB := ledgerDB(t, shared, name), ledgerDB(t, testenv.MySQL2(t), name)
	shardA, shardB := ledgerDB(t, shared, ""), ledgerDB(t, shared, "")

	a, _ := openSink(t, 1, "", controlA, shardA)
	if _, err := a.Claim(ctx, []int32{0}); err != nil {
		t.Fatal(err)
	}
	// Participant 1 is the shard: the decided and the undecided branch of
	// ledger A both live on the shared server.
	decided := checkpoint(t, a, 1, "decide", []int{1}, "decided")
	undecided := checkpoint(t, a, 2, "prepare", []int{1}, "undecided")
	drop(decided, undecided)

	b, _ := openSink(t, 1, "", controlB, shardB)
	res, err := b.Recover(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Committed+res.RolledBack+res.Ended != 0 {
		t.Fatalf("ledger B's recovery touched ledger A's branches: %+v", res)
	}
	inDoubt, err := a.InDoubtBranches(ctx)
	if err != nil || len(inDoubt) != 2 {
		t.Fatalf("ledger A's branches in doubt: %d (%v), want 2", len(inDoubt), err)
	}

	a2, da := openSink(t, 1, "", controlA, shardA)
	res, err = a2.Recover(ctx, 0)
	if err != nil || res.Committed != 1 || res.RolledBack != 1 {
		t.Fatalf("ledger A's own recovery = %+v, %v; want 1 committed, 1 rolled back", res, err)
	}
	if v, ok := balance(t, da, 1, "decided1"); !ok || v != 1 {
		t.Fatalf("the decided write = %d,%v after recovery", v, ok)
	}
	if _, ok := balance(t, da, 1, "undecided1"); ok {
		t.Fatal("the undecided write is visible")
	}
}

// drop abandons the transactions as a dying process would (their prepared
// branches detach and stay in doubt).
func drop(txs ...*txsink.Txn) {
	for _, tx := range txs {
		tx.Abandon()
	}
}

// Another account prepares a branch with the service's gtrid format, the
// ledger's identity and the id of one of our own live connections, but
// without the ledger's MAC: recovery must not decide, resolve or end
// anything for it, pass after pass.
func TestForgedBranchOfAnotherAccount(t *testing.T) {
	ctx := context.Background()
	dsn := ledgerDB(t, "", "")
	s, d := openSink(t, 1, "", dsn)
	if _, err := s.Claim(ctx, []int32{0}); err != nil {
		t.Fatal(err)
	}
	// A live connection of ours, idle in the pool.
	victim, err := d.Server(0).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close(true)
	fx := fixtures{}.New(ctx, t)
	mallory, err := fx.Other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	forged := driver.Xid{Format: txsink.FormatID, Gtrid: "blg1-0a0b0c0d0e0f-1-1",
		Bqual: fmt.Sprintf("p0-c%x-l%s-m000000000000", victim.ID(), s.Ledger())}
	for _, v := range []driver.Verb{driver.Start, driver.End, driver.Prepare} {
		if err := mallory.XA(ctx, v, forged); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = mallory.XA(context.Background(), driver.Rollback, forged)
		mallory.Close(false)
	})
	for pass := range 2 {
		res, err := s.Recover(ctx, 0)
		if err != nil || res.Committed+res.RolledBack+res.Ended != 0 || len(res.Remaining) != 0 {
			t.Fatalf("pass %d over a forged branch: %+v, %v", pass, res, err)
		}
	}
	if sess, err := d.Server(0).Session(ctx, victim.ID()); err != nil || !sess.Exists {
		t.Fatalf("our connection named in the forged branch was ended: %+v, %v", sess, err)
	}
	if _, decided, err := d.Control().Lookup(ctx, forged.Gtrid); err != nil || decided {
		t.Fatalf("a decision was made for the forged gtrid (%v)", err)
	}
	xs, err := d.Server(0).Recover(ctx)
	if err != nil || !slices.Contains(xs, forged) {
		t.Fatalf("the forged branch was resolved by the service (%v)", err)
	}
}

// When a checkpoint's first XA COMMIT fails, no connection of the
// checkpoint stays checked out of the pool: the branches left prepared are
// dropped with their connections (recovery rolls them forward).
func TestFailedCommitReleasesEveryConnection(t *testing.T) {
	ctx := context.Background()
	dsn := ledgerDB(t, "", "")
	s, d := openSink(t, 3, "between-commits=error", dsn)
	if _, err := s.Claim(ctx, []int32{0}); err != nil {
		t.Fatal(err)
	}
	tx := checkpoint(t, s, 1, "decide", []int{0, 1, 2}, "c")
	if err := tx.Commit(ctx); !errors.Is(err, failpoint.ErrInjected) {
		t.Fatalf("Commit = %v, want the armed failure", err)
	}
	// The committed branch's connection may be kept for the next
	// checkpoint (one); the failed ones must not be held.
	if st := d.Server(0).DB().Stats(); st.InUse > 1 {
		t.Fatalf("%d connections still checked out after the failed commit, want at most the one kept", st.InUse)
	}
	s.Close()
	if st := d.Server(0).DB().Stats(); st.InUse != 0 {
		t.Fatalf("%d connections checked out after Close", st.InUse)
	}
	other, _ := openSink(t, 1, "", dsn)
	res, err := other.Recover(ctx, time.Hour)
	if err != nil || res.Committed != 2 {
		t.Fatalf("recovery after the failed commit = %+v, %v; want the 2 prepared branches committed", res, err)
	}
}

// OpenSink sizes each server's pool for the branches, OtherConns and the
// read-ahead's connections, and the cleanup pool apart.
func TestOpenSinkPoolSizes(t *testing.T) {
	s, d, err := mysqldriver.OpenSink(context.Background(), []string{ledgerDB(t, "", "")}, mysqldriver.Options{LockWaitTimeout: 2 * time.Second, ReadAheadConns: 3},
		txsink.Config{Branches: 2, Group: "g", Topic: "billing", StepTimeout: 10 * time.Second, Logger: testenv.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	defer s.Close()
	sv := d.Servers()[0].(*mysqldriver.Server)
	if got, want := sv.DB().Stats().MaxOpenConnections, 2+mysqldriver.OtherConns+3; got != want {
		t.Errorf("pool of %d connections, want %d (2 branches, OtherConns, 3 read-ahead)", got, want)
	}
	if got := sv.CleanupDB().Stats().MaxOpenConnections; got != mysqldriver.DefaultCleanupConns {
		t.Errorf("cleanup pool of %d connections, want %d", got, mysqldriver.DefaultCleanupConns)
	}
}
