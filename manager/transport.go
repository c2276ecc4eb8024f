package manager

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Calls that outlive their callers.
//
// go-redis bounds a command by the caller's context only with
// ContextTimeoutEnabled, and its auto-pipeliner not even then: a hung
// server (SIGSTOP, a long script, a dead link with open sockets) holds a
// command for the client's ReadTimeout or longer. shardlock promises that
// a call returns by its context's deadline whatever the client's options,
// so where the client cannot be trusted with the deadline, the exchange
// with Redis runs in a goroutine of the Manager's and the caller stops
// waiting at the deadline. What the exchange did is then settled when its
// reply comes: an acquire that took the key releases it at once. Close
// waits for these goroutines.

// abandonedError is the error of a call whose caller stopped waiting
// before its reply: it matches the context's error. What was sent may
// still run; the Manager settles it when the reply comes.
type abandonedError struct{ cause error }

func (e *abandonedError) Error() string {
	return "shardlock: no reply from Redis in time: " + e.cause.Error()
}

func (e *abandonedError) Unwrap() error { return e.cause }

// lateGrace is how long a call that reached its own deadline (not its
// context's) still waits for the reply: the exchange runs under the same
// deadline, so a client that honours it answers within moments, with the
// error that says why (a refused connection, say).
const lateGrace = 20 * time.Millisecond

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

