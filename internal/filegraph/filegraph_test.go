package filegraph

import (
	"os"
	"path/filepath"
	"testing"
)

// A package whose files call each other in a circle is reported, one
// whose files call downward is not, and a hub's fields do not count.
func TestCycles(t *testing.T) {
	write := func(dir string, files map[string]string) {
		for name, src := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module x\n\ngo 1.22\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	circle := t.TempDir()
	write(circle, map[string]string{
		"a.go": "package x\n\nfunc A() { B() }\n",
		"b.go": "package x\n\nfunc B() { C() }\n",
		"c.go": "package x\n\nfunc C() { A() }\n",
	})
	got, err := Cycles(circle)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || len(got[0]) != 3 {
		t.Fatalf("a -> b -> c -> a: %v, want one cycle of 3", got)
	}
	layered := t.TempDir()
	write(layered, map[string]string{
		"hub.go": "package x\n\ntype M struct{ n int }\n",
		"a.go":   "package x\n\nfunc (m *M) A() int { return m.n + B() }\n",
		"b.go":   "package x\n\nfunc B() int { return 1 }\n",
	})
	if got, err := Cycles(layered, "hub.go"); err != nil || len(got) != 0 {
		t.Fatalf("a -> hub, a -> b: %v, %v; want no cycle", got, err)
	}
}
