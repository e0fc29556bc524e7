package shards_test

import (
	"strings"
	"testing"

	"github.com/billing/ledger/internal/shards"
	"github.com/billing/ledger/internal/txsink/driver"
)

const ledger = "00000000000000aa"

func srv(host, uuid, claim string) shards.Server {
	return shards.Server{Host: host, Identity: driver.ServerIdentity{UUID: uuid, Ledger: claim}, Found: true}
}

// Compare names each kind of difference between the configured servers
// and the stored layout, and none when they agree.
func TestCompare(t *testing.T) {
	stored := shards.Layout{Version: 1, Servers: []string{"u0", "u1", "u2"}}
	a, b, c := srv("a:3306", "u0", ledger), srv("b:3306", "u1", ledger), srv("c:3306", "u2", ledger)
	tests := []struct {
		name       string
		stored     shards.Layout
		configured []shards.Server
		want       []string // one substring per difference, in order; none: they agree
	}{
		{"same servers, same order", stored, []shards.Server{a, b, c}, nil},
		{"a new host or password: the same server", stored, []shards.Server{a, srv("b-alias:3306", "u1", ledger), c}, nil},
		{"reordered", stored, []shards.Server{a, c, b}, []string{
			"server 1 (c:3306) is the ledger's server 2: the list is in another order",
			"server 2 (b:3306) is the ledger's server 1"}},
		{"control server not first", stored, []shards.Server{b, a, c}, []string{"server 0 (b:3306) is the ledger's server 1", "server 1 (a:3306) is the ledger's server 0"}},
		{"a server missing", stored, []shards.Server{a, b}, []string{"the ledger's server 2 (server u2) is missing from the list"}},
		{"a server missing in the middle", stored, []shards.Server{a, c}, []string{
			"server 1 (c:3306) is the ledger's server 2", "the ledger's server 1 (server u1) is missing"}},
		{"a server to add, last", stored, []shards.Server{a, b, c, srv("d:3306", "u3", "")}, nil},
		{"a server to add, claimed by the add", stored, []shards.Server{a, b, c, srv("d:3306", "u3", ledger)}, nil},
		{"a server to add, not last", stored, []shards.Server{a, srv("d:3306", "u3", ""), b, c}, []string{
			"server 1 (d:3306) (server u3) is not one of the ledger's servers", "server 2 (b:3306) is the ledger's server 1", "server 3 (c:3306) is the ledger's server 2"}},
		{"another ledger's server to add", stored, []shards.Server{a, b, c, srv("d:3306", "u3", "00000000000000bb")}, []string{
			"server 3 (d:3306) belongs to another ledger", "server 3 (d:3306) (server u3) is not one of the ledger's servers"}},
		{"another ledger's server", stored, []shards.Server{a, b, srv("c:3306", "u2", "00000000000000bb")}, []string{
			"server 2 (c:3306) belongs to another ledger (00000000000000bb)"}},
		{"the same database twice", stored, []shards.Server{a, b, c, srv("c2:3306", "u2", ledger)}, []string{"server 3 (c2:3306) is the same database as server 2 (c:3306)"}},
		{"no identity", stored, []shards.Server{a, b, {Host: "c:3306"}}, []string{
			"server 2 (c:3306) has no server identity", "the ledger's server 2 (server u2) is missing"}},
		{"none stored: any list of fresh servers", shards.Layout{}, []shards.Server{srv("a", "u0", ""), srv("b", "u1", "")}, nil},
		{"none stored: another ledger's server", shards.Layout{}, []shards.Server{srv("a", "u0", ""), srv("b", "u1", "00000000000000bb")}, []string{
			"server 1 (b) belongs to another ledger"}},
		{"none stored: a control server in a shard's place", shards.Layout{}, []shards.Server{srv("a", "u0", ""), {Host: "b", Identity: driver.ServerIdentity{UUID: "u1"}, Found: true, Control: true}}, []string{
			"server 1 (b) holds a ledger identity: it is a ledger's control server, which must come first"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := shards.Compare(ledger, tt.stored, tt.configured)
			if len(got) != len(tt.want) {
				t.Fatalf("differences %q, want %d like %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("difference %d is %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}

// FromRows refuses rows that are not one layout.
func TestFromRows(t *testing.T) {
	l, err := shards.FromRows([]driver.LayoutRow{{Version: 2, Ordinal: 0, ServerUUID: "u0"}, {Version: 2, Ordinal: 1, ServerUUID: "u1"}})
	if err != nil || l.Describe() != "version 2: 0 u0, 1 u1" {
		t.Fatalf("%+v %v", l, err)
	}
	if _, err := shards.FromRows([]driver.LayoutRow{{Version: 1, Ordinal: 0, ServerUUID: "u0"}, {Version: 1, Ordinal: 2, ServerUUID: "u1"}}); err == nil {
		t.Error("a gap in the ordinals: no error")
	}
	if _, err := shards.FromRows([]driver.LayoutRow{{Version: 1, Ordinal: 0, ServerUUID: "u0"}, {Version: 1, Ordinal: 1, ServerUUID: "u0"}}); err == nil {
		t.Error("a server twice: no error")
	}
}

// The refusal says what to do.
func TestMismatchErrorSaysWhatToDo(t *testing.T) {
	err := &shards.MismatchError{Stored: shards.Layout{Version: 1, Servers: []string{"u0"}}, Differences: []string{"x"}}
	for _, w := range []string{"version 1: 0 u0", ": x;", "billing shards status", "billing shards add", "docs/production.md"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q does not say %q", err, w)
		}
	}
}

func TestHostHidesThePassword(t *testing.T) {
	if h := shards.Host("u:secret@tcp(db1:3306)/ledger?tls=true"); h != "db1:3306/ledger" || strings.Contains(h, "secret") {
		t.Fatalf("host %q", h)
	}
}

// Covers accepts the configured servers that begin with the layout's, in
// its order, and names each of the layout's servers missing or elsewhere.
func TestCovers(t *testing.T) {
	grown := shards.Layout{Version: 2, Servers: []string{"u0", "u1", "u2"}}
	for _, tc := range []struct {
		name  string
		uuids []string
		want  []string
	}{
		{"the layout's servers", []string{"u0", "u1", "u2"}, nil},
		{"and one to add", []string{"u0", "u1", "u2", "u3"}, nil},
		{"the added server missing", []string{"u0", "u1"}, []string{"the ledger's server 2 (server u2) is not configured: add it to MYSQL_SHARD_DSNS"}},
		{"in another order", []string{"u0", "u2", "u1"}, []string{"server 1 (server u1) is configured as server 2", "server 2 (server u2) is configured as server 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := shards.Covers(grown, tc.uuids)
			if len(got) != len(tc.want) {
				t.Fatalf("Covers(%q) = %q, want %d like %q", tc.uuids, got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("difference %d is %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}
