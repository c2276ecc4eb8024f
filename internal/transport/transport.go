// Package transport carries shardlock's commands to Redis: which master
// serves a key (the topology), the coalescer that pipelines concurrent
// callers' commands per master and never sends a command twice, the
// exchanges that return by their caller's deadline whatever the client's
// timeouts, and the classes of the errors that come back. The engine
// (package manager) speaks to Redis only through a *Transport.
package transport

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Transport is one manager's way to its Redis deployment.
type Transport struct {
	*topology
	client redis.UniversalClient
	cmd    Commander  // the coalescer in front of client, or client behind once
	co     *coalescer // nil when coalescing is off
	io     inflight   // goroutines carrying exchanges whose callers may have gone

	// Whether the clients bound every command by its context's deadline
	// (see direct): cmd's and client's.
	cmdBounds, clientBounds bool
}

// Config says how a Transport sends.
type Config struct {
	// Coalesce pipelines concurrent callers' commands (see coalescer);
	// without it each command goes alone, never twice (see once).
	Coalesce bool
	// Flushers bounds the coalescer's pipelines in flight together with
	// every other Transport that shares it.
	Flushers *FlusherBound
}

// New returns a Transport on client: a *redis.Client (standalone, or
// Sentinel failover) or a *redis.ClusterClient; any other kind is an error.
func New(client redis.UniversalClient, cfg Config) (*Transport, error) {
	topo, err := newTopology(client)
	if err != nil {
		return nil, err
	}
	t := &Transport{topology: topo, client: client}
	t.cmd = newOnce(client)
	if cfg.Coalesce {
		if cfg.Flushers == nil {
			cfg.Flushers = NewFlusherBound()
		}
		t.co = newCoalescer(client, topo, cfg.Flushers)
		t.cmd = t.co
	}
	t.cmdBounds, t.clientBounds = honoursDeadlines(t.cmd), honoursDeadlines(client)
	return t, nil
}

// Client returns the client the Transport was made with.
func (t *Transport) Client() redis.UniversalClient { return t.client }

// Cmd returns what the lock calls send their commands through: the
// coalescer, or the client behind once.
func (t *Transport) Cmd() Commander { return t.cmd }

// CmdBounds and ClientBounds report whether Cmd and Client bound every
// command by its context's deadline.
func (t *Transport) CmdBounds() bool    { return t.cmdBounds }
func (t *Transport) ClientBounds() bool { return t.clientBounds }

// Go runs fn in a goroutine that Close waits for.
func (t *Transport) Go(fn func()) { t.io.goFn(fn) }

// Settle waits, until ctx ends, for the exchanges and the coalescer's
// flushers and re-sends in flight: what they did is settled when they end.
func (t *Transport) Settle(ctx context.Context) {
	t.io.wait(ctx)
	if t.co != nil {
		t.co.run.wait(ctx)
	}
}

// Close makes commands queued in the coalescer from now on fail with
// redis.ErrClosed and waits, until ctx ends, for every goroutine the
// Transport runs. It returns how many still had an exchange in flight
// then: each ends with its exchange, by the client's timeouts.
func (t *Transport) Close(ctx context.Context) int {
	pending := 0
	if t.co != nil {
		pending = t.co.close(ctx)
	}
	return pending + t.io.wait(ctx)
}

// What tests of the engine read of a Transport.

// Exchanges returns how many exchanges run on goroutines of the Transport's.
func (t *Transport) Exchanges() int64 { return t.io.n.Load() }

// WaitFlushers waits until ctx ends for the coalescer's flushers and
// re-sends, and returns how many still run.
func (t *Transport) WaitFlushers(ctx context.Context) int {
	if t.co == nil {
		return 0
	}
	return t.co.run.wait(ctx)
}

// FlushersWaitedOn reports whether someone (Close) waits for the
// coalescer's flushers.
func (t *Transport) FlushersWaitedOn() bool {
	if t.co == nil {
		return false
	}
	t.co.run.mu.Lock()
	defer t.co.run.mu.Unlock()
	return t.co.run.zero != nil
}

// FlushersBusy reports whether a flusher (or a lone caller sending) runs on
// any of the coalescer's lanes.
func (t *Transport) FlushersBusy() bool {
	if t.co == nil {
		return false
	}
	co := t.co
	co.mu.Lock()
	defer co.mu.Unlock()
	for _, l := range co.lanes {
		if l.flushers > 0 {
			return true
		}
	}
	return false
}

// Flushers returns the bound the coalescer counts its flushers under.
func (t *Transport) Flushers() *atomic.Int32 {
	if t.co == nil {
		return nil
	}
	return t.co.flushers
}

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

// lateGrace is how long a call that reached its own deadline (not its
// context's) still waits for the reply: the exchange runs under the same
// deadline, so a client that honours it answers within moments, with the
// error that says why (a refused connection, say).
const lateGrace = 20 * time.Millisecond

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

