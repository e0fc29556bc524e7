package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/billing/ledger/internal/ledgercheck"
	"github.com/billing/ledger/internal/periods"
	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
)

func TestParseFlagsDSNs(t *testing.T) {
	t.Setenv("MYSQL_DSN", "")
	t.Setenv("MYSQL_SHARD_DSNS", "u:p@tcp(h2:3306)/db,u:p@tcp(h3:3306)/db")
	var stderr bytes.Buffer
	o, err := parseFlags([]string{"-dsn", "u:p@tcp(h1:3306)/db"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.dsns) != 3 {
		t.Errorf("env shards not used: %q", o.dsns)
	}
	o, err = parseFlags([]string{"-dsn", "u:p@tcp(h1:3306)/db", "-shard-dsns", "u:p@tcp(h1:3306)/db,u:p@tcp(h4:3306)/db",
		"-shard-dsns", "u:p@tcp(h5:3306)/db"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(o.dsns, " ") != "u:p@tcp(h1:3306)/db u:p@tcp(h4:3306)/db u:p@tcp(h5:3306)/db" {
		t.Errorf("flags must override env, repeats dropped: %q", o.dsns)
	}
	if _, err := parseFlags(nil, &stderr); err != nil {
		t.Errorf("env alone: %v", err)
	}
	t.Setenv("MYSQL_SHARD_DSNS", "")
	if _, err := parseFlags(nil, &stderr); err == nil {
		t.Error("no DSN accepted")
	}
}

func TestRunExitCodes(t *testing.T) {
	t.Setenv("MYSQL_DSN", "")
	t.Setenv("MYSQL_SHARD_DSNS", "")
	dir := t.TempDir()
	good := filepath.Join(dir, "expected.json")
	l, _ := ledgercheck.NewModel(time.Hour)
	if err := ledgercheck.WriteFile(good, l.Expected()); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"version": 9}`), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args []string
		want int
	}{
		{[]string{"-expected", good}, exitUsage},                                                                 // no DSN
		{[]string{"-dsn", "u:p@tcp(127.0.0.1:1)/db", "-expected", bad}, exitUnreadable},                          // bad file
		{[]string{"-dsn", "u:p@tcp(127.0.0.1:1)/db", "-expected", filepath.Join(dir, "x")}, exitUnreadable},      // no file
		{[]string{"-dsn", "u:p@tcp(127.0.0.1:1)/db", "-expected", good, "-query-timeout", "2s"}, exitUnreadable}, // no server
		{[]string{"-max-diffs", "-1", "-dsn", "u:p@tcp(h)/db"}, exitUsage},
		{[]string{"-bogus"}, exitUsage},
		{[]string{"-h"}, exitExact},
	}
	for _, tc := range tests {
		var out, errb bytes.Buffer
		if got := run(t.Context(), tc.args, &out, &errb); got != tc.want {
			t.Errorf("%q: exit %d, want %d\n%s%s", tc.args, got, tc.want, out.String(), errb.String())
		}
		if tc.want == exitUnreadable && !strings.Contains(errb.String(), "could not compare") {
			t.Errorf("%q: the error does not say the comparison could not be made:\n%s", tc.args, errb.String())
		}
		if strings.Contains(out.String()+errb.String(), "u:p@") {
			t.Errorf("%q: password printed:\n%s%s", tc.args, out.String(), errb.String())
		}
	}
}

// TestHelpDescribesAndListsExitCodes: -help says what the tool does and
// what each exit status means (issue 22: it printed the flags only).
func TestHelpDescribesAndListsExitCodes(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"-help"}, &out, &errb); code != exitExact {
		t.Fatalf("-help: exit %d", code)
	}
	help := out.String() + errb.String()
	for _, want := range []string{"Usage of billing-verify", "Compares the ledger in MySQL", "Exit status:", "0  EXACT", "1  MISMATCH", "2  usage error", "3  could not compare", "-expected", "-wait"} {
		if !strings.Contains(help, want) {
			t.Errorf("-help lacks %q:\n%s", want, help)
		}
	}
}

// TestDocsListEveryFlag: docs/operations.md documents every flag of the
// tool (it was only in scripts/demo.sh).
func TestDocsListEveryFlag(t *testing.T) {
	var out, errb bytes.Buffer
	run(t.Context(), []string{"-help"}, &out, &errb)
	testenv.DocumentsEveryFlag(t, out.String()+errb.String(), "../../docs/operations.md")
}

// The period settings are the ledger's: a ledger whose stored settings are
// not the expected file's is not compared (exit 3, naming each); one
// without any stored is compared under the file's, with a warning.
func TestPeriodSettingsComeFromTheLedger(t *testing.T) {
	dsn, _ := testenv.LedgerDB(t)
	d, err := mysqldriver.Open(t.Context(), []string{dsn}, mysqldriver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	dir := t.TempDir()
	file := filepath.Join(dir, "expected.json")
	l, _ := ledgercheck.NewModel(time.Hour)
	if err := ledgercheck.WriteFile(file, l.Expected()); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"-dsn", dsn, "-expected", file}, &out, &errb); code != exitExact || !strings.Contains(errb.String(), "no period settings stored") {
		t.Fatalf("a ledger without settings: exit %d\n%s%s", code, out.String(), errb.String())
	}
	month, err := periods.ParsePeriod("month", "Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := periods.Ensure(t.Context(), d, periods.Settings{Period: month, Close: true}, 48*time.Hour, "test", testenv.Logger()); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	code := run(t.Context(), []string{"-dsn", dsn, "-expected", file}, &out, &errb)
	for _, want := range []string{"BILLING_WINDOW is month in the ledger, 1h0m0s here", "WINDOW_CLOSE_AFTER is set (windows close) in the ledger, empty (windows never close) here"} {
		if code != exitUnreadable || !strings.Contains(errb.String(), want) {
			t.Fatalf("a ledger of Berlin months against an hourly file: exit %d, want %d saying %q\n%s%s", code, exitUnreadable, want, out.String(), errb.String())
		}
	}
}

// TestMain removes the containers the test environment may start (its
// testcontainers path); see testenv.Main.
func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
