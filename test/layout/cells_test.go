package layout

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// Cells meet through tables (DESIGN.md §3, issue 17): a cell reads what
// another cell knows from the tables that cell writes (statedb/...), never
// by calling it. The check below makes that precise for the Go code of
// the cells (cells/<name>/..., test files excepted; a cell's
// subpackages belong to it; cells/hive is the framework, not a cell):
//
//   - Forbidden: naming an exported interface type of another cell. A
//     cell's interfaces are its allocator and lookup API (ipam.Allocator,
//     the former ipam.Lookup and ipam.Lister, identity.Allocator, ...);
//     holding one is how a cell calls into another.
//   - Allowed, not checked here: statedb/ (tables, row types, indexes and
//     their query helpers, such as statedb/ipam and statedb/identity), api/
//     and libraries.
//   - Allowed from another cell: everything that is not an interface (its
//     Cell value, config struct, value types, constants, sentinel errors,
//     plain helper functions such as statedir.WriteFile), and the small
//     interfaces in smallInterfaces, which carry configuration or
//     infrastructure, not the providing cell's state.
//   - Tolerated: the uses in pendingCalls, each saying why it is still a
//     call. The list may only shrink: an entry no code needs any more
//     fails the test, so that it is removed.

// smallInterfaces are interfaces of a cell that other cells may hold.
var smallInterfaces = map[string]string{
	"cells/k8s.Clientset":        "the Kubernetes API client: infrastructure every cell that writes to the API shares",
	"cells/identity.LabelFilter": "configuration: which pod labels count for identities (--label flags)",
	"cells/ipam.PodMTU":          "configuration: the pod MTU (cni-config's --mtu) for POST /v1/ipam's reply",
	"cells/agentapi.Validator":   "the agent API's request validation hook, implemented by request types",
}

// pendingCalls are the calls between cells that have not become tables
// yet, keyed "<calling cell> -> <interface>". Empty: the last ones (the
// endpoint manager's IPAM claims and identity references, the doctor's
// refused CEPs) became the ipam-requests, identity-requests and
// ipcache-refused-ceps tables. A new entry needs a reason and an issue.
var pendingCalls = map[string]string{}

func TestCellsMeetThroughTables(t *testing.T) {
	root := filepath.Join("..", "..", "cells")
	type file struct {
		cell string
		path string
		ast  *ast.File
	}
	var files []file
	interfaces := map[string]bool{} // "cells/<pkg path>.<Name>"
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == "testdata" || strings.HasPrefix(n, ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(filepath.Join("..", ".."), path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, spec := range g.Specs {
				ts := spec.(*ast.TypeSpec)
				if _, ok := ts.Type.(*ast.InterfaceType); ok && ts.Name.IsExported() {
					interfaces[pkg+"."+ts.Name.Name] = true
				}
			}
		}
		files = append(files, file{cell: cellOf(rel), path: rel, ast: f})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 50 || len(interfaces) < 5 {
		t.Fatalf("found only %d files and %d interfaces under cells/", len(files), len(interfaces))
	}

	used := map[string]bool{}
	seen := map[string]bool{} // file and interface already reported
	var violations []string
	for _, f := range files {
		if f.cell == "hive" {
			continue
		}
		imports := map[string]string{} // local name -> "cells/..." package
		for _, im := range f.ast.Imports {
			p, err := strconv.Unquote(im.Path.Value)
			if err != nil || !strings.HasPrefix(p, module+"/cells/") {
				continue
			}
			p = strings.TrimPrefix(p, module+"/")
			if c := cellOf(p); c == f.cell || c == "hive" {
				continue
			}
			name := p[strings.LastIndex(p, "/")+1:]
			if im.Name != nil {
				name = im.Name.Name
			}
			imports[name] = p
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			x, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			pkg, ok := imports[x.Name]
			if !ok {
				return true
			}
			name := pkg + "." + sel.Sel.Name
			if !interfaces[name] || smallInterfaces[name] != "" {
				return true
			}
			key := f.cell + " -> " + name
			if pendingCalls[key] != "" {
				used[key] = true
				return true
			}
			if seen[f.path+" "+name] {
				return true
			}
			seen[f.path+" "+name] = true
			violations = append(violations, fmt.Sprintf("%s: cell %s holds %s: read the tables %s writes instead (statedb/...), or, for a small interface carrying configuration, add it to smallInterfaces with a reason",
				f.path, f.cell, name, cellOf(pkg)))
			return true
		})
	}
	sort.Strings(violations)
	for _, v := range violations {
		t.Error(v)
	}
	for key := range pendingCalls {
		if !used[key] {
			t.Errorf("pendingCalls lists %q, which no cell uses any more: remove the entry", key)
		}
	}
	for name := range smallInterfaces {
		if !interfaces[name] {
			t.Errorf("smallInterfaces lists %s, which is not an interface of a cell any more: remove the entry", name)
		}
	}
}

// cellOf is the cell of a path "cells/<cell>/...".
func cellOf(rel string) string {
	parts := strings.Split(rel, "/")
	if len(parts) < 2 || parts[0] != "cells" {
		return ""
	}
	return parts[1]
}
