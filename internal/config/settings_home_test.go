package config

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// environmentReaders are the variables a command may read by hand, by
// file, each with its reason: none is a setting of the service.
var environmentReaders = map[string]map[string]string{
	"cmd/billing/main.go":        {"GOMEMLIMIT": "the Go runtime's own limit, which the service's default memory limit yields to"},
	"cmd/billing/deadletters.go": {"USER": "the operator's login, the re-injection audit's default author"},
}

// environmentHomes are the directories whose code may read the
// environment freely, each with its reason.
var environmentHomes = map[string]string{
	"internal/config":   "the settings' one home",
	"internal/testenv":  "test support: the test servers' addresses",
	"cmd/billing-bench": "the benchmark's flags, whose defaults follow the test servers' variables",
	"internal/bench":    "the benchmark (cmd/billing-bench's body)'s own flags and its children's environments, outside the service's settings",
}

// TestSettingsAreReadOnlyHere: every setting is read through this package
// (Load, LoadScope, Unchecked, Environment), with the one default of its
// tag. No other code of the module (tests and the homes above aside)
// calls os.Getenv, os.LookupEnv or os.Environ, except for the variables
// listed with their reasons, so a command can neither read a setting by
// hand nor give it a default of its own.
func TestSettingsAreReadOnlyHere(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if _, ok := environmentHomes[rel]; ok || d.Name() == ".git" || d.Name() == ".services" || d.Name() == "testdata" || d.Name() == "bin" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		files++
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok || pkg.Name != "os" && pkg.Name != "syscall" {
				return true
			}
			switch sel.Sel.Name {
			case "Getenv", "LookupEnv", "Environ":
			default:
				return true
			}
			name := "(no name)"
			if len(call.Args) == 1 {
				if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					name, _ = strconv.Unquote(lit.Value)
				}
			}
			if _, ok := environmentReaders[rel][name]; !ok {
				t.Errorf("%s: %s.%s(%s) reads the environment by hand: read the setting through package config", rel, pkg.Name, sel.Sel.Name, name)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked %d files under %s: not the module", files, root)
	}
}

// Unchecked reads what the environment sets and the tags' defaults for the
// rest, requires nothing (no KAFKA_BROKERS, no MYSQL_DSN) and reports no
// problem: a value that does not parse is left zero, one set empty
// stays empty (HTTP_ADDR= disables the endpoints, as the service reads it).
func TestUncheckedReadsWithoutChecking(t *testing.T) {
	setenv(t, map[string]string{"MYSQL_SHARD_DSNS": "a@tcp(h:1)/x,b@tcp(h:2)/y", "CHECKPOINT_INTERVAL": "soon", "KAFKA_TOPIC": "t2"})
	c := Unchecked()
	def := Defaults()
	if c.MySQLDSN != "" || len(c.KafkaBrokers) != 0 || len(c.MySQLShardDSNs) != 2 || c.MySQLShardDSNs[1] != "b@tcp(h:2)/y" ||
		c.CheckpointInterval != 0 || c.KafkaTopic != "t2" || c.HTTPAddr != def.HTTPAddr || def.HTTPAddr == "" {
		t.Errorf("Unchecked = %+v", c)
	}
	t.Setenv("HTTP_ADDR", "")
	if c := Unchecked(); c.HTTPAddr != "" {
		t.Errorf("HTTP_ADDR set empty reads %q, want empty", c.HTTPAddr)
	}
}
