package transport

import (
	"context"
	"sync"
	"sync/atomic"
)

// inflight counts the Manager's goroutines that carry exchanges with
// Redis. The count is an atomic: the hot path takes no lock.
type inflight struct {
	n    atomic.Int64
	mu   sync.Mutex
	zero chan struct{} // closed when n drops to 0 while wait waits; made by wait
}

func (f *inflight) add() { f.n.Add(1) }

func (f *inflight) done() {
	if f.n.Add(-1) != 0 {
		return
	}
	f.mu.Lock()
	if f.zero != nil && f.n.Load() == 0 {
		close(f.zero)
		f.zero = nil
	}
	f.mu.Unlock()
}

// wait waits until no exchange is in flight, or until ctx ends; it returns
// how many were still in flight then.
func (f *inflight) wait(ctx context.Context) int {
	f.mu.Lock()
	if f.n.Load() == 0 {
		f.mu.Unlock()
		return 0
	}
	if f.zero == nil {
		f.zero = make(chan struct{})
	}
	z := f.zero
	f.mu.Unlock()
	select {
	case <-z:
		return 0
	case <-ctx.Done():
		return int(f.n.Load())
	}
}

// goFn runs fn in a goroutine that Close waits for.
func (f *inflight) goFn(fn func()) {
	f.add()
	go func() {
		defer f.done()
		fn()
	}()
}
