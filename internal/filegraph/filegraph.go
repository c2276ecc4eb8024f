// Package filegraph measures the layering of a Go package: which of its
// files refer to each other in a circle. A file refers to another when it
// names a package-level object, a method or a struct field declared there;
// the fields of the structs declared in the hub files are not counted
// (every file reads the Manager's fields, which says nothing about
// layering). Test files are left out. The engine's layering tests use it.
package filegraph

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// Cycles returns the sets of files of the package in dir that refer to
// each other in a circle (the strongly connected components of more than
// one file), largest first, each sorted by name.
func Cycles(dir string, hubs ...string) ([][]string, error) {
	adj, nodes, err := refs(dir, hubs)
	if err != nil {
		return nil, err
	}
	var out [][]string
	for _, c := range components(nodes, adj) {
		if len(c) > 1 {
			sort.Strings(c)
			out = append(out, c)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// refs type-checks the package in dir against its dependencies' export
// data and returns which file refers to which.
func refs(dir string, hubs []string) (map[string]map[string]bool, []string, error) {
	out, err := exec.Command("go", "list", "-C", dir, "-export", "-deps", "-f", "{{.ImportPath}} {{.Export}}", ".").Output()
	if err != nil {
		return nil, nil, fmt.Errorf("go list: %w", err)
	}
	exp := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 {
			exp[f[0]] = f[1]
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) { return os.Open(exp[path]) })
	matches, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	var files []*ast.File
	var nodes []string
	for _, m := range matches {
		if strings.HasSuffix(m, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, m, nil, 0)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, f)
		nodes = append(nodes, filepath.Base(m))
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	pkg, err := (&types.Config{Importer: imp}).Check("x", fset, files, info)
	if err != nil {
		return nil, nil, err
	}
	hub := map[string]bool{}
	for _, h := range hubs {
		hub[h] = true
	}
	adj := map[string]map[string]bool{}
	for id, obj := range info.Uses {
		if obj == nil || obj.Pkg() != pkg {
			continue
		}
		_, isFunc := obj.(*types.Func)
		v, isVar := obj.(*types.Var)
		field := isVar && v.IsField()
		if !(obj.Parent() == pkg.Scope() || isFunc || field) {
			continue
		}
		from := filepath.Base(fset.Position(id.Pos()).Filename)
		to := filepath.Base(fset.Position(obj.Pos()).Filename)
		if from == to || (field && hub[to]) {
			continue
		}
		if adj[from] == nil {
			adj[from] = map[string]bool{}
		}
		adj[from][to] = true
	}
	return adj, nodes, nil
}

// components returns the strongly connected components of the graph
// (Tarjan's algorithm).
func components(nodes []string, adj map[string]map[string]bool) [][]string {
	index, low, on := map[string]int{}, map[string]int{}, map[string]bool{}
	var stack []string
	var comps [][]string
	n := 0
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = n, n
		n++
		stack = append(stack, v)
		on[v] = true
		next := make([]string, 0, len(adj[v]))
		for w := range adj[v] {
			next = append(next, w)
		}
		sort.Strings(next)
		for _, w := range next {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			var c []string
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				on[w] = false
				c = append(c, w)
				if w == v {
					break
				}
			}
			comps = append(comps, c)
		}
	}
	sort.Strings(nodes)
	for _, v := range nodes {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	return comps
}
