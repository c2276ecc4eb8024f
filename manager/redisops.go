package manager

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shardlock/shardlock/internal/scripts"
)

// minServer is the oldest Redis shardlock supports: SET ... NX GET needs
// 6.2, and 7.0 is the oldest release still maintained that has sharded
// pub/sub and the cluster behaviour we test against.
const minServer = "7.0.0"

// formatMs is a duration as a script's argument in milliseconds.
func formatMs(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// luaFlag is a script's boolean argument: "1" or "0".
func luaFlag(on bool) string {
	if on {
		return "1"
	}
	return "0"
}

// Script arguments boxed once: a string put into an interface anew costs
// an allocation on every call.
var (
	luaTrue  any = "1"
	luaFalse any = "0"
)

// luaArg is luaFlag(on) as a script argument.
func luaArg(on bool) any {
	if on {
		return luaTrue
	}
	return luaFalse
}

// isReply reports whether err is an error reply from Redis: the server saw
// the command, so nothing about it is ambiguous.
func isReply(err error) bool {
	_, ok := replyMsg(err)
	return ok
}

// replyMsg returns the message of the error reply in err's chain (a
// wrapped reply too), and whether there is one; redis.Nil is none.
func replyMsg(err error) (string, bool) {
	if err == nil || err == redis.Nil {
		return "", false // the hot path: no errors.As, whose target escapes
	}
	var re redis.Error
	if !errors.As(err, &re) || errors.Is(err, redis.Nil) {
		return "", false
	}
	return re.Error(), true
}

// hasReplyPrefix reports whether err is an error reply starting with prefix.
func hasReplyPrefix(err error, prefix string) bool {
	msg, ok := replyMsg(err)
	return ok && strings.HasPrefix(msg, prefix)
}

// isAmbiguous reports whether a command that failed with err may still have
// run (or may still run later) on the server: a timeout, a dropped
// connection or a cancelled context after the command was written. An
// error that shows the command never left is not (see neverSent).
func isAmbiguous(err error) bool {
	return err != nil && !isReply(err) && !errors.Is(err, redis.Nil) && !errors.Is(err, redis.ErrPoolTimeout) &&
		!errors.Is(err, redis.ErrClosed) && !errors.Is(err, syscall.ECONNREFUSED) && !neverSent(err)
}

// neverSent reports whether err says a command was never written: a dial
// that failed, or a context that ended before the command had a
// connection. go-redis answers the bare context error only then (once a
// command is on a connection, an ended deadline is the connection's
// timeout, a *net.OpError), and so do the coalescer and exchange for a
// command they never sent; a caller that stopped waiting for a command in
// flight gets an *abandonedError instead.
func neverSent(err error) bool {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Op == "dial"
	}
	return (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) && !isAbandoned(err)
}

// isWrongType reports whether err is Redis's WRONGTYPE reply: the key
// holds another type, so it is no lock of ours.
func isWrongType(err error) bool { return hasReplyPrefix(err, "WRONGTYPE") }

// ranWithError reports whether err is an error reply from a command that
// ran: not a redirect or a "not now" (which mean it did not run). A script
// that failed that way may have written before it failed.
func ranWithError(err error) bool { return isReply(err) && !isTransient(err) }

// isTransient reports whether err is worth retrying: a network fault, or a
// reply that means "not now" (a failover, a migrating slot, a loading node).
// Context errors are not transient: the caller's context decides.
func isTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, redis.ErrClosed) {
		return false
	}
	if msg, ok := replyMsg(err); ok {
		return isNotNow(err) || isRedirect(err) || strings.HasPrefix(msg, "BUSY") || strings.HasPrefix(msg, "NOSCRIPT")
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, redis.ErrPoolTimeout)
}

// retryTransient runs op until it returns nil or an error that is not
// transient, until deadline (zero: none) or ctx ends, with jittered
// exponential backoff from 10 ms to 500 ms between tries. On a transient
// error it asks a cluster client to reload its slot map, so a failover is
// followed without waiting for a redirect.
func (m *Manager) retryTransient(ctx context.Context, deadline time.Time, op func(context.Context) error) error {
	return m.retryWhile(ctx, deadline, isTransient, op)
}

