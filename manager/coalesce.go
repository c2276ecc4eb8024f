package manager

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// commander is what the lock calls send their commands through: the
// client itself, or the coalescer in front of it.
type commander interface {
	redis.Scripter
	Process(ctx context.Context, cmd redis.Cmder) error
}

var (
	_ commander = (*redis.Client)(nil)
	_ commander = (*redis.ClusterClient)(nil)
	_ commander = (*coalescer)(nil)
)

// coalescer sends concurrent callers' commands to one server (a standalone
// or Sentinel-managed client) as pipelines: each caller queues its command
// and waits for its own reply, until its context ends. A command whose
// caller stopped waiting before it was sent is never sent; one already sent
// is answered into the void (what it did is settled by the caller's
// reaper). One pipeline of at most coalesceBatch commands is in flight at
// a time: the commands queued meanwhile go together in the next one.
//
// It replaces go-redis's AutoPipeline() for single-server clients: that
// one waits for a batch however the caller's context ends, so bounding a
// call by its deadline would cost a goroutine per call.
type coalescer struct {
	c redis.UniversalClient

	mu     sync.Mutex
	queue  []*queued
	closed bool

	wake chan struct{} // one token per batch to send; buffered
	stop chan struct{}
	wg   sync.WaitGroup
}

const (
	coalesceBatch    = 256
	coalesceFlushers = 1
)

// queued command states
const (
	queuedWaiting int32 = iota // in the queue
	queuedSent                 // taken by a flusher
	queuedDropped              // its caller left before it was sent
	queuedLeft                 // its caller left after it was sent
)

type queued struct {
	cmd   redis.Cmder
	state atomic.Int32
	done  chan struct{} // closed when the reply is in cmd
}

func newCoalescer(c redis.UniversalClient) *coalescer {
	co := &coalescer{c: c, wake: make(chan struct{}, coalesceFlushers), stop: make(chan struct{})}
	for range coalesceFlushers {
		co.wg.Go(co.flusher)
	}
	return co
}

// Process queues cmd and waits for its reply or ctx's end. It returns
// cmd's error; ctx's error when cmd was not sent (nothing about it is
// ambiguous); an *abandonedError when cmd was sent but ctx ended first
// (then cmd belongs to the coalescer: do not read it).
func (co *coalescer) Process(ctx context.Context, cmd redis.Cmder) error {
	if err := ctx.Err(); err != nil {
		cmd.SetErr(err)
		return err
	}
	q := &queued{cmd: cmd, done: make(chan struct{})}
	co.mu.Lock()
	if co.closed {
		co.mu.Unlock()
		cmd.SetErr(redis.ErrClosed)
		return redis.ErrClosed
	}
	co.queue = append(co.queue, q)
	first := len(co.queue) == 1
	co.mu.Unlock()
	if first {
		select {
		case co.wake <- struct{}{}:
		default: // every flusher has a batch to take already
		}
	}
	select {
	case <-q.done:
		return cmd.Err()
	case <-ctx.Done():
	}
	if q.state.CompareAndSwap(queuedWaiting, queuedDropped) {
		cmd.SetErr(ctx.Err()) // never sent: the flusher skips it
		return ctx.Err()
	}
	if q.state.CompareAndSwap(queuedSent, queuedLeft) {
		return &abandonedError{cause: ctx.Err()}
	}
	<-q.done // answered meanwhile
	return cmd.Err()
}

// flusher sends batches from the queue until stop.
func (co *coalescer) flusher() {
	for {
		select {
		case <-co.stop:
			return
		case <-co.wake:
		}
		for co.flushOnce() {
		}
	}
}

// flushOnce sends one batch; it reports false when the queue was empty.
func (co *coalescer) flushOnce() bool {
	co.mu.Lock()
	n := min(len(co.queue), coalesceBatch)
	if n == 0 {
		co.mu.Unlock()
		return false
	}
	batch := make([]*queued, 0, n)
	for _, q := range co.queue[:n] {
		if q.state.CompareAndSwap(queuedWaiting, queuedSent) {
			batch = append(batch, q)
		}
	}
	rest := copy(co.queue, co.queue[n:])
	clear(co.queue[rest:])
	co.queue = co.queue[:rest]
	co.mu.Unlock()
	if rest > 0 {
		select {
		case co.wake <- struct{}{}: // another flusher takes the rest meanwhile
		default:
		}
	}
	if len(batch) == 0 {
		return true
	}
	if len(batch) == 1 {
		// A lone command goes as itself: no pipeline to build.
		_ = co.c.Process(context.Background(), batch[0].cmd)
	} else {
		pipe := co.c.Pipeline()
		for _, q := range batch {
			_ = pipe.Process(context.Background(), q.cmd)
		}
		_, _ = pipe.Exec(context.Background())
	}
	for _, q := range batch {
		close(q.done)
	}
	return true
}

// close stops the flushers after the batches in flight, waiting for them
// until ctx ends (a batch stuck on a hung server ends by the client's
// timeouts); commands queued after it fail with redis.ErrClosed.
func (co *coalescer) close(ctx context.Context) {
	co.mu.Lock()
	if co.closed {
		co.mu.Unlock()
		return
	}
	co.closed = true
	co.mu.Unlock()
	close(co.stop)
	stopped := make(chan struct{})
	go func() {
		co.wg.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		return // the flushers end with their batches
	}
	co.mu.Lock()
	for _, q := range co.queue {
		if q.state.CompareAndSwap(queuedWaiting, queuedSent) {
			q.cmd.SetErr(redis.ErrClosed)
			close(q.done)
		}
	}
	co.queue = nil
	co.mu.Unlock()
}

// scriptCmd runs a script command (EVAL, EVALSHA and their _RO forms)
// through the coalescer. A caller that stopped waiting after it was sent
// gets a command of its own with the error, as the coalescer now owns the
// one it sent.
func (co *coalescer) scriptCmd(ctx context.Context, name, body string, keys []string, args []any) *redis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, name, body, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	if err := co.Process(ctx, cmd); isAbandoned(err) {
		own := redis.NewCmd(ctx)
		own.SetErr(err)
		return own
	}
	return cmd
}

func (co *coalescer) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return co.scriptCmd(ctx, "eval", script, keys, args)
}

func (co *coalescer) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return co.scriptCmd(ctx, "evalsha", sha1, keys, args)
}

func (co *coalescer) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return co.scriptCmd(ctx, "eval_ro", script, keys, args)
}

func (co *coalescer) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return co.scriptCmd(ctx, "evalsha_ro", sha1, keys, args)
}

func (co *coalescer) ScriptExists(ctx context.Context, hashes ...string) *redis.BoolSliceCmd {
	return co.c.ScriptExists(ctx, hashes...)
}

func (co *coalescer) ScriptLoad(ctx context.Context, script string) *redis.StringCmd {
	return co.c.ScriptLoad(ctx, script)
}
