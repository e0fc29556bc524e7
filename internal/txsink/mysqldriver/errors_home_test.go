package mysqldriver

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

// TestErrorNumbersHaveOneHome: errors.go is the one home of the server
// error numbers (issue 19). No other file of the module's code (tests
// build errors of their own and are left out) looks inside a
// *mysql.MySQLError or spells a number this file names: each asks
// errors.go (Code, ErrorKind, Denied, NoSuchTable, DeniedCreate, ...).
func TestErrorNumbersHaveOneHome(t *testing.T) {
	known := map[int64]bool{erUnknownSystemVariable: true, erSpecificAccessDenied: true, erNoSuchTable: true,
		ErDBAccessDenied: true, ErAccessDenied: true, ErTableAccessDenied: true, ErColumnAccessDenied: true}
	for n := range numbers {
		known[int64(n)] = true
	}
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	self, _ := filepath.Abs("errors.go")
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".services" || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || path == self {
			return nil
		}
		files++
		for _, p := range numberProblems(t, path, known) {
			rel, _ := filepath.Rel(root, path)
			t.Errorf("%s: %s (errors.go is the one home of server error numbers)", rel, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked %d files under %s: not the module", files, root)
	}
}

// numberProblems lists, in the file at path, every use of go-sql-driver's
// MySQLError and every integer literal that is a known error number.
func numberProblems(t *testing.T, path string, known map[int64]bool) []string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	mysqlName := ""
	for _, imp := range f.Imports {
		if imp.Path.Value == `"github.com/go-sql-driver/mysql"` {
			mysqlName = "mysql"
			if imp.Name != nil {
				mysqlName = imp.Name.Name
			}
		}
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.SelectorExpr:
			if id, ok := x.X.(*ast.Ident); ok && mysqlName != "" && id.Name == mysqlName && x.Sel.Name == "MySQLError" {
				out = append(out, fset.Position(x.Pos()).String()+": looks inside mysql.MySQLError")
			}
		case *ast.BasicLit:
			if x.Kind != token.INT {
				return true
			}
			if v, err := strconv.ParseInt(x.Value, 0, 64); err == nil && known[v] {
				out = append(out, fset.Position(x.Pos()).String()+": the error number "+x.Value)
			}
		}
		return true
	})
	return out
}
