package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// scripts/demo.sh names its topic, group, database and log folder after
// the run: two runs started within the same second (the name once was
// the time to the second) get different names, valid as a database name
// and a topic name.
func TestDemoRunNamesDoNotCollide(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "scripts", "demo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	line := regexp.MustCompile(`(?m)^RUN=.*$`).FindString(string(b))
	if line == "" {
		t.Fatal("scripts/demo.sh sets no RUN")
	}
	seen := map[string]bool{}
	for range 20 {
		out, err := exec.Command("bash", "-c", line+"; printf %s \"$RUN\"").Output()
		if err != nil {
			t.Fatal(err)
		}
		run := string(out)
		if !regexp.MustCompile(`^[0-9A-Za-z_]{1,40}$`).MatchString("demo_"+run) || strings.ContainsAny(run, " \n") {
			t.Fatalf("RUN=%q makes no valid database name", run)
		}
		if seen[run] {
			t.Fatalf("two runs named %q", run)
		}
		seen[run] = true
	}
}
