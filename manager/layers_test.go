package manager_test

import (
	"testing"

	"github.com/shardlock/shardlock/internal/filegraph"
)

// The engine's files call downward only (docs/design.md, "The engine's
// rooms"): no files refer to each other in a circle, but for the one pair
// the design allows, the Lock's kind (kind.go) and the state that holds it
// (manager.go).
func TestEngineFilesCallDownward(t *testing.T) {
	cycles, err := filegraph.Cycles(".", "manager.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cycles {
		if len(c) > 2 || c[0] != "kind.go" || c[1] != "manager.go" {
			t.Errorf("files that call each other in a circle: %v", c)
		}
	}
}
