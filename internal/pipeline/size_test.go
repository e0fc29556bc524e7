package pipeline

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines bounds a function of the pipeline, the protocol and the
// dedup operator (issue 19): one that grows past it does several things
// that each deserve a name (see planner.go and executor.go for how
// attempt was taken apart).
const maxFuncLines = 100

// longFuncs lists the functions (declarations, tests included) of the Go
// files under roots whose text, from func to the closing brace, is longer
// than max lines.
func longFuncs(t *testing.T, max int, roots ...string) []string {
	t.Helper()
	var long []string
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			for _, decl := range f.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				from, to := fset.Position(fd.Pos()), fset.Position(fd.End())
				if n := to.Line - from.Line + 1; n > max {
					long = append(long, fmt.Sprintf("%s:%d %s (%d lines)", path, from.Line, fd.Name.Name, n))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return long
}

// No function of internal/pipeline, internal/txsink (its drivers and
// conformance suite included) or internal/dedup is over 100 lines.
func TestNoFunctionOverAHundredLines(t *testing.T) {
	for _, f := range longFuncs(t, maxFuncLines, ".", "../txsink", "../dedup") {
		t.Errorf("%s: split it (at most %d lines)", f, maxFuncLines)
	}
	// The check sees the functions it is meant to: this file's longest
	// is longFuncs itself.
	if got := longFuncs(t, 20, "."); len(got) == 0 {
		t.Fatal("no function over 20 lines found in internal/pipeline: the check reads nothing")
	}
}