// retryWhile is retryTransient for the errors retryable accepts.
func (m *Manager) retryWhile(ctx context.Context, deadline time.Time, retryable func(error) bool, op func(context.Context) error) error {
	err := op(ctx)
	if err == nil || !retryable(err) || ctx.Err() != nil {
		return withCtxErr(ctx, err)
	}
	// The retry loop and its deadline are set up only when needed: the
	// first try is the hot path.
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for attempt := 1; ; attempt++ {
		m.reloadTopology(ctx)
		timer.Reset(transientBackoff(attempt))
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-timer.C:
		}
		err = op(ctx)
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return withCtxErr(ctx, err)
		}
	}
}

// withCtxErr joins ctx's error to err when ctx has ended and err does not say so.
func withCtxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return errors.Join(err, ctx.Err())
	}
	return err
}

func transientBackoff(attempt int) time.Duration {
	ceil := 500 * time.Millisecond
	if attempt < 6 {
		ceil = (10 * time.Millisecond) << (attempt - 1)
	}
	return ceil/2 + rand.N(ceil/2+1)
}

// reloadTopology makes a cluster client re-read the slot map, at most once
// per 100 ms per manager.
func (m *Manager) reloadTopology(ctx context.Context) { m.topo.reload(ctx) }

// scriptCall is one script invocation in a pipelined batch.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
}

// runBatch sends calls in one pipeline per node (a cluster client splits a
// pipeline by node and runs the parts concurrently), each command once:
// go-redis's pipelines send a node's whole batch again after a lost
// connection or a "not now" reply at its head, answered commands included,
// so its retries are off for them (noRetry); redirects are still followed.
// After a connection error the calls whose replies were read keep them,
// and only the others carry the error. Calls that meet NOSCRIPT (a
// failover or SCRIPT FLUSH emptied a node's script cache) are sent once
// more with EVAL. Each call's result is in its cmd; its caller settles a
// call that did not run ("not now") or whose outcome is unknown (a lost
// connection): a release or renewal retries it while the lock is valid, a
// MultiLock acquire gives the group's token to the reaper, or tries again
// if it waits.
func runBatch(ctx context.Context, c redis.UniversalClient, calls []scriptCall) {
	send := func(idx []int, eval bool) {
		pipe := c.Pipeline()
		queue := scripter{c: c, process: func(ctx context.Context, cmd redis.Cmder) error {
			return pipe.Process(ctx, noRetry{cmd})
		}}
		for _, i := range idx {
			cl := &calls[i]
			if eval {
				cl.cmd = cl.script.Eval(ctx, queue, cl.keys, cl.args...)
			} else {
				cl.cmd = queue.EvalSha(ctx, cl.script.Hash(), cl.keys, cl.args...)
			}
		}
		if _, err := pipe.Exec(ctx); err != nil && !isReply(err) {
			for _, i := range idx {
				unstamp(calls[i].cmd)
			}
		}
	}
	all := make([]int, len(calls))
	for i := range all {
		all[i] = i
	}
	send(all, false)
	var again []int
	for i := range calls {
		if hasReplyPrefix(calls[i].cmd.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		send(again, true)
	}
}

// startupCheck checks that every master is new enough and preloads the
// scripts on every master. A reply that says "not now" (a server loading
// its data, a cluster that is down or failing over: see isNotNow) makes it
// look again (retryWhile's backoff, the slot map reloaded) until ctx ends;
// then it returns that reply with ctx's error.
func (m *Manager) startupCheck(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err // nothing sent
	}
	return m.retryWhile(ctx, time.Time{}, isNotNow, m.startupCheckOnce)
}

// startupCheckOnce makes the startup check's commands once.
func (m *Manager) startupCheckOnce(ctx context.Context) error {
	check := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "server").Result()
		if isReply(err) {
			return nil // a server that does not say its version (an emulator); nothing to check
		}
		if err != nil {
			return err
		}
		v := infoField(info, "redis_version")
		if v != "" && versionLess(v, minServer) {
			return &ServerVersionError{Addr: c.Options().Addr, Version: v, Need: minServer}
		}
		return nil
	}
	if err := m.topo.eachMaster(ctx, check); err != nil {
		return err
	}
	for _, s := range scripts.All() {
		if err := s.Load(ctx, m.client).Err(); err != nil {
			return err
		}
	}
	return nil
}

func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// versionLess compares dotted versions numerically.
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}
