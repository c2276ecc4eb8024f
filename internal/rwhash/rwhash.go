// Package rwhash reads a read-write lock's hash, whose layout
// internal/scripts/rw.lua defines: the one reader of it for the manager's
// Inspect and List and for the exporter's scan.
package rwhash

import (
	"strconv"
	"strings"
	"time"
)

// Magic is the value of field "sl" that marks a read-write lock's hash.
const Magic = "rw1"

// State is what a read-write lock's hash holds right now.
type State struct {
	Writer  string   // the writer's token while its time runs, else ""
	Readers []string // the tokens of the readers whose time runs
	Fence   uint64   // the last fence handed to a writer (0: none)
	Queue   []string // the queue's entries, first first
}

// Parse reads the fields of a hash (HGETALL) and reports whether they are
// a read-write lock's. A writer or reader whose expiry (server clock, ms)
// is not after now does not count.
func Parse(f map[string]string, now time.Time) (State, bool) {
	if f["sl"] != Magic {
		return State{}, false
	}
	ms := now.UnixMilli()
	live := func(exp string) bool {
		n, err := strconv.ParseInt(exp, 10, 64)
		return err == nil && n > ms
	}
	var s State
	if w := f["w"]; w != "" && live(f["we"]) {
		s.Writer = w
	}
	for k, v := range f {
		if tok, ok := strings.CutPrefix(k, "r:"); ok && live(v) {
			s.Readers = append(s.Readers, tok)
		}
	}
	s.Fence, _ = strconv.ParseUint(f["f"], 10, 64)
	if q := f["q"]; q != "" {
		s.Queue = strings.Split(q, "\n")
	}
	return s, true
}

// Held reports whether a writer or a reader holds the lock.
func (s State) Held() bool { return s.Writer != "" || len(s.Readers) > 0 }
