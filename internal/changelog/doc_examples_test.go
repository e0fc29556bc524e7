package changelog_test

import (
	"os"
	"strings"
	"testing"

	"github.com/billing/ledger/internal/changelog"
	"github.com/billing/ledger/internal/changelogtest"
)

// TestDocExamplesAreTheEncoders: every one-line example event of
// docs/changelog.md (a key line, then its value) decodes and encodes back
// to the same bytes, so the documented format is the one published.
func TestDocExamplesAreTheEncoders(t *testing.T) {
	b, err := os.ReadFile("../../docs/changelog.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	seen := map[changelog.Op]int{}
	for i := 0; i+1 < len(lines); i++ {
		key, val := lines[i], lines[i+1]
		if !strings.HasPrefix(key, `{"`) || !strings.HasPrefix(val, `{"before"`) {
			continue
		}
		_, rest, ok := strings.Cut(val, `"table":"`)
		table, _, _ := strings.Cut(rest, `"`)
		if !ok {
			t.Fatalf("line %d: no source.table", i+2)
		}
		ev, err := changelogtest.DecodeEvent(table, []byte(key), []byte(val))
		if err != nil {
			t.Fatalf("line %d (%s): %v", i+2, table, err)
		}
		k, v, err := changelog.Encode(ev)
		if err != nil || string(k) != key || string(v) != val {
			t.Errorf("line %d (%s): encoded again as\n%s\n%s\n(%v)", i+2, table, k, v, err)
		}
		seen[ev.Op]++
	}
	if seen[changelog.OpCreate] == 0 || seen[changelog.OpUpdate] == 0 || seen[changelog.OpRead] == 0 {
		t.Errorf("examples by op %v: want c, u and r", seen)
	}
}
