package benchkit

import (
	"path/filepath"
	"sync"
	"testing"
)

// Two mappings of one counter file see each other's adds, as two processes'
// do, and concurrent adds are not lost.
func TestCounterShared(t *testing.T) {
	path := filepath.Join(t.TempDir(), "counter")
	a, err := OpenCounter(path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := OpenCounter(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var wg sync.WaitGroup
	for _, c := range []*Counter{a, b} {
		wg.Go(func() {
			for range 1000 {
				c.Add(1)
			}
		})
	}
	wg.Wait()
	if got := a.Add(0); got != 2000 {
		t.Fatalf("counter = %d, want 2000", got)
	}
	if got := b.Add(1); got != 2001 {
		t.Fatalf("counter through the second mapping = %d, want 2001", got)
	}
}
