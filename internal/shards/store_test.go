package shards_test

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/billing/ledger/internal/shards"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// server is one ledger database of a test, on one of the two servers.
type server struct {
	dsn string
	db  *sqlx.DB
}

// servers makes n fresh ledger databases, alternating between the two
// MySQL servers (the first on MYSQL_DSN's).
func servers(t *testing.T, n int) []server {
	t.Helper()
	admins := []string{testenv.MySQL(t), testenv.MySQL2(t)}
	out := make([]server, n)
	for i := range out {
		dsn, db := testenv.LedgerDBOn(t, admins[i%2], testenv.RandomName("t_"))
		out[i] = server{dsn, db}
	}
	return out
}

func open(t *testing.T, list ...server) *mysqldriver.Driver {
	t.Helper()
	var dsns []string
	for _, s := range list {
		dsns = append(dsns, s.dsn)
	}
	d, err := mysqldriver.Open(t.Context(), dsns, mysqldriver.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

func ensure(t *testing.T, list ...server) (string, shards.Layout, error) {
	t.Helper()
	return ensureOn(t, open(t, list...), list...)
}

// ensureOn is ensure on d, opened on list; it may run on any goroutine.
func ensureOn(t *testing.T, d *mysqldriver.Driver, list ...server) (string, shards.Layout, error) {
	hosts := make([]string, len(list))
	for i, s := range list {
		hosts[i] = shards.Host(s.dsn)
	}
	return shards.Ensure(t.Context(), d, hosts, txsink.NewIdentity, "the test", testenv.Logger())
}

func refused(t *testing.T, err error, want ...string) {
	t.Helper()
	var me *shards.MismatchError
	if !errors.As(err, &me) {
		t.Fatalf("%v: want a MismatchError", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("%q does not say %q", err, w)
		}
	}
}

func identities(t *testing.T, s server) int {
	t.Helper()
	var n int
	if err := s.db.Get(&n, `SELECT COUNT(*) FROM ledger_identity`); err != nil {
		t.Fatal(err)
	}
	return n
}

// A ledger on two servers stores its layout at the first start; the same
// list starts again; the list reordered, with a server dropped, with a
// server added, or with another ledger's server is refused, naming the
// difference, and changes nothing: no ledger identity is made on a shard
// listed first.
func TestEnsureStoresTheLayoutAndRefusesOtherLists(t *testing.T) {
	sv := servers(t, 4)
	a, b, c, other := sv[0], sv[1], sv[2], sv[3]

	ledger, first, err := ensure(t, a, b)
	if err != nil {
		t.Fatal(err)
	}
	if first.Version != 1 || len(first.Servers) != 2 || first.RecordedBy != "the test" {
		t.Fatalf("first layout %+v", first)
	}
	again, layout, err := ensure(t, a, b)
	if err != nil || again != ledger || layout.Describe() != first.Describe() {
		t.Fatalf("the same list: %q %s %v; want %q %s", again, layout.Describe(), err, ledger, first.Describe())
	}
	// The same server under another host name (127.0.0.1 for localhost,
	// or the reverse) is the same server.
	alias := b
	if strings.Contains(b.dsn, "127.0.0.1") {
		alias.dsn = strings.Replace(b.dsn, "127.0.0.1", "localhost", 1)
	} else {
		alias.dsn = strings.Replace(b.dsn, "localhost", "127.0.0.1", 1)
	}
	if _, _, err := ensure(t, a, alias); err != nil {
		t.Fatalf("the same servers under another name: %v", err)
	}

	_, _, err = ensure(t, b, a)
	refused(t, err, "server 0 ("+shards.Host(b.dsn)+") is a shard server of ledger "+ledger, "the control server must come first")
	if identities(t, b) != 0 {
		t.Fatal("a start with a shard listed first made a ledger identity on it")
	}
	_, _, err = ensure(t, a)
	refused(t, err, "the ledger's server 1 (server "+first.Servers[1]+") is missing from the list", "version 1")
	// A fresh server after the ledger's is one to add: accepted, placed
	// on by nothing (billing shards add adds it); before them it is not.
	if _, layout, err := ensure(t, a, b, c); err != nil || layout.Describe() != first.Describe() {
		t.Fatalf("the ledger's servers and one to add: %s %v", layout.Describe(), err)
	}
	_, _, err = ensure(t, a, c, b)
	refused(t, err, "server 1 ("+shards.Host(c.dsn)+") (server ", "is not one of the ledger's servers")
	if _, _, err := ensure(t, other); err != nil {
		t.Fatal(err)
	}
	_, _, err = ensure(t, a, other)
	refused(t, err, "server 1 ("+shards.Host(other.dsn)+") belongs to another ledger")

	// Nothing a refused start did changed the layout.
	if _, layout, err := ensure(t, a, b); err != nil || layout.Describe() != first.Describe() {
		t.Fatalf("after the refusals: %s %v", layout.Describe(), err)
	}
}

// A ledger that predates the stored layout (an identity, rows, no layout:
// an older version ran it, then this one migrated it) adopts the list it
// starts with; from then on that list is checked. Before adopting, a list
// with the control server in a shard's place is refused.
func TestAnExistingLedgerAdoptsItsList(t *testing.T) {
	sv := servers(t, 2)
	a, b := sv[0], sv[1]
	// The older version: its sink made the identity on the control server
	// and wrote a row on each server; nothing of a layout.
	s, d, err := mysqldriver.OpenSink(t.Context(), []string{a.dsn, b.dsn}, mysqldriver.Options{}, txsink.Config{Branches: 1, Group: "g", Topic: "t", StepTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ledger := s.Ledger()
	s.Close()
	d.Close()
	for _, x := range sv {
		if _, err := x.db.Exec(`INSERT INTO account_balances (account_id, currency, balance_minor, event_count, updated_at) VALUES ('acct', 'EUR', 1, 1, NOW())`); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := a.db.Get(&n, `SELECT COUNT(*) FROM ledger_layout`); err != nil || n != 0 {
		t.Fatalf("layout rows before the first start: %d %v", n, err)
	}

	_, _, err = ensure(t, b, a)
	refused(t, err, "holds no ledger identity", "server 1 ("+shards.Host(a.dsn)+") is a control server")
	if identities(t, b) != 0 {
		t.Fatal("the refused start made a ledger identity on the shard")
	}

	got, layout, err := ensure(t, a, b)
	if err != nil || got != ledger || layout.Version != 1 || len(layout.Servers) != 2 {
		t.Fatalf("adoption: %q %s %v; want ledger %q", got, layout.Describe(), err, ledger)
	}
	for i, x := range sv {
		var row struct {
			UUID   string `db:"server_uuid"`
			Ledger string `db:"ledger_id"`
		}
		if err := x.db.Get(&row, `SELECT server_uuid, ledger_id FROM ledger_server`); err != nil || row.Ledger != ledger || row.UUID != layout.Servers[i] {
			t.Fatalf("server %d after adoption: %+v %v", i, row, err)
		}
	}
	_, _, err = ensure(t, b, a)
	refused(t, err, "is a shard server of ledger "+ledger)
	_, _, err = ensure(t, a)
	refused(t, err, "is missing from the list")
}

// Of instances starting together on a new ledger with different lists,
// exactly one stores its list; the other is refused as any later start
// with another list is.
func TestConcurrentFirstStartsStoreOneLayout(t *testing.T) {
	sv := servers(t, 3)
	a, b, c := sv[0], sv[1], sv[2]
	errs := make(chan error, 2)
	for _, list := range [][]server{{a, b}, {a, c}} {
		d := open(t, list...)
		go func() {
			_, _, err := ensureOn(t, d, list...)
			errs <- err
		}()
	}
	var stored, refusedN int
	for range 2 {
		err := <-errs
		var me *shards.MismatchError
		switch {
		case err == nil:
			stored++
		case errors.As(err, &me) && strings.Contains(err.Error(), "is not one of the ledger's servers"):
			refusedN++
		default:
			t.Fatalf("a first start: %v", err)
		}
	}
	if stored != 1 || refusedN != 1 {
		t.Fatalf("%d stored, %d refused; want one of each", stored, refusedN)
	}
	var n int
	if err := a.db.Get(&n, `SELECT COUNT(*) FROM ledger_layout`); err != nil || n != 2 {
		t.Fatalf("%d layout rows, %v; want the 2 of one list", n, err)
	}
}
