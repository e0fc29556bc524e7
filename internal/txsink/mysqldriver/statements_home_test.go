package mysqldriver

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// statementHomes are the places besides this package whose code may hold
// SQL on the ledger's tables, each with its reason.
var statementHomes = map[string]string{
	"internal/ledgercheck": "the independent verifier reads the tables with statements of its own, sharing none with the driver it checks",
	"internal/testenv":     "test support: it sets up and inspects ledgers for the tests",
	"internal/bench":       "the benchmark (cmd/billing-bench's body)'s naive baseline and its set-up write the tables as a competing implementation would",
}

// TestLedgerStatementsHaveOneHome: every statement on the ledger's tables
// (those the store declares its access to) is this package's. No string
// literal, or concatenation of literals, of the module's other code (tests and the homes above aside)
// reads or writes one of them: the tools, the status report, the metrics
// and the period settings go through the driver, whose statements the
// conformance suite holds the in-memory driver to.
func TestLedgerStatementsHaveOneHome(t *testing.T) {
	var tables []string
	for _, a := range access {
		if !slices.Contains(tables, a.Table) {
			tables = append(tables, a.Table)
		}
	}
	stmt := regexp.MustCompile(`(?is)\b(SELECT|INSERT|UPDATE|DELETE|REPLACE|TRUNCATE)\b.*\b(` + strings.Join(tables, "|") + `)\b`)
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	self, _ := filepath.Abs(".")
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if _, ok := statementHomes[filepath.ToSlash(rel)]; ok || path == self || d.Name() == ".git" || d.Name() == ".services" || d.Name() == "testdata" ||
				d.Name() == "bin" || d.Name() == "integration" {
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
			// A statement may be built of pieces ("SELECT " + cols + "
			// FROM t"): the string literals of a concatenation are read
			// together.
			var text []string
			switch e := n.(type) {
			case *ast.BinaryExpr:
				if e.Op != token.ADD {
					return true
				}
				ast.Inspect(e, func(m ast.Node) bool {
					if lit, ok := m.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						if s, err := strconv.Unquote(lit.Value); err == nil {
							text = append(text, s)
						}
					}
					return true
				})
			case *ast.BasicLit:
				if s, err := strconv.Unquote(e.Value); err == nil && e.Kind == token.STRING {
					text = append(text, s)
				}
			default:
				return true
			}
			if s := strings.Join(text, " "); stmt.MatchString(s) {
				t.Errorf("%s: a statement on the ledger's tables outside the driver: %.80q", rel, s)
			}
			return false
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