// honoursDeadlines reports whether every command c sends is bounded by its
// context's deadline: the coalescer, or a *redis.Client or
// *redis.ClusterClient with ContextTimeoutEnabled (directly or behind
// once).
func honoursDeadlines(c any) bool {
	switch c := c.(type) {
	case *coalescer:
		return true
	case *once:
		return honoursDeadlines(c.c)
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// direct reports whether an exchange under ctx, bounded by deadline (zero:
// none), can run on the caller's goroutine: the client it goes through
// bounds it by ctx's deadline (bounds), which comes no later than
// deadline, or there is nothing to bound it by.
func direct(ctx context.Context, deadline time.Time, bounds bool) bool {
	d, ok := ctx.Deadline()
	if !ok {
		return deadline.IsZero() && ctx.Done() == nil
	}
	return bounds && (deadline.IsZero() || !d.After(deadline))
}

// onCaller returns the context under which an exchange under ctx, bounded
// by deadline, runs on the caller's goroutine, or nil when it needs a
// goroutine of the Manager's. It is ctx itself where direct says so.
// Otherwise, where the client bounds a command by its context (bounds)
// and ctx would end later than deadline, or never (context.Background,
// say), it is ctx narrowed to deadline. A ctx that can end without a
// deadline (cancelled only) gets nil: its caller must be able to stop
// waiting at once, which a goroutine of the Manager's allows.
func onCaller(ctx context.Context, deadline time.Time, bounds bool) (context.Context, context.CancelFunc) {
	if direct(ctx, deadline, bounds) {
		return ctx, func() {}
	}
	if !bounds || deadline.IsZero() {
		return nil, nil
	}
	if _, ok := ctx.Deadline(); !ok && ctx.Done() != nil {
		return nil, nil
	}
	return context.WithDeadline(ctx, deadline)
}

// call states
const (
	callRunning int32 = iota
	callAnswered
	callAbandoned
)

// call is one exchange run on a goroutine of the Manager's (see exchange).
type call[T any] struct {
	m      *Manager
	ctx    context.Context
	cancel context.CancelFunc // of ctx, when exchange made it
	f      func(context.Context) (T, error)
	late   func(T, error)
	state  atomic.Int32
	done   chan struct{} // closed when answered
	out    T
	err    error
}

func (c *call[T]) run() {
	defer c.m.io.done()
	if c.cancel != nil {
		defer c.cancel()
	}
	out, err := c.f(c.ctx)
	if c.state.CompareAndSwap(callRunning, callAnswered) {
		c.out, c.err = out, err
		close(c.done)
		return
	}
	if c.late != nil {
		c.late(out, err)
	}
}

// abandon gives up waiting for c, unless its answer came meanwhile.
func (c *call[T]) abandon(cause error) (T, error) {
	if c.state.CompareAndSwap(callRunning, callAbandoned) {
		var zero T
		return zero, &abandonedError{cause: cause}
	}
	<-c.done
	return c.out, c.err
}

// exchange runs f, one exchange with Redis, so that it returns by ctx's end
// and by deadline (zero: none), whatever the client's timeouts. An ended
// ctx returns its error at once and sends nothing. When the caller stops
// waiting first, exchange returns the zero T and an *abandonedError
// (matching the context's error), and f goes on in the background; late,
// if not nil, then gets f's result once f has returned, on f's goroutine,
// to settle what f did.
//
// exchange is for exchanges through the Manager's client; exchangeOn says
// whether the client f goes through bounds a command by its context's
// deadline (see honoursDeadlines).
func exchange[T any](m *Manager, ctx context.Context, deadline time.Time, f func(context.Context) (T, error), late func(T, error)) (T, error) {
	return exchangeOn(m, m.clientBounds, ctx, deadline, f, late)
}

// exchangeOn is exchange through a client that bounds commands by their
// context's deadline or not (bounds).
func exchangeOn[T any](m *Manager, bounds bool, ctx context.Context, deadline time.Time, f func(context.Context) (T, error), late func(T, error)) (T, error) {
	if err := ctx.Err(); err != nil {
		var zero T
		return zero, err
	}
	if cctx, cancel := onCaller(ctx, deadline, bounds); cctx != nil {
		defer cancel()
		return f(cctx)
	}
	c := &call[T]{m: m, ctx: ctx, f: f, late: late, done: make(chan struct{})}
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		if d, ok := ctx.Deadline(); !ok || deadline.Before(d) {
			c.ctx, c.cancel = context.WithDeadline(ctx, deadline)
			t := time.NewTimer(time.Until(deadline))
			defer t.Stop()
			timeout = t.C
		}
	}
	m.io.add()
	go c.run()
	select {
	case <-c.done:
		return c.out, c.err
	case <-ctx.Done():
		return c.abandon(ctx.Err())
	case <-timeout:
		grace := time.NewTimer(lateGrace)
		defer grace.Stop()
		select {
		case <-c.done:
			return c.out, c.err
		case <-grace.C:
			return c.abandon(context.DeadlineExceeded)
		}
	}
}

// bounded is exchange for an exchange without a result.
func (m *Manager) bounded(ctx context.Context, deadline time.Time, op func(context.Context) error, late func(error)) error {
	var l func(struct{}, error)
	if late != nil {
		l = func(_ struct{}, err error) { late(err) }
	}
	_, err := exchange(m, ctx, deadline, func(ctx context.Context) (struct{}, error) { return struct{}{}, op(ctx) }, l)
	return err
}

// abandonedCause returns err if it is a call its caller stopped waiting
// for, else nil.
func abandonedCause(err error) error {
	if isAbandoned(err) {
		return err
	}
	return nil
}

// isAbandoned reports whether err is a call its caller stopped waiting for.
func isAbandoned(err error) bool {
	if err == nil {
		return false // the hot path: no errors.As, whose target escapes
	}
	var ae *abandonedError
	return errors.As(err, &ae)
}

// runScript runs s on c bounded by ctx (see exchange), with EVALSHA and
// the EVAL fallback. Through the coalescer it runs on the caller's
// goroutine under any ctx: the coalescer waits for a reply only until ctx
// ends (see coalescer.Process).
func (m *Manager) runScript(ctx context.Context, c redis.Scripter, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	bounds, waits := m.clientBounds, false
	if c == redis.Scripter(m.cmd) {
		bounds, waits = m.cmdBounds, m.co != nil
	}
	if ctx.Err() == nil && (waits || direct(ctx, time.Time{}, bounds)) {
		return s.Run(ctx, c, keys, args...) // the hot path: no closure
	}
	cmd, err := exchangeOn(m, bounds, ctx, time.Time{}, func(ctx context.Context) (*redis.Cmd, error) {
		cmd := s.Run(ctx, c, keys, args...)
		return cmd, cmd.Err()
	}, nil)
	if cmd == nil { // not sent, or no reply in time
		cmd = redis.NewCmd(ctx)
		cmd.SetErr(err)
	}
	return cmd
}
