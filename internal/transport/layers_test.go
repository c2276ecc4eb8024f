package transport

import (
	"testing"

	"github.com/shardlock/shardlock/internal/filegraph"
)

// The transport's files call downward only: none refer to each other in a
// circle.
func TestTransportFilesCallDownward(t *testing.T) {
	cycles, err := filegraph.Cycles(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cycles {
		t.Errorf("files that call each other in a circle: %v", c)
	}
}
