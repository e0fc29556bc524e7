package mysqldriver_test

import (
	"context"
	"testing"
	"time"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
)

// On a server whose system time zone is east of UTC (Asia/Tokyo, UTC+9),
// a transaction's age is still measured right: INNODB_TRX.trx_started is
// in the system zone, the sessions run in UTC. Measured across zones, a
// frozen coordinator's prepared branch looked nine hours younger than it
// was, and recovery never ended its connection: its locks held until
// someone intervened. The server is one of the test's own (the shared
// ones run in UTC and are never reconfigured).
func TestTransactionAgeOnServerEastOfUTC(t *testing.T) {
	ctx := context.Background()
	admin := testenv.OwnMariaDB(t, "TZ=Asia/Tokyo")
	dsn := ledgerDB(t, admin, "")
	frozen, _ := openSink(t, 1, "", dsn)
	if _, err := frozen.Claim(ctx, []int32{0}); err != nil {
		t.Fatal(err)
	}
	tx := checkpoint(t, frozen, 1, "prepare", []int{0}, "f") // attached to its connection: frozen
	other, d := openSink(t, 1, "", dsn)
	var zone string
	if err := d.Server(0).DB().Get(&zone, `SELECT @@system_time_zone`); err != nil || zone != "JST" {
		t.Fatalf("the server's system time zone is %q (%v), want JST: the test would prove nothing", zone, err)
	}
	inDoubt, err := other.InDoubtBranches(ctx)
	if err != nil || len(inDoubt) != 1 {
		t.Fatalf("branches in doubt: %v (%v), want the frozen one", inDoubt, err)
	}
	const minAge = 2 * time.Second
	time.Sleep(minAge + 500*time.Millisecond)

	s, err := d.Server(0).Session(ctx, inDoubt[0].Qual.Conn)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Exists || !s.TxKnown || !s.InTx || s.TxAge < minAge || s.TxAge > time.Minute {
		t.Fatalf("the frozen connection's session: %+v; want a transaction between %v and a minute old", s, minAge)
	}

	deadline := time.Now().Add(20 * time.Second)
	var res txsink.RecoveryResult
	for res.RolledBack == 0 {
		if res, err = other.Recover(ctx, minAge); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the frozen coordinator's branch is still in doubt: %+v", res)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if res.Ended == 0 && res.RolledBack == 0 {
		t.Fatalf("recovery did not end the frozen connection: %+v", res)
	}
	if _, ok := balance(t, d, 0, "f0"); ok {
		t.Fatal("the rolled-back write is visible")
	}
	drop(tx)
}