// OnCaller returns the context under which an exchange under ctx, bounded
// by deadline, runs on the caller's goroutine, or nil when it needs a
// goroutine of the Manager's. It is ctx itself where direct says so.
// Otherwise, where the client bounds a command by its context (bounds)
// and ctx would end later than deadline, or never (context.Background,
// say), it is ctx narrowed to deadline. A ctx that can end without a
// deadline (cancelled only) gets nil: its caller must be able to stop
// waiting at once, which a goroutine of the Manager's allows.
func OnCaller(ctx context.Context, deadline time.Time, bounds bool) (context.Context, context.CancelFunc) {
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
	t      *Transport
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
	defer c.t.io.done()
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

// Exchange runs f, one exchange with Redis, so that it returns by ctx's end
// and by deadline (zero: none), whatever the client's timeouts. An ended
// ctx returns its error at once and sends nothing. When the caller stops
// waiting first, exchange returns the zero T and an *abandonedError
// (matching the context's error), and f goes on in the background; late,
// if not nil, then gets f's result once f has returned, on f's goroutine,
// to settle what f did.
//
// exchange is for exchanges through the Manager's client; ExchangeOn says
// whether the client f goes through bounds a command by its context's
// deadline (see honoursDeadlines).
func Exchange[T any](t *Transport, ctx context.Context, deadline time.Time, f func(context.Context) (T, error), late func(T, error)) (T, error) {
	return ExchangeOn(t, t.clientBounds, ctx, deadline, f, late)
}

// ExchangeOn is Exchange through a client that bounds commands by their
// context's deadline or not (bounds).
func ExchangeOn[T any](t *Transport, bounds bool, ctx context.Context, deadline time.Time, f func(context.Context) (T, error), late func(T, error)) (T, error) {
	if err := ctx.Err(); err != nil {
		var zero T
		return zero, err
	}
	if cctx, cancel := OnCaller(ctx, deadline, bounds); cctx != nil {
		defer cancel()
		return f(cctx)
	}
	c := &call[T]{t: t, ctx: ctx, f: f, late: late, done: make(chan struct{})}
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		if d, ok := ctx.Deadline(); !ok || deadline.Before(d) {
			c.ctx, c.cancel = context.WithDeadline(ctx, deadline)
			t := time.NewTimer(time.Until(deadline))
			defer t.Stop()
			timeout = t.C
		}
	}
	t.io.add()
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

// Bounded is Exchange for an exchange without a result.
func (t *Transport) Bounded(ctx context.Context, deadline time.Time, op func(context.Context) error, late func(error)) error {
	var l func(struct{}, error)
	if late != nil {
		l = func(_ struct{}, err error) { late(err) }
	}
	_, err := Exchange(t, ctx, deadline, func(ctx context.Context) (struct{}, error) { return struct{}{}, op(ctx) }, l)
	return err
}

// RunScript runs s on c bounded by ctx (see exchange), with EVALSHA and
// the EVAL fallback. Through the coalescer it runs on the caller's
// goroutine under any ctx: the coalescer waits for a reply only until ctx
// ends (see coalescer.Process). keys must not change after the call (see
// scriptCmd).
func (t *Transport) RunScript(ctx context.Context, c redis.Scripter, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	bounds, waits := t.clientBounds, false
	if c == redis.Scripter(t.cmd) {
		bounds, waits = t.cmdBounds, t.co != nil
	}
	if ctx.Err() == nil && (waits || direct(ctx, time.Time{}, bounds)) {
		return s.Run(ctx, c, keys, args...) // the hot path: no closure
	}
	cmd, err := ExchangeOn(t, bounds, ctx, time.Time{}, func(ctx context.Context) (*redis.Cmd, error) {
		cmd := s.Run(ctx, c, keys, args...)
		return cmd, cmd.Err()
	}, nil)
	if cmd == nil { // not sent, or no reply in time
		cmd = redis.NewCmd(ctx)
		cmd.SetErr(err)
	}
	return cmd
}

// Process sends cmd, a command of its own (not a script), through c (Cmd,
// or a client) bounded by ctx as RunScript is: through the coalescer on
// the caller's goroutine under any ctx, else on the caller's goroutine
// where the client bounds commands by their deadline, else on a goroutine
// of the Transport's. It is sent once: a command through a client goes
// with go-redis's retries off. cmd is read only when Process returns nil
// or an error reply; after any other error the command may belong to an
// exchange still in flight.
func (t *Transport) Process(ctx context.Context, c Commander, cmd redis.Cmder) error {
	bounds, waits := t.clientBounds, false
	if c == t.cmd {
		bounds, waits = t.cmdBounds, t.co != nil
	} else {
		cmd = noRetry{cmd}
	}
	if ctx.Err() == nil && (waits || direct(ctx, time.Time{}, bounds)) {
		return c.Process(ctx, cmd) // the hot path: no closure
	}
	return t.Bounded(ctx, time.Time{}, func(ctx context.Context) error { return c.Process(ctx, cmd) }, nil)
}

// ProcessGroup sends cmds through c as a group (see Commander), bounded by
// ctx as Process bounds a command, and returns the first error among
// their replies.
func (t *Transport) ProcessGroup(ctx context.Context, c Commander, cmds ...redis.Cmder) error {
	bounds, waits := t.clientBounds, false
	if c == t.cmd {
		bounds, waits = t.cmdBounds, t.co != nil
	}
	if ctx.Err() == nil && (waits || direct(ctx, time.Time{}, bounds)) {
		return c.ProcessGroup(ctx, cmds...)
	}
	return t.Bounded(ctx, time.Time{}, func(ctx context.Context) error { return c.ProcessGroup(ctx, cmds...) }, nil)
}
