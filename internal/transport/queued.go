package transport

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// queued command states
const (
	queuedWaiting uint64 = iota // in the queue
	queuedSent                  // taken by a flusher
	queuedDropped               // its caller left before it was sent
	queuedLeft                  // its caller left after it was sent
)

// The bits of queued.st: the state, whether done has had its one value,
// and the entry's generation (how often it was recycled), so that the
// deadline watch never acts on a later command of a recycled entry.
const (
	stateBits     uint64 = 3
	signalledBit  uint64 = 4
	generationLsb        = 8
)

type queued struct {
	ctx  context.Context // the caller's: bounds a re-send
	cmd  redis.Cmder
	once noRetry // cmd as sent: &once is a redis.Cmder without an allocation of its own
	st   atomic.Uint64
	done chan struct{} // one value, when the reply is in cmd (answer) or the caller is to leave (expire); buffered, so that never blocks
}

// queuedPool keeps the queued commands whose callers have taken their
// answer: a command's entry and its channel are made once and serve many
// commands. An entry whose caller left before the answer is never put
// back (the flusher may still hold it, and its answer may still come).
var queuedPool = sync.Pool{New: func() any { return &queued{done: make(chan struct{}, 1)} }}

func newQueued(ctx context.Context, cmd redis.Cmder) *queued {
	q := queuedPool.Get().(*queued)
	q.ctx, q.cmd, q.once = ctx, cmd, noRetry{cmd}
	return q
}

// state returns q's state.
func (q *queued) state() uint64 { return q.st.Load() & stateBits }

// move changes q's state from from to to, and reports whether it did.
func (q *queued) move(from, to uint64) bool {
	for {
		w := q.st.Load()
		if w&stateBits != from {
			return false
		}
		if q.st.CompareAndSwap(w, w&^stateBits|to) {
			return true
		}
	}
}

// answer hands q's caller its reply, unless the deadline watch has told it
// to leave already.
func (q *queued) answer() {
	for {
		w := q.st.Load()
		if w&signalledBit != 0 {
			return
		}
		if q.st.CompareAndSwap(w, w|signalledBit) {
			q.done <- struct{}{}
			return
		}
	}
}

// expire tells q's caller, if q is still of generation gen and unanswered,
// that its context has ended: a command still queued is dropped (never
// sent), one in flight is left to the coalescer. It reports whether it did.
func (q *queued) expire(gen uint64) bool {
	for {
		w := q.st.Load()
		if w>>generationLsb != gen || w&signalledBit != 0 {
			return false
		}
		to := queuedLeft
		switch w & stateBits {
		case queuedWaiting:
			to = queuedDropped
		case queuedSent:
		default:
			return false
		}
		if q.st.CompareAndSwap(w, w&^stateBits|to|signalledBit) {
			q.done <- struct{}{}
			return true
		}
	}
}

// generation returns q's generation.
func (q *queued) generation() uint64 { return q.st.Load() >> generationLsb }

// recycle puts q back in the pool once its caller has taken the answer:
// nothing else refers to it then but, possibly, a deadline watch entry of
// this generation, which the next one makes stale.
func (q *queued) recycle() {
	q.reset()
	queuedPool.Put(q)
}

// reset makes q a waiting entry of the next generation, with no command.
func (q *queued) reset() {
	q.ctx, q.cmd, q.once = nil, nil, noRetry{}
	q.st.Store((q.generation() + 1) << generationLsb) // queuedWaiting, not signalled
}
